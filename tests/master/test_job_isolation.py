"""A worker's refusal that is about one job never marks it DOWN for the others (issue 25).

A worker that holds its limit of jobs (``max_jobs = 1`` here) answers a second job's LoadJob RESOURCE_EXHAUSTED.
That says nothing about the worker: it stays UP for the job it serves, and the second job asks it again every
:data:`~gradcode.master.loading.REFUSED_RETRY_SECONDS` until the first ends and frees its place; both succeed.
(Before, the master marked the worker DOWN for every job on that refusal.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
import pytest

from gradcode.master.node import MasterNode
from gradcode.v1 import master_pb2, master_pb2_grpc
from gradcode.worker.node import WorkerNode
from tests.helpers import fixed_delay

from .test_master_node import job_spec

TIMEOUT = 120.0


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
