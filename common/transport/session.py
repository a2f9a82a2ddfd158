"""Many Computes over one long-lived stream: both ends of ``Worker.Session``.

A new gRPC call per iteration costs more CPU than a p = 1e5 gradient: in ``bench.transport``'s call-shape
stage, a round of 16 new unary-stream calls (what a Compute is) took 6.6 ms of wall and 12.2 ms of CPU on
2 cores, the same round of messages on long-lived bidirectional streams 2.2 and 4.0 ms. So the master keeps
one Session per worker and sends each iteration's ComputeRequest on it.

* The caller's end, :class:`Session`: :meth:`Session.compute` sends one request and returns a
  :class:`SessionCompute`, an async iterator of that request's chunks (the replies are sorted by their
  ``request_id``) that ends as the Compute call would have: normally, or raising :class:`CallError` with
  the status the worker ended it with; ``cancel()`` stops the worker's computation. A broken stream fails
  every request under way with the call's own ``grpc.aio.AioRpcError`` (a killed worker: UNAVAILABLE), and
  the session with it; its owner opens a new one.
* The worker's end, :func:`serve_session`: runs each request as its own task through the same
  computation as a Compute call, and sends its chunks and then its :func:`status_chunk`.

On both ends one writer task owns the stream's writes, so cancelling a computation (or a caller that stops
waiting) never interrupts a message half written, and a request or chunk whose computation was cancelled
before its turn is not sent at all.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from gradcode.common.exceptions import GradcodeError
from gradcode.common.ops import metrics
from gradcode.common.transport.status import status_code
from gradcode.common.transport.wire import (
    SESSION_METHOD,
    Placer,
    ReceivedChunk,
    Serialized,
    compute_stream,
    parse_chunk,
    serialize_chunk,
    serialized_size,
)
from gradcode.v1 import worker_pb2

__all__ = [
    "GRPC_MESSAGE_PREFIX_BYTES",
    "MAX_SESSION_REQUESTS",
    "TRAFFIC",
    "CallError",
    "Caller",
    "ChunkStream",
    "DeliversItems",
    "Promotable",
    "ReportsStart",
    "Session",
    "SessionCompute",
    "SessionProtocolError",
    "SessionStream",
    "Traffic",
    "control_problem",
    "ready_chunk",
    "serve_session",
    "started_chunk",
    "status_chunk",
]

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class ChunkStream(Protocol):
    """One Compute's chunks: a :class:`SessionCompute`, or a Compute call (``grpc.aio.UnaryStreamCall``).

    A stream may offer more, which its consumer looks for by name (a Compute call offers none of it): handing its
    items over as they arrive, payloads placed where the consumer says (:class:`DeliversItems`); news that the
    computation began (:class:`ReportsStart`); promotion of a backup (:class:`Promotable`).
    """

    def __aiter__(self) -> AsyncIterator[worker_pb2.GradientChunk | ReceivedChunk]: ...

    def cancel(self) -> bool: ...


class DeliversItems(Protocol):
    """A stream's optional capability: items passed to a sink as they arrive, payloads placed by the consumer."""

    place: Placer | None

    def consume(self, sink: Sink) -> None: ...


class ReportsStart(Protocol):
    """A stream's optional capability: ``started`` turns true when the worker says its computation began, and
    ``on_started`` (set by the consumer) is called then."""

    started: bool
    on_started: Callable[[], None] | None


class Promotable(Protocol):
    """A stream's optional capability: ask a backup to compute at normal priority (a held one: to send)."""

    def promote(self) -> None: ...


class Holds(Protocol):
    """A stream's optional capability: a held backup's ``ready`` turns true when its messages wait to be pulled,
    and ``on_ready`` (set by the consumer) is called then."""

    ready: bool
    on_ready: Callable[[], None] | None


class CallError(GradcodeError):
    """A Compute on a session that ended with a status other than OK (the stream itself stays open)."""

    def __init__(self, code: grpc.StatusCode, details: str, children_lost: Sequence[int] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.children_lost = tuple(int(c) for c in children_lost)
        """A tree parent's children that lost the job (the Compute call's trailing metadata)."""

    @classmethod
    def from_status(cls, status: worker_pb2.CallStatus) -> CallError:
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        return cls(code, status.details, status.children_lost)


def status_chunk(request_id: int, code: grpc.StatusCode, details: str = "", children_lost: Sequence[int] = ()) -> bytes:
    """The last chunk sent for a Session request: how its computation ended."""
    status = worker_pb2.CallStatus(code=code.value[0], details=details, children_lost=children_lost)
    return worker_pb2.GradientChunk(request_id=request_id, status=status).SerializeToString()


def started_chunk(request_id: int) -> bytes:
    """Sent for a Session request that asked ``report_start`` when its computation begins."""
    return worker_pb2.GradientChunk(request_id=request_id, started=True).SerializeToString()


def ready_chunk(request_id: int) -> bytes:
    """Sent for a Session request that asked ``hold`` when its messages are computed and kept, waiting to be pulled."""
    return worker_pb2.GradientChunk(request_id=request_id, ready=True).SerializeToString()


GRPC_MESSAGE_PREFIX_BYTES = 5
"""What gRPC adds to each message of a stream (a compressed flag and a 4-byte length); HTTP/2's frames, TLS's records
and TCP's segments are below what a process counts."""


TrafficKey = tuple[str, int]
"""What :class:`Traffic` counts bytes for: a job's id and an iteration."""


class Traffic:
    """Bytes a receiver's Computes carried, by job and iteration: what it sent (requests with their models, cancels,
    promotions) and what it received (every chunk: messages, notices, statuses), each counted as it went through the
    stream (its serialized size plus the stream's framing of it: :data:`GRPC_MESSAGE_PREFIX_BYTES`, or a link's
    length). Payloads left in shared memory do not cross the stream and do not count. The master takes an iteration's
    totals with its report (:meth:`take`): the next round's requests, sent before that report, wait for their own;
    bytes of an iteration that arrive after its report (the rest of a cancelled message) count in the next one."""

    JOBS = 4096
    """Jobs remembered; the oldest is forgotten beyond (a tree parent counts its jobs too, and nobody takes them)."""
    ITERATIONS = 8
    """Iterations of a job counted apart until taken (the master takes each with its report, so two or three
    wait at most); beyond, the two oldest are counted as one, and a job nobody takes stays small."""

    def __init__(self) -> None:
        self._jobs: collections.OrderedDict[str, _JobTraffic] = collections.OrderedDict()

    def add(self, key: TrafficKey, *, sent: int = 0, received: int = 0) -> None:
        job_id, iteration = key
        job = self._job(job_id)
        counted = max(iteration, job.taken + 1)
        totals = job.pending.get(counted)
        if totals is None:
            totals = job.pending[counted] = [0, 0]
        totals[0] += sent
        totals[1] += received
        if len(job.pending) > self.ITERATIONS:
            oldest, older = sorted(job.pending)[:2]
            out, came = job.pending.pop(oldest)
            job.pending[older][0] += out
            job.pending[older][1] += came

    def take(self, job_id: str, iteration: int) -> tuple[int, int]:
        """Bytes (sent, received) of ``job_id``'s ``iteration``, with those of its earlier iterations not yet taken."""
        job = self._job(job_id)
        job.taken = max(job.taken, iteration)
        sent = received = 0
        for counted in [i for i in job.pending if i <= iteration]:
            out, came = job.pending.pop(counted)
            sent += out
            received += came
        return sent, received

    def _job(self, job_id: str) -> _JobTraffic:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _JobTraffic()
            if len(self._jobs) > self.JOBS:
                self._jobs.popitem(last=False)
        return job


@dataclasses.dataclass
class _JobTraffic:
    taken: int = -1
    """The last iteration taken: bytes of it or before count in the next."""
    pending: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    """(sent, received) by iteration, not yet taken."""


TRAFFIC = Traffic()
"""This process's Compute traffic (every :class:`Session`, and every Compute call a :class:`Caller` makes)."""

_END = object()
"""Queued for a SessionCompute after its last chunk when it ended OK."""


Sink = Callable[[ReceivedChunk | BaseException | None], None]
"""Told each item of a :class:`SessionCompute` as it arrives: a chunk, None when it ended OK, or the exception
that ended it."""


class SessionCompute:
    """One Compute on a :class:`Session`: iterate it for the chunks, or have them passed to a callback as they
    arrive (:meth:`consume`); :meth:`cancel` stops it (a ChunkStream)."""

    def __init__(self, session: Session, request_id: int, job_id: str = "", iteration: int = 0) -> None:
        self.session = session
        self.request_id = request_id
        self.job_id = job_id
        self.traffic_key: TrafficKey = (job_id, iteration)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._sink: Sink | None = None
        self.ended = False
        """The worker sent its status, the session broke, or the caller cancelled."""
        self.place: Placer | None = None
        """Where its large chunks' payloads go as they arrive on a link (the consumer's
        :meth:`~gradcode.common.transport.wire.MessageAssembler.place`); None: they arrive as received bytes."""
        self.started = False
        """The worker said its computation began (the request asked ``report_start``)."""
        self.on_started: Callable[[], None] | None = None
        """Called when :attr:`started` becomes true (a round that times the expected workers' starts wakes up)."""
        self.ready = False
        """The worker said its messages are computed and held until :meth:`promote` (the request asked ``hold``)."""
        self.on_ready: Callable[[], None] | None = None
        """Called when :attr:`ready` becomes true (a round waiting for news wakes up)."""

    def __aiter__(self) -> AsyncIterator[ReceivedChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[ReceivedChunk]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> bool:
        """Stop waiting, and ask the worker to stop computing; False when it had already ended."""
        if self.ended:
            return False
        self.ended = True
        self.session._cancel(self.request_id)
        return True

    def promote(self) -> None:
        """Ask the worker to compute this backup's remaining messages at normal priority (if still running), and
        to send the messages it holds (``hold``)."""
        if not self.ended:
            self.session._promote(self.request_id, self.traffic_key)

    def consume(self, sink: Sink) -> None:
        """Pass every item to ``sink`` as the session reads it (those already here at once), instead of iterating:
        the reader calls it, without a queue and a task between them."""
        self._sink = sink
        while not self._queue.empty():
            item = self._queue.get_nowait()
            sink(None if item is _END else item)

    def _deliver(self, item: Any) -> None:
        if not isinstance(item, ReceivedChunk):
            self.ended = True
        if self._sink is not None:
            self._sink(None if item is _END else item)
        else:
            self._queue.put_nowait(item)


class SessionStream(Protocol):
    """What a :class:`Session` runs on: a ``Worker.Session`` call (``grpc.aio.StreamStreamCall``), or a worker's
    link (:class:`gradcode.common.transport.link.LinkStream`)."""

    def write(self, data: Serialized) -> Awaitable[None]: ...

    def __aiter__(self) -> AsyncIterator[ReceivedChunk]: ...

    def cancel(self) -> bool: ...


LostJob = Callable[[str], None]
"""Told the id of a job the worker no longer holds, learnt from a request the caller had stopped waiting for."""

_CANCELLED_REMEMBERED = 1024


class Session:
    """The caller's end of one Session stream (create it inside the event loop): :meth:`on` a channel, or on
    any :class:`SessionStream`.

    ``on_lost_job`` hears of every NOT_FOUND that ends a request, whether or not anyone still reads the request:
    a restarted worker whose refusal arrives after its round decoded (cancelled by then, or about to be) would
    otherwise go unnoticed (and unreloaded) for as long as its refusals keep arriving late.
    """

    def __init__(self, stream: SessionStream, on_lost_job: LostJob | None = None) -> None:
        self._call = stream
        self.on_lost_job = on_lost_job
        self._computes: dict[int, SessionCompute] = {}
        self._cancelled: collections.OrderedDict[int, TrafficKey] = collections.OrderedDict()
        """Job ids and iterations of the requests cancelled lately, by request id, until their status arrives."""
        self._ids = itertools.count(1)
        self._outbox: asyncio.Queue[tuple[SessionCompute | None, Serialized, TrafficKey]] = asyncio.Queue()
        """What to write: the request it belongs to (not sent once ended; None: a control), the bytes, whose
        iteration they count for."""
        self._framing: int = getattr(stream, "framing_bytes", GRPC_MESSAGE_PREFIX_BYTES)
        self._write_at_once: Callable[[Serialized], bool] | None = getattr(stream, "write_now", None)
        """A link's ``write_now`` (a gRPC call has none: it is written by the writer task only)."""
        self.error: BaseException | None = None
        """Why the stream broke (None while it is open)."""
        place_with = getattr(stream, "place_with", None)  # a link can receive payloads where their consumer says
        if place_with is not None:
            place_with(self._place)
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read(), name="session-reader")
        self._writer = loop.create_task(self._write(), name="session-writer")

    @classmethod
    def on(cls, channel: grpc.aio.Channel, on_lost_job: LostJob | None = None) -> Session:
        """A new ``Worker.Session`` call on ``channel``."""
        method = channel.stream_stream(
            SESSION_METHOD, request_serializer=serialize_chunk, response_deserializer=parse_chunk
        )
        return cls(method(), on_lost_job)

    @property
    def broken(self) -> bool:
        return self.error is not None

    def compute(self, head: worker_pb2.ComputeRequest, body: bytes = b"") -> SessionCompute:
        """Send ``head`` (its ``request_id`` is set here) followed by ``body``, more ComputeRequest fields
        already serialized (the iteration's model, shared by every worker's request)."""
        request_id = next(self._ids)
        head.request_id = request_id
        compute = SessionCompute(self, request_id, head.job_id, head.iteration)
        if self.error is not None:
            compute._deliver(self.error)
            return compute
        self._computes[request_id] = compute
        data = (head.SerializeToString(), body)  # on a link, the model is not copied
        if not (self._outbox.empty() and self._write_now(data, compute.traffic_key)):
            self._outbox.put_nowait((compute, data, compute.traffic_key))
        return compute

    def _write_now(self, data: Serialized, key: TrafficKey) -> bool:
        """Write ``data`` from the caller's own step when the stream can (a link with room in its send buffer) and
        nothing waits before it: a round's requests then leave as it asks them, not after whatever the event loop
        runs before the writer task (a job's publish ran first: 1-2 ms of every iteration with no worker busy)."""
        if self._write_at_once is None or not self._write_at_once(data):
            return False
        self._sent(data, key)
        return True

    def _sent(self, data: Serialized, key: TrafficKey) -> None:
        nbytes = serialized_size(data) + self._framing
        TRAFFIC.add(key, sent=nbytes)
        metrics.COMPUTE_BYTES_SENT.inc(nbytes)

    def _place(self, meta: worker_pb2.GradientChunk, nbytes: int) -> memoryview | None:
        compute = self._computes.get(meta.request_id)
        if compute is None or compute.ended or compute.place is None:
            return None
        return compute.place(meta, nbytes)

    def _cancel(self, request_id: int) -> None:
        compute = self._computes.pop(request_id, None)
        if compute is not None and self.error is None:
            self._cancelled[request_id] = compute.traffic_key
            if len(self._cancelled) > _CANCELLED_REMEMBERED:
                self._cancelled.popitem(last=False)
            cancel = worker_pb2.ComputeRequest(request_id=request_id, cancel=True).SerializeToString()
            self._outbox.put_nowait((None, cancel, compute.traffic_key))

    def _promote(self, request_id: int, key: TrafficKey) -> None:
        if self.error is None:
            promote = worker_pb2.ComputeRequest(request_id=request_id, promote=True).SerializeToString()
            self._outbox.put_nowait((None, promote, key))

    async def _write(self) -> None:
        while True:
            compute, data, key = await self._outbox.get()
            ended = compute is not None and compute.ended
            del compute  # waiting for the next, the writer holds no request (nor the round its callbacks lead to)
            if ended:
                continue  # cancelled before its turn: not sent at all
            try:
                await self._call.write(data)
                self._sent(data, key)
            except Exception as exc:  # the stream broke
                if not isinstance(exc, (grpc.aio.AioRpcError, CallError)):  # the reader breaks it, with its status
                    await asyncio.wait({self._reader}, timeout=1.0)
                self._break(exc)  # (no-op once the reader has)
                return

    async def _read(self) -> None:
        try:
            async for chunk in self._call:
                self._take(chunk)
                del chunk  # not held while the next is awaited: a chunk placed in its message is a view of it
            self._break(CallError(grpc.StatusCode.UNAVAILABLE, "the worker closed the session"))
        except (grpc.aio.AioRpcError, CallError) as exc:
            self._break(exc)
        except asyncio.CancelledError:
            self._break(CallError(grpc.StatusCode.CANCELLED, "the session was closed"))
            raise
        except Exception as exc:  # a malformed chunk: nothing on this stream can be trusted any more
            self._break(exc)
            self._call.cancel()

    def _take(self, chunk: ReceivedChunk) -> None:
        """One chunk from the worker: to its request, as news of it, or as its end."""
        compute = self._computes.get(chunk.meta.request_id)
        self._count(chunk, compute)
        if compute is None:  # the rest of a cancelled request
            if chunk.meta.HasField("status"):
                self._late_status(chunk.meta.request_id, chunk.meta.status)
            return
        if chunk.meta.started:  # news of the computation, not part of a message
            compute.started = True
            if compute.on_started is not None:
                compute.on_started()
            return
        if chunk.meta.ready:  # a held backup's messages wait to be pulled
            compute.ready = True
            if compute.on_ready is not None:
                compute.on_ready()
            return
        if not chunk.meta.HasField("status"):
            compute._deliver(chunk)
            return
        del self._computes[chunk.meta.request_id]
        status = chunk.meta.status
        if status.code == 0:
            if chunk.meta.HasField("header") or chunk.meta.HasField("trailer"):
                compute._deliver(chunk)  # the last message's last chunk carries the status
            compute._deliver(_END)
        else:
            self._tell_lost(compute.job_id, status)
            compute._deliver(CallError.from_status(status))

    def _count(self, chunk: ReceivedChunk, compute: SessionCompute | None) -> None:
        """Count a chunk's bytes for its request's job (a cancelled request's too, while remembered)."""
        nbytes = chunk.nbytes + self._framing
        metrics.COMPUTE_BYTES_RECEIVED.inc(nbytes)
        key = compute.traffic_key if compute is not None else self._cancelled.get(chunk.meta.request_id)
        if key is not None:
            TRAFFIC.add(key, received=nbytes)

    def _late_status(self, request_id: int, status: worker_pb2.CallStatus) -> None:
        key = self._cancelled.pop(request_id, None)
        if key is not None:
            self._tell_lost(key[0], status)

    def _tell_lost(self, job_id: str, status: worker_pb2.CallStatus) -> None:
        if status.code == grpc.StatusCode.NOT_FOUND.value[0] and self.on_lost_job is not None:
            self.on_lost_job(job_id)

    def _break(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        self._writer.cancel()  # nothing more goes out on a broken stream
        computes, self._computes = self._computes, {}
        for compute in computes.values():
            compute._deliver(error)

    def close(self) -> None:
        """Cancel the stream (the worker stops every computation on it) and fail what is under way."""
        self._break(CallError(grpc.StatusCode.CANCELLED, "the session was closed"))
        self._call.cancel()


LinkOpener = Callable[[], Awaitable[SessionStream]]
"""Opens a link to a worker (:func:`gradcode.common.transport.link.open_link` with its channel, address and
security)."""


class Caller:
    """A worker's Computes on ``channel``: over a :class:`Session` opened on first use and again after it broke.

    With ``link``, a link to the worker is opened in the background when the first session is; once it is up,
    Computes go over it (a Session without gRPC on the data path) and the gRPC session is used again only while
    no link is up. A worker without links (an older version, ``--link-port off``, a link port the network
    does not let through) keeps the gRPC session. A worker that answers a Session UNIMPLEMENTED (older still)
    gets its request again as a Compute call, and Compute calls from then on. Create it inside the event loop.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        name: str = "the worker",
        link: LinkOpener | None = None,
        on_lost_job: LostJob | None = None,
    ) -> None:
        self.channel = channel
        self.on_lost_job = on_lost_job
        """Passed to every :class:`Session` this caller opens."""
        self.name = name
        """Who answers on ``channel``, for logs."""
        self.serves_sessions: bool | None = None
        """Whether the worker serves Worker.Session (None: not known yet; False: it answered UNIMPLEMENTED)."""
        self.serves_links: bool | None = None if link is not None else False
        """Whether Computes go over a link (None: not known yet; False: not asked for, or the worker has none)."""
        self._link = link
        self._linked: Session | None = None
        self._dialing: asyncio.Task[None] | None = None
        self._session: Session | None = None
        self._compute_call = compute_stream(channel)

    def compute(self, head: worker_pb2.ComputeRequest, body: bytes = b"") -> ChunkStream:
        """One Compute: ``head``, the worker's own fields, followed by ``body``, more fields already serialized
        (the iteration's model, the same for every worker; protobuf concatenation merges them)."""
        if self._linked is not None and not self._linked.broken:
            return self._linked.compute(head, body)
        if self.serves_sessions is False:
            return _CountedCall(self._compute_call, head.SerializeToString() + body, (head.job_id, head.iteration))
        if self._session is None or self._session.broken:
            self._session = Session.on(self.channel, self.on_lost_job)
        if self.serves_links is not False and self._dialing is None:
            self._dialing = asyncio.get_running_loop().create_task(self._dial(), name="link-dial")
        if self.serves_sessions:
            return self._session.compute(head, body)
        return _FirstCompute(self, self._session.compute(head, body), head, body)

    def call(self, head: worker_pb2.ComputeRequest, body: bytes = b"") -> ChunkStream:
        """One Compute as a call of its own on the channel (a new HTTP/2 stream), off the session and the link: how a
        request that went unanswered on them is asked again. ``head`` is not changed."""
        request = worker_pb2.ComputeRequest()
        request.CopyFrom(head)
        request.ClearField("request_id")  # a call, not a Session request: no in-band status
        request.report_start = False
        request.hold = False  # a call cannot be promoted: it sends its messages
        return _CountedCall(self._compute_call, request.SerializeToString() + body, (head.job_id, head.iteration))

    async def _dial(self) -> None:
        assert self._link is not None
        try:
            self._linked = Session(await self._link(), self.on_lost_job)
            self.serves_links = True
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
                log.info("%s serves no link (%s): its gRPC Session carries the Computes", self.name, exc.details())
                self.serves_links = False
            # else (the worker is down, say): the next session dials again
        except Exception as exc:  # the offered port not reachable, TLS refused, the hello refused
            log.warning(
                "%s: no link (%s: %s); Computes go over its gRPC Session. Let the master reach the worker's link "
                "port (its --link-port), or turn links off (--link off) to silence this.",
                self.name, type(exc).__name__, exc,
            )  # fmt: skip
            self.serves_links = False
        finally:
            self._dialing = None

    def close(self) -> None:
        """Close the sessions and the link, if open (what runs on them fails with CANCELLED)."""
        if self._dialing is not None:
            self._dialing.cancel()
        for session in (self._linked, self._session):
            if session is not None:
                session.close()
        self._linked = self._session = None


class _CountedCall:
    """A Compute call (``call``, with the serialized request) whose bytes count in :data:`TRAFFIC` as they go."""

    def __init__(self, call: Callable[[bytes], Any], request: bytes, key: TrafficKey) -> None:
        self.traffic_key = key
        self.inner: ChunkStream = call(request)
        nbytes = len(request) + GRPC_MESSAGE_PREFIX_BYTES
        TRAFFIC.add(key, sent=nbytes)
        metrics.COMPUTE_BYTES_SENT.inc(nbytes)

    def __aiter__(self) -> AsyncIterator[worker_pb2.GradientChunk | ReceivedChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[worker_pb2.GradientChunk | ReceivedChunk]:
        async for chunk in self.inner:
            if isinstance(chunk, ReceivedChunk):
                nbytes = chunk.nbytes + GRPC_MESSAGE_PREFIX_BYTES
                TRAFFIC.add(self.traffic_key, received=nbytes)
                metrics.COMPUTE_BYTES_RECEIVED.inc(nbytes)
            yield chunk

    def cancel(self) -> bool:
        return self.inner.cancel()


class _FirstCompute:
    """A Compute on a worker not yet known to serve Session: if it answers UNIMPLEMENTED, the same request goes
    as a Compute call (see :class:`Caller`). Until then it is the Session request, and its start, ready notice and
    promotion are the request's (:class:`ReportsStart`, :class:`Holds`, :class:`Promotable`): the first round a
    worker is asked in can time its start and promote or pull it like any other."""

    def __init__(self, caller: Caller, first: SessionCompute, head: worker_pb2.ComputeRequest, body: bytes) -> None:
        self.caller = caller
        self.first = first
        self.inner: ChunkStream = first
        self.request = (head, body)

    @property
    def started(self) -> bool:
        return self.first.started

    @property
    def on_started(self) -> Callable[[], None] | None:
        return self.first.on_started

    @on_started.setter
    def on_started(self, callback: Callable[[], None] | None) -> None:
        self.first.on_started = callback

    @property
    def ready(self) -> bool:
        return self.first.ready

    @property
    def on_ready(self) -> Callable[[], None] | None:
        return self.first.on_ready

    @on_ready.setter
    def on_ready(self, callback: Callable[[], None] | None) -> None:
        self.first.on_ready = callback

    def promote(self) -> None:
        """Promote the Session request (a Compute call it fell back to sends its messages unasked)."""
        self.first.promote()

    def __aiter__(self) -> AsyncIterator[worker_pb2.GradientChunk | ReceivedChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[worker_pb2.GradientChunk | ReceivedChunk]:
        try:
            async for chunk in self.inner:
                self.caller.serves_sessions = True
                yield chunk
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.info("%s has no Worker.Session (an older version?): Compute calls instead", self.caller.name)
            self.caller.serves_sessions = False
            self.inner = self.caller.compute(*self.request)
            async for chunk in self.inner:
                yield chunk
            return
        self.caller.serves_sessions = True

    def cancel(self) -> bool:
        return self.inner.cancel()


MAX_SESSION_REQUESTS = 1024
"""Requests one Session may have running at once; one more is refused (RESOURCE_EXHAUSTED) until some end. A
master asks each worker for at most a few requests per job it holds (a worker holds at most 16 by default)."""
_ENDED_REMEMBERED = 1024
"""Ids of a Session's requests that ended lately, remembered to tell a late cancel (a race with the end, ignored)
from one naming no request, and to refuse an id used again."""


class SessionProtocolError(GradcodeError, ValueError):
    """The caller broke the Session stream itself (a message that is not a ComputeRequest): it ends with
    INVALID_ARGUMENT saying so; the worker keeps serving its other streams."""


def control_problem(request: worker_pb2.ComputeRequest) -> str | None:
    """What is wrong with a cancel or promote request (None: nothing): it names a request by a non-zero id and
    carries nothing else."""
    if request.request_id == 0:
        return "names request id 0; name the running request to cancel or promote by its request_id"
    if request.cancel and request.promote:
        return "sets both cancel and promote; send one of them"
    minimal = worker_pb2.ComputeRequest(request_id=request.request_id, cancel=request.cancel, promote=request.promote)
    if request.ByteSize() != minimal.ByteSize():
        return "carries fields of a computation; a cancel or promote sets only request_id and cancel or promote"
    return None


Computation = Callable[[worker_pb2.ComputeRequest], AsyncIterator[Serialized]]
"""A worker's Compute: the serialized chunks answering one request, tagged with its ``request_id``, the last
one carrying its OK status (:func:`status_chunk`, or a message's last chunk with ``status`` set); it raises a
gradcode refusal (:data:`gradcode.common.transport.status.STATUS_CODES`) to end with that status instead."""


async def serve_session(
    requests: AsyncIterator[worker_pb2.ComputeRequest],
    write: Callable[[Serialized], Any],
    computation: Computation,
    closing: asyncio.Event,
    promote: Callable[[worker_pb2.ComputeRequest], None] | None = None,
    *,
    write_now: Callable[[Serialized], bool] | None = None,
) -> None:
    """The worker's end of a Session: each request runs as its own task of ``computation``; its chunks, then its
    status, go out through one writer (``write`` is the stream's ``context.write``), or straight from the request's
    task when nothing waits before them and ``write_now`` (a link's) takes them at once. A ``promote`` request is
    passed to ``promote`` as the running request it names.

    Every request is answered by a status for its ``request_id``: a computation's own (its last chunk), CANCELLED
    for a computation the caller cancelled, or a refusal of a malformed request (INVALID_ARGUMENT: id 0 or used
    before, a cancel or promote that is not one (:func:`control_problem`) or names no request of the stream;
    RESOURCE_EXHAUSTED beyond :data:`MAX_SESSION_REQUESTS` running). A cancel or promote of a request that ended
    lately is a race with its end, not an error: its status is already on its way, so nothing more is sent.

    Returns when the caller closes its side (every computation still running is cancelled then), or once
    ``closing`` is set (the worker is shutting down: new requests are no longer read, the running ones finish
    and are sent, and the stream ends; the caller sees UNAVAILABLE and its next session is refused). Raises
    :class:`SessionProtocolError` when ``requests`` fails (a message that is not a ComputeRequest): every
    computation is cancelled, and the stream's owner ends it with that refusal.
    """
    await _SessionServer(write, computation, promote, write_now).serve(requests, closing)


class _SessionServer:
    """:func:`serve_session`'s state and steps: the requests running, those ended lately, and one writer."""

    def __init__(
        self,
        write: Callable[[Serialized], Any],
        computation: Computation,
        promote: Callable[[worker_pb2.ComputeRequest], None] | None,
        write_now: Callable[[Serialized], bool] | None = None,
    ) -> None:
        self.write = write
        self.write_now = write_now
        self.writing = False
        """The writer task has taken a chunk and not yet finished writing it (a chunk written now would pass it)."""
        self.computation = computation
        self.promote = promote
        self.outbox: asyncio.Queue[tuple[asyncio.Task[None] | None, Serialized | None]] = asyncio.Queue()
        self.running: dict[int, tuple[asyncio.Task[None], worker_pb2.ComputeRequest]] = {}
        """The running requests and their tasks, by id."""
        self.ended: collections.OrderedDict[int, None] = collections.OrderedDict()
        """Ids of the requests that ended lately, oldest first."""
        self.loop = asyncio.get_running_loop()

    def answer(self, request_id: int, code: grpc.StatusCode, message: str) -> None:
        """End request ``request_id`` with ``code`` (cancelling its computation if it runs): its one status."""
        cancelled = self.running.pop(request_id, None)
        if cancelled is not None:
            cancelled[0].cancel()  # its own chunks, and status, are not sent any more
        self.remember(request_id)
        self.outbox.put_nowait((None, status_chunk(request_id, code, message)))

    def remember(self, request_id: int) -> None:
        ended = self.ended
        ended[request_id] = None
        ended.move_to_end(request_id)
        if len(ended) > _ENDED_REMEMBERED:
            ended.popitem(last=False)

    async def run(self, request: worker_pb2.ComputeRequest) -> None:
        request_id = int(request.request_id)
        task = asyncio.current_task()
        try:
            async for chunk in self.computation(request):
                self.send_or_queue(task, chunk)
        except Exception as exc:
            code = status_code(exc)
            if code is None:
                log.exception("Session request %d failed", request_id)
                code = grpc.StatusCode.UNKNOWN
            lost = getattr(exc, "children_lost", ())
            self.outbox.put_nowait((task, status_chunk(request_id, code, str(exc), lost)))
        finally:
            if request_id in self.running and self.running[request_id][0] is task:
                del self.running[request_id]
                self.remember(request_id)

    def send_or_queue(self, task: asyncio.Task[None] | None, chunk: Serialized) -> None:
        """Write ``chunk`` now if nothing waits before it and the stream takes it at once (a message leaves as it is
        made, not after what the event loop runs before the writer task); else queue it for the writer."""
        idle = self.outbox.empty() and not self.writing
        if not (idle and self.write_now is not None and self.write_now(chunk)):
            self.outbox.put_nowait((task, chunk))

    async def send(self) -> None:
        while True:
            task, chunk = await self.outbox.get()
            if chunk is None:
                return
            if task is None or not (task.cancelling() or task.cancelled()):  # cancelled: the caller wants no more
                self.writing = True
                try:
                    await self.write(chunk)
                finally:
                    self.writing = False

    async def read(self, requests: AsyncIterator[worker_pb2.ComputeRequest]) -> None:
        async for request in requests:
            request_id = int(request.request_id)
            if request.cancel or request.promote:
                self.control(request, request_id)
            else:
                self.start(request, request_id)

    def start(self, request: worker_pb2.ComputeRequest, request_id: int) -> None:
        """Run a computation request, unless its id is taken or too many run."""
        if request_id == 0 or request_id in self.running or request_id in self.ended:
            message = f"Session request id {request_id} is 0 or already used; give each request a new id."
            self.outbox.put_nowait((None, status_chunk(request_id, grpc.StatusCode.INVALID_ARGUMENT, message)))
        elif len(self.running) >= MAX_SESSION_REQUESTS:
            message = (
                f"Session request {request_id} refused: {MAX_SESSION_REQUESTS} requests already run on this "
                "session, its limit; wait for some to end, or cancel them."
            )
            self.outbox.put_nowait((None, status_chunk(request_id, grpc.StatusCode.RESOURCE_EXHAUSTED, message)))
        else:
            task = self.loop.create_task(self.run(request), name=f"session-request-{request_id}")
            self.running[request_id] = (task, request)

    def control(self, request: worker_pb2.ComputeRequest, request_id: int) -> None:
        kind = "cancel" if request.cancel else "promote"
        problem = control_problem(request)
        if problem is not None:
            self.answer(request_id, grpc.StatusCode.INVALID_ARGUMENT, f"Session {kind} request {problem}.")
        elif request_id in self.running:
            if request.cancel:
                message = f"Session request {request_id} cancelled by the caller."
                self.answer(request_id, grpc.StatusCode.CANCELLED, message)
            elif self.promote is not None:
                self.promote(self.running[request_id][1])
        elif request_id not in self.ended:
            message = f"Session {kind} request names request {request_id}, which this session never ran."
            self.answer(request_id, grpc.StatusCode.INVALID_ARGUMENT, message)

    async def serve(self, requests: AsyncIterator[worker_pb2.ComputeRequest], closing: asyncio.Event) -> None:
        """Read and run requests until the caller closes its side, ``requests`` fails, or ``closing`` is set."""
        loop = self.loop
        writer = loop.create_task(self.send(), name="session-writer")
        reader = loop.create_task(self.read(requests), name="session-reader")
        shutdown = loop.create_task(closing.wait(), name="session-closing")
        try:
            await asyncio.wait({reader, shutdown}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not reader.cancelled() and isinstance(reader.exception(), DecodeError):
                raise SessionProtocolError(
                    "A Session message is not a ComputeRequest (its bytes do not parse); the session ends here."
                )
            if shutdown.done():
                reader.cancel()
                await asyncio.gather(*(task for task, _ in self.running.values()), return_exceptions=True)
                self.outbox.put_nowait((None, None))
                await writer
        finally:
            for task in (reader, shutdown, *(task for task, _ in self.running.values()), writer):
                task.cancel()
