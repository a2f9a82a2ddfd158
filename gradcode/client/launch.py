"""Start a master and n workers as separate local processes on loopback, and always stop them.

This is the default way to try gradcode on one machine (``gradcode demo``) and what the end-to-end
tests use. Each process limits BLAS to one thread: many worker processes share few cores.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from gradcode.common.transport.serving import BLAS_THREAD_VARIABLES

__all__ = ["LocalCluster", "ServiceProcess", "service_env"]

_LISTENING = re.compile(r"(?:master|worker) listening on (\S+)")


PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
"""The folder this ``gradcode`` package is imported from (a checkout, or site-packages)."""


def service_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The current environment with numerical libraries limited to one thread each, and this ``gradcode`` first
    on the import path, so the children run the same code as the parent whatever their working directory."""
    env = dict(os.environ)
    for var in BLAS_THREAD_VARIABLES:
        env[var] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env.update(extra or {})
    return env


class ServiceProcess:
    """A master or worker child process whose announced address is read from its output.

    ``argv`` is the whole command (e.g. ``[sys.executable, "-m", "gradcode.worker", "--listen", ...]``).
    """

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None):
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or service_env(),
        )  # in the caller's working directory: relative paths in argv mean what the user meant
        self.address: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._log.write(line)
            self._log.flush()
            match = _LISTENING.search(line)
            if match and self.address is None:
                self.address = match.group(1)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Block until the process announced its address; raise with its log if it died or timed out."""
        self._ready.wait(timeout)
        if self.address is None:
            self.kill()
            self.stop()  # closes its output and its log
            raise RuntimeError(
                f"{' '.join(self.argv)} did not start within {timeout:.0f} s; its output:\n{self.log_tail()}"
            )
        return self.address

    def log_tail(self, chars: int = 2000) -> str:
        """The end of what the process printed (for an error that should say why it did not come up)."""
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the failure the straggler-tolerant codes must survive."""
        if self.alive:
            self.process.kill()
        self.process.wait()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=2)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


class LocalCluster:
    """A master and ``num_workers`` workers on 127.0.0.1, each its own process.

    Workers register with the master (as under ``docker-compose --scale worker=N``). ``env`` adds
    variables to every process's environment (TLS files and secrets); ``master_args`` are extra master
    flags (e.g. ``--state-dir``), ``worker_args(i)`` extra flags of worker ``i`` (e.g. its ``--machine-id``).
    Use as a context manager; every process is stopped on exit, even after an error.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        run_dir: Path,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        master_args: Sequence[str] = (),
        worker_args: Callable[[int], Sequence[str]] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, not {num_workers}.")
        self.num_workers = num_workers
        self.run_dir = Path(run_dir).resolve()
        """Absolute, so the master child (told ``--run-dir``) and this process write to the same place."""
        self.host = host
        self.env = service_env(env)
        """Every process's environment (``env`` adds e.g. the GRADCODE_TLS_* and secret variables)."""
        self.master_args = list(master_args)
        self.worker_args = worker_args
        self.master: ServiceProcess | None = None
        self.workers: list[ServiceProcess] = []
        self._master_starts = 0

    @property
    def master_address(self) -> str:
        if self.master is None or self.master.address is None:
            raise RuntimeError("The cluster is not started.")
        return self.master.address

    def start(self, timeout: float = 60.0) -> LocalCluster:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        self.master = self._start_master(f"{self.host}:0")
        master = self.master.wait_ready(timeout)
        for i in range(self.num_workers):
            self.add_worker(master, logs / f"worker-{i}.log")
        for w in self.workers:
            w.wait_ready(timeout)
        return self

    def _start_master(self, listen: str) -> ServiceProcess:
        argv = [sys.executable, "-m", "gradcode.master", "--listen", listen, "--run-dir", str(self.run_dir)]
        name = "master.log" if not self._master_starts else f"master-restart-{self._master_starts}.log"
        self._master_starts += 1
        return ServiceProcess([*argv, *self.master_args], log_path=self.run_dir / "logs" / name, env=self.env)

    def restart_master(self, timeout: float = 60.0, attempts: int = 5) -> str:
        """Start the master again at its old address (after it died), so the workers find it when they
        re-register; retries while the port is not free yet. Returns the address."""
        if self.master is None or self.master.address is None:
            raise RuntimeError("The cluster is not started.")
        old, address = self.master, self.master.address
        if old.alive:
            raise RuntimeError(f"The master at {address} is still running; kill or stop it first.")
        old.stop()
        for attempt in range(attempts):
            self.master = self._start_master(address)
            try:
                return self.master.wait_ready(timeout)
            except RuntimeError:
                self.master.stop()
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"The master could not be restarted at {address}; see {self.run_dir / 'logs'}.")

    def add_worker(
        self, master_address: str | None = None, log_path: Path | None = None, listen: str | None = None
    ) -> ServiceProcess:
        """Start one more worker that registers with the master (also used to bring one back, at its old
        ``listen`` address if given)."""
        master_address = master_address or self.master_address
        log_path = log_path or self.run_dir / "logs" / f"worker-{len(self.workers)}.log"
        listen = listen or f"{self.host}:0"
        argv = [sys.executable, "-m", "gradcode.worker", "--listen", listen, "--master", master_address]
        extra = self.worker_args(len(self.workers)) if self.worker_args is not None else ()
        worker = ServiceProcess([*argv, "--name", log_path.stem, *extra], log_path=log_path, env=self.env)
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
