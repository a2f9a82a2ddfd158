"""The Master gRPC service: worker registry and the job control API for clients.

Every refusal is a gRPC status with a precise message (INVALID_ARGUMENT for a bad spec or request,
NOT_FOUND for an unknown job, ALREADY_EXISTS for a duplicate job id, FAILED_PRECONDITION when too few
workers are up and the spec does not wait); a bad request never disturbs the other calls or jobs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from master.job import JobRunner, JobSpecError, plan_job
from master.pool import WorkerPool
from protos.gradcode.v1 import master_pb2, master_pb2_grpc

__all__ = ["MasterServicer"]

log = logging.getLogger(__name__)


class MasterServicer(master_pb2_grpc.MasterServicer):
    """Holds the pool and the jobs; one instance per master process."""

    def __init__(self, pool: WorkerPool, *, run_dir: Path | None = None) -> None:
        self.pool = pool
        self.run_dir = run_dir
        self.jobs: dict[str, JobRunner] = {}

    # ---- workers -----------------------------------------------------------------------------------
    async def RegisterWorker(  # noqa: N802 - gRPC method name
        self, request: master_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.RegisterWorkerReply:
        try:
            worker = await self.pool.register(request.address, request.name)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return master_pb2.RegisterWorkerReply(worker_id=worker.worker_id)

    async def ListWorkers(  # noqa: N802
        self, request: master_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ListWorkersReply:
        return master_pb2.ListWorkersReply(workers=[w.info() for w in self.pool.workers])

    # ---- jobs --------------------------------------------------------------------------------------
    async def CreateJob(  # noqa: N802
        self, request: master_pb2.JobSpec, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        if request.job_id and request.job_id in self.jobs:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Job {request.job_id!r} already exists.")
        known = [w.worker_id for w in self.pool.workers]
        try:
            plan = await asyncio.to_thread(plan_job, request, known_worker_ids=known)
        except JobSpecError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if plan.job_id in self.jobs:  # created concurrently while we planned
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Job {plan.job_id!r} already exists.")
        n, up = plan.num_workers, self.pool.up()
        if plan.spec.wait_for_workers_seconds == 0 and not plan.spec.worker_ids and len(up) < n:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Gradient code {plan.code!r} needs {n} workers but {len(up)} are up "
                f"(ids {[w.worker_id for w in up]}); start more workers or set wait_for_workers_seconds.",
            )
        job = JobRunner(plan, self.pool, run_dir=self.run_dir)
        self.jobs[plan.job_id] = job
        job.start()
        log.info("created job %s: %r", plan.job_id, plan.code)
        return job.info()

    async def _job(self, job_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> JobRunner:
        job = self.jobs.get(job_id)
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown job {job_id!r}; known jobs: {known}.")
        assert job is not None
        return job

    async def GetJob(  # noqa: N802
        self, request: master_pb2.GetJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        return (await self._job(request.job_id, context)).info()

    async def WatchJob(  # noqa: N802
        self, request: master_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[master_pb2.IterationReport]:
        job = await self._job(request.job_id, context)
        async for report in job.watch():
            yield report

    async def GetModel(  # noqa: N802
        self, request: master_pb2.GetModelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ModelReply:
        return (await self._job(request.job_id, context)).model_reply()

    async def CancelJob(  # noqa: N802
        self, request: master_pb2.CancelJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        job = await self._job(request.job_id, context)
        await job.cancel()
        return job.info()

    async def close(self) -> None:
        """Cancel every running job and wait for them to stop."""
        await asyncio.gather(*(job.cancel() for job in self.jobs.values()), return_exceptions=True)
