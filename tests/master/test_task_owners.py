"""Every background task of a job and of a node has an owner: none outlives them, and a crash is not lost.

A master job's evaluations, publishes, checkpoints, reloads, probes and late streams are its
:class:`~gradcode.common.tasks.TaskOwner`'s; a worker node's registration is the node's.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradcode.master import reporting
from gradcode.master.job import JobRunner
from gradcode.master.node import MasterNode
from gradcode.master.pool import WorkerPool
from gradcode.master.spec import JobPlan
from gradcode.v1 import master_pb2
from gradcode.worker.node import WorkerNode
from tests.master.test_master_node import TIMEOUT, job_spec, running_master

JOB_TASKS = ("job-", "gather-w", "load-", "probe-", "partition-")
"""How the tasks a job starts are named (:mod:`gradcode.master.job`, :mod:`gradcode.master.liveness`, ...)."""


def _pending(prefixes: tuple[str, ...]) -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if not t.done() and t.get_name().startswith(prefixes))


async def test_a_job_that_ends_leaves_no_task_it_started_pending(tmp_path: Path) -> None:
    """Evaluations every iteration, checkpoints every iteration, publishes beside the rounds: once the job has
    ended, its owner is closed and empty, and nothing it started is pending, while the master still runs."""
    async with asyncio.timeout(TIMEOUT), running_master(3, state_dir=tmp_path, checkpoint_every=1) as master:
        ids = await master.wait_workers(3)
        spec = job_spec("cyclic", {"n": 3, "s": 1}, iterations=6, worker_ids=ids, evaluate_every=1)
        info, reports = await master.run(spec)
        job = master.node.servicer.jobs[info.job_id]
        assert isinstance(job, JobRunner)
        await job.wait()
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert [r.iteration for r in reports] == list(range(1, 7))
        assert job.tasks.closed and job.tasks.tasks == frozenset() and job.tasks.crash is None
        assert _pending(JOB_TASKS) == []
        node_tasks = {t.get_name() for t in master.node.tasks.tasks}
        assert {"pool-health-monitor", "pool-idle-monitor", "event-loop-watch"} <= node_tasks
    assert master.node.tasks.tasks == frozenset()  # the master's own, once it has stopped


async def test_a_crashing_evaluation_fails_the_job_with_its_error_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The evaluation of iteration 2 raises: the job fails at once, saying which task crashed and how. (Before
    the job owned its tasks, the crash was lost: the reports waited for that evaluation forever and the job never
    ended.)"""
    original, calls = reporting.evaluate, itertools.count(1)

    def broken(plan: JobPlan, params: np.ndarray[Any, Any]) -> reporting.Evaluation:
        if next(calls) == 2:  # (evaluations start in iteration order)
            raise RuntimeError("the test set is gone")
        return original(plan, params)

    monkeypatch.setattr(reporting, "evaluate", broken)
    async with asyncio.timeout(20), running_master(2) as master:
        ids = await master.wait_workers(2)
        spec = job_spec("uncoded", {"n": 2}, iterations=6, worker_ids=ids, evaluate_every=1)
        info, reports = await master.run(spec)
        job = master.node.servicer.jobs[info.job_id]
        assert isinstance(job, JobRunner)
        await job.wait()
        assert _pending(JOB_TASKS) == []
    assert info.state == master_pb2.JOB_STATE_FAILED
    crashed = f"internal error: job-{info.job_id}-evaluate-2 crashed: RuntimeError: "
    assert info.message.startswith(crashed), info.message
    assert "the test set is gone" in info.message
    assert [r.iteration for r in reports] == [1]  # nothing after the iteration whose evaluation broke


async def test_a_failing_publish_fails_the_job() -> None:
    """The history file cannot be written for iteration 2's report (a publish beside the next round): the job
    fails with that error, as a publish in the loop would have."""
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        ids = await master.wait_workers(2)
        original = reporting.History.append

        def full(self: reporting.History, report: master_pb2.IterationReport) -> None:
            if report.iteration == 2:
                raise OSError(28, "No space left on device")
            original(self, report)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reporting.History, "append", full)
            info, _ = await master.run(job_spec("uncoded", {"n": 2}, iterations=8, worker_ids=ids))
    assert info.state == master_pb2.JOB_STATE_FAILED
    assert "internal error: " in info.message and "No space left on device" in info.message, info.message


async def test_a_worker_node_that_stops_leaves_no_task_it_started_pending() -> None:
    """A worker registered with a master and computed a job; once it has stopped, no Python task that appeared with
    it is still pending (its registration, its link's connections, its Sessions, the master's side of them); what
    is left are grpc's own tasks of the master's channel to it, which the pool keeps for when it comes back."""
    async with asyncio.timeout(TIMEOUT), running_master(0) as master:
        before = set(asyncio.all_tasks())
        worker = WorkerNode(master_address=master.node.address, name="w", grace=0.5)
        await worker.start()
        ids = await master.wait_workers(1)
        info, _ = await master.run(job_spec("uncoded", {"n": 1}, iterations=2, worker_ids=ids))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert "register" in {t.get_name() for t in worker.tasks.tasks}
        await worker.shutdown()
        await asyncio.sleep(0.1)  # the master's side of the worker's sessions sees them end
        left = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
        assert worker.tasks.tasks == frozenset() and worker.tasks.closed
        python = [t for t in left if "cython" not in type(t.get_coro()).__module__]  # (grpc's own are Cython's)
        assert python == [], [(t.get_name(), t.get_coro()) for t in python]


async def test_a_crashing_pool_monitor_shuts_the_master_down_and_run_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A master that stopped watching its workers must not go on as if it did: its run() raises the monitor's
    crash once it has shut down. (Before the node owned the monitors, the crash was lost and the master served on.)"""

    async def broken(self: WorkerPool) -> None:
        raise RuntimeError("the monitor broke")

    monkeypatch.setattr(WorkerPool, "probe_down", broken)
    node = MasterNode(grace=0.1)
    async with asyncio.timeout(10):
        with pytest.raises(RuntimeError, match="the monitor broke"):
            await node.run()
    assert node.is_shutdown and node.tasks.tasks == frozenset() and node.tasks.closed


async def test_a_crashing_registration_stops_the_worker_server_and_run_raises_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registration loop crashes: the worker shuts down for good (its port closes) and run() raises the crash.
    (Before, awaiting the crashed registration raised inside the shutdown, which then never stopped the server.)"""

    async def broken(self: WorkerNode, master_address: str) -> None:
        raise RuntimeError("registration broke")

    monkeypatch.setattr(WorkerNode, "_register_forever", broken)
    node = WorkerNode(master_address="127.0.0.1:9", grace=0.1, link_port=None)
    async with asyncio.timeout(10):
        with pytest.raises(RuntimeError, match="registration broke"):
            await node.run()
        host, port = node.address.rsplit(":", 1)
        with pytest.raises(OSError):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.close()
    assert node.tasks.tasks == frozenset() and node.tasks.closed
