"""Workers on the master's host exchange models and messages through its shared-memory directory:
real master and worker processes, a straggler whose late messages must never reach a later round, a
worker killed mid-job, one killed mid-round and restarted in place, and the same job with shared memory off."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from gradcode.client.launch import ServiceProcess
from gradcode.v1 import master_pb2, master_pb2_grpc
from tests.e2e.conftest import START_TIMEOUT, job_spec, log_tails, metric_total, run_job
from tests.helpers import fixed_delay, free_port

pytestmark = pytest.mark.e2e

NUM_WORKERS = 4
ITERATIONS = 12
EXACT = 1e-9


class _Processes:
    """A master (with ``master_args``) and NUM_WORKERS registered workers, each with a metrics port."""

    def __init__(self, tmp_path: Path, master_args: list[str]) -> None:
        self.tmp_path, self.master_args = tmp_path, master_args
        self.metrics = [free_port() for _ in range(NUM_WORKERS)]
        self.listen = [free_port() for _ in range(NUM_WORKERS)]
        self.processes: list[ServiceProcess] = []
        self.address = ""
        self.ids: list[int] = []
        """The pool worker id of each worker process."""

    def __enter__(self) -> _Processes:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> _Processes:
        t = self.tmp_path
        master = ServiceProcess(
            [sys.executable, "-m", "gradcode", "master", "--listen", "127.0.0.1:0", "--run-dir", str(t),
             *self.master_args],
            log_path=t / "master.log",
        )  # fmt: skip
        self.processes.append(master)
        self.address = master.wait_ready(START_TIMEOUT)
        addresses: list[str] = []
        for i in range(NUM_WORKERS):
            addresses.append(self._start_worker(i))
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # registered and UP at the master; learn their pool ids
            with grpc.insecure_channel(self.address) as channel:
                listed = master_pb2_grpc.MasterStub(channel).ListWorkers(master_pb2.ListWorkersRequest(), timeout=5)
            up = {w.address: w.worker_id for w in listed.workers if w.state == master_pb2.WORKER_STATE_UP}
            if all(a in up for a in addresses):
                self.ids = [up[a] for a in addresses]
                return self
            late = [p for p, a in zip(self.processes[1:], addresses, strict=True) if a not in up]
            assert time.monotonic() < deadline, f"workers not all UP at the master: {listed}\n{log_tails(late)}"
            time.sleep(0.1)

    def _worker(self, i: int, generation: int = 0) -> ServiceProcess:
        return ServiceProcess(
            [sys.executable, "-m", "gradcode", "worker", "--listen", f"127.0.0.1:{self.listen[i]}",
             "--master", self.address, "--metrics-port", str(self.metrics[i])],
            log_path=self.tmp_path / f"worker-{i}-{generation}.log",
        )  # fmt: skip

    def _start_worker(self, i: int, attempts: int = 3) -> str:
        """Start worker ``i``; when another process took its chosen ports meanwhile, again on fresh ones."""
        for generation in range(attempts - 1):
            try:
                return self._started(i, generation)
            except RuntimeError:
                self.listen[i], self.metrics[i] = free_port(), free_port()
        return self._started(i, attempts - 1)

    def _started(self, i: int, generation: int) -> str:
        """Worker ``i``'s address once it listens (RuntimeError, the process stopped, if it never does)."""
        worker = self._worker(i, generation)
        address = worker.wait_ready(START_TIMEOUT)
        self.processes.append(worker)
        return address

    def restart(self, i: int) -> None:
        """Kill worker process ``i`` and start a new one at the same address (it registers again)."""
        self.processes[1 + i].kill()
        self.processes[1 + i].stop()  # closes its output and log
        self.processes[1 + i] = self._worker(i, generation=9)
        self.processes[1 + i].wait_ready(START_TIMEOUT)

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.stop()

    def shared_bytes(self) -> list[float]:
        return [metric_total(port, "gradcode_shared_bytes_sent_total") for port in self.metrics]

    def chunk_bytes(self) -> list[float]:
        return [metric_total(port, "gradcode_bytes_sent_total") for port in self.metrics]


def _spec(job_id: str, ids: list[int]) -> master_pb2.JobSpec:
    # Job worker 0 is 0.5 s slow every iteration: its messages arrive after their round, and are swept.
    return job_spec(
        "cyclic", {"n": NUM_WORKERS, "s": 1}, iterations=ITERATIONS, worker_ids=ids,
        straggler=fixed_delay(0.5, workers=[0]), job_id=job_id, verify=True,
    )  # fmt: skip


def _assert_exact(info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport]) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == ITERATIONS
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)


async def test_workers_on_the_master_host_send_through_shared_memory_exactly_and_leave_nothing_behind(
    tmp_path: Path,
) -> None:
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    with _Processes(tmp_path, ["--shared-memory", str(root)]) as cluster:
        seen: list[tuple[str, int]] = []

        def look(report: master_pb2.IterationReport) -> None:
            # The last report may come as the job removes its directory; a worker's acceptance check makes
            # and removes a hidden file when it loads the job.
            for d in root.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    seen.append((d.name, sum(not p.name.startswith(".") for p in d.iterdir())))

        info, reports = await run_job(cluster.address, _spec("shm-job", cluster.ids), look)
        _assert_exact(info, reports)
        # One private directory for the job, which never piles up messages: its owner file, the probes not yet
        # spent, the model and one slot per worker (one row each) at most, however many iterations ran.
        assert len(seen) >= ITERATIONS - 1 and len({name for name, _ in seen}) == 1, seen
        assert seen[0][0].startswith("gradcode-") and max(files for _, files in seen) <= 2 + 2 * NUM_WORKERS, seen
        shared, chunks = cluster.shared_bytes(), cluster.chunk_bytes()
        # The three fast workers sent every message through shared memory: the gRPC stream carried only
        # headers and trailers, far fewer bytes than the payloads.
        fast = [i for i, b in enumerate(shared) if b > 0]
        assert len(fast) >= NUM_WORKERS - 1, shared
        for i in fast:
            assert chunks[i] < shared[i] / 4, (chunks, shared)
        deadline = time.monotonic() + 30
        while list(root.iterdir()):  # the job's directory goes when the job ends (EndJob is best effort)
            assert time.monotonic() < deadline, list(root.rglob("*"))
            await asyncio.sleep(0.1)


async def test_a_worker_killed_mid_job_leaves_the_shared_memory_job_exact(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    with _Processes(tmp_path, ["--shared-memory", str(root)]) as cluster:
        killed = cluster.processes[2]  # job worker 1 (no delay): it answers through shared memory until killed

        def kill(report: master_pb2.IterationReport) -> None:
            if report.iteration == 4:
                killed.kill()

        info, reports = await run_job(cluster.address, _spec("shm-kill", cluster.ids), kill)
        _assert_exact(info, reports)
        assert any(r.iteration > 4 and r.failed_workers for r in reports)  # the kill was seen


async def test_a_worker_restarted_in_place_mid_round_answers_that_round_inline_and_the_job_stays_exact(
    tmp_path: Path,
) -> None:
    """The round asked job worker 1 for a shared-memory message; its process is killed while it works and a new
    one starts at the same address. The round needs it (worker 0 is gone), so it asks the new process again: a
    worker is asked for shared payloads once per round, so this answer must come inline and no slot the round
    may hold is rewritten. Later rounds use shared memory again."""
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    iterations = 7
    spec = job_spec(
        "cyclic", {"n": NUM_WORKERS, "s": 1}, iterations=iterations, worker_ids=[], job_id="shm-restart",
        straggler=fixed_delay(1.0, workers=[1]), verify=True,
    )  # fmt: skip
    with _Processes(tmp_path, ["--shared-memory", str(root)]) as cluster:
        spec.worker_ids[:] = cluster.ids
        zero, one = cluster.ids[0], cluster.ids[1]
        restarter: list[threading.Timer] = []
        restarted: list[int] = []

        def act(report: master_pb2.IterationReport) -> None:
            if report.iteration == 1:  # job worker 0 goes for good: every later round needs worker 1
                cluster.processes[1].kill()
            # The kill lands a few rounds in at most (the next rounds may finish before it does). The first round
            # without worker 0 waited for worker 1, and so does the next: restart worker 1 while it sleeps its 1 s.
            if report.iteration > 1 and zero not in report.used_workers and not restarter:
                restarted.append(report.iteration + 1)
                restarter.append(threading.Timer(0.4, cluster.restart, args=(1,)))
                restarter[0].start()

        info, reports = await run_job(cluster.address, spec, act)
        assert restarter, [(r.iteration, r.used_workers) for r in reports]
        restarter[0].join()
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert len(reports) == iterations
        for r in reports:
            assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)
        (restart_round,) = restarted
        assert restart_round < iterations - 1, "the kill took effect too late to test the restart"
        # Every round from the restart's on used worker 1 (worker 0 was gone), the one the restart hit too: it waited
        # for the new process (a start, a reload and the 1 s delay after the kill) and is the longest.
        after = [r for r in reports if r.iteration >= restart_round]
        assert all(one in r.used_workers and zero not in r.used_workers for r in after), [
            (r.iteration, r.used_workers) for r in reports
        ]
        assert max(reports[1:], key=lambda r: r.wall_seconds).iteration == restart_round
        # The new process sent that message inline (at least its payload through gRPC), and the later ones
        # through shared memory.
        payload = 8 * (65 * 10 + 2)  # digits softmax: 650 parameters, loss and score, float64
        metrics = cluster.metrics[1]  # the new process's counters (job worker 0's process is gone)
        inline = metric_total(metrics, "gradcode_bytes_sent_total")
        shared = metric_total(metrics, "gradcode_shared_bytes_sent_total")
        assert inline >= payload and shared >= payload * (iterations - restart_round), (inline, shared)


async def test_shared_memory_off_sends_every_payload_through_grpc(tmp_path: Path) -> None:
    with _Processes(tmp_path, ["--shared-memory", "off"]) as cluster:
        info, reports = await run_job(cluster.address, _spec("inline-job", cluster.ids))
        _assert_exact(info, reports)
        assert cluster.shared_bytes() == [0.0] * NUM_WORKERS
        assert sum(b > 0 for b in cluster.chunk_bytes()) >= NUM_WORKERS - 1


async def test_a_killed_masters_directory_is_removed_by_the_next_master(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    with _Processes(tmp_path, ["--shared-memory", str(root)]) as cluster:
        master = cluster.processes[0]

        def kill(report: master_pb2.IterationReport) -> None:
            if report.iteration == 3:
                master.kill()  # SIGKILL: no chance to remove its job's directory

        with contextlib.suppress(grpc.aio.AioRpcError):  # the watch breaks with the master
            await run_job(cluster.address, _spec("shm-orphan", cluster.ids), kill)
        assert not master.alive
        (left,) = list(root.iterdir())
        assert (left / "model").exists()
        successor = ServiceProcess(
            [sys.executable, "-m", "gradcode", "master", "--listen", "127.0.0.1:0", "--run-dir", str(tmp_path),
             "--shared-memory", str(root)],
            log_path=tmp_path / "successor.log",
        )  # fmt: skip
        cluster.processes.append(successor)
        successor.wait_ready(START_TIMEOUT)
        assert list(root.iterdir()) == []
        assert "removed 1 shared-memory directories of killed masters" in (tmp_path / "successor.log").read_text()
