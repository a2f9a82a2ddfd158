"""The Master gRPC service: worker registry and the job control API for clients.

Every refusal is a gRPC status with a precise message, raised as an error of
:mod:`gradcode.common.exceptions` and mapped by :func:`gradcode.common.status.grpc_errors`:
INVALID_ARGUMENT for a bad spec or request, NOT_FOUND for an unknown or evicted job, ALREADY_EXISTS for
a duplicate job id, FAILED_PRECONDITION when too few workers are up and the spec does not wait,
RESOURCE_EXHAUSTED when planning a job runs out of memory despite the size caps of
:mod:`gradcode.master.limits`. A bad request never disturbs the other calls or jobs.

Finished jobs are kept in memory (GetJob, WatchJob, GetModel) only up to ``max_finished_jobs``
(:data:`MAX_FINISHED_JOBS`, the most recently finished ones); older ones are evicted with their
dataset and history, and answer NOT_FOUND saying so. Their history stays on disk in the run directory
(``<run_dir>/<job_id>.jsonl``), and their ids cannot be reused.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from gradcode.common.exceptions import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidRequestError,
    NotFoundError,
    ResourceExhaustedError,
)
from gradcode.common.status import grpc_errors
from gradcode.master.job import JobRunner
from gradcode.master.pool import WorkerPool
from gradcode.master.spec import plan_job
from gradcode.v1 import master_pb2, master_pb2_grpc

__all__ = ["MAX_FINISHED_JOBS", "MasterServicer"]

log = logging.getLogger(__name__)

MAX_FINISHED_JOBS = 32
"""Finished jobs the master keeps in memory; older ones are evicted (their history stays on disk)."""
MAX_EVICTED_IDS = 100_000
"""Evicted job ids remembered (to answer "evicted" and refuse their reuse); the oldest are forgotten."""


class MasterServicer(master_pb2_grpc.MasterServicer):
    """Holds the pool and the jobs; one instance per master process."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        run_dir: Path | None = None,
        data_dir: Path | None = None,
        max_finished_jobs: int = MAX_FINISHED_JOBS,
    ) -> None:
        if max_finished_jobs < 0:
            raise ValueError(f"Argument 'max_finished_jobs' must be >= 0, not {max_finished_jobs!r}.")
        self.pool = pool
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.max_finished_jobs = max_finished_jobs
        self.jobs: dict[str, JobRunner] = {}
        self.evicted: OrderedDict[str, None] = OrderedDict()
        """Ids of evicted jobs, oldest first."""

    # ---- workers -----------------------------------------------------------------------------------
    @grpc_errors
    async def RegisterWorker(  # noqa: N802 - gRPC method name
        self, request: master_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.RegisterWorkerReply:
        try:
            worker = await self.pool.register(request.address, request.name)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return master_pb2.RegisterWorkerReply(worker_id=worker.worker_id)

    @grpc_errors
    async def ListWorkers(  # noqa: N802
        self, request: master_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ListWorkersReply:
        return master_pb2.ListWorkersReply(workers=[w.info() for w in self.pool.workers])

    # ---- jobs --------------------------------------------------------------------------------------
    @grpc_errors
    async def CreateJob(  # noqa: N802
        self, request: master_pb2.JobSpec, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        if request.job_id and (request.job_id in self.jobs or request.job_id in self.evicted):
            raise AlreadyExistsError(f"Job {request.job_id!r} already exists.")
        known = [w.worker_id for w in self.pool.workers]
        try:
            plan = await asyncio.to_thread(plan_job, request, known_worker_ids=known, data_dir=self.data_dir)
        except MemoryError:
            raise ResourceExhaustedError(
                "The master ran out of memory while planning this job; use a smaller dataset, model or code "
                "(fewer workers or partitions)."
            ) from None
        if plan.job_id in self.jobs or plan.job_id in self.evicted:  # created concurrently while we planned
            raise AlreadyExistsError(f"Job {plan.job_id!r} already exists.")
        n, up = plan.num_workers, self.pool.up()
        if plan.spec.wait_for_workers_seconds == 0 and not plan.spec.worker_ids and len(up) < n:
            raise FailedPreconditionError(
                f"Gradient code {plan.code!r} needs {n} workers but {len(up)} are up "
                f"(ids {[w.worker_id for w in up]}); start more workers or set wait_for_workers_seconds."
            )
        try:
            job = JobRunner(plan, self.pool, run_dir=self.run_dir)
        except MemoryError:
            raise ResourceExhaustedError("The master ran out of memory while starting this job.") from None
        self.jobs[plan.job_id] = job
        job.start(on_done=self._evict)
        log.info("created job %s: %r", plan.job_id, plan.code)
        return job.info()

    def _job(self, job_id: str) -> JobRunner:
        job = self.jobs.get(job_id)
        if job is None and job_id in self.evicted:
            where = f" its history is in {self.run_dir / (job_id + '.jsonl')}" if self.run_dir is not None else ""
            raise NotFoundError(
                f"Job {job_id!r} finished and was evicted: the master keeps only the {self.max_finished_jobs} most "
                f"recently finished jobs;{where or ' it kept no history (no run directory)'}."
            )
        if job is None:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise NotFoundError(f"Unknown job {job_id!r}; known jobs: {known}.")
        return job

    @grpc_errors
    async def GetJob(  # noqa: N802
        self, request: master_pb2.GetJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        return self._job(request.job_id).info()

    @grpc_errors
    async def WatchJob(  # noqa: N802
        self, request: master_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[master_pb2.IterationReport]:
        job = self._job(request.job_id)
        async for report in job.watch():
            yield report

    @grpc_errors
    async def GetModel(  # noqa: N802
        self, request: master_pb2.GetModelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ModelReply:
        return self._job(request.job_id).model_reply()

    @grpc_errors
    async def CancelJob(  # noqa: N802
        self, request: master_pb2.CancelJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        job = self._job(request.job_id)
        await job.cancel()
        return job.info()

    def _evict(self, _finished: JobRunner | None = None) -> None:
        """Forget all but the ``max_finished_jobs`` most recently finished jobs."""
        done = sorted((j for j in self.jobs.values() if j.done), key=lambda j: j.finished_at or 0.0)
        for job in done[: max(0, len(done) - self.max_finished_jobs)]:
            del self.jobs[job.job_id]
            self.evicted[job.job_id] = None
            log.info("evicted finished job %s", job.job_id)
        while len(self.evicted) > MAX_EVICTED_IDS:
            self.evicted.popitem(last=False)

    async def close(self) -> None:
        """Cancel every running job and wait for them to stop."""
        await asyncio.gather(*(job.cancel() for job in self.jobs.values()), return_exceptions=True)
