"""End-to-end helpers: a real master and real workers as separate processes on loopback (port 0).

:func:`start_cluster` starts them with :class:`gradcode.client.launch.LocalCluster` (each process limited to
one BLAS thread), waits until the master lists every worker UP, and always stops every process.
:class:`Cluster` knows which process is which pool worker, can SIGKILL one and restart it (at the same
address when the port is still free; it re-registers and is UP again). :func:`run_job` runs a job
through :meth:`gradcode.client.sdk.GradcodeClient.run` and returns its final info and reports.
"""

from __future__ import annotations

import contextlib
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gradcode.client.launch import LocalCluster, ServiceProcess
from gradcode.client.sdk import GradcodeClient, ReportCallback
from gradcode.common.transport.wire import struct_from_dict
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc

START_TIMEOUT = 60.0
RESTART_ATTEMPTS = 3
"""Tries to restart a worker on its old port before it gets a new one."""


class Cluster:
    """A running LocalCluster plus the map from worker process to pool worker id."""

    def __init__(self, local: LocalCluster) -> None:
        self.local = local
        self.master_address = local.master_address
        self.addresses = [w.wait_ready(START_TIMEOUT) for w in local.workers]
        self.processes: list[ServiceProcess] = list(local.workers)
        self.ids: list[int] = []

    def list_workers(self) -> list[master_pb2.WorkerInfo]:
        with grpc.insecure_channel(self.master_address) as channel:
            return list(
                master_pb2_grpc.MasterStub(channel).ListWorkers(master_pb2.ListWorkersRequest(), timeout=5).workers
            )

    def wait_all_up(self, timeout: float = START_TIMEOUT) -> None:
        """Block until the master lists every worker process UP; learn their pool ids."""
        deadline = time.monotonic() + timeout
        while True:
            by_address = {w.address: w for w in self.list_workers()}
            infos = [by_address.get(a) for a in self.addresses]
            if all(i is not None and i.state == master_pb2.WORKER_STATE_UP for i in infos):
                self.ids = [i.worker_id for i in infos if i is not None]
                return
            if time.monotonic() > deadline:
                down = [
                    p
                    for p, i in zip(self.processes, infos, strict=True)
                    if i is None or i.state != master_pb2.WORKER_STATE_UP
                ]
                raise TimeoutError(
                    f"workers not all UP at the master after {timeout} s: {by_address}\n{log_tails(down)}"
                )
            time.sleep(0.1)

    def kill(self, index: int) -> None:
        """SIGKILL worker process ``index`` (no-op if already dead)."""
        self.processes[index].kill()

    def restart(self, index: int) -> None:
        """Start worker ``index`` again, at its old address if that port is still free.

        Another process may have taken the port meanwhile: after a few tries the worker starts on a new
        port instead (it registers as a new pool worker; :meth:`wait_all_up` learns its id).
        """
        old = self.processes[index]
        if old.alive:
            return
        old.stop()
        host = self.addresses[index].rpartition(":")[0]
        for attempt in range(RESTART_ATTEMPTS + 1):
            listen = self.addresses[index] if attempt < RESTART_ATTEMPTS else f"{host}:0"
            argv = [sys.executable, "-m", "gradcode.worker", "--listen", listen, "--master", self.master_address]
            log = old.log_path.with_name(f"{old.log_path.stem}-restart-{int(time.time() * 1000)}.log")
            proc = ServiceProcess(argv, log_path=log)
            self.local.workers.append(proc)  # so LocalCluster.stop() stops it too
            try:
                self.addresses[index] = proc.wait_ready(START_TIMEOUT)
            except RuntimeError:  # it could not bind (the port is taken): try again, finally on a new port
                proc.stop()
                time.sleep(0.2 * (attempt + 1))
                continue
            self.processes[index] = proc
            return
        raise RuntimeError(f"worker {index} could not be restarted; see {old.log_path.parent}")

    def ensure_all_up(self) -> None:
        """Restart any dead worker and wait until the master sees all of them UP."""
        for i, proc in enumerate(self.processes):
            if not proc.alive:
                self.restart(i)
        self.wait_all_up()


def log_tails(processes: Sequence[ServiceProcess]) -> str:
    """The end of each process's log, and whether it still runs: what a set-up timeout should show."""
    return "\n".join(
        f"--- {p.log_path.name} ({'running' if p.alive else f'exited {p.process.returncode}'}):\n{p.log_tail()}"
        for p in processes
    )


def metric_total(port: int, name: str) -> float:
    """The sum of every sample named ``name`` that the metrics endpoint on ``port`` serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@contextlib.contextmanager
def start_cluster(
    num_workers: int,
    run_dir: Path,
    worker_args: Callable[[int], Sequence[str]] | None = None,
    master_args: Sequence[str] = (),
) -> Iterator[Cluster]:
    """A master (with ``master_args``) and ``num_workers`` registered workers (worker ``i`` with ``worker_args(i)``);
    every process is stopped on exit."""
    local = LocalCluster(num_workers, run_dir=run_dir, worker_args=worker_args, master_args=list(master_args))
    try:
        local.start(timeout=START_TIMEOUT)
        cluster = Cluster(local)
        cluster.wait_all_up()
        yield cluster
    finally:
        local.stop()  # every process, its output pipe and its log


@pytest.fixture(scope="module")
def cluster6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(6, tmp_path_factory.mktemp("cluster6")) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def master_stub(address: str) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        yield master_pb2_grpc.MasterStub(channel)


def job_spec(
    code: str,
    params: dict[str, Any],
    *,
    iterations: int = 5,
    learning_rate: float = 0.5,
    worker_ids: list[int] | None = None,
    straggler: common_pb2.StragglerSpec | None = None,
    **fields: Any,
) -> master_pb2.JobSpec:
    """Softmax regression on scikit-learn's digits with gradient descent, unless ``fields`` say otherwise."""
    defaults: dict[str, Any] = {
        "dataset": master_pb2.DatasetSpec(name="digits"),
        "optimizer": master_pb2.OptimizerSpec(kind="gd", learning_rate=learning_rate),
    }
    spec = master_pb2.JobSpec(
        code=common_pb2.CodeSpec(name=code, params=struct_from_dict(params)),
        iterations=iterations,
        worker_ids=worker_ids or [],
        **{**defaults, **fields},
    )
    if straggler is not None:
        spec.straggler.CopyFrom(straggler)
    return spec


async def run_job(
    address: str, spec: master_pb2.JobSpec, on_report: ReportCallback | None = None
) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport]]:
    """Create the job, watch it to the end, return its final JobInfo and every report (whatever the outcome)."""
    async with GradcodeClient(address) as client:
        return await client.run(spec, on_report, check=False)
