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
policy asks workers that came back); what already arrived is kept. The round only collects: what its owner
decides meanwhile is a :class:`GatherStrategy` handed to the gather (tree parents hand none, or integrity's wait
rule): the master's backups and hedges (:class:`gradcode.master.hedging.Hedging`), or the consistency checks'
wait for surplus messages past the first decodable moment (:class:`gradcode.common.gather.integrity.WaitForChecks`).
What a stream can do beyond yielding chunks (place payloads, say its computation began, be promoted) are
optional capabilities of :class:`~gradcode.common.transport.session.ChunkStream`. :meth:`Round.decode` then combines the
decodable set into a :class:`Decoded` without changing the round.

Every decode carries an error certificate (:meth:`Decoding.certify
<gradcode.common.codes.base.Decoding.certify>`): a bound on the relative error of the decoded
gradient from the decoding weights, the code's rows, the norms of the messages it combined (each
accumulated in float64 while its chunks arrived), the magnitudes $\\sum_j |b_j| \\|g_j\\|$ the senders report in
their trailers (a message of several partitions without one cannot be certified: the decode is then not exact)
and the errors senders certify for their own messages (a leaf summing several partitions, a tree parent:
``decode_error``). The decode is ``exact`` only when that bound is within the round's tolerance
(:func:`~gradcode.common.codes.numerics.decode_tolerance`) and no message it used was flagged approximate by a tree
parent.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

import grpc
import numpy as np

from gradcode.common.codes.base import Array, Decoding, OnlineDecoder
from gradcode.common.codes.consistency import decode_excluding
from gradcode.common.codes.numerics import CombinationBound, decode_tolerance, relative_bound
from gradcode.common.gather.clock import MONOTONIC, Clock
from gradcode.common.tasks import TaskOwner
from gradcode.common.transport.session import CallError, ChunkStream, DeliversItems, Holds, ReportsStart
from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.common.transport.wire import (
    CompletedMessage,
    MessageAssembler,
    ReceivedChunk,
    Timing,
    WireError,
    children_lost_from_metadata,
)
from gradcode.v1 import worker_pb2

__all__ = [
    "Certified",
    "ChunkStream",
    "Decoded",
    "FailureKind",
    "GatherStrategy",
    "Gathering",
    "Integrity",
    "Round",
    "Source",
    "WorkerFailure",
]


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
    subtree: frozenset[int] = frozenset()
    """The worker indices below this worker in a tree (empty for a leaf and in a flat job): the only nodes its
    messages' trailers and its failure's metadata may name (:class:`~gradcode.common.transport.wire.Subtree`)."""


class FailureKind(enum.Enum):
    """Why a worker gave no usable answer in a round: the tag of a :class:`WorkerFailure`."""

    STATUS = "status"
    """Its call ended with a gRPC status (:attr:`WorkerFailure.status`): the worker, its Session or the channel refused
    or failed it (NOT_FOUND: it restarted and lost the job, :attr:`WorkerFailure.lost_job`)."""
    MALFORMED = "malformed"
    """What it sent broke the wire contract (a :class:`~gradcode.common.exceptions.WireError`: a chunk out of order, a
    wrong shape, a non-finite value...); its stream was cancelled."""
    BROKEN = "broken"
    """Its stream ended with another exception (a connection lost, a link closed, a stream that could not open)."""
    DOWN = "down"
    """Not asked: the worker is DOWN, or quarantined (:meth:`WorkerFailure.worker_down`)."""


@dataclass(frozen=True)
class WorkerFailure:
    """Why a worker gave no usable answer this round: a :class:`FailureKind` and what goes with it.

    ``status`` is the gRPC status of a :attr:`FailureKind.STATUS` failure (None for every other kind); ``error`` names
    the exception type of a :attr:`~FailureKind.MALFORMED` or :attr:`~FailureKind.BROKEN` one. ``str()`` reads
    ``"LABEL: details"`` for people (the status's name, ``DOWN``, or the exception type's name).
    """

    kind: FailureKind
    details: str
    status: grpc.StatusCode | None = None
    error: str = ""
    children_lost: tuple[int, ...] = ()
    """A failed tree parent's children that lost the job (its error's trailing metadata)."""

    def __post_init__(self) -> None:
        if (self.kind is FailureKind.STATUS) != (self.status is not None):
            raise ValueError(f"A {self.kind.name} failure has a gRPC status exactly when its kind is STATUS; "
                             f"got status={self.status!r}.")  # fmt: skip

    @classmethod
    def from_exception(cls, exc: BaseException) -> WorkerFailure:
        """The failure an exception that ended a worker's stream (or its message's checks) stands for."""
        if isinstance(exc, grpc.aio.AioRpcError):
            lost = children_lost_from_metadata(exc.trailing_metadata())
            return cls(FailureKind.STATUS, str(exc.details()), status=exc.code(), children_lost=lost)
        if isinstance(exc, CallError):
            return cls(FailureKind.STATUS, exc.details, status=exc.code, children_lost=exc.children_lost)
        kind = FailureKind.MALFORMED if isinstance(exc, WireError) else FailureKind.BROKEN
        return cls(kind, str(exc), error=type(exc).__name__)

    @classmethod
    def worker_down(cls, reason: str) -> WorkerFailure:
        return cls(FailureKind.DOWN, reason)

    def has_status(self, code: grpc.StatusCode) -> bool:
        """A :attr:`FailureKind.STATUS` failure with status ``code``."""
        return self.kind is FailureKind.STATUS and self.status is code

    @property
    def lost_job(self) -> bool:
        """The worker answered NOT_FOUND: it restarted and lost the job (its receiver loads it again)."""
        return self.has_status(grpc.StatusCode.NOT_FOUND)

    def __str__(self) -> str:
        match self.kind:
            case FailureKind.DOWN:
                label = "DOWN"
            case FailureKind.STATUS:
                label = self.status.name if self.status is not None else "STATUS"
            case FailureKind.MALFORMED | FailureKind.BROKEN:
                label = self.error
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
    """A lower bound of the Euclidean norm of the gradient part of :attr:`vector` (:attr:`Certified.norm`)."""


@dataclass(frozen=True)
class Certified:
    """What :meth:`Round.certify` found: relative and absolute bounds, the combination's magnitude, and the lower
    bound of its norm the relative bound rests on."""

    bound: float
    absolute: float
    magnitude: float
    norm: float
    """At most the Euclidean norm of the gradient part (the norm of its first coordinates when that sufficed)."""


Received = ReceivedChunk | worker_pb2.GradientChunk
"""A chunk as a stream yields it."""


class _News:
    """Queued in a gather when a worker's computation began (:class:`~gradcode.common.transport.session.ReportsStart`)
    or a held backup's messages are ready (:class:`~gradcode.common.transport.session.Holds`): it wakes the loop,
    so the strategies look again."""


_NEWS = _News()
Item = CompletedMessage | BaseException | _News | None
"""What the gather's queue carries for a worker: a message, the exception that ended its stream, news, or its end."""


def _cancel_late(streams: Iterable[ChunkStream], tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the late workers' streams (the cancellation reaches the worker) and their pump tasks.

    :meth:`Round.gather` schedules this instead of doing it on its way out: the caller's synchronous work
    after a decodable gather (decode, step) comes first. Cancelling two gRPC streams and their tasks took
    0.5 ms (median; 0.7 ms p90, one process, idle 2-core machine), which stood between the first decodable
    moment and the step. It still runs before the caller's next await can
    start anything else (the next round's calls go out after it), and nothing of the round changes meanwhile:
    only :meth:`Round.gather`'s loop reads the queue the pumps fill.

    The cancelled tasks are not awaited: the round's owner (:attr:`Round.tasks`) holds them until they end. Awaiting
    them put their teardown (0.2 ms median, 1 ms p90 with one late worker; more with several) between the first
    decodable moment and the step.
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
        clock: Clock = MONOTONIC,
        tasks: TaskOwner | None = None,
    ) -> None:
        self.decoder = decoder
        self.tasks = TaskOwner(f"round {iteration} of job {job_id}") if tasks is None else tasks
        """Who holds the tasks that read the round's streams (the job's owner on the master, the parent's job's on a
        tree parent; a round given none holds its own): a late stream's task, cancelled when the gather ended,
        finishes there instead of delaying the caller's step. A stream task's crash is only logged (the round has
        taken what it needed)."""
        self.clock = clock
        """What the round's times are read from and waited on (a test's
        :class:`~gradcode.common.gather.clock.ManualClock`
        runs a gather without sleeping)."""
        self.shared = shared
        """Where the sources with ``shared`` leave their payloads (:mod:`gradcode.common.transport.shared_memory`)."""
        self.job_id = job_id
        self.iteration = iteration
        self.length = length
        self.dtypes = dtypes
        self.certified_length = length if certified_length is None else certified_length
        """Leading elements of a message the certificate covers: the gradient, not the appended statistics."""
        self.tolerance = decode_tolerance(dtypes[0]) if tolerance is None else tolerance
        """Largest certified relative error of a decode called exact."""
        self.started = clock.now() if started is None else started
        """:attr:`clock`'s time when the iteration started (default: now); :attr:`finished` counts from it."""
        self.messages: dict[int, CompletedMessage] = {}
        self.finished: dict[int, float] = {}
        self.failed: dict[int, WorkerFailure] = {}
        self.late: list[int] = []
        self.stragglers: list[int] = []
        self.backups: set[int] = set()
        self.promoted: set[int] = set()
        self.reasked: set[int] = set()
        """Workers asked again in this round because nothing came from them (:meth:`Gathering.reopen`)."""
        self._gathering: Gathering | None = None
        """The gather under way (None: none is)."""
        self.decoding: Decoding | None = None
        self.excluded: set[int] = set()
        """Workers whose messages the decoding leaves out (:meth:`exclude`)."""
        self.integrity = Integrity()
        self.timed_out = False
        self.gather_decode_seconds = 0.0

    @property
    def decodable(self) -> bool:
        return self.decoding is not None

    def timings(self) -> dict[int, Timing]:
        """Each worker in :attr:`finished`: its seconds, with its own account from its messages' trailers (its model's
        seconds, its rows' computing added up, its emulated delay as its last row says: a worker's delays add up
        row by row)."""
        account: dict[int, tuple[float, float, float]] = {}
        nothing = (0.0, 0.0, 0.0)
        for m in self.messages.values():
            model, compute, straggle = account.get(m.worker_id, nothing)
            account[m.worker_id] = (
                max(model, m.model_seconds),
                compute + m.compute_seconds,
                max(straggle, m.straggle_seconds),
            )
        return {worker: Timing(seconds, *account.get(worker, nothing)) for worker, seconds in self.finished.items()}

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

    def error_bound(self) -> CombinationBound:
        """The decoding's error bound from the messages it combines (call it before the combine, while they are in
        cache): each message's norm, its sender's reported magnitude (a message of several partitions without one
        cannot be certified: the bound is then infinite) and, where the sender certified its message's error
        itself (a leaf summing several partitions, a tree parent: ``decode_error``), that error in place of the
        receiver's estimate of it."""
        if self.decoding is None:
            raise ValueError("Nothing to certify: the gather did not reach a decodable set.")
        messages = [self.messages[r] for r in self.decoding.rows]
        return self.decoding.error_bound(
            [m.norm for m in messages], dtype=np.result_type(*(m.vector.dtype for m in messages)),
            magnitudes=[m.magnitude for m in messages], length=min(self.certified_length, self.length),
            sender_errors=[m.decode_error for m in messages],
        )  # fmt: skip

    def certify(self, vector: Array, bound: CombinationBound) -> Certified:
        """Certified error of ``vector``'s gradient part, the decoding's combination (:class:`Certified`), from its
        :meth:`error_bound` divided by a lower bound of the vector's norm
        (:meth:`~gradcode.common.codes.base.Decoding.certify_vector`)."""
        if self.decoding is None:
            raise ValueError("Nothing to certify: the gather did not reach a decodable set.")
        certificate, norm = self.decoding.certify_vector(
            vector, bound, tolerance=self.tolerance, length=min(self.certified_length, self.length)
        )
        return Certified(certificate.bound, certificate.absolute, certificate.magnitude, norm)

    def decode(self) -> Decoded:
        """:meth:`combine` and its certificate, timed, with what the decoding rests on."""
        if self.decoding is None:
            raise ValueError("Nothing to decode: the gather did not reach a decodable set.")
        started = time.perf_counter()
        error_bound = self.error_bound()
        vector = self.combine()
        certified = self.certify(vector, error_bound)
        bound, absolute = certified.bound, certified.absolute
        norm = certified.norm
        if self.integrity.lie_bound > 0:  # what the checks could have missed counts as error too
            absolute += self.integrity.lie_bound
            norm = float(np.linalg.norm(vector[: self.certified_length]))  # the whole norm: the tightest bound
            bound = relative_bound(absolute, norm)
        seconds = self.gather_decode_seconds + time.perf_counter() - started
        exact = (
            self.decoding.exact and bound <= self.tolerance and not self.approximate_messages and self.integrity.trusted
        )
        return Decoded(
            vector, exact, bound, absolute, self.used_workers, tuple(self.decoding.rows), seconds,
            magnitude=certified.magnitude, norm=norm,
        )  # fmt: skip

    def join(self, source: Source) -> bool:
        """Ask ``source`` too, in the gather under way (a worker that became able to answer meanwhile: reloaded
        after it lost the job, say); False when no gather is under way (ask it in the next one)."""
        if self._gathering is None:
            return False
        self._gathering.join(source)
        return True

    def _shared_reader(self, source: Source) -> Callable[[int, np.dtype[Any], int], Array] | None:
        if not source.shared or self.shared is None:
            return None
        return functools.partial(self.shared.message, source.worker_id)

    async def gather(
        self,
        sources: list[Source],
        *,
        timeout: float | None = None,
        strategies: Iterable[GatherStrategy] = (),
        on_failure: Callable[[int, WorkerFailure], None] | None = None,
    ) -> dict[int, WorkerFailure]:
        """Ask every source concurrently until the decoder can decode, no source is left, or ``timeout``.

        The round only collects: it reassembles and checks each source's messages, feeds them to the decoder and
        stops at the first decodable moment. What else its owner decides while it gathers is a
        :class:`GatherStrategy` of ``strategies``: promoting backups and asking silent workers again (the master's
        :class:`~gradcode.master.hedging.Hedging`), going on past the first decodable moment until surplus messages
        are enough to check (:class:`~gradcode.common.gather.integrity.WaitForChecks`). Returns the failures of this
        attempt (also recorded in :attr:`failed`); on expiry :attr:`timed_out` is set.

        ``on_failure(worker, failure)`` hears of each failure as it comes, so the owner can act on it within the
        gather (reload a worker that lost the job, then :meth:`join` it) instead of after it; a worker that
        joins and answers has its failure taken back.
        """
        gathering = Gathering(self, tuple(strategies), on_failure)
        started = self.clock.now()
        self.timed_out = False
        for source in sources:
            gathering.ask(source)
        gathering.backups = {source.worker_id for source in sources if source.backup}
        self.backups |= gathering.backups
        for strategy in gathering.strategies:
            strategy.begin(gathering)
        await gathering.run(None if timeout is None else started + timeout)
        return gathering.failures


class GatherStrategy:
    """What a round's owner decides while the round gathers, beyond collecting (the base decides nothing).

    :meth:`Round.gather` calls these hooks from its loop, in its own task: :meth:`begin` once its sources are
    asked, :meth:`joined` for a source that joins later (:meth:`Round.join`), :meth:`tick` at each turn of the
    loop that is about to wait (the items that came together are taken first), :meth:`ended` when a worker's
    stream ended (``failure`` None: it delivered every row), :meth:`wake_at` for when the strategy wants a turn
    although nothing arrived, and :meth:`enough` whether a decodable round may stop (asked after each new message
    once decodable; every strategy must agree). A strategy acts through the :class:`Gathering` it was given
    (:meth:`Gathering.promote`, :meth:`Gathering.reopen`).
    """

    def begin(self, gathering: Gathering) -> None:
        """The gather's sources are asked (:attr:`Gathering.sources`)."""

    def joined(self, source: Source) -> None:
        """``source`` joined the gather under way."""

    def tick(self, now: float) -> None:
        """A turn of the gather's loop that is about to wait, at ``now``."""

    def ended(self, worker_id: int, failure: WorkerFailure | None) -> None:
        """Worker ``worker_id``'s stream ended: it delivered (``failure`` None) or failed."""

    def wake_at(self) -> float | None:
        """When the strategy wants its next :meth:`tick` although nothing arrives (None: no need)."""
        return None

    def enough(self) -> bool:
        """Whether the decodable round may stop gathering."""
        return True


class Gathering:
    """One :meth:`Round.gather` under way: its streams, the workers still out, and what a :class:`GatherStrategy`
    may do to them (:meth:`promote`, :meth:`reopen`).

    A Session's chunks are received as the session reads them
    (:class:`~gradcode.common.transport.session.DeliversItems`),
    another stream's (a Compute call) by a task that iterates it; each message is reassembled and checked as its
    chunks arrive, and handed to the round's decoder in the loop (:meth:`run`), the only reader of the queue.
    """

    def __init__(
        self,
        round_: Round,
        strategies: tuple[GatherStrategy, ...],
        on_failure: Callable[[int, WorkerFailure], None] | None,
    ) -> None:
        self.round = round_
        self.strategies = strategies
        self.on_failure = on_failure
        self.queue: asyncio.Queue[tuple[int, Item]] = asyncio.Queue()
        self.streams: dict[int, ChunkStream] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.failures: dict[int, WorkerFailure] = {}
        self.sources: dict[int, Source] = {}
        """Every source asked in this gather, by worker."""
        self.pending: set[int] = set()
        """Workers asked whose stream has not ended."""
        self.heard: set[int] = set()
        """Workers from which something (a chunk, the end, a failure) came in this gather."""
        self.began_at: dict[int, float] = {}
        """When each worker was first known to have begun (its start news, or the first thing heard from it), on the
        round's clock from :attr:`Round.started`."""
        self.refused: set[MessageAssembler] = set()
        """The streams (by their assemblers) already ended by a failure: what else they deliver is dropped."""
        self.backups: set[int] = set()
        """The workers this gather's sources asked as backups (:attr:`Source.backup`)."""

    @property
    def decodable(self) -> bool:
        return self.round.decoder.decodable

    def now(self) -> float:
        """The time on the round's clock (:attr:`Round.clock`): what :attr:`Round.started` counts from."""
        return self.round.clock.now()

    def began(self, worker_id: int) -> bool:
        """The worker said its computation began (a stream that
        :class:`~gradcode.common.transport.session.ReportsStart`), or
        its message is arriving (a worker whose messages compute in a few milliseconds sends no notice; on a slow
        link its message streams for longer than that): :attr:`began_at` holds it."""
        return worker_id in self.began_at

    def ready(self) -> set[int]:
        """The held backups still out whose messages wait to be pulled
        (:class:`~gradcode.common.transport.session.Holds`)."""
        held = (w for w in self.pending & self.backups if w not in self.round.promoted)
        return {w for w in held if getattr(self.streams.get(w), "ready", False) is True}

    def promote(self, workers: Iterable[int]) -> None:
        """Ask these backups to compute at normal priority (those whose streams are
        :class:`~gradcode.common.transport.session.Promotable`; once each per round: :attr:`Round.promoted`)."""
        promoted = self.round.promoted
        for w in workers:
            promote: Callable[[], None] | None = getattr(self.streams.get(w), "promote", None)
            if w not in promoted and promote is not None:
                promote()
                promoted.add(w)

    def reopen(self, worker_id: int) -> None:
        """Cancel worker ``worker_id``'s call and open its source again (:attr:`Round.reasked`)."""
        self.round.reasked.add(worker_id)
        old_stream, old_task = self.streams.pop(worker_id, None), self.tasks.pop(worker_id, None)
        _cancel_late([] if old_stream is None else [old_stream], [] if old_task is None else [old_task])
        self._start(self.sources[worker_id])

    def ask(self, source: Source) -> None:
        self._start(source)
        self.sources[source.worker_id] = source
        self.pending.add(source.worker_id)

    def join(self, source: Source) -> None:
        """Ask one more source (:meth:`Round.join`), unless it is asked already or has answered."""
        w = source.worker_id
        if w not in self.pending and w not in self.round.finished:
            self.heard.discard(w)
            self.began_at.pop(w, None)
            self.ask(source)
            for strategy in self.strategies:
                strategy.joined(source)

    def _fail(self, worker_id: int, exc: BaseException) -> None:
        if worker_id in self.streams:  # a refused message: the worker stops, its session forgets it
            self.streams[worker_id].cancel()
        self.queue.put_nowait((worker_id, exc))

    def _receive(self, worker_id: int, assembler: MessageAssembler, item: Received | BaseException | None) -> None:
        """One item of a worker's stream: a chunk, None at its end, or the exception that ended it. After a refusal
        the stream's remaining items are dropped: the first reason is the one the round records."""
        self._hear(worker_id)
        if assembler in self.refused:
            return
        if isinstance(item, BaseException):
            self.refused.add(assembler)
            self._fail(worker_id, item)
            return
        try:
            if item is None:
                if not assembler.complete:
                    raise WireError(f"stream ended before all rows {assembler.rows} were sent")
                self.queue.put_nowait((worker_id, None))
                return
            done = assembler.feed(item)
        except Exception as exc:
            self.refused.add(assembler)
            self._fail(worker_id, exc)
            return
        if done is not None:
            self.queue.put_nowait((worker_id, done))

    async def _pump(self, worker_id: int, assembler: MessageAssembler, stream: ChunkStream) -> None:
        try:
            async for chunk in stream:
                self._receive(worker_id, assembler, chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(worker_id, exc)
            return
        self._receive(worker_id, assembler, None)

    def _began(self, worker_id: int) -> None:
        """Worker ``worker_id`` said its computation began: note when, and wake the loop."""
        self.began_at.setdefault(worker_id, self.now() - self.round.started)
        self.queue.put_nowait((worker_id, _NEWS))

    def _hear(self, worker_id: int) -> None:
        """Something came from worker ``worker_id``: it has begun, if it had not said so."""
        if worker_id not in self.heard:
            self.heard.add(worker_id)
            self.began_at.setdefault(worker_id, self.now() - self.round.started)

    def _place(
        self, worker_id: int, assembler: MessageAssembler, meta: worker_pb2.GradientChunk, nbytes: int
    ) -> memoryview | None:
        """Where a large chunk's payload is received (:meth:`MessageAssembler.place`), asked when its first bytes
        arrive: the worker is heard from then, not once the chunk is whole. A message computed in a few milliseconds
        sends no start notice, and on a slow link its one chunk takes a transfer to arrive: heard only at its end, a
        worker whose message streamed beside another's read as not begun when that one ended (on the emulated
        cluster, one 0.8 MB chunk over 200 Mbit/s: 32 ms later). Heard, it is not asked again as silent: a stream
        that stalls midway is the held-pull rule's and the hedge's to cover."""
        self._hear(worker_id)
        return assembler.place(meta, nbytes)

    def _start(self, source: Source) -> None:
        """Open ``source``'s stream and have its items received."""
        round_, worker_id = self.round, source.worker_id
        assembler = MessageAssembler(
            job_id=round_.job_id, iteration=round_.iteration, worker_id=worker_id, rows=source.rows,
            length=round_.length, dtypes=round_.dtypes, norm_length=round_.certified_length,
            shared=round_._shared_reader(source), subtree=source.subtree,
        )  # fmt: skip
        try:
            stream = source.open()
        except Exception as exc:
            self._hear(worker_id)
            self.queue.put_nowait((worker_id, exc))
            return
        self.streams[worker_id] = stream
        if hasattr(stream, "on_started"):  # an expected worker's start is timed and wakes the loop
            cast(ReportsStart, stream).on_started = functools.partial(self._began, worker_id)
        if getattr(stream, "started", False) is True:  # (one that began before it was watched)
            self._began(worker_id)
        if hasattr(stream, "on_ready"):  # a held backup's news wakes it too
            cast(Holds, stream).on_ready = functools.partial(self.queue.put_nowait, (worker_id, _NEWS))
        if callable(getattr(stream, "consume", None)):  # on a link: payloads received straight into the message
            direct = cast(DeliversItems, stream)
            direct.place = functools.partial(self._place, worker_id, assembler)
            direct.consume(functools.partial(self._receive, worker_id, assembler))
        else:
            self.tasks[worker_id] = round_.tasks.spawn(
                self._pump(worker_id, assembler, stream), name=f"gather-w{worker_id}", fatal=False
            )

    def _finish(self, worker_id: int) -> None:
        self.round.finished[worker_id] = self.now() - self.round.started
        self.round.failed.pop(worker_id, None)
        self.failures.pop(worker_id, None)  # (one that joined again after failing)

    def _done(self) -> bool:
        return self.round.decoder.decodable and all(strategy.enough() for strategy in self.strategies)

    def _wake(self, deadline: float | None) -> float | None:
        """The earliest time the loop must look again although nothing arrived: the deadline or a strategy's turn."""
        times = [t for t in (strategy.wake_at() for strategy in self.strategies) if t is not None]
        if deadline is not None:
            times.append(deadline)
        return min(times, default=None)

    async def _next(self, deadline: float | None, now: float) -> tuple[int, Item]:
        """The next item to take; TimeoutError when the deadline or a strategy's turn comes first."""
        if not self.queue.empty():  # items that came together: no timer to arm for each
            return self.queue.get_nowait()
        wake = self._wake(deadline)
        async with self.round.clock.timeout(None if wake is None else wake - now):
            return await self.queue.get()

    def _take(self, worker_id: int, item: Item) -> None:
        """A message for the decoder, or the end of a worker's stream (delivered, or failed); news (a computation
        began, a held backup is ready) only wakes the loop."""
        round_ = self.round
        if isinstance(item, _News):
            return
        if isinstance(item, CompletedMessage):
            round_.messages[item.row] = item
            t0 = time.perf_counter()
            round_.decoder.add(item.row)
            round_.gather_decode_seconds += time.perf_counter() - t0
            return
        self.pending.discard(worker_id)
        self.began_at.setdefault(worker_id, self.now() - round_.started)  # (a stream that failed before a word)
        failure = None
        if item is None:
            self._finish(worker_id)
        else:
            self.failures[worker_id] = round_.failed[worker_id] = failure = self._failure(worker_id, item)
            if self.on_failure is not None:
                self.on_failure(worker_id, failure)
        for strategy in self.strategies:
            strategy.ended(worker_id, failure)

    def _failure(self, worker_id: int, exc: BaseException) -> WorkerFailure:
        """The failure ``exc`` ends worker ``worker_id``'s stream with; of the children its metadata says lost the
        job, only those below it count (a node cannot have others reloaded)."""
        failure = WorkerFailure.from_exception(exc)
        subtree = self.sources[worker_id].subtree
        if any(c not in subtree for c in failure.children_lost):
            failure = replace(failure, children_lost=tuple(c for c in failure.children_lost if c in subtree))
        return failure

    async def run(self, deadline: float | None) -> None:
        """Take items until the round is decodable (and every strategy has enough), no source is left, or
        ``deadline``; then decode and leave the late streams to be cancelled."""
        round_ = self.round
        round_._gathering = self
        try:
            while self.pending and not self._done():
                now = self.now()
                if self.queue.empty():  # before a wait, not between items that came together (n = 16: 31 ticks -> 2.4)
                    for strategy in self.strategies:
                        strategy.tick(now)
                if deadline is not None and now >= deadline:
                    round_.timed_out = True
                    break
                try:
                    worker_id, item = await self._next(deadline, now)
                except TimeoutError:
                    continue  # a strategy's or the deadline's turn, at the top of the loop
                self._take(worker_id, item)
            if round_.decoder.decodable and not round_.excluded:  # (again after a gather that added surplus)
                t0 = time.perf_counter()
                round_.decoding = round_.decoder.decoding()
                round_.gather_decode_seconds += time.perf_counter() - t0
        finally:
            round_._gathering = None
            self._wrap_up()
            self._detach()

    def _detach(self) -> None:
        """Let go of the streams, the sources and the owner's hooks once the gather is over. Each of them holds the
        gather in turn (a stream its callbacks, a source its owner's iteration, a strategy its gathering), so a
        finished gather was otherwise a knot of reference cycles left to the cyclic garbage collector: about 1000
        objects per iteration at n = 16, whose collections took 6 % of the master's CPU. What the owner reads
        afterwards (:attr:`failures`, :attr:`began_at`, :attr:`backups`) stays; a late stream's chunks still find
        this gather and are dropped with it."""
        self.streams.clear()
        self.tasks.clear()
        self.sources.clear()
        self.strategies = ()
        self.on_failure = None

    def _wrap_up(self) -> None:
        """Record what the gather ends with, and let the late streams be cancelled after the caller's step."""
        round_, pending = self.round, self.pending
        while not self.queue.empty():  # a refusal already here when the round became decodable is a fact all the same
            worker_id, item = self.queue.get_nowait()
            if isinstance(item, BaseException) and worker_id in pending:
                pending.discard(worker_id)
                self.failures[worker_id] = round_.failed[worker_id] = self._failure(worker_id, item)
        for w in list(pending):
            if all(r in round_.messages for r in self.sources[w].rows):  # delivered all; end-of-stream not seen yet
                pending.discard(w)
                self._finish(w)
        round_.late = sorted(pending)
        round_.stragglers = sorted(pending - self.backups)
        if pending:
            late_streams = [self.streams[w] for w in pending if w in self.streams]
            late_tasks = [self.tasks[w] for w in pending if w in self.tasks]
            asyncio.get_running_loop().call_soon(_cancel_late, late_streams, late_tasks)
