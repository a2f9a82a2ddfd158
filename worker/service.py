"""The gradcode.v1.Worker gRPC service: a thin adapter over :mod:`gradcode.worker.compute` and
:mod:`gradcode.worker.parent`.

* ``LoadJob`` (client streaming): a ``setup`` chunk, then the partition data; replaces an earlier
  job with the same id.
* ``Compute`` (server streaming): one iteration; applies the job's straggler emulation as a
  cancellable sleep, spread over the worker's messages (a straggler is slow, not dead), computes
  the rows in a worker thread and streams each one as soon as it is ready. When the receiver
  cancels the call, the sleep is cancelled and the compute thread stops at its next partition, so
  the worker starts the next iteration fresh. A Compute for a later iteration of the same job also
  stops any older one still running (it can no longer be used), and a Compute for an iteration older
  than the newest one seen is refused (ABORTED). EndJob, a replacing LoadJob or a newer iteration
  wake an abandoned call from its straggler sleep at once.
* ``EndJob``: forget a job.

Every refusal is a gRPC status with a precise message; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np

from gradcode.common.codes.base import Array
from gradcode.common.security import Security, short
from gradcode.common.wire import WireError, array_from_tensor, dict_from_struct, message_chunks
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gradcode.worker.compute import (
    MAX_JOB_BYTES,
    ComputeCancelledError,
    JobBuilder,
    JobSetupError,
    JobTooLargeError,
    WorkerJob,
)
from gradcode.worker.parent import ChildrenSum, ChildrenUnavailableError, ParentRunner

__all__ = ["MAX_JOBS", "MAX_TOTAL_BYTES", "Cancellation", "JobRuntime", "PartitionObserver", "WorkerServicer"]

logger = logging.getLogger(__name__)

MAX_TOTAL_BYTES = 16 * 1024**3
"""Default budget of the data all jobs together may hold on one worker (16 GiB)."""
MAX_JOBS = 16
"""Default bound on the jobs one worker holds at once."""

PartitionObserver = Callable[[str, int, int], None]
"""Called from the compute thread after each partial gradient: ``(job_id, iteration, partition)``."""

_T = TypeVar("_T")


class Cancellation:
    """One computation's cancel flag: polled by its compute thread, awaited by its straggler sleep.

    :meth:`set` must be called from the event loop's thread (every caller in this module is).
    """

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._event = asyncio.Event()

    def set(self) -> None:
        self._flag.set()
        self._event.set()

    def is_set(self) -> bool:
        return self._flag.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, but raise ComputeCancelledError as soon as the flag is set."""
        if seconds > 0 and not self.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), seconds)
        if self.is_set():
            raise ComputeCancelledError("Cancelled during the emulated straggler delay.")

    async def race(self, task: asyncio.Task[_T]) -> _T:
        """``task``'s result, or ComputeCancelledError as soon as the flag is set (``task`` keeps running)."""
        waiter = asyncio.create_task(self._event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.is_set():
            raise ComputeCancelledError("Cancelled while waiting for the children.")
        return task.result()


@dataclass
class JobRuntime:
    """A loaded job plus what serving it needs: delay model, parent role, running computations."""

    job: WorkerJob
    delay_model: Any | None = None
    parent: ParentRunner | None = None
    active: dict[int, set[Cancellation]] = field(default_factory=dict)
    """Cancellation flags of the computations running now, by iteration."""
    newest_iteration: int = -1
    """The highest iteration a Compute has started for this job; older ones are refused."""

    def cancel_all(self, *, before: int | None = None) -> None:
        """Set the flags of every running computation (of iterations before ``before``, if given)."""
        for iteration, flags in self.active.items():
            if before is None or iteration < before:
                for flag in flags:
                    flag.set()


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Holds the jobs loaded on this worker and serves LoadJob / Compute / EndJob."""

    def __init__(
        self,
        *,
        max_job_bytes: int = MAX_JOB_BYTES,
        on_partition: PartitionObserver | None = None,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        max_jobs: int = MAX_JOBS,
        security: Security | None = None,
        instance_id: str = "",
    ) -> None:
        if max_jobs < 1 or max_total_bytes < 1:
            raise ValueError(f"max_jobs and max_total_bytes must be >= 1, not {max_jobs!r} and {max_total_bytes!r}.")
        self.jobs: dict[str, JobRuntime] = {}
        self.max_job_bytes = max_job_bytes
        self.on_partition = on_partition
        self.max_total_bytes = max_total_bytes
        """Budget of the data all jobs together hold; a LoadJob beyond it is RESOURCE_EXHAUSTED."""
        self.max_jobs = max_jobs
        self.security = security or Security()
        """How a tree parent reaches its children (TLS and the worker call token)."""
        self.instance_id = instance_id
        """What Hello answers: the random id this process registered with."""
        self._loading: dict[int, int] = {}
        """Bytes budgeted to the LoadJob streams under way, by stream."""

    def _budget(self, replacing: str) -> tuple[int, int]:
        """(bytes still free for one more job, other jobs held or loading) under the worker-wide limits.

        Loads under way count with the bytes they may still receive, so concurrent LoadJobs cannot
        together exceed the budget or the job count.
        """
        held = sum(r.job.bytes_received for job_id, r in self.jobs.items() if job_id != replacing)
        others = sum(1 for job_id in self.jobs if job_id != replacing) + len(self._loading)
        return self.max_total_bytes - held - sum(self._loading.values()), others

    # ---- LoadJob -------------------------------------------------------------------------------
    async def LoadJob(  # noqa: N802 - proto name
        self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.LoadJobReply:
        builder: JobBuilder | None = None
        error: str | None = None
        code = grpc.StatusCode.INVALID_ARGUMENT
        stream = id(request_iterator)
        budget_bound = False
        try:
            index = 0
            async for chunk in request_iterator:
                kind = chunk.WhichOneof("payload")
                if kind == "setup":
                    if builder is not None:
                        raise JobSetupError(
                            f"Chunk {index} is a second setup (job {short(chunk.setup.job_id)}); a LoadJob stream "
                            "carries exactly one setup, first."
                        )
                    free, others = self._budget(chunk.setup.job_id)
                    if others >= self.max_jobs:
                        code = grpc.StatusCode.RESOURCE_EXHAUSTED
                        raise JobSetupError(
                            f"This worker already holds {others} jobs, its limit; end one (EndJob) first."
                        )
                    budget_bound = free < self.max_job_bytes  # the worker-wide budget is this job's tighter limit
                    limit = max(0, min(self.max_job_bytes, free))
                    self._loading[stream] = limit
                    builder = JobBuilder(chunk.setup, max_bytes=limit)
                elif kind == "data":
                    if builder is None:
                        raise JobSetupError(
                            f"Chunk {index} carries data for partition {chunk.data.partition} before any setup; "
                            "send the setup chunk first."
                        )
                    builder.add(chunk.data)
                else:
                    raise JobSetupError(f"Chunk {index} is empty; set either 'setup' or 'data'.")
                index += 1
            if builder is None:
                raise JobSetupError("The LoadJob stream ended without a setup chunk; send the setup first.")
            job = await asyncio.to_thread(builder.finish)
            runtime = JobRuntime(job=job)
            runtime.delay_model = _delay_model(job.setup.straggler)
            if job.setup.HasField("parent"):
                runtime.parent = ParentRunner(
                    job.setup.parent, job_id=job.job_id, num_params=job.num_params, message_dtype=job.message_dtype,
                    security=self.security,
                )  # fmt: skip
        except JobTooLargeError as exc:
            error = str(exc)
            if budget_bound:
                code = grpc.StatusCode.RESOURCE_EXHAUSTED
        except ValueError as exc:  # JobSetupError and the validators of models, codes and delay models
            error = str(exc)
        finally:
            self._loading.pop(stream, None)
        if error is not None:
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                error += f" (all jobs on this worker may hold {self.max_total_bytes} bytes together)"
            await _abort(context, code, f"LoadJob refused: {error}")
        old = self.jobs.get(job.job_id)
        self.jobs[job.job_id] = runtime
        if old is not None:
            logger.info("job %r replaced by a new LoadJob", job.job_id)
            await self._retire(old)
        logger.info(
            "job %r loaded: worker %d, rows %s, partitions %s, %d bytes",
            job.job_id, job.worker_id, job.row_ids, sorted(job.partitions), job.bytes_received,
        )  # fmt: skip
        return worker_pb2.LoadJobReply(
            job_id=job.job_id, worker_id=job.worker_id, partitions=sorted(job.partitions),
            bytes_received=job.bytes_received,
        )  # fmt: skip

    # ---- Compute -------------------------------------------------------------------------------
    async def Compute(  # noqa: N802 - proto name
        self, request: worker_pb2.ComputeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.GradientChunk]:
        runtime = self.jobs.get(request.job_id)
        if runtime is None:
            await _abort(
                context, grpc.StatusCode.NOT_FOUND,
                f"Unknown job {short(request.job_id)} on this worker; load it with LoadJob first.",
            )  # fmt: skip
        job = runtime.job
        if request.worker_id != job.worker_id:
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION,
                f"This worker is worker {job.worker_id} of job {job.job_id!r}; the request is for worker "
                f"{request.worker_id}.",
            )  # fmt: skip
        error = None
        try:
            if request.model.dtype != common_pb2.DTYPE_FLOAT64:
                raise ValueError(f"The model must be DTYPE_FLOAT64, not {common_pb2.DType.Name(request.model.dtype)}.")
            params = job.check_params(array_from_tensor(request.model))
            if not np.isfinite(params).all():
                bad = int(np.count_nonzero(~np.isfinite(params)))
                raise ValueError(f"The model holds {bad} NaN or infinite values; a model must be finite.")
            rows = job.check_rows(list(request.rows))
        except (ValueError, WireError) as exc:
            error = str(exc)
        if error is not None:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"Compute refused: {error}")

        iteration = int(request.iteration)
        if iteration < runtime.newest_iteration:
            await _abort(
                context, grpc.StatusCode.ABORTED,
                f"Compute refused: iteration {iteration} is older than iteration {runtime.newest_iteration} already "
                f"started for job {job.job_id!r}; its gradient could no longer be used.",
            )  # fmt: skip
        try:
            delay = self._delay(runtime, iteration)
        except ValueError as exc:
            error = (
                f"Compute refused: the straggler delay model of job {job.job_id!r} fails for worker {job.worker_id}, "
                f"iteration {iteration}: {exc}"
            )
        if error is not None:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, error)

        runtime.newest_iteration = iteration
        flag = Cancellation()
        runtime.cancel_all(before=iteration)  # an older iteration still running can no longer be used
        runtime.active.setdefault(iteration, set()).add(flag)
        try:
            if runtime.parent is not None:
                await self._straggle(runtime, flag, delay)
                parent = runtime.parent
                messages, approximate = await self._parent_messages(runtime, parent, request, params, rows, flag)
                for row, (vector, seconds) in messages.items():
                    for chunk in self._chunks(job, iteration, row, vector, seconds, delay, approximate=approximate):
                        yield chunk
            else:
                # A straggler is slow, not dead: its delay is spread over its messages, so a worker with
                # several messages (partial stragglers) still delivers its first ones early.
                computation = job.start(params, cancelled=flag, on_partition=self._observer(job.job_id, iteration))
                for index, row in enumerate(rows):
                    await self._straggle(runtime, flag, delay / len(rows))
                    vector, seconds = await asyncio.to_thread(computation.message, row)
                    straggled = delay * (index + 1) / len(rows)
                    for chunk in self._chunks(job, iteration, row, vector, seconds, straggled):
                        yield chunk
            job.stats.add(iterations_completed=1)
        except ComputeCancelledError:
            error = (
                f"Iteration {iteration} of job {job.job_id!r} was abandoned: a later iteration started, or the job "
                "was ended or replaced."
            )
        except ChildrenUnavailableError as exc:
            error = str(exc)
            await _abort(context, grpc.StatusCode.UNAVAILABLE, error)
        except asyncio.CancelledError:
            job.stats.add(calls_cancelled=1)
            logger.debug("job %r iteration %d: call cancelled by the receiver", job.job_id, iteration)
            raise
        finally:
            flag.set()  # stops the compute thread at its next partition if it is still running
            flags = runtime.active.get(iteration)
            if flags is not None:
                flags.discard(flag)
                if not flags:
                    del runtime.active[iteration]
        if error is not None:
            await _abort(context, grpc.StatusCode.ABORTED, error)

    def _chunks(
        self,
        job: WorkerJob,
        iteration: int,
        row: int,
        vector: Array,
        seconds: float,
        straggle: float,
        *,
        approximate: bool = False,
    ) -> Iterator[worker_pb2.GradientChunk]:
        return message_chunks(
            vector, job_id=job.job_id, iteration=iteration, worker_id=job.worker_id, row=row,
            compute_seconds=seconds, straggle_seconds=straggle, approximate=approximate,
        )  # fmt: skip

    async def _straggle(self, runtime: JobRuntime, flag: Cancellation, seconds: float) -> None:
        """The emulated delay; ComputeCancelledError if the call is abandoned or its job is gone by the end."""
        await flag.sleep(seconds)
        if self.jobs.get(runtime.job.job_id) is not runtime:  # ended or replaced (its flags are set too)
            raise ComputeCancelledError(f"Job {runtime.job.job_id!r} was ended or replaced during the delay.")

    def _observer(self, job_id: str, iteration: int) -> Callable[[int], None] | None:
        observer = self.on_partition
        if observer is None:
            return None
        return lambda partition: observer(job_id, iteration, partition)

    def _delay(self, runtime: JobRuntime, iteration: int) -> float:
        """This iteration's emulated straggler delay for this worker (0 when emulation is off)."""
        if runtime.delay_model is None:
            return 0.0
        return max(0.0, float(runtime.delay_model.delay(runtime.job.worker_id, iteration)))

    async def _parent_messages(
        self,
        runtime: JobRuntime,
        parent: ParentRunner,
        request: worker_pb2.ComputeRequest,
        params: Array,
        rows: tuple[int, ...],
        flag: Cancellation,
    ) -> tuple[dict[int, tuple[Array, float]], bool]:
        """Own messages (in a thread) and the children's decoded sum (gather), concurrently; then add.

        Returns the messages by row and whether they are approximate (the children's decode was not exact).
        """
        job = runtime.job
        started = time.perf_counter()
        children: asyncio.Task[ChildrenSum] = asyncio.create_task(parent.children_sum(request))
        try:
            computation = job.start(params, cancelled=flag, on_partition=self._observer(job.job_id, request.iteration))
            own = {row: (await asyncio.to_thread(computation.message, row))[0] for row in rows}
            decoded = await flag.race(children)
        finally:
            if not children.done():
                children.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await children
        seconds = time.perf_counter() - started
        logger.log(
            logging.DEBUG if decoded.exact else logging.WARNING,
            "job %r iteration %d: children used %s, late %s, failed %s, exact %s",
            job.job_id, request.iteration, decoded.used, decoded.late, decoded.failed, decoded.exact,
        )  # fmt: skip
        out: dict[int, tuple[Array, float]] = {}
        for row in rows:
            total = own[row].astype(np.result_type(own[row].dtype, decoded.vector.dtype)) + decoded.vector
            out[row] = (total.astype(job.row_dtype(row), copy=False), seconds)
        return out, not decoded.exact

    # ---- EndJob --------------------------------------------------------------------------------
    async def EndJob(  # noqa: N802 - proto name
        self, request: worker_pb2.EndJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.EndJobReply:
        runtime = self.jobs.pop(request.job_id, None)
        if runtime is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"Unknown job {short(request.job_id)} on this worker.")
        await self._retire(runtime)
        logger.info("job %r ended", request.job_id)
        return worker_pb2.EndJobReply()

    # ---- Hello ---------------------------------------------------------------------------------
    async def Hello(  # noqa: N802 - proto name
        self, request: worker_pb2.HelloRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.HelloReply:
        return worker_pb2.HelloReply(instance_id=self.instance_id)

    async def _retire(self, runtime: JobRuntime) -> None:
        runtime.cancel_all()
        if runtime.parent is not None:
            await runtime.parent.close()

    async def close(self) -> None:
        """Stop every computation and close the children's channels (on node shutdown)."""
        runtimes = list(self.jobs.values())
        self.jobs.clear()
        for runtime in runtimes:
            await self._retire(runtime)


def _delay_model(spec: common_pb2.StragglerSpec) -> Any | None:
    """The job's delay model, or None when emulation is off."""
    if spec.model in ("", "none"):
        return None
    from gradcode.common.stragglers import make_delay_model

    try:
        return make_delay_model(spec.model, dict_from_struct(spec.params), int(spec.seed))
    except ValueError as exc:
        raise ValueError(f"JobSetup.straggler is invalid: {exc}") from None


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str) -> NoReturn:
    logger.info("refusing call: %s: %s", code.name, details)
    await context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
