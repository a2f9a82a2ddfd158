"""The gradcode.v1.Worker gRPC service: the protocol only, over :mod:`gradcode.worker.runtime` (a loaded
job's leaf and parent paths), :mod:`gradcode.worker.straggling` (straggler emulation) and
:mod:`gradcode.worker.compute` (what a worker computes).

* ``LoadJob`` (client streaming): a ``setup`` chunk, then the partition data (or, for worker-local
  data, nothing: the worker loads its partitions from its ``--data-dir``); replaces an earlier job with
  the same id. A refused stream is read to its end before the refusal is sent: a grpc.aio client
  still writing could see INTERNAL in its place (:func:`gradcode.common.transport.status.grpc_errors`).
* ``Compute`` (server streaming): one iteration; applies the job's straggler emulation as a
  cancellable sleep, spread over the worker's messages (a straggler is slow, not dead), computes
  the rows in a worker thread and streams each one as soon as it is ready. When the receiver
  cancels the call, the sleep is cancelled and the compute thread stops at its next partition, so
  the worker starts the next iteration fresh. A Compute for a later iteration of the same job also
  stops any older one still running (it can no longer be used), and a Compute for an iteration older
  than the newest one seen is refused (ABORTED), one beyond the job's length (JobSetup.iterations) is refused
  (INVALID_ARGUMENT). EndJob, a replacing LoadJob or a newer iteration
  wake an abandoned call from its straggler sleep at once.
* ``Session`` (bidirectional): many Computes on one long-lived stream, what the master and tree parents
  use (:mod:`gradcode.common.transport.session`): each request runs as ``Compute`` would, its chunks tagged with
  its ``request_id`` and its status sent in band; a cancel request does what cancelling the call does (the
  request ends CANCELLED). Every request gets a status, a malformed one a precise refusal; a message that is
  not a ComputeRequest ends the call INVALID_ARGUMENT. When the node shuts down its sessions take no new
  request, finish the running ones and end.
* ``FetchModel``: the model this worker holds for an iteration of a job, for a peer told to fetch it here
  (``ComputeRequest.relayed_model``; :mod:`gradcode.worker.relay`). A Compute with a relayed model fetches it from
  the peer named, checks its digest, and ends FAILED_PRECONDITION when it cannot (the master then sends it inline).
* ``EndJob``: forget a job.

Every refusal is a gRPC status with a precise message (an error of :mod:`gradcode.common.exceptions`,
mapped by :func:`gradcode.common.transport.status.grpc_errors`); the server keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from gradcode.common.codes.base import Array
from gradcode.common.codes.numerics import all_finite
from gradcode.common.exceptions import (
    AbortedError,
    ChildrenUnavailableError,
    ComputeCancelledError,
    FailedPreconditionError,
    InvalidRequestError,
    JobSetupError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from gradcode.common.ops import metrics
from gradcode.common.ops.logs import set_log_context
from gradcode.common.training.datafile import MAX_DATA_FILE_BYTES
from gradcode.common.transport import shared_memory
from gradcode.common.transport.link import LinkServer
from gradcode.common.transport.security import (
    CALL_SCOPE,
    MAX_NONCE_BYTES,
    Security,
    bearer_of,
    hello_proof,
    job_of,
    new_process_secret,
    short,
)
from gradcode.common.transport.serving import return_freed_memory
from gradcode.common.transport.session import (
    SessionProtocolError,
    ready_chunk,
    serve_session,
    started_chunk,
    status_chunk,
)
from gradcode.common.transport.status import grpc_errors
from gradcode.common.transport.wire import (
    Serialized,
    array_from_tensor,
    children_lost_metadata,
    message_chunk_pieces,
    serialize_chunk,
    serialized_size,
)
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gradcode.worker.compute import MAX_JOB_BYTES, JobBuilder, JobTooLargeError, WorkerJob
from gradcode.worker.parent import ParentRunner
from gradcode.worker.relay import LONGEST_WAIT_SECONDS, PeerFetcher, check_relayed, relayed
from gradcode.worker.runtime import Computing, JobRuntime, Message, PartitionObserver, until_promoted
from gradcode.worker.straggling import Cancellation, StragglerEmulation

__all__ = [
    "MAX_JOBS",
    "MAX_TOTAL_BYTES",
    "WorkerServicer",
    "add_worker_service",
]

logger = logging.getLogger(__name__)

MAX_TOTAL_BYTES = 16 * 1024**3
"""Default budget of the data all jobs together may hold on one worker (16 GiB)."""
MAX_JOBS = 16
"""Default bound on the jobs one worker holds at once."""


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
        process_secret: bytes | None = None,
        chunk_bytes: int | None = None,
        data_dir: Path | None = None,
        max_data_file_bytes: int = MAX_DATA_FILE_BYTES,
    ) -> None:
        if max_jobs < 1 or max_total_bytes < 1:
            raise ValueError(f"max_jobs and max_total_bytes must be >= 1, not {max_jobs!r} and {max_total_bytes!r}.")
        self.jobs: dict[str, JobRuntime] = {}
        self.max_job_bytes = max_job_bytes
        self.on_partition = on_partition
        self.chunk_bytes = chunk_bytes
        """Payload bytes per gradient chunk (None: sized to each message)."""
        self.max_total_bytes = max_total_bytes
        """Budget of the data all jobs together hold; a LoadJob beyond it is RESOURCE_EXHAUSTED."""
        self.max_jobs = max_jobs
        self.security = security or Security()
        """How a tree parent reaches its children (TLS; their call tokens come in the job's ChildSpecs)."""
        self.instance_id = instance_id
        """What Hello answers: the random id this process registered with (a label)."""
        self.process_secret = process_secret or new_process_secret()
        """This process's secret, sent only to its master when it registers; Hello proves it holds it."""
        self.data_dir = data_dir
        """The only directory worker-local jobs read data files from (None: none)."""
        self.max_data_file_bytes = max_data_file_bytes
        self._loading: dict[int, int] = {}
        """Bytes the LoadJob streams under way have declared so far (their partitions' sizes), by stream."""
        self._reserving = threading.Lock()
        """Guards :attr:`_loading`: a worker-local load declares its partitions from a thread."""
        self.closing = asyncio.Event()
        """Set by :meth:`drain`: Sessions stop taking requests."""
        self.link: LinkServer | None = None
        """This worker's link listener, which OpenLink offers (None: this worker serves no link)."""

    def _others(self, replacing: str) -> int:
        """Jobs held or loading besides ``replacing``: what a new LoadJob counts against ``max_jobs``."""
        return sum(1 for job_id in self.jobs if job_id != replacing) + len(self._loading)

    def _reserve(self, stream: int, replacing: str, size: int) -> None:
        """Reserve ``size`` more bytes of the worker-wide budget for the LoadJob ``stream`` (the size a partition
        declares, before its data is accepted); :class:`_OverBudgetError` if the jobs held and the loads under way
        would then exceed it.

        A load reserves what it declares, never the per-job cap: concurrent loads of small jobs fit together
        as their data does (each reserving the cap made the third of three concurrent loads refused at 0 bytes).
        """
        with self._reserving:
            held = sum(r.job.bytes_received for job_id, r in list(self.jobs.items()) if job_id != replacing)
            loading = sum(self._loading.values())
            if held + loading + size > self.max_total_bytes:
                raise _OverBudgetError(
                    f"{size} more bytes for job {short(replacing)} would bring this worker to "
                    f"{held + loading + size} bytes ({held} held by other jobs, {loading} by loads under way)"
                )
            self._loading[stream] = self._loading.get(stream, 0) + size

    # ---- LoadJob -------------------------------------------------------------------------------
    @grpc_errors
    async def LoadJob(  # noqa: N802 - proto name
        self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.LoadJobReply:
        stream = id(request_iterator)
        try:
            runtime = await self._receive(request_iterator, stream)
        except _OverBudgetError as exc:  # the worker-wide budget, not the per-job cap, was hit: try again later
            raise ResourceExhaustedError(
                f"LoadJob refused: {exc}, over the {self.max_total_bytes} bytes all jobs on this worker may hold "
                "together; retry once other jobs end."
            ) from None
        except ValueError as exc:  # JobSetupError (the per-job cap too) and the validators of models, codes, delays
            raise InvalidRequestError(f"LoadJob refused: {exc}") from None
        finally:
            with self._reserving:
                self._loading.pop(stream, None)
        job = runtime.job
        old = self.jobs.get(job.job_id)
        self.jobs[job.job_id] = runtime
        if old is not None:
            logger.info("job %r replaced by a new LoadJob", job.job_id)
            await old.retire()
            del old
            return_freed_memory()
        logger.info(
            "job %r loaded: worker %d, rows %s, partitions %s, %d bytes",
            job.job_id, job.worker_id, job.row_ids, sorted(job.partitions), job.bytes_received,
        )  # fmt: skip
        return worker_pb2.LoadJobReply(
            job_id=job.job_id, worker_id=job.worker_id, partitions=sorted(job.partitions),
            bytes_received=job.bytes_received,
            shared_memory_proof="" if runtime.shared is None else runtime.shared.proof,
        )  # fmt: skip

    async def _receive(self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], stream: int) -> JobRuntime:
        """The job a LoadJob stream carries: one setup chunk first, then the partition data.

        The job is held to the per-job cap, and each partition's declared size is reserved from the worker-wide
        budget before its data is accepted (:meth:`_reserve`); loads under way count with what they declared
        (``_loading``), so concurrent LoadJobs cannot together exceed the budget or the job count.
        """
        builder: JobBuilder | None = None
        index = 0
        async for chunk in request_iterator:
            kind = chunk.WhichOneof("payload")
            if kind == "setup":
                if builder is not None:
                    raise JobSetupError(
                        f"Chunk {index} is a second setup (job {short(chunk.setup.job_id)}); a LoadJob stream "
                        "carries exactly one setup, first."
                    )
                set_log_context(job_id=chunk.setup.job_id)  # this call's task only
                others = self._others(chunk.setup.job_id)
                if others >= self.max_jobs:
                    raise ResourceExhaustedError(
                        f"LoadJob refused: this worker already holds {others} jobs, its limit; end one (EndJob) first."
                    )
                with self._reserving:
                    self._loading[stream] = 0
                builder = JobBuilder(
                    chunk.setup, max_bytes=self.max_job_bytes, data_dir=self.data_dir,
                    max_file_bytes=self.max_data_file_bytes,
                    reserve=functools.partial(self._reserve, stream, chunk.setup.job_id),
                )  # fmt: skip
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
        runtime = JobRuntime(
            job=job, stragglers=StragglerEmulation(job.setup.straggler), peers=PeerFetcher(job.job_id, self.security)
        )
        if job.setup.HasField("shared_memory") and not job.setup.HasField("parent"):
            runtime.shared = shared_memory.accept(job.setup.shared_memory, job.worker_id)
        if job.setup.HasField("parent"):
            runtime.parent = ParentRunner(
                job.setup.parent, job_id=job.job_id, length=job.message_length, message_dtype=job.message_dtype,
                certified_length=job.num_params, security=self.security,
            )  # fmt: skip
        return runtime

    # ---- Compute and Session ---------------------------------------------------------------------
    @grpc_errors
    async def Compute(  # noqa: N802 - proto name
        self, request: worker_pb2.ComputeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Serialized]:
        """Serialized GradientChunks (:func:`~gradcode.common.transport.wire.message_chunk_pieces`); register the
        servicer
        with :func:`add_worker_service`, whose Compute sends them as they are."""
        CALL_SCOPE.set(job_of(bearer_of(context)))  # this call's task only
        try:
            async for chunk in self._compute(request):
                yield chunk
        except ChildrenUnavailableError as exc:  # the master reloads the children that lost the job
            context.set_trailing_metadata(children_lost_metadata(exc.children_lost))
            raise

    async def Session(  # noqa: N802 - proto name
        self,
        requests: AsyncIterator[worker_pb2.ComputeRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """Computes on one long-lived stream (:func:`gradcode.common.transport.session.serve_session`): each request as
        Compute would answer it, its chunks tagged with its ``request_id``, then its status. A message that is not
        a ComputeRequest ends the stream with INVALID_ARGUMENT."""
        CALL_SCOPE.set(job_of(bearer_of(context)))  # this call's task, and the computations it starts
        try:
            await self.serve_session(requests, context.write)
        except SessionProtocolError as exc:
            logger.info("refusing a Session: %s", exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def serve_session(
        self,
        requests: AsyncIterator[worker_pb2.ComputeRequest],
        write: Callable[[Serialized], Awaitable[None]],
        write_now: Callable[[Serialized], bool] | None = None,
    ) -> None:
        """A Session on any stream: a gRPC call's, or a link's (:class:`gradcode.common.transport.link.LinkServer`),
        which can also send a frame at once (``write_now``)."""
        await serve_session(requests, write, self._compute, self.closing, self._promote, write_now=write_now)

    @grpc_errors
    async def OpenLink(  # noqa: N802 - proto name
        self, request: worker_pb2.OpenLinkRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.LinkOffer:
        """A port and a one-time token for a Session over plain TCP (:mod:`gradcode.common.transport.link`)."""
        if self.link is None or self.closing.is_set():
            raise FailedPreconditionError("This worker serves no link (started with --link-port off, or stopping).")
        return self.link.offer(scope=job_of(bearer_of(context)))  # a link opened with a job token: that job only

    async def _compute(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
        """One Compute: the serialized chunks of every requested row; a gradcode refusal ends it. On a Session
        (``request_id`` set) the last chunk carries the request's OK status."""
        set_log_context(job_id=request.job_id, iteration=int(request.iteration))  # this call's task only
        started = time.perf_counter()
        runtime, params, rows, delay = await self._admit(request)
        model_seconds = time.perf_counter() - started
        job, iteration = runtime.job, int(request.iteration)
        flag = runtime.begin(iteration)
        try:
            async for chunk in self._answer(request, runtime, params, rows, delay, flag, model_seconds):
                yield chunk
            job.stats.add(iterations_completed=1)
            metrics.COMPUTES_SERVED.inc()
        except ComputeCancelledError:
            metrics.COMPUTES_CANCELLED.inc()
            raise AbortedError(
                f"Iteration {iteration} of job {job.job_id!r} was abandoned: a later iteration started, or the job "
                "was ended or replaced."
            ) from None
        except asyncio.CancelledError:
            job.stats.add(calls_cancelled=1)
            metrics.COMPUTES_CANCELLED.inc()
            logger.debug("job %r iteration %d: call cancelled by the receiver", job.job_id, iteration)
            raise
        finally:
            runtime.end(iteration, flag)

    async def _admit(self, request: worker_pb2.ComputeRequest) -> tuple[JobRuntime, Array, tuple[int, ...], float]:
        """The job's runtime, the model, the rows and this iteration's emulated delay of a Compute this worker
        serves; a gradcode refusal (PERMISSION_DENIED, FAILED_PRECONDITION, INVALID_ARGUMENT, ABORTED) otherwise.
        The model is held for the job's peers (:attr:`JobRuntime.models`)."""
        scope = CALL_SCOPE.get()
        if scope is not None and request.job_id != scope:
            raise PermissionDeniedError(
                f"This call's job token is for job {short(scope)}, not {short(request.job_id)}: a tree parent's "
                "token opens the Computes of its own job only."
            )
        runtime = self._runtime(request.job_id)
        job = runtime.job
        if request.worker_id != job.worker_id:
            raise FailedPreconditionError(
                f"This worker is worker {job.worker_id} of job {job.job_id!r}; the request is for worker "
                f"{request.worker_id}."
            )
        iteration = int(request.iteration)
        try:
            job.check_iteration(iteration)  # before anything records it as the newest
            rows = job.check_rows(list(request.rows))
            params = await self._model_of(request, runtime)
            if request.hold and not request.backup:
                raise ValueError(
                    "hold is set without backup: only a backup may keep its messages until pulled (an expected "
                    "worker's are needed at once); set backup too, or clear hold."
                )
        except ValueError as exc:  # WireError is a ValueError
            raise InvalidRequestError(f"Compute refused: {exc}") from None
        if iteration < runtime.newest_iteration:
            raise AbortedError(
                f"Compute refused: iteration {iteration} is older than iteration {runtime.newest_iteration} already "
                f"started for job {job.job_id!r}; its gradient could no longer be used."
            )
        try:
            delay = runtime.stragglers.delay(job.worker_id, iteration)
        except ValueError as exc:
            raise InvalidRequestError(
                f"Compute refused: the straggler delay model of job {job.job_id!r} fails for worker {job.worker_id}, "
                f"iteration {iteration}: {exc}"
            ) from None
        return runtime, params, rows, delay

    @staticmethod
    async def _model_of(request: worker_pb2.ComputeRequest, runtime: JobRuntime) -> Array:
        """The request's model (inline, in the job's shared memory, or fetched from a peer), checked and held for the
        job's peers; ValueError saying what is wrong, ModelUnavailableError when a relayed one cannot be had."""
        job, iteration = runtime.job, int(request.iteration)
        if request.HasField("relayed_model"):
            if CALL_SCOPE.get() is not None or runtime.peers is None:
                raise ValueError(
                    "a relayed model on a call opened by a job token: only the master relays models (a tree parent "
                    "sends its children the model inline)."
                )
            check_relayed(request.relayed_model, job.num_params)
            relay = request.relayed_model
            fetch = functools.partial(runtime.peers.fetch, relay, iteration)
            return await relayed(runtime.models, relay, iteration, fetch, functools.partial(_checked, job))
        if request.HasField("shared_model"):
            if runtime.shared is None:
                raise ValueError(
                    "the request names a shared-memory model, but this worker did not accept the job's "
                    "shared-memory offer; send the model inline."
                )
            params = _checked(job, runtime.shared.read_model(request.shared_model))
        elif request.model.dtype != common_pb2.DTYPE_FLOAT64:
            raise ValueError(f"The model must be DTYPE_FLOAT64, not {common_pb2.DType.Name(request.model.dtype)}.")
        else:
            params = _checked(job, array_from_tensor(request.model))
        runtime.models.hold(iteration, params)
        return params

    async def _answer(
        self,
        request: worker_pb2.ComputeRequest,
        runtime: JobRuntime,
        params: Array,
        rows: tuple[int, ...],
        delay: float,
        flag: Cancellation,
        model_seconds: float,
    ) -> AsyncIterator[Serialized]:
        """The chunks of the requested rows as they are computed: the started notice, each message (a held backup's
        kept until pulled, after its ready notice), and a Session's OK status had no message carried it.
        ``model_seconds``: how long the request took to admit, its model read and checked (each message says so)."""
        shared = runtime.shared if request.HasField("shared_model") else None
        hold = runtime.promotion(int(request.iteration)) if request.hold and request.request_id else None
        """Set when the receiver pulls this held backup's messages (a Compute call cannot be promoted: it sends)."""
        held: list[Message] = []
        sent = 0
        async for m in runtime.messages(request, params, rows, delay, flag, self.on_partition):
            if isinstance(m, Computing):
                yield started_chunk(request.request_id)
                continue
            metrics.COMPUTE_SECONDS.inc(m.compute_seconds)
            outgoing = [*held, m]  # a backup promoted while some were held: those go first
            held = []
            if hold is not None and not hold.is_set():
                held = outgoing  # kept until pulled; dropped with the request if it is cancelled
                if len(held) < len(rows):
                    continue
                yield ready_chunk(request.request_id)
                await until_promoted(flag, hold)
                outgoing, held = held, []
            for message in outgoing:
                sent += 1
                final = sent == len(rows)
                for chunk in self._message_chunks(message, request, runtime, model_seconds, final=final, shared=shared):
                    metrics.BYTES_SENT.inc(serialized_size(chunk))
                    yield chunk
        if request.request_id and sent < len(rows):  # the Session's status, had no message carried it
            yield status_chunk(request.request_id, grpc.StatusCode.OK)

    def _message_chunks(
        self,
        m: Message,
        request: worker_pb2.ComputeRequest,
        runtime: JobRuntime,
        model_seconds: float,
        *,
        final: bool,
        shared: shared_memory.SharedPeer | None,
    ) -> Iterator[Serialized]:
        """The serialized chunks of message ``m`` answering ``request`` (its payload in shared memory with
        ``shared``); ``final``: the request's last message, whose last chunk carries a Session's OK status."""
        job, iteration = runtime.job, int(request.iteration)
        return message_chunk_pieces(
            m.vector, job_id=job.job_id, iteration=iteration, worker_id=job.worker_id, row=m.row,
            compute_seconds=m.compute_seconds, straggle_seconds=m.straggle_seconds, model_seconds=model_seconds,
            approximate=m.approximate, decode_error=m.decode_error, subtree=m.subtree,
            chunk_bytes=self.chunk_bytes, magnitude=m.magnitude, request_id=request.request_id, final=final,
            shared=None if shared is None else functools.partial(_write_shared, runtime, iteration, m.row),
        )  # fmt: skip

    def _promote(self, request: worker_pb2.ComputeRequest) -> None:
        """The receiver needs the backup ``request`` asked for after all: its remaining work at normal priority, and
        the messages it holds (``hold``) sent."""
        runtime = self.jobs.get(request.job_id)
        if runtime is not None:
            runtime.promotion(int(request.iteration)).set()

    def _runtime(self, job_id: str) -> JobRuntime:
        runtime = self.jobs.get(job_id)
        if runtime is None:
            raise NotFoundError(f"Unknown job {short(job_id)} on this worker; load it with LoadJob first.")
        return runtime

    # ---- FetchModel ----------------------------------------------------------------------------
    @grpc_errors
    async def FetchModel(  # noqa: N802 - proto name
        self, request: worker_pb2.FetchModelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """The model a Compute of this job's iteration was admitted with, for a peer, as serialized FetchModelReply
        pieces made once for every fetcher; while it is still arriving, an empty reply every
        :data:`~gradcode.worker.relay.HEARTBEAT_SECONDS` (this worker is alive and waiting). A relay token opens
        its own job's models only."""
        scope = job_of(bearer_of(context))
        if scope is not None and request.job_id != scope:
            raise PermissionDeniedError(
                f"This call's relay token is for job {short(scope)}, not {short(request.job_id)}: it opens the models "
                "of its own job only."
            )
        runtime = self._runtime(request.job_id)
        async for reply in runtime.models.replies(int(request.iteration), LONGEST_WAIT_SECONDS):
            yield reply
        metrics.MODELS_RELAYED.inc()

    # ---- EndJob --------------------------------------------------------------------------------
    @grpc_errors
    async def EndJob(  # noqa: N802 - proto name
        self, request: worker_pb2.EndJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.EndJobReply:
        runtime = self.jobs.pop(request.job_id, None)
        if runtime is None:
            raise NotFoundError(f"Unknown job {short(request.job_id)} on this worker.")
        await runtime.retire()
        del runtime
        return_freed_memory()
        logger.info("job %r ended", request.job_id)
        return worker_pb2.EndJobReply()

    # ---- Hello ---------------------------------------------------------------------------------
    @grpc_errors
    async def Hello(  # noqa: N802 - proto name
        self, request: worker_pb2.HelloRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.HelloReply:
        """Which process answers at this address: the proof that it holds its process secret, for the master's
        nonce (the master admits a registration only where the secret it was sent is proven)."""
        if len(request.nonce) > MAX_NONCE_BYTES:
            raise InvalidRequestError(f"Hello's nonce is {len(request.nonce)} bytes; at most {MAX_NONCE_BYTES}.")
        proof = hello_proof(self.process_secret, request.nonce) if request.nonce else b""
        return worker_pb2.HelloReply(instance_id=self.instance_id, proof=proof)

    def drain(self) -> None:
        """The node is shutting down: sessions take no new request, finish the running ones and end."""
        self.closing.set()

    async def close(self) -> None:
        """Stop every computation and close the children's channels (on node shutdown)."""
        runtimes = list(self.jobs.values())
        self.jobs.clear()
        for runtime in runtimes:
            await runtime.retire()


class _OverBudgetError(JobTooLargeError):
    """A load's declared data does not fit in what the worker-wide budget leaves (RESOURCE_EXHAUSTED)."""


class _HandlerRecorder:
    """Stands in for a server to capture the generated Worker method handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def _checked(job: WorkerJob, params: Array) -> Array:
    """``params`` as the job's model (float64, its length, finite); ValueError saying what is wrong."""
    params = job.check_params(params)
    if not all_finite(params):
        bad = int(np.count_nonzero(~np.isfinite(params)))
        raise ValueError(f"The model holds {bad} NaN or infinite values; a model must be finite.")
    return params


def _write_shared(runtime: JobRuntime, iteration: int, row: int, payload: np.ndarray[Any, Any]) -> bool:
    """Leave a message's payload in its slot of the receiver's shared-memory directory; False (send it inline) if
    that fails, or if a later iteration has started: a stale message never overwrites a slot the receiver may be
    reading (the check and the write run together on the event loop)."""
    if runtime.shared is None or iteration != runtime.newest_iteration:
        return False
    try:
        runtime.shared.write_message(runtime.job.worker_id, row, payload)
    except (OSError, ValueError) as exc:  # a full tmpfs; a slot of another size (WireError)
        logger.warning("iteration %d row %d: shared-memory write failed (%s); sending it inline", iteration, row, exc)
        return False
    metrics.SHARED_BYTES_SENT.inc(payload.nbytes)
    return True


def add_worker_service(servicer: WorkerServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` as gradcode.v1.Worker: the generated handlers, except that Compute and Session send the
    serialized chunks they yield, and FetchModel its serialized replies, as they are
    (:func:`~gradcode.common.transport.wire.serialize_chunk`)."""
    recorder = _HandlerRecorder()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, recorder)  # type: ignore[no-untyped-call]
    compute, session, fetch = (recorder.handlers[name] for name in ("Compute", "Session", "FetchModel"))
    recorder.handlers["FetchModel"] = grpc.unary_stream_rpc_method_handler(
        fetch.unary_stream, request_deserializer=fetch.request_deserializer, response_serializer=serialize_chunk
    )
    recorder.handlers["Compute"] = grpc.unary_stream_rpc_method_handler(
        compute.unary_stream, request_deserializer=compute.request_deserializer, response_serializer=serialize_chunk
    )
    recorder.handlers["Session"] = grpc.stream_stream_rpc_method_handler(
        session.stream_stream, request_deserializer=session.request_deserializer, response_serializer=serialize_chunk
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(recorder.service, recorder.handlers),))
    server.add_registered_method_handlers(recorder.service, recorder.handlers)
