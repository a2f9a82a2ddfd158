"""The Master gRPC service: worker registry and the job control API for clients.

Every refusal is a gRPC status with a precise message, raised as an error of
:mod:`gradcode.common.exceptions` and mapped by :func:`gradcode.common.transport.status.grpc_errors`:
INVALID_ARGUMENT for a bad spec or request, NOT_FOUND for an unknown or evicted job, ALREADY_EXISTS for
a duplicate job id, FAILED_PRECONDITION when too few workers are up and the spec does not wait,
RESOURCE_EXHAUSTED when planning a job runs out of memory despite the size caps of
:mod:`gradcode.master.limits`. A bad request never disturbs the other calls or jobs.

Finished jobs are kept in memory (GetJob, WatchJob, GetModel) only up to ``max_finished_jobs``
(:data:`MAX_FINISHED_JOBS`, the most recently finished ones); older ones are evicted with their
dataset and history, and answer NOT_FOUND saying so. Their history stays on disk in the run directory
(``<run_dir>/<job_id>.jsonl``), and their ids cannot be reused.

A job id is never reused for another job's history: CreateJob refuses (ALREADY_EXISTS) an id this
master holds, evicted, or finds a history (``<run_dir>/<job_id>.jsonl``) or checkpoint of.

Durable jobs (with a state directory): every job is checkpointed (:mod:`gradcode.master.checkpoint`).
A master started on a state directory resumes the jobs whose checkpoint says ``running`` (they were
running when the last master died or stopped: :meth:`MasterServicer.close` suspends, never cancels);
ResumeJob resumes one explicitly, from the state directory or from a checkpoint file sent by the
client (for example one written by another master). A resumed job runs on whichever workers are up
(its ``worker_ids`` named the old master's pool and are dropped) and waits at least
:data:`RESUME_WAIT_SECONDS` for them to re-register. The jobs it finds finished it holds as they were
(:class:`~gradcode.master.finished.FinishedJob`): listed, their history replayed, their model read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from gradcode.common.exceptions import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidRequestError,
    JobSpecError,
    NotFoundError,
    RequestError,
    ResourceExhaustedError,
)
from gradcode.common.ops import metrics
from gradcode.common.ops.logs import log_context
from gradcode.common.tasks import TaskOwner
from gradcode.common.transport.security import short
from gradcode.common.transport.shared_memory import DEFAULT_ROOT
from gradcode.common.transport.status import grpc_errors
from gradcode.master.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    remove_interrupted_writes,
    saved_checkpoints,
)
from gradcode.master.finished import FINAL_STATES, FinishedJob
from gradcode.master.job import DEFAULT_CHECKPOINT_EVERY, JobRunner
from gradcode.master.limits import MAX_DATA_FILE_BYTES, MAX_FEATURES, check_free_form
from gradcode.master.pool import WorkerPool
from gradcode.master.reporting import history_path
from gradcode.master.spec import JobPlan, plan_job
from gradcode.master.spec_checks import SpecCheckError, check_spec_numbers
from gradcode.v1 import master_pb2, master_pb2_grpc

__all__ = ["MAX_FINISHED_JOBS", "RESUME_WAIT_SECONDS", "MasterServicer"]

log = logging.getLogger(__name__)

MAX_FINISHED_JOBS = 32
"""Finished jobs the master keeps in memory; older ones are evicted (their history stays on disk)."""
MAX_EVICTED_IDS = 100_000
"""Evicted job ids remembered (to answer "evicted" and refuse their reuse); the oldest are forgotten."""
MAX_LISTED_EVICTED = 100
"""ListJobs names at most this many of the most recently evicted job ids."""
RESUME_WAIT_SECONDS = 120.0
"""A resumed job waits at least this long for enough workers (they re-register with a restarted master)."""


class MasterServicer(master_pb2_grpc.MasterServicer):
    """Holds the pool and the jobs; one instance per master process."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        run_dir: Path | None = None,
        data_dir: Path | None = None,
        max_finished_jobs: int = MAX_FINISHED_JOBS,
        max_data_file_bytes: int = MAX_DATA_FILE_BYTES,
        max_features: int = MAX_FEATURES,
        state_dir: Path | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        shared_memory: Path | None = DEFAULT_ROOT,
        tasks: TaskOwner | None = None,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"Argument 'checkpoint_every' must be >= 1, not {checkpoint_every!r}.")
        if max_features < 1:
            raise ValueError(f"Argument 'max_features' must be >= 1, not {max_features!r}.")
        if max_finished_jobs < 0:
            raise ValueError(f"Argument 'max_finished_jobs' must be >= 0, not {max_finished_jobs!r}.")
        self.pool = pool
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.max_data_file_bytes = max_data_file_bytes
        self.max_features = max_features
        self.max_finished_jobs = max_finished_jobs
        self.state_dir = state_dir
        self.checkpoint_every = checkpoint_every
        self.shared_memory = shared_memory
        self.jobs: dict[str, JobRunner | FinishedJob] = {}
        """The jobs held: running, finished here, or finished under an earlier master (:class:`FinishedJob`)."""
        self.evicted: OrderedDict[str, None] = OrderedDict()
        """Ids of evicted jobs, oldest first."""
        self.tasks = TaskOwner("master") if tasks is None else tasks
        """Holds each job's task and its metrics watcher (the master node's owner)."""
        self._observers: set[asyncio.Task[None]] = set()
        metrics.watch_jobs(self._job_states)

    def _job_states(self) -> list[int]:
        """The state of every job held (read from the metrics scrape thread: a snapshot first)."""
        return [int(job.info().state) for job in list(self.jobs.values())]

    # ---- workers -----------------------------------------------------------------------------------
    @grpc_errors
    async def RegisterWorker(  # noqa: N802 - gRPC method name
        self, request: master_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.RegisterWorkerReply:
        try:
            worker = await self.pool.register(
                request.address, request.name, request.instance_id, request.machine_id, secret=request.process_secret
            )
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        except RequestError as exc:  # unreachable, address taken, pool full, removed: the pool says which
            log.warning("refused a worker registering as %s: %s", short(request.address), exc)
            raise
        return master_pb2.RegisterWorkerReply(worker_id=worker.worker_id, call_token=worker.call_token or "")

    @grpc_errors
    async def RemoveWorker(  # noqa: N802
        self, request: master_pb2.RemoveWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.WorkerInfo:
        try:
            worker = await self.pool.remove(request.worker_id)
        except KeyError as exc:
            raise NotFoundError(exc.args[0]) from None
        return worker.info()

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
        check_free_form(request)  # sizes first: the checks below read every field
        try:
            check_spec_numbers(request)
        except SpecCheckError as exc:
            raise InvalidRequestError(str(exc)) from None
        if request.job_id:
            self._refuse_reuse(request.job_id)
        plan = await self._plan(request, known_worker_ids=[w.worker_id for w in self.pool.workers])
        self._refuse_reuse(plan.job_id)  # created concurrently while we planned
        n, up = plan.num_workers, self.pool.up()
        if plan.spec.wait_for_workers_seconds == 0 and not plan.spec.worker_ids and len(up) < n:
            raise FailedPreconditionError(
                f"Gradient code {plan.code!r} needs {n} workers but {len(up)} are up "
                f"(ids {[w.worker_id for w in up]}); start more workers or set wait_for_workers_seconds."
            )
        try:
            job = JobRunner(
                plan, self.pool, run_dir=self.run_dir, state_dir=self.state_dir, checkpoint_every=self.checkpoint_every,
                shared_memory=self.shared_memory,
            )  # fmt: skip
        except MemoryError:
            raise ResourceExhaustedError("The master ran out of memory while starting this job.") from None
        self._start(job)
        log.info("created job %s: %r", plan.job_id, plan.code, extra={"job_id": plan.job_id})
        return job.info()

    async def _plan(self, spec: master_pb2.JobSpec, *, known_worker_ids: list[int] | None) -> JobPlan:
        """Plan a job in a thread; running out of memory is RESOURCE_EXHAUSTED."""
        try:
            return await asyncio.to_thread(
                plan_job, spec, known_worker_ids=known_worker_ids, data_dir=self.data_dir,
                max_data_file_bytes=self.max_data_file_bytes, max_features=self.max_features,
            )  # fmt: skip
        except MemoryError:
            raise ResourceExhaustedError(
                "The master ran out of memory while planning this job; use a smaller dataset, model or code "
                "(fewer workers or partitions)."
            ) from None

    def _refuse_reuse(self, job_id: str) -> None:
        """ALREADY_EXISTS when ``job_id`` names a job held, evicted, or with a history or checkpoint on disk."""
        if isinstance(self.jobs.get(job_id), FinishedJob):
            raise AlreadyExistsError(
                f"Job {short(job_id)} already exists: it finished under an earlier master, and the master's state "
                f"directory holds its checkpoint; choose another job id, or continue that job with "
                f"`gradcode resume {job_id}`."
            )
        if job_id in self.jobs or job_id in self.evicted:
            raise AlreadyExistsError(f"Job {short(job_id)} already exists.")
        saved = []
        if self.run_dir is not None:
            saved.append((history_path(self.run_dir, job_id), "run directory holds its history"))
        if self.state_dir is not None:
            saved.append((checkpoint_path(self.state_dir, job_id), "state directory holds its checkpoint"))
        for path, what in saved:
            if path.exists():  # the text names no server path: a client has no business knowing the master's disk
                raise AlreadyExistsError(
                    f"Job {short(job_id)} already exists: the master's {what}; choose another job id, "
                    f"or continue that job with `gradcode resume {job_id}`."
                )

    # ---- durable jobs ------------------------------------------------------------------------------
    async def resume_saved(self) -> list[str]:
        """Resume every job whose checkpoint in the state directory says it was running; returns their ids.

        The finished ones are held as they were (:class:`FinishedJob`: listed, watched, their model read), up to
        ``max_finished_jobs`` of the most recent. Called once, as the master starts: the temporary files of
        checkpoint writes a killed master left are removed first."""
        if self.state_dir is None:
            return []
        interrupted = remove_interrupted_writes(self.state_dir)
        if interrupted:
            log.info("removed %d temporary files of interrupted checkpoint writes", len(interrupted))
        resumed = []
        for path in saved_checkpoints(self.state_dir):
            try:
                checkpoint = await asyncio.to_thread(Checkpoint.load, path)
                if checkpoint.job_id in self.jobs:
                    continue
                if checkpoint.state in FINAL_STATES:
                    self._hold_finished(checkpoint, path)
                    continue
                job = await self._resume(checkpoint)
            except (CheckpointError, RequestError, ValueError) as exc:
                log.error("not resuming from %s: %s", path, exc)
                continue
            resumed.append(job.job_id)
        self._evict()
        return resumed

    def _hold_finished(self, checkpoint: Checkpoint, path: Path) -> None:
        """Hold a job an earlier master finished, ordered among finished jobs by when its checkpoint was written."""
        written_ago = max(0.0, time.time() - path.stat().st_mtime)
        history = None if self.run_dir is None else history_path(self.run_dir, checkpoint.job_id)
        self.jobs[checkpoint.job_id] = FinishedJob(checkpoint, history, finished_at=time.monotonic() - written_ago)

    async def _resume(self, checkpoint: Checkpoint) -> JobRunner:
        """Plan the checkpoint's job again and start it from the checkpoint."""
        if not checkpoint.resumable:
            raise FailedPreconditionError(
                f"Job {short(checkpoint.job_id)} {checkpoint.state} after {checkpoint.iteration} of "
                f"{checkpoint.spec.iterations} iterations; there is nothing to resume."
            )
        try:
            check_spec_numbers(checkpoint.spec)  # a checkpoint sent may come from anywhere: as CreateJob checks
        except SpecCheckError as exc:
            raise InvalidRequestError(f"The checkpoint's job cannot be planned here: {exc}") from None
        spec = master_pb2.JobSpec()
        spec.CopyFrom(checkpoint.spec)
        spec.ClearField("worker_ids")  # they named the old master's pool
        spec.wait_for_workers_seconds = max(spec.wait_for_workers_seconds, RESUME_WAIT_SECONDS)
        try:
            plan = await self._plan(spec, known_worker_ids=None)
        except JobSpecError as exc:
            raise InvalidRequestError(f"The checkpoint's job cannot be planned here: {exc}") from None
        try:
            job = JobRunner(
                plan, self.pool, run_dir=self.run_dir, state_dir=self.state_dir,
                checkpoint_every=self.checkpoint_every, resume=checkpoint, shared_memory=self.shared_memory,
            )  # fmt: skip
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        self.evicted.pop(job.job_id, None)
        self._start(job)
        log.info(
            "resumed job %s after iteration %d: %r", job.job_id, checkpoint.iteration, plan.code,
            extra={"job_id": job.job_id},
        )  # fmt: skip
        return job

    @grpc_errors
    async def ResumeJob(  # noqa: N802
        self, request: master_pb2.ResumeJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        if request.checkpoint:
            try:
                checkpoint = Checkpoint.from_bytes(request.checkpoint, source="The checkpoint sent")
            except CheckpointError as exc:
                raise InvalidRequestError(str(exc)) from None
            if request.job_id and request.job_id != checkpoint.job_id:
                raise InvalidRequestError(
                    f"The checkpoint sent is of job {short(checkpoint.job_id)}, not {short(request.job_id)}."
                )
        else:
            if not request.job_id:
                raise InvalidRequestError("ResumeJob needs a job_id or a checkpoint.")
            if self.state_dir is None:
                raise FailedPreconditionError(
                    "This master keeps no checkpoints (start it with --state-dir); send the checkpoint file instead."
                )
            path = checkpoint_path(self.state_dir, request.job_id)
            if not path.exists():
                raise NotFoundError(f"No checkpoint of job {short(request.job_id)} in this master's state directory.")
            source = f"The checkpoint of job {short(request.job_id)} in this master's state directory"
            try:
                checkpoint = await asyncio.to_thread(Checkpoint.load, path, source=source)
            except CheckpointError as exc:
                raise FailedPreconditionError(str(exc)) from None
        held = self.jobs.get(checkpoint.job_id)
        if held is not None and not held.done:
            raise AlreadyExistsError(f"Job {short(checkpoint.job_id)} is running on this master.")
        return (await self._resume(checkpoint)).info()

    def _start(self, job: JobRunner) -> None:
        """Hold and start ``job``: its log lines name it, its reports feed the metrics, its end is logged.

        Every way a job starts (created, or resumed) goes through here.
        """
        self.jobs[job.job_id] = job
        with log_context(job_id=job.job_id):  # the job's tasks inherit it: their log lines name the job
            job.start(self.tasks, on_done=self._job_done)
            observer = self.tasks.spawn(self._observe(job), name=f"metrics-{job.job_id}", fatal=False)
        self._observers.add(observer)
        observer.add_done_callback(self._observers.discard)

    async def _observe(self, job: JobRunner) -> None:
        """Record each of the job's iteration reports in the metrics, as a watcher of the job."""
        async for report in job.watch():
            metrics.record_iteration(report, stragglers_tolerated=job.plan.code.s)

    def _job(self, job_id: str) -> JobRunner | FinishedJob:
        """The job, or NOT_FOUND that echoes a short prefix of the id and never lists the other jobs."""
        job = self.jobs.get(job_id)
        if job is None and job_id in self.evicted:
            where = " its history is in the master's run directory" if self.run_dir is not None else ""
            raise NotFoundError(
                f"Job {short(job_id)} finished and was evicted: the master keeps only the {self.max_finished_jobs} "
                f"most recently finished jobs;{where or ' it kept no history (no run directory)'}."
            )
        if job is None:
            raise NotFoundError(f"Unknown job {short(job_id)}.")
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
    async def ListJobs(  # noqa: N802
        self, request: master_pb2.ListJobsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.ListJobsReply:
        """Every job the master holds, oldest first, without its spec (GetJob has it)."""
        jobs = []
        for job in list(self.jobs.values()):
            info = job.info()
            info.ClearField("spec")
            jobs.append(info)
        return master_pb2.ListJobsReply(jobs=jobs, evicted_job_ids=list(self.evicted)[-MAX_LISTED_EVICTED:])

    @grpc_errors
    async def CancelJob(  # noqa: N802
        self, request: master_pb2.CancelJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> master_pb2.JobInfo:
        job = self._job(request.job_id)
        await job.cancel()
        return job.info()

    def _job_done(self, job: JobRunner) -> None:
        """A job reached its final state: say so in the log and the metrics, then evict old jobs."""
        info = job.info()
        state = metrics.job_state_label(info.state)
        metrics.JOBS_FINISHED.labels(state=state).inc()
        with log_context(job_id=job.job_id):
            log.log(
                logging.INFO if info.state == master_pb2.JOB_STATE_SUCCEEDED else logging.WARNING,
                "job %s %s after %d iterations: %s", job.job_id, state, info.iterations_done, info.message,
            )  # fmt: skip
        self._evict(job)

    def _evict(self, _finished: JobRunner | None = None) -> None:
        """Forget all but the ``max_finished_jobs`` most recently finished jobs."""
        done = sorted((j for j in self.jobs.values() if j.done), key=lambda j: j.finished_at or 0.0)
        for job in done[: max(0, len(done) - self.max_finished_jobs)]:
            del self.jobs[job.job_id]
            metrics.forget_job(job.job_id)
            self.evicted[job.job_id] = None
            log.info("evicted finished job %s", job.job_id)
        while len(self.evicted) > MAX_EVICTED_IDS:
            self.evicted.popitem(last=False)

    async def close(self) -> None:
        """Stop every running job (suspended: a checkpointed one resumes with the next master) and wait."""
        jobs = list(self.jobs.values())
        for job in jobs:
            job.suspend()
        await asyncio.gather(*(job.wait() for job in jobs), return_exceptions=True)
        for observer in list(self._observers):
            observer.cancel()
        await asyncio.gather(*self._observers, return_exceptions=True)
