"""The Master gRPC service: worker registry and the job control API for clients.

Every refusal is a gRPC status with a precise message (INVALID_ARGUMENT for a bad spec or request,
NOT_FOUND for an unknown or evicted job, ALREADY_EXISTS for a duplicate job id, FAILED_PRECONDITION when
too few workers are up and the spec does not wait, RESOURCE_EXHAUSTED when planning a job runs out of
memory despite the size caps of :func:`gradcode.master.job.plan_job`); a bad request never disturbs the other
calls or jobs.

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

from gradcode.common.security import short
from gradcode.master.job import JobRunner, JobSpecError, plan_job
from gradcode.master.pool import (
    AddressTakenError,
    PoolFullError,
    RemovedWorkerError,
    UnreachableWorkerError,
    WorkerPool,
)
from gradcode.master.spec_checks import SpecCheckError, check_spec_numbers
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
    async def RegisterWorker(  # noqa: N802 - gRPC method name
        self, request: master_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.RegisterWorkerReply:
        code: grpc.StatusCode | None = None
        try:
            worker = await self.pool.register(request.address, request.name, request.instance_id)
        except ValueError as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except UnreachableWorkerError as exc:
            code, message = grpc.StatusCode.FAILED_PRECONDITION, str(exc)
        except AddressTakenError as exc:
            code, message = grpc.StatusCode.ALREADY_EXISTS, str(exc)
        except PoolFullError as exc:
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except RemovedWorkerError as exc:
            code, message = grpc.StatusCode.PERMISSION_DENIED, str(exc)
        if code is not None:
            log.warning("refused a worker registering as %s: %s", short(request.address), message)
            await context.abort(code, message)
        return master_pb2.RegisterWorkerReply(worker_id=worker.worker_id)

    async def RemoveWorker(  # noqa: N802
        self, request: master_pb2.RemoveWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.WorkerInfo:
        try:
            worker = await self.pool.remove(request.worker_id)
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.args[0])
        return worker.info()

    async def ListWorkers(  # noqa: N802
        self, request: master_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ListWorkersReply:
        return master_pb2.ListWorkersReply(workers=[w.info() for w in self.pool.workers])

    # ---- jobs --------------------------------------------------------------------------------------
    async def CreateJob(  # noqa: N802
        self, request: master_pb2.JobSpec, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        try:
            check_spec_numbers(request)
        except SpecCheckError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.job_id and (request.job_id in self.jobs or request.job_id in self.evicted):
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Job {short(request.job_id)} already exists.")
        known = [w.worker_id for w in self.pool.workers]
        try:
            plan = await asyncio.to_thread(plan_job, request, known_worker_ids=known, data_dir=self.data_dir)
        except JobSpecError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except MemoryError:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "The master ran out of memory while planning this job; use a smaller dataset, model or code "
                "(fewer workers or partitions).",
            )
        if plan.job_id in self.jobs or plan.job_id in self.evicted:  # created concurrently while we planned
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Job {short(plan.job_id)} already exists.")
        n, up = plan.num_workers, self.pool.up()
        if plan.spec.wait_for_workers_seconds == 0 and not plan.spec.worker_ids and len(up) < n:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Gradient code {plan.code!r} needs {n} workers but {len(up)} are up "
                f"(ids {[w.worker_id for w in up]}); start more workers or set wait_for_workers_seconds.",
            )
        try:
            job = JobRunner(plan, self.pool, run_dir=self.run_dir)
        except MemoryError:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "The master ran out of memory while starting this job."
            )
        self.jobs[plan.job_id] = job
        job.start(on_done=self._evict)
        log.info("created job %s: %r", plan.job_id, plan.code)
        return job.info()

    async def _job(self, job_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> JobRunner:
        """The job, or NOT_FOUND that echoes a short prefix of the id and never lists the other jobs."""
        job = self.jobs.get(job_id)
        if job is None and job_id in self.evicted:
            where = f" its history is in {self.run_dir / (job_id + '.jsonl')}" if self.run_dir is not None else ""
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"Job {short(job_id)} finished and was evicted: the master keeps only the "
                f"{self.max_finished_jobs} most recently finished jobs;"
                f"{where or ' it kept no history (no run directory)'}.",
            )
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Unknown job {short(job_id)}.")
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
