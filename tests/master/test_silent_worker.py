"""A worker that stays silent on a request inside an iteration is asked again within it (issue 25).

Two cyclic n = 8, s = 2 chaos runs failed when a worker that was alive and had just been reloaded never answered
for the whole iteration while two others were down. Here, cyclic n = 3, s = 1: worker 0 is an emulated straggler
that never answers in time, so workers 1 and 2 are both needed every iteration; at iteration 3 worker 2 loses
the job (as a restarted worker does), is reloaded, and its first request on its Session after the reload is
never answered. The round must ask it again (as a Compute call of its own) well before the iteration deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gradcode.common.transport.wire import Serialized
from gradcode.master.node import MasterNode
from gradcode.master.rounds import AnswerTimes
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2
from gradcode.worker.node import WorkerNode
from gradcode.worker.service import WorkerServicer
from tests.helpers import fixed_delay

from .test_master_node import job_spec

DEADLINE = 12.0
TIMEOUT = 120.0
ITERATIONS = 6


class SilentAfterReload(WorkerServicer):
    """Drops its job at iteration 3 (as a restarted worker would); once reloaded, it never answers the first
    request it gets on a Session (it neither computes nor ends it)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.loads = 0
        self.swallowed: list[int] = []
        """Iterations whose Session request was never answered."""

    async def LoadJob(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        self.loads += 1
        return await super().LoadJob(request_iterator, context)

    async def _compute(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
        if request.iteration >= 3 and self.loads == 1 and request.job_id in self.jobs:
            await self.jobs.pop(request.job_id).retire()
        if self.loads == 2 and request.request_id and not self.swallowed:
            self.swallowed.append(int(request.iteration))
            await asyncio.Event().wait()  # silent until the caller cancels the request
        async for chunk in super()._compute(request):
            yield chunk


async def test_a_silent_reloaded_worker_is_asked_again_within_the_iteration() -> None:
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master = await stack.enter_async_context(MasterNode(grace=0.5))
        workers = [WorkerNode(master_address=master.address, name=f"w{i}", grace=0.5) for i in range(3)]
        silent = SilentAfterReload(instance_id=workers[2].instance_id)
        workers[2].servicer = silent
        for worker in workers:
            await stack.enter_async_context(worker)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        while len([w for w in master.pool.workers if w.is_up]) < 3:
            await asyncio.sleep(0.05)
        by_name = {w.name: w.worker_id for w in master.pool.workers}
        spec = job_spec(
            "cyclic", {"n": 3, "s": 1}, worker_ids=[by_name[f"w{i}"] for i in range(3)],
            straggler=fixed_delay(10 * DEADLINE, workers=[0]),
        )  # fmt: skip
        spec.iterations, spec.iteration_deadline_seconds = ITERATIONS, DEADLINE
        info = await stub.CreateJob(spec)
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        info = await stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id))
    assert silent.loads == 2 and len(silent.swallowed) == 1  # it was reloaded, then silent on a request
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == ITERATIONS and all(r.exact for r in reports)
    slowest = max(r.wall_seconds for r in reports)  # the silent one's: its bound, not the deadline
    assert slowest < AnswerTimes.FLOOR_SECONDS + DEADLINE / 2, slowest
