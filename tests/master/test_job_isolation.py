"""A worker's refusal that is about one job never marks it DOWN for the others (issue 25).

ABORTED (one request of one job abandoned on the worker) is about the job too: the request is asked again.

A worker that holds its limit of jobs (``max_jobs = 1`` here) answers a second job's LoadJob RESOURCE_EXHAUSTED.
That says nothing about the worker: it stays UP for the job it serves, and the second job asks it again every
:data:`~gradcode.master.loading.REFUSED_RETRY_SECONDS` until the first ends and frees its place; both succeed.
(Before, the master marked the worker DOWN for every job on that refusal.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
import pytest

from gradcode.common.exceptions import AbortedError
from gradcode.common.transport.wire import Serialized
from gradcode.master.node import MasterNode
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2
from gradcode.worker.node import WorkerNode
from gradcode.worker.service import WorkerServicer
from tests.helpers import fixed_delay

from .test_master_node import job_spec

TIMEOUT = 120.0
S = TypeVar("S", bound=WorkerServicer)


async def test_a_worker_full_of_jobs_refuses_another_without_being_marked_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gradcode.master.loading")
    states: list[int] = []
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master = await stack.enter_async_context(MasterNode(grace=0.5))
        await stack.enter_async_context(WorkerNode(master_address=master.address, name="w", grace=0.5, max_jobs=1))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        while not any(w.is_up for w in master.pool.workers):
            await asyncio.sleep(0.05)

        async def watch_states() -> None:
            while True:
                states.extend(w.state for w in master.pool.workers)
                await asyncio.sleep(0.02)

        watcher = asyncio.ensure_future(watch_states())
        first = await stub.CreateJob(
            job_spec("uncoded", {"n": 1}, iterations=8, straggler=fixed_delay(0.25, workers=[0]))
        )
        while not any(w.jobs for w in master.pool.workers):  # the first job holds the worker's one place
            await asyncio.sleep(0.02)
        second = await stub.CreateJob(job_spec("uncoded", {"n": 1}, iterations=3, iteration_deadline_seconds=60.0))
        infos = []
        for job in (first, second):
            _ = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=job.job_id))]
            infos.append(await stub.GetJob(master_pb2.GetJobRequest(job_id=job.job_id)))
        watcher.cancel()
    assert [i.state for i in infos] == [master_pb2.JOB_STATE_SUCCEEDED] * 2, [i.message for i in infos]
    assert any("RESOURCE_EXHAUSTED" in r.getMessage() for r in caplog.records)  # it was refused, then retried
    assert states and set(states) == {master_pb2.WORKER_STATE_UP}  # and never DOWN


class AbortsOnce(WorkerServicer):
    """Answers the first request of iteration 2 ABORTED, as a worker whose job a reload replaced mid-computation."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.aborted = 0

    async def _compute(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
        if request.iteration == 2 and not self.aborted:
            self.aborted += 1
            raise AbortedError(f"Iteration 2 of job {request.job_id!r} was abandoned: the job was replaced.")
        async for chunk in super()._compute(request):
            yield chunk


async def test_a_request_abandoned_by_the_worker_is_asked_again_and_the_worker_stays_up() -> None:
    """ABORTED ends one request of one job (it was replaced or superseded on the worker); the master asks again
    instead of marking the worker DOWN for every job."""
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master, aborts, stub = await _master_and_worker(stack, AbortsOnce)
        job = await stub.CreateJob(job_spec("uncoded", {"n": 1}, iterations=4, iteration_deadline_seconds=30.0))
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=job.job_id))]
        info = await stub.GetJob(master_pb2.GetJobRequest(job_id=job.job_id))
        errors = [w.last_error for w in master.pool.workers]
    assert aborts.aborted == 1
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and len(reports) == 4, info.message
    assert errors == [""]  # never marked DOWN
    assert max(r.wall_seconds for r in reports) < 5.0  # asked again at once, not after a probe and a reload


class SlowToLoad(WorkerServicer):
    """Takes its time over the first LoadJob (as a worker importing a model plugin), so the master's channel to it
    can close under that call."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.loading = asyncio.Event()
        self.loads = 0

    async def LoadJob(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802 - proto name
        self.loads += 1
        if self.loads == 1:
            self.loading.set()
            await asyncio.sleep(2.0)
        return await super().LoadJob(request_iterator, context)


async def test_a_load_whose_channel_closes_under_it_is_retried_and_never_cancels_the_job() -> None:
    """grpc.aio ends a call with CancelledError when its channel closes (the worker went DOWN, or registered again and
    got a new channel). Read as the job's own cancellation, that ended jobs "cancelled after 0 iterations"
    (a training benchmark lost its run that way); the load is now one that failed, and the worker is loaded
    again."""
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master, slow, stub = await _master_and_worker(stack, SlowToLoad)
        job = await stub.CreateJob(job_spec("uncoded", {"n": 1}, iterations=3, iteration_deadline_seconds=30.0))
        await slow.loading.wait()
        master.pool.workers[0].reconnect()  # the channel closes under the LoadJob in flight
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=job.job_id))]
        info = await stub.GetJob(master_pb2.GetJobRequest(job_id=job.job_id))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and len(reports) == 3, info.message
    assert slow.loads >= 2  # loaded again after the closed channel


async def _master_and_worker(stack: contextlib.AsyncExitStack, servicer: Callable[..., S]) -> tuple[MasterNode, S, Any]:
    """A master and one registered, UP worker serving ``servicer``'s kind; the master's stub. ``stack`` stops them."""
    master = await stack.enter_async_context(MasterNode(grace=0.5))
    worker = WorkerNode(master_address=master.address, name="w", grace=0.5)
    worker.servicer = served = servicer(instance_id=worker.instance_id)
    await stack.enter_async_context(worker)
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
    stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
    while not any(w.is_up for w in master.pool.workers):
        await asyncio.sleep(0.05)
    return master, served, stub
