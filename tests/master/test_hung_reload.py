"""A returning worker that hangs in LoadJob must not stall the iterations of the others (issue 9).

One of four workers (cyclic, n=4, s=1) "restarts" at iteration 3 (it forgets the job, so its Compute
answers NOT_FOUND and the runner reloads it) and then hangs in every LoadJob. The three others
suffice: every iteration must end within its deadline and the job must succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gradcode.common.transport.wire import Serialized
from gradcode.master import loading
from gradcode.master.node import MasterNode
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2
from gradcode.worker.node import WorkerNode
from gradcode.worker.service import WorkerServicer

from .test_master_node import job_spec

DEADLINE = 5.0
TIMEOUT = 120.0


class RestartsThenHangs(WorkerServicer):
    """Drops its job at iteration 3 (as a restarted worker would) and then hangs in every LoadJob."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.loads = 0
        self.hung = asyncio.Event()

    async def LoadJob(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        self.loads += 1
        if self.loads > 1:
            self.hung.set()
            await asyncio.Event().wait()  # until the caller gives up
        return await super().LoadJob(request_iterator, context)

    async def _compute(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
        """What both Compute and Session run for a request."""
        if request.iteration >= 3 and request.job_id in self.jobs:
            await self.jobs.pop(request.job_id).retire()
        async for chunk in super()._compute(request):
            yield chunk


async def test_a_hung_reload_never_delays_the_other_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "LOAD_STALL_SECONDS", 20.0)  # bounds the old behaviour's stall
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master = await stack.enter_async_context(MasterNode(grace=0.5))
        workers = [WorkerNode(master_address=master.address, name=f"w{i}", grace=0.5) for i in range(4)]
        special = RestartsThenHangs(instance_id=workers[3].instance_id)
        workers[3].servicer = special
        for worker in workers:
            await stack.enter_async_context(worker)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        while len([w for w in master.pool.workers if w.is_up]) < 4:
            await asyncio.sleep(0.05)
        spec = job_spec("cyclic", {"n": 4, "s": 1}, worker_ids=[w.worker_id for w in master.pool.workers])
        spec.iterations, spec.iteration_deadline_seconds = 8, DEADLINE
        info = await stub.CreateJob(spec)
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        info = await stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id))
    assert special.hung.is_set()  # the reload did hang
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == 8 and max(r.wall_seconds for r in reports) < DEADLINE
