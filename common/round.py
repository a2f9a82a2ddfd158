"""One iteration's gather-and-decode: the round the master and every tree parent run.

A :class:`Round` owns everything about one iteration's gather: the scheme's online decoder, the messages
received so far, when each worker finished, which ones failed and why (a typed :class:`WorkerFailure`,
never a string to parse back), and the decoding. :meth:`Round.gather` starts one Compute per
:class:`Source` (a worker or a child; a request on its Session), reassembles and validates the messages
as they arrive, feeds each to the decoder and stops at the first decodable moment: every Compute still
running is cancelled (the cancellation reaches the worker, which abandons its stale computation) as soon
as the caller's synchronous work after the gather is done, and no late message can leak into a later
iteration.

A caller may call :meth:`Round.gather` again on the same round with other sources (the master's retry
policy asks workers that came back); what already arrived is kept. A caller that wants surplus
messages (consistency checks) passes ``enough``: the gather then goes on past the first decodable
moment until ``enough()`` says so. :meth:`Round.decode` then combines the decodable set into a
:class:`Decoded` without changing the round.

Every decode carries an error certificate (:meth:`Decoding.certify
<gradcode.common.codes.base.Decoding.certify>`): a bound on the relative error of the decoded
gradient from the decoding weights, the code's rows, the norms of the messages it combined (each
accumulated in float64 while its chunks arrived), the magnitudes $\\sum_j |b_j| \\|g_j\\|$ the senders report in
their trailers (a message of several partitions without one cannot be certified: the decode is then not exact)
and the errors senders certify for their own messages (a leaf summing several partitions, a tree parent:
``decode_error``). The decode is ``exact`` only when that bound is
within the round's tolerance (:func:`decode_tolerance`) and no message it used was flagged approximate by a
tree parent.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from gradcode.common.codes.base import Array, Decoding, OnlineDecoder
from gradcode.common.codes.consistency import decode_excluding
from gradcode.common.codes.numerics import relative_bound
from gradcode.common.session import CallError, ChunkStream, SessionCompute
from gradcode.common.shared_memory import SharedDirectory
from gradcode.common.wire import (
    CompletedMessage,
    MessageAssembler,
    ReceivedChunk,
    WireError,
    children_lost_from_metadata,
)
from gradcode.v1 import worker_pb2

__all__ = [
    "EXACT_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "HOLD_OVERDUE_FACTOR",
    "Certified",
    "ChunkStream",
    "Decoded",
    "Integrity",
    "Round",
    "Source",
    "WorkerFailure",
    "decode_tolerance",
]

EXACT_TOLERANCE = 1e-9
"""Largest certified relative error of a decode called exact (float64 and complex128 messages)."""
FLOAT32_TOLERANCE = 1e-5
"""The same bound when the workers send float32 messages."""


HOLD_OVERDUE_FACTOR = 2.0
"""A held backup that is ready is pulled when an expected worker is still out this many times the round's time to
the latest expected worker that finished (:meth:`Round._overdue_at`)."""


def decode_tolerance(dtype: np.dtype[Any] | type) -> float:
    """The relative error a decode of messages of ``dtype`` may have and still be called exact."""
    return FLOAT32_TOLERANCE if np.dtype(dtype) == np.float32 else EXACT_TOLERANCE


@dataclass(frozen=True)
class Source:
    """One worker to ask: its id, the rows it computes this iteration, how to open its stream, and whether its
    messages come through the round's shared-memory directory."""

    worker_id: int
    rows: tuple[int, ...]
    open: Callable[[], ChunkStream]
    shared: bool = False
    """The call asks for shared-memory payloads (its request carries ``shared_model``)."""
    backup: bool = False
    """The call asks a backup (``ComputeRequest.backup``): the round expects to decode without it."""


@dataclass(frozen=True)
class WorkerFailure:
    """Why a worker gave no usable answer this round.

    ``status`` is the gRPC status its call ended with (None when it failed otherwise: a malformed
    message, a broken stream, or ``down`` when it was not asked because it is DOWN); ``error`` names the
    exception type in that case. ``str()`` reads ``"STATUS: details"`` for people.
    """

    details: str
    status: grpc.StatusCode | None = None
    error: str = ""
    down: bool = False
    children_lost: tuple[int, ...] = ()
    """A failed tree parent's children that lost the job (its error's trailing metadata)."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> WorkerFailure:
        if isinstance(exc, grpc.aio.AioRpcError):
            lost = children_lost_from_metadata(exc.trailing_metadata())
            return cls(details=str(exc.details()), status=exc.code(), children_lost=lost)
        if isinstance(exc, CallError):
            return cls(details=exc.details, status=exc.code, children_lost=exc.children_lost)
        return cls(details=str(exc), error=type(exc).__name__)

    @classmethod
    def worker_down(cls, reason: str) -> WorkerFailure:
        return cls(details=reason, down=True)

    def __str__(self) -> str:
        label = "DOWN" if self.down else self.status.name if self.status is not None else self.error
        return f"{label}: {self.details}"


@dataclass(frozen=True)
class Integrity:
    """What the consistency checks of a round's surplus messages found (the receiver's policy sets it).

    ``checks`` counts the independent linear relations checked (0: none); ``suspects`` are the workers
    whose messages broke them; ``trusted`` is False when a violation remains that the decode could not
    be cleared of, or when the decode used rows no relation checks (the decode is then not exact);
    ``note`` says it in words for reports and logs.
    """

    checks: int = 0
    suspects: tuple[int, ...] = ()
    trusted: bool = True
    note: str = "not checked"
    unchecked: tuple[int, ...] = ()
    """Workers whose rows the decode used and no relation covers (a checking policy then calls it not exact)."""
    lie_bound: float = 0.0
    """Absolute error an undetected lie of one worker could add to the decode (added to its certificate)."""
    singled_out: int | None = None
    """The worker the checks singled out (the decode leaves it out when the others decode)."""
    quarantined: tuple[int, ...] = ()
    """Workers the policy quarantined in this round."""


@dataclass(frozen=True)
class Decoded:
    """A round's combined gradient and what it rests on."""

    vector: Array
    exact: bool
    """The decoding is exact by construction, its certified error bound is within the round's tolerance,
    no message it uses was itself decoded approximately (by a tree parent), and the consistency checks
    (if any) left it trusted."""
    error_bound: float
    """Certified relative error of the gradient part (``inf``: nothing could be certified)."""
    absolute_error: float
    """Certified absolute error (Euclidean norm) of the gradient part: what a tree parent passes up."""
    used_workers: list[int]
    rows: tuple[int, ...]
    decode_seconds: float
    """Online decoding while gathering plus the combine."""
    magnitude: float = math.inf
    r"""$\sum_i |a_i| \mu_i$, a bound on $\sum_j |c_j| \|g_j\|$ of the decoded combination (what a tree parent
    reports up for it); ``inf`` when not known."""
    norm: float = math.nan
    """Euclidean norm of the gradient part of :attr:`vector`."""


@dataclass(frozen=True)
class Certified:
    """What :meth:`Round.certify` found: relative and absolute bounds, the combination's magnitude and norm."""

    bound: float
    absolute: float
    magnitude: float
    norm: float


Received = ReceivedChunk | worker_pb2.GradientChunk
"""A chunk as a stream yields it."""


class _Ready:
    """Queued in a gather when a held backup says its messages are ready (:attr:`SessionCompute.ready`)."""


_READY = _Ready()

_finishing: set[asyncio.Task[None]] = set()
"""Stream tasks a gather cancelled (or that wait for an end of stream), held until they end."""


def _let_finish(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Let the gather's stream tasks end on their own instead of awaiting them.

    Awaiting the cancelled streams of late workers put their teardown (0.2 ms median, 1 ms p90 with
    one late worker; more with several) between the first decodable moment and the step. The tasks
    only touch the gather's own queue, so nothing of this round changes after it returns.
    """
    for task in tasks:
        if not task.done():
            _finishing.add(task)
            task.add_done_callback(_finishing.discard)


def _cancel_late(streams: Iterable[ChunkStream], tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the late workers' streams (the cancellation reaches the worker) and their pump tasks.

    :meth:`Round.gather` schedules this instead of doing it on its way out: the caller's synchronous work
    after a decodable gather (decode, step) comes first. Cancelling two gRPC streams and their tasks took
    0.5 ms (median; 0.7 ms p90, one process, idle 2-core machine), which stood between the first decodable
    moment and the step. It still runs before the caller's next await can
    start anything else (the next round's calls go out after it), and nothing of the round changes meanwhile:
    only :meth:`Round.gather`'s loop reads the queue the pumps fill.
    """
    for stream in streams:
        stream.cancel()
    for task in tasks:
        task.cancel()


class Round:
    """One iteration's gather: decoder, received messages, timings, failures and decoding.

    ``finished`` maps each worker that delivered every requested row to its seconds since the round
    started; ``failed`` the workers whose last attempt failed; ``late`` the workers still running
    when the last :meth:`gather` ended (cancelled then), of which ``stragglers`` are the ones it expected;
    ``backups`` the workers asked as backups and ``promoted`` those of them promoted.
    """

    def __init__(
        self,
        decoder: OnlineDecoder,
        *,
        job_id: str,
        iteration: int,
        length: int,
        dtypes: tuple[np.dtype[Any], ...] = (np.dtype("<f8"),),
        started: float | None = None,
        certified_length: int | None = None,
        tolerance: float | None = None,
        shared: SharedDirectory | None = None,
    ) -> None:
        self.decoder = decoder
        self.shared = shared
        """Where the sources with ``shared`` leave their payloads (:mod:`gradcode.common.shared_memory`)."""
        self.job_id = job_id
        self.iteration = iteration
        self.length = length
        self.dtypes = dtypes
        self.certified_length = length if certified_length is None else certified_length
        """Leading elements of a message the certificate covers: the gradient, not the appended statistics."""
        self.tolerance = decode_tolerance(dtypes[0]) if tolerance is None else tolerance
        """Largest certified relative error of a decode called exact."""
        self.started = time.perf_counter() if started is None else started
        """``time.perf_counter()`` when the iteration started (default: now); :attr:`finished` counts from it."""
        self.messages: dict[int, CompletedMessage] = {}
        self.finished: dict[int, float] = {}
        self.failed: dict[int, WorkerFailure] = {}
        self.late: list[int] = []
        self.stragglers: list[int] = []
        self.backups: set[int] = set()
        self.promoted: set[int] = set()
        self.reasked: set[int] = set()
        """Workers asked again in this round because nothing came from them (:meth:`gather`'s ``reask_after``)."""
        self._join: Callable[[Source], None] | None = None
        """Adds a source to the gather under way (None: no gather is)."""
        self.decoding: Decoding | None = None
        self.excluded: set[int] = set()
        """Workers whose messages the decoding leaves out (:meth:`exclude`)."""
        self.integrity = Integrity()
        self.timed_out = False
        self.gather_decode_seconds = 0.0

    @property
    def decodable(self) -> bool:
        return self.decoding is not None

    @property
    def approximate_messages(self) -> bool:
        """True when a message the decoding uses was itself decoded approximately (by a tree parent)."""
        return self.decoding is not None and any(self.messages[r].approximate for r in self.decoding.rows)

    @property
    def used_workers(self) -> list[int]:
        """Workers whose messages the decoding uses."""
        if self.decoding is None:
            return []
        return sorted({self.messages[r].worker_id for r in self.decoding.rows})

    def fail(self, worker_id: int, failure: WorkerFailure) -> None:
        """Record a failure found outside a gather (a worker that is DOWN), unless one is known already."""
        self.failed.setdefault(worker_id, failure)

    def exclude(self, workers: Iterable[int]) -> bool:
        """Decode without the messages of ``workers`` (e.g. a worker the consistency checks singled out).

        Returns False, leaving the decoding as it was, when the other messages are not decodable.
        """
        if self.decoding is None:
            raise ValueError("Nothing to exclude from: the gather did not reach a decodable set.")
        left_out = set(workers)
        decoding = decode_excluding(self.decoder.code, self.messages, left_out, self.decoder.assignment)
        if decoding is None:
            return False
        self.decoding = decoding
        self.excluded |= left_out
        return True

    def combine(self) -> Array:
        """The decoded gradient: the decoding's combination of the received messages."""
        if self.decoding is None:
            raise ValueError("Nothing to combine: the gather did not reach a decodable set.")
        return self.decoding.combine({r: m.vector for r, m in self.messages.items()})

    def certify(self, vector: Array) -> Certified:
        """Certified error of ``vector``'s gradient part, the decoding's combination (:class:`Certified`).

        From each message's norm, its sender's reported magnitude (a message of several partitions without one
        cannot be certified: the bound is then infinite) and, where the sender certified its message's error
        itself (a leaf summing several partitions, a tree parent: ``decode_error``), that error in place of the
        receiver's estimate of it.
        """
        if self.decoding is None:
            raise ValueError("Nothing to certify: the gather did not reach a decodable set.")
        rows = self.decoding.rows
        norms = [self.messages[r].norm for r in rows]
        combined = float(np.linalg.norm(vector[: self.certified_length]))
        dtype = np.result_type(*(self.messages[r].vector.dtype for r in rows))
        magnitudes = [self.messages[r].magnitude for r in rows]
        certificate = self.decoding.certify(
            norms, combined, dtype=dtype, magnitudes=magnitudes, length=min(self.certified_length, self.length),
            sender_errors=[self.messages[r].decode_error for r in rows],
        )  # fmt: skip
        return Certified(certificate.bound, certificate.absolute, certificate.magnitude, combined)

    def decode(self) -> Decoded:
        """:meth:`combine` and its certificate, timed, with what the decoding rests on."""
        if self.decoding is None:
            raise ValueError("Nothing to decode: the gather did not reach a decodable set.")
        started = time.perf_counter()
        vector = self.combine()
        certified = self.certify(vector)
        bound, absolute = certified.bound, certified.absolute
        if self.integrity.lie_bound > 0:  # what the checks could have missed counts as error too
            absolute += self.integrity.lie_bound
            bound = relative_bound(absolute, certified.norm)
        seconds = self.gather_decode_seconds + time.perf_counter() - started
        exact = (
            self.decoding.exact and bound <= self.tolerance and not self.approximate_messages and self.integrity.trusted
        )
        return Decoded(
            vector, exact, bound, absolute, self.used_workers, tuple(self.decoding.rows), seconds,
            magnitude=certified.magnitude, norm=certified.norm,
        )  # fmt: skip

    def join(self, source: Source) -> bool:
        """Ask ``source`` too, in the gather under way (a worker that became able to answer meanwhile: reloaded
        after it lost the job, say); False when no gather is under way (ask it in the next one)."""
        if self._join is None:
            return False
        self._join(source)
        return True

    def _shared_reader(self, source: Source) -> Callable[[int, np.dtype[Any], int], Array] | None:
        if not source.shared or self.shared is None:
            return None
        return functools.partial(self.shared.message, source.worker_id)

    def _promote_completing(
        self,
        backups: Iterable[int],
        computing: Iterable[int],
        streams: dict[int, ChunkStream],
        first: Collection[int] = (),
    ) -> None:
        """Promote the ``backups`` that complete the messages of the workers that answered and of those still
        ``computing`` (a minimal set), preferring those in ``first`` (held backups whose messages are ready), then
        those promoted already."""
        decoder = self.decoder
        given = [*self.finished, *computing]
        preference = sorted(backups, key=lambda w: (w not in first, w not in self.promoted, w))
        chosen = decoder.code.decoding_set(decoder.assignment, preference, given=given) or ()
        self._promote(chosen, streams)

    def _overdue_at(self, backups: Collection[int]) -> float | None:
        """When the (at most ``s``) expected workers still out are overdue, the moment a held backup that is ready
        gets pulled (:meth:`gather`): :data:`HOLD_OVERDUE_FACTOR` times the round's time to the latest expected
        worker that finished, on :func:`time.perf_counter`'s clock; None before any has finished (the hedge
        covers that).

        A simple rule on purpose (a backup strategy could own it): the expected workers share the receiver's
        link, so on a slow link the last of them finishes up to one message's transfer after the one before;
        twice the time the others took is past that, yet a frozen worker (one that began, so the rules before
        hold wait for it) costs at most that time plus the pulled message's transfer, instead of the hedge's
        twice the median round."""
        times = [t for w, t in self.finished.items() if w not in backups]
        return self.started + HOLD_OVERDUE_FACTOR * max(times) if times else None

    def _promote(self, backups: Iterable[int], streams: dict[int, ChunkStream]) -> None:
        for w in backups:
            stream = streams.get(w)
            if w not in self.promoted and isinstance(stream, SessionCompute):
                stream.promote()
                self.promoted.add(w)

    async def gather(
        self,
        sources: list[Source],
        *,
        timeout: float | None = None,
        enough: Callable[[], bool] | None = None,
        promote_after: float | None = None,
        reask_after: Callable[[int], float | None] | None = None,
        on_failure: Callable[[int, WorkerFailure], None] | None = None,
    ) -> dict[int, WorkerFailure]:
        """Ask every source concurrently until the decoder can decode, no source is left, or ``timeout``.

        With ``enough``, a decodable round goes on gathering until ``enough()`` is true (asked after each
        new message once decodable; it may look at :attr:`messages`). Returns the failures of this
        attempt (also recorded in :attr:`failed`); on expiry :attr:`timed_out` is set.

        The sources not asked as backups (:attr:`Source.backup`) are the ones the round expects to decode from.
        When an expected worker ends without the round decoding, and at most ``s`` of the expected workers still
        out have not said their computation began (:attr:`~gradcode.common.session.SessionCompute.started`; one
        that did is finishing, not straggling), the backups that complete the messages in hand and those being
        computed (:meth:`~gradcode.common.codes.base.GradientCode.decoding_set`) are promoted: they compute on at
        normal priority, on the CPU the expected workers that answered left; should an expected worker then
        fail, the backups that complete the messages without it are promoted too. While every expected worker
        still out has begun, nothing is promoted: backups would only take its CPU. ``promote_after`` seconds after
        the round started, a round still not decodable promotes every backup still out (more than ``s`` expected
        workers may hang, or one that began may never finish). A backup asked to ``hold`` its messages computes them
        but sends only a notice that they are ready (:attr:`~gradcode.common.session.SessionCompute.ready`) until
        promoted, which pulls them: every rule above pulls the held backups it promotes, and while the round is not
        decodable, a held backup is ready and at most ``s`` expected workers are still out past :meth:`_overdue_at`,
        the backups that complete the messages in hand are pulled too, the ready ones first (once per gather).

        ``reask_after(worker)`` (the owner's policy; None: never) is how long an expected worker may stay silent: one
        from which nothing at all has come that long after it was asked, while the round is not decodable, has its
        call cancelled and its source opened again, once per gather (:attr:`reasked`): a request lost on its way
        or stuck in a worker then costs that bound, not the iteration. Backups are silent by design and never are.

        ``on_failure(worker, failure)`` hears of each failure as it comes, so the owner can act on it within the
        gather (reload a worker that lost the job, then :meth:`join` it) instead of after it; a worker that
        joins and answers has its failure taken back.
        """
        queue: asyncio.Queue[tuple[int, CompletedMessage | BaseException | _Ready | None]] = asyncio.Queue()
        streams: dict[int, ChunkStream] = {}
        tasks: dict[int, asyncio.Task[None]] = {}
        failures: dict[int, WorkerFailure] = {}
        started = time.perf_counter()
        self.timed_out = False
        heard: set[int] = set()
        """Workers from which something (a chunk, the end, a failure) came in this gather."""
        reask_at: dict[int, float] = {}
        """When each expected worker, silent until then, is asked again (once)."""

        def fail(worker_id: int, exc: BaseException) -> None:
            if worker_id in streams:  # a refused message: the worker stops, its session forgets it
                streams[worker_id].cancel()
            queue.put_nowait((worker_id, exc))

        def receive(worker_id: int, assembler: MessageAssembler, item: Received | BaseException | None) -> None:
            """One item of a worker's stream: a chunk, None at its end, or the exception that ended it."""
            heard.add(worker_id)
            if isinstance(item, BaseException):
                fail(worker_id, item)
                return
            try:
                if item is None:
                    if not assembler.complete:
                        raise WireError(f"stream ended before all rows {assembler.rows} were sent")
                    queue.put_nowait((worker_id, None))
                    return
                done = assembler.feed(item)
            except Exception as exc:
                fail(worker_id, exc)
                return
            if done is not None:
                queue.put_nowait((worker_id, done))

        async def pump(worker_id: int, assembler: MessageAssembler, stream: ChunkStream) -> None:
            try:
                async for chunk in stream:
                    receive(worker_id, assembler, chunk)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                fail(worker_id, exc)
                return
            receive(worker_id, assembler, None)

        def start(source: Source) -> None:
            """Open ``source``'s stream: a Session's chunks are received as the session reads them, another
            stream's (a Compute call) by a task that iterates it."""
            worker_id = source.worker_id
            assembler = MessageAssembler(
                job_id=self.job_id, iteration=self.iteration, worker_id=worker_id, rows=source.rows,
                length=self.length, dtypes=self.dtypes, norm_length=self.certified_length,
                shared=self._shared_reader(source),
            )  # fmt: skip
            try:
                stream = source.open()
            except Exception as exc:
                heard.add(worker_id)
                queue.put_nowait((worker_id, exc))
                return
            streams[worker_id] = stream
            if isinstance(stream, SessionCompute):  # on a link: payloads received straight into the message
                stream.place = assembler.place
                stream.on_ready = functools.partial(queue.put_nowait, (worker_id, _READY))
                stream.consume(functools.partial(receive, worker_id, assembler))
            else:
                tasks[worker_id] = asyncio.create_task(pump(worker_id, assembler, stream), name=f"gather-w{worker_id}")

        def finish(worker_id: int) -> None:
            self.finished[worker_id] = time.perf_counter() - self.started
            self.failed.pop(worker_id, None)
            failures.pop(worker_id, None)  # (one that joined again after failing)

        def ask(source: Source) -> None:
            start(source)
            by_id[source.worker_id] = source
            pending.add(source.worker_id)
            bound = None if reask_after is None or source.backup else reask_after(source.worker_id)
            if bound is not None:
                reask_at[source.worker_id] = time.perf_counter() + bound

        def join(source: Source) -> None:
            """Ask one more source (:meth:`join`), unless it is asked already or has answered."""
            w = source.worker_id
            if w not in pending and w not in self.finished:
                heard.discard(w)
                ask(source)

        def reask(now: float) -> None:
            """Cancel and reopen the calls of the expected workers silent past their bound (once each)."""
            for worker_id in [w for w, at in reask_at.items() if at <= now]:
                del reask_at[worker_id]
                if worker_id not in pending or worker_id in heard:
                    continue
                self.reasked.add(worker_id)
                old_stream, old_task = streams.pop(worker_id, None), tasks.pop(worker_id, None)
                _cancel_late([] if old_stream is None else [old_stream], [] if old_task is None else [old_task])
                _let_finish([] if old_task is None else [old_task])
                start(by_id[worker_id])

        by_id: dict[int, Source] = {}
        pending: set[int] = set()
        for source in sources:
            ask(source)
        deadline = None if timeout is None else started + timeout
        decoder = self.decoder
        backups = {source.worker_id for source in sources if source.backup}
        self.backups |= backups
        out = pending - backups if backups else set()
        """Expected workers still out: the trigger of the backups' promotion (none left: no backups to promote)."""
        hedge_at = self.started + promote_after if backups and promote_after is not None else None
        promoted = False
        """This gather has promoted the backups completing the expected workers' messages."""
        pulled = False
        """This gather has pulled held backups for overdue expected workers."""

        def done() -> bool:
            return decoder.decodable and (enough is None or enough())

        def began(worker_id: int) -> bool:
            """The worker said its computation began, or its message is arriving (a worker whose messages compute
            in a few milliseconds sends no notice; on a slow link its message streams for longer than that)."""
            if worker_id in heard:
                return True
            return isinstance(stream := streams.get(worker_id), SessionCompute) and stream.started

        def ready() -> set[int]:
            """The held backups still out whose messages wait to be pulled."""
            held = ((w, streams.get(w)) for w in pending & backups if w not in self.promoted)
            return {w for w, stream in held if isinstance(stream, SessionCompute) and stream.ready}

        self._join = join
        try:
            while pending and not done():
                now = time.perf_counter()
                if hedge_at is not None and now >= hedge_at:
                    self._promote(sorted(pending & backups), streams)
                    hedge_at = None
                holding = not pulled and not decoder.decodable and 0 < len(out) <= decoder.code.s and ready()
                pull_at = self._overdue_at(backups) if holding else None
                if pull_at is not None and now >= pull_at:  # a held backup waits, an expected worker is overdue
                    self._promote_completing(pending & backups, (), streams, first=ready())
                    pulled, pull_at = True, None
                if reask_at:
                    if decoder.decodable:  # gathering surplus (``enough``): nobody is needed any more
                        reask_at.clear()
                    elif queue.empty():
                        reask(now)
                if deadline is not None and now >= deadline:
                    self.timed_out = True
                    break
                if not queue.empty():  # items that came together: no timer to arm for each
                    worker_id, item = queue.get_nowait()
                else:
                    wake = min(
                        (t for t in (deadline, hedge_at, pull_at, *reask_at.values()) if t is not None), default=None
                    )
                    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel of the caller
                        async with asyncio.timeout(None if wake is None else wake - now):
                            worker_id, item = await queue.get()
                    except TimeoutError:
                        continue  # the hedge's, the pull's or the deadline's turn, at the top of the loop
                if isinstance(item, _Ready):
                    continue  # news for the pull rule, at the top of the loop
                if isinstance(item, CompletedMessage):
                    self.messages[item.row] = item
                    t0 = time.perf_counter()
                    decoder.add(item.row)
                    self.gather_decode_seconds += time.perf_counter() - t0
                elif item is None:
                    pending.discard(worker_id)
                    finish(worker_id)
                else:
                    pending.discard(worker_id)
                    failures[worker_id] = self.failed[worker_id] = failure = WorkerFailure.from_exception(item)
                    if on_failure is not None:
                        on_failure(worker_id, failure)
                if worker_id in out and not isinstance(item, CompletedMessage):
                    out.discard(worker_id)
                    # After the first promotion, again only when an expected worker failed (it may have been
                    # counted on as computing).
                    if not decoder.decodable and (not promoted or item is not None):
                        computing = {w for w in out if began(w)}
                        if not out or 0 < len(out - computing) <= decoder.code.s:
                            self._promote_completing(pending - out, computing, streams)
                            promoted = True
            if decoder.decodable and not self.excluded:  # (again after a gather that added surplus)
                t0 = time.perf_counter()
                self.decoding = decoder.decoding()
                self.gather_decode_seconds += time.perf_counter() - t0
        finally:
            self._join = None
            while not queue.empty():  # a refusal already here when the round became decodable is a fact all the same
                worker_id, item = queue.get_nowait()
                if isinstance(item, BaseException) and worker_id in pending:
                    pending.discard(worker_id)
                    failures[worker_id] = self.failed[worker_id] = WorkerFailure.from_exception(item)
            for w in list(pending):
                if all(r in self.messages for r in by_id[w].rows):  # delivered everything; end-of-stream not seen yet
                    pending.discard(w)
                    finish(w)
            self.late = sorted(pending)
            self.stragglers = sorted(pending - backups)
            if pending:
                late_streams = [streams[w] for w in pending if w in streams]
                late_tasks = [tasks[w] for w in pending if w in tasks]
                asyncio.get_running_loop().call_soon(_cancel_late, late_streams, late_tasks)
            _let_finish(tasks.values())
        return failures
