"""A loaded job on a worker and its two ways of producing an iteration's messages.

:class:`JobRuntime` holds the job (:class:`~gradcode.worker.compute.WorkerJob`), its straggler
emulation, its parent role when it is an inner tree node, and the computations running now.
:meth:`JobRuntime.messages` yields the iteration's messages, one :class:`Message` per requested row:

* a leaf computes its own rows in a worker thread, spreading the emulated delay over its messages (a
  worker with several messages, e.g. partial stragglers, still delivers its first ones early);
* a parent asks its children first (its :class:`~gradcode.worker.parent.ParentRunner` gathers and
  decodes them, one :class:`~gradcode.common.gather.round.Round`), then sleeps its own delay and computes its
  own rows meanwhile, and adds the two (Reisizadeh et al., Algorithm 2): its emulated slowness never
  holds up its children's work. Its messages are approximate when the children's decode was not
  exact, and name the children that lost the job (:func:`~gradcode.worker.parent.children_lost`).

Either computes on the event loop instead of a thread once the job's messages are known to be short
(:data:`INLINE_MESSAGE_SECONDS`). A leaf asked as a backup (``ComputeRequest.backup``: the receiver expects to
decode without it) computes in a thread of lowest priority (:func:`backup_executor`), so it takes only CPU
nobody else wants; a backup that shares its machine with the receiver's other workers
(``ComputeRequest.deferred``) computes nothing until promoted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gradcode.common.codes.base import Array
from gradcode.common.exceptions import ComputeCancelledError
from gradcode.common.gather.round import Round
from gradcode.common.transport.shared_memory import SharedPeer
from gradcode.common.transport.wire import NO_SUBTREE, Subtree
from gradcode.v1 import worker_pb2
from gradcode.worker.compute import CancelFlag, IterationComputation, WorkerJob
from gradcode.worker.parent import ParentRunner, upward_message
from gradcode.worker.relay import HeldModels, PeerFetcher
from gradcode.worker.straggling import Cancellation, StragglerEmulation

__all__ = [
    "BACKUP_NICENESS",
    "COMPUTING",
    "Computing",
    "JobRuntime",
    "Message",
    "PartitionObserver",
    "backup_executor",
    "until_promoted",
]

logger = logging.getLogger(__name__)

PartitionObserver = Callable[[str, int, int], None]
"""Called after each partial gradient, ``(job_id, iteration, partition)``: from the compute thread, or from the
event loop for a computation run inline (never a job's first)."""

INLINE_MESSAGE_SECONDS = 0.002
"""A job whose previous message took less than this computes the next one on the event loop, not in a thread.
The hop to a thread and back (executor queue, two wake-ups, the loop's self-pipe) cost 0.4 ms of CPU per
Compute on 2 cores at n = 16, p = 1e5, more than such a gradient; blocking the loop for under 2 ms delays
nothing the worker serves (health checks, cancellations, other jobs' calls) by more than that."""

INLINE_PARTITION_SECONDS = 0.012
"""A job whose partial gradients each took less than this much CPU computes the next message on the event loop a
partition at a time, yielding to the loop between them: a cancellation or a request on a link is served at the
next partition, a gRPC call (which needs several turns of the loop) within the message. On 2 cores with six
workers of Tandon et al.'s logistic workload (5-9 ms partitions) the hop to a thread and back cost each worker
0.4-0.6 ms of CPU per message.

A partition is timed in its thread's CPU seconds
(:attr:`~gradcode.worker.compute.IterationComputation.longest_partition_seconds`), not in wall seconds: six
workers on two cores each wait for a core two thirds of the time, so a 7 ms partition took 20 ms of wall time and
every message went to a thread all the same. Timed in CPU, the steady period of a 150-iteration uncoded job of that
workload went from 28.3 to 24.8 ms (6 interleaved pairs, each pair's ratio 0.79-0.98, median 0.885; the workers'
CPU 0.91x; load 3.4-4.3). A partition that waits on something else (a page of memory-mapped data read from disk)
holds the loop for that wait too; between partitions the loop is served."""


BACKUP_NICENESS = 19
"""Niceness of the threads that compute backups: the lowest priority an ordinary thread can have."""


@functools.cache
def backup_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that compute backup messages, each at :data:`BACKUP_NICENESS` on Linux (which sets a thread's
    own niceness); elsewhere at normal priority.

    Priority inversion is bounded: the thread holds the GIL only between numpy calls (microseconds per block of
    rows), so a backup starved of CPU rarely keeps the event loop waiting."""
    return concurrent.futures.ThreadPoolExecutor(thread_name_prefix="gradcode-backup", initializer=_lowest_priority)


def _lowest_priority() -> None:
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKUP_NICENESS)
    except OSError as exc:  # e.g. a seccomp profile that forbids it: backups then run at normal priority
        logger.warning("could not lower a backup thread's priority (%s); backups compute at normal priority", exc)


@dataclass(frozen=True)
class _AnyOf:
    """A cancel flag set when any of ``flags`` is."""

    flags: tuple[CancelFlag | None, ...]

    def is_set(self) -> bool:
        return any(flag is not None and flag.is_set() for flag in self.flags)


_ON_THE_LOOP: set[IterationComputation] = set()
"""Messages being computed on this process's event loop now (:func:`_stepwise_message`). While one is, another
job's goes to a thread: two jobs' gradients still run side by side where there are cores for both."""


async def _stepwise_message(computation: IterationComputation, row: int) -> tuple[Array, float]:
    """Row ``row``'s message computed on the event loop one partial gradient at a time, the loop served between
    them (a cancellation set meanwhile stops it at the next partition); its seconds leave those yields out."""
    seconds = 0.0
    _ON_THE_LOOP.add(computation)
    try:
        for partition in computation.job.rows[row].partitions:
            started = time.perf_counter()
            computation.partial(partition)
            seconds += time.perf_counter() - started
            await asyncio.sleep(0)
    finally:
        _ON_THE_LOOP.discard(computation)
    vector, combine_seconds = computation.message(row)  # the partials are cached: only their combination
    return vector, seconds + combine_seconds


def _outcome_seen(future: asyncio.Future[Any]) -> None:
    """Mark a backup attempt's exception retrieved (``result()`` still raises it to a caller that asks)."""
    if not future.cancelled():
        future.exception()


@dataclass(frozen=True)
class Message:
    """One coded message ready to send."""

    row: int
    vector: Array
    compute_seconds: float
    """The computing this message adds to the ones before it (their sum is the worker's)."""
    straggle_seconds: float
    """The emulated delay slept by the time this message was ready."""
    approximate: bool = False
    decode_error: float = 0.0
    """The sender's certified absolute error of this message: a leaf's rounding of a row of several partitions
    (:meth:`IterationComputation.rounding`), a parent's children's decode plus its own rounding
    (:func:`~gradcode.worker.parent.upward_message`); 0: the receiver bounds it from the row."""
    subtree: Subtree = NO_SUBTREE
    """A parent's word on the nodes below it (:meth:`~gradcode.worker.parent.ParentRunner.subtree`)."""
    magnitude: float = math.nan
    r"""$\sum_j |b_j| \|g_j\|$: a leaf's (:meth:`IterationComputation.magnitude`), a parent's over its own part and
    its children's (:func:`~gradcode.worker.parent.upward_message`)."""


async def until_promoted(flag: Cancellation, promotion: Cancellation) -> None:
    """Wait until the receiver promotes a backup (``promotion`` set): a deferred backup before it computes, a held one
    (``ComputeRequest.hold``) before it sends; ComputeCancelledError as soon as ``flag`` (its cancellation) is set."""
    if promotion.is_set():
        return
    promoted = asyncio.create_task(promotion.wait())
    try:
        await flag.race(promoted, "its promotion")
    finally:
        promoted.cancel()


class Computing:
    """Yielded once by :meth:`JobRuntime.messages`, for a Session request that asked ``report_start``, when its
    computation begins: after the emulated delay (and a deferred backup's promotion), before the first message; not
    when a leaf's message is computed inline (it then goes out as soon)."""


COMPUTING = Computing()


@dataclass
class JobRuntime:
    """A loaded job plus what serving it needs: straggler emulation, parent role, running computations."""

    job: WorkerJob
    stragglers: StragglerEmulation
    parent: ParentRunner | None = None
    active: dict[int, set[Cancellation]] = field(default_factory=dict)
    """Cancellation flags of the computations running now, by iteration."""
    newest_iteration: int = -1
    """The highest iteration a Compute has started for this job; older ones are refused."""
    retired: bool = False
    """Set when the job was ended or replaced: running computations stop at their next step."""
    message_seconds: float = math.inf
    """Wall seconds this job's last own message took to compute (inf before the first): what decides whether the
    next one runs inline (:data:`INLINE_MESSAGE_SECONDS`)."""
    partition_seconds: float = math.inf
    """CPU seconds of the longest partial gradient of this job's last own message (inf before the first): whether
    the next message is computed on the loop a partition at a time (:data:`INLINE_PARTITION_SECONDS`)."""
    promotions: dict[int, Cancellation] = field(default_factory=dict)
    """By iteration, set when the receiver promotes this worker's backup computation of it."""
    shared: SharedPeer | None = None
    """The receiver's shared-memory directory, when this worker accepted its offer
    (:func:`gradcode.common.transport.shared_memory.accept`; leaves only, a parent forwards its model inline)."""
    models: HeldModels = field(default_factory=HeldModels)
    """The models this worker's Computes of the last iterations were admitted with, for its peers' FetchModel."""
    peers: PeerFetcher | None = None
    """Fetches a relayed model (``ComputeRequest.relayed_model``) from a peer; None: this worker relays nothing."""

    def begin(self, iteration: int) -> Cancellation:
        """Start a computation of ``iteration``: it becomes the newest, older ones still running are
        cancelled (they can no longer be used); returns its cancellation flag."""
        self.newest_iteration = iteration
        flag = Cancellation()
        self.cancel_all(before=iteration)
        for old in [t for t in self.promotions if t < iteration]:
            del self.promotions[old]
        self.active.setdefault(iteration, set()).add(flag)
        return flag

    def end(self, iteration: int, flag: Cancellation) -> None:
        """The computation of ``flag`` is over: stop its thread at its next partition if it still runs."""
        flag.set()
        flags = self.active.get(iteration)
        if flags is not None:
            flags.discard(flag)
            if not flags:
                del self.active[iteration]

    def promotion(self, iteration: int) -> Cancellation:
        """Set when the receiver promotes this worker's backup computation of ``iteration``."""
        return self.promotions.setdefault(iteration, Cancellation())

    def cancel_all(self, *, before: int | None = None) -> None:
        """Set the flags of every running computation (of iterations before ``before``, if given)."""
        for iteration, flags in self.active.items():
            if before is None or iteration < before:
                for flag in flags:
                    flag.set()

    async def retire(self) -> None:
        """Stop every computation and close the parent role for good (the job ended or was replaced)."""
        self.retired = True
        self.cancel_all()
        if self.shared is not None:
            self.shared.close()
        if self.peers is not None:
            await self.peers.close()
        if self.parent is not None:
            await self.parent.close()

    async def messages(
        self,
        request: worker_pb2.ComputeRequest,
        params: Array,
        rows: tuple[int, ...],
        delay: float,
        flag: Cancellation,
        observer: PartitionObserver | None,
    ) -> AsyncIterator[Message | Computing]:
        """This iteration's messages, row by row (a leaf's preceded by :data:`COMPUTING` when the request asked
        ``report_start``); ComputeCancelledError when abandoned."""
        on_partition = None if observer is None else _bind(observer, self.job.job_id, int(request.iteration))
        if self.parent is None:
            promotion = self.promotion(int(request.iteration)) if request.backup else None
            deferred = promotion is not None and request.deferred
            report_start = request.report_start and bool(request.request_id)  # a Session's request only
            async for message in self._leaf_messages(
                params, rows, delay, flag, on_partition, promotion, deferred, report_start
            ):
                yield message
        else:
            report_start = request.report_start and bool(request.request_id)
            async for message in self._parent_messages(
                self.parent, request, params, rows, delay, flag, on_partition, report_start
            ):
                yield message

    async def _straggle(self, flag: Cancellation, seconds: float) -> None:
        """The emulated delay; ComputeCancelledError if the call is abandoned or its job is gone by the end."""
        await flag.sleep(seconds)
        if self.retired:  # ended or replaced (its flags are set too)
            raise ComputeCancelledError(f"Job {self.job.job_id!r} was ended or replaced during the delay.")

    async def _leaf_messages(
        self,
        params: Array,
        rows: tuple[int, ...],
        delay: float,
        flag: Cancellation,
        on_partition: Callable[[int], None] | None,
        promotion: Cancellation | None,
        deferred: bool = False,
        report_start: bool = False,
    ) -> AsyncIterator[Message | Computing]:
        """A leaf's messages; ``promotion`` (a backup's) says when to compute them at normal priority, and a
        ``deferred`` backup computes nothing before it is set (its emulated delay runs meanwhile). With
        ``report_start``, :data:`COMPUTING` comes first."""
        computation = self.job.start(params, cancelled=flag, on_partition=on_partition)
        for index, row in enumerate(rows):
            await self._straggle(flag, delay / len(rows))
            if deferred and promotion is not None:
                await until_promoted(flag, promotion)
            if report_start and index == 0 and self.message_seconds >= INLINE_MESSAGE_SECONDS:
                yield COMPUTING  # (an inline message goes out as soon)
            vector, seconds = await self._message(computation, row, promotion)
            magnitude = computation.magnitude(row)
            yield Message(
                row, vector, seconds, delay * (index + 1) / len(rows),
                decode_error=computation.rounding(row, magnitude), magnitude=magnitude,
            )  # fmt: skip

    async def _message(
        self,
        computation: IterationComputation,
        row: int,
        promotion: Cancellation | None = None,
        *,
        beside_a_round: bool = False,
    ) -> tuple[Array, float]:
        """Row ``row``'s message (:meth:`IterationComputation.message`): on the event loop when this job's last
        one took under :data:`INLINE_MESSAGE_SECONDS`, or a partition at a time when its partitions took under
        :data:`INLINE_PARTITION_SECONDS`, else in a worker thread; a backup not promoted (``promotion`` not set) in
        a lowest-priority one (:meth:`_backup_message`). ``beside_a_round``: the loop gathers a parent's children
        meanwhile, and a thread lets their messages be received while the partitions are computed; another job's
        message on the loop (:data:`_ON_THE_LOOP`) sends this one to a thread too."""
        if self.message_seconds < INLINE_MESSAGE_SECONDS:
            vector, self.message_seconds = computation.message(row)
        elif promotion is not None and not promotion.is_set():
            vector, self.message_seconds = await self._backup_message(computation, row, promotion)
        elif self.partition_seconds < INLINE_PARTITION_SECONDS and not beside_a_round and not _ON_THE_LOOP:
            vector, self.message_seconds = await _stepwise_message(computation, row)
        else:
            vector, self.message_seconds = await asyncio.to_thread(computation.message, row)
        if computation.longest_partition_seconds:
            self.partition_seconds = computation.longest_partition_seconds
        return vector, self.message_seconds

    async def _backup_message(
        self, computation: IterationComputation, row: int, promotion: Cancellation
    ) -> tuple[Array, float]:
        """A backup's message in a thread of :func:`backup_executor`; once promoted, in a normal thread, which keeps
        the partial gradients the backup thread finished (that thread stops at its next partition)."""
        attempt = computation.sharing(_AnyOf((computation.cancelled, promotion)))
        in_context = functools.partial(contextvars.copy_context().run, attempt.message, row)  # as to_thread does
        backup = asyncio.get_running_loop().run_in_executor(backup_executor(), in_context)
        backup.add_done_callback(_outcome_seen)  # superseded, or its call cancelled: its end is no error to log
        promoted: asyncio.Future[Any] = asyncio.ensure_future(promotion.wait())
        try:
            await asyncio.wait((backup, promoted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            promoted.cancel()
        if backup.done() and (backup.exception() is None or not promotion.is_set()):
            return backup.result()
        return await asyncio.to_thread(computation.message, row)

    async def _parent_messages(
        self,
        parent: ParentRunner,
        request: worker_pb2.ComputeRequest,
        params: Array,
        rows: tuple[int, ...],
        delay: float,
        flag: Cancellation,
        on_partition: Callable[[int], None] | None,
        report_start: bool = False,
    ) -> AsyncIterator[Message | Computing]:
        """Own messages (in a thread) and the children's decoded sum (a round), concurrently; then add. With
        ``report_start``, :data:`COMPUTING` comes once the emulated delay is over and the parent's own part begins
        (its children work from the start: a parent that began is finishing, one that did not is delayed)."""
        job = self.job
        started = time.perf_counter()
        children: asyncio.Task[Round] = asyncio.create_task(parent.children_sum(request, params))
        try:
            await self._straggle(flag, delay)  # the children already work meanwhile
            if report_start:
                yield COMPUTING
            computation = job.start(params, cancelled=flag, on_partition=on_partition)
            own = {row: (await self._message(computation, row, beside_a_round=True))[0] for row in rows}
            gathered = await flag.race(children)
        finally:
            if not children.done():
                children.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await children
        decoded = gathered.decode()
        seconds = time.perf_counter() - started
        logger.log(
            logging.DEBUG if decoded.exact else logging.WARNING,
            "job %r iteration %d: children used %s, late %s, failed %s, exact %s (certified error %.2g)",
            job.job_id, request.iteration, decoded.used_workers, gathered.late, gathered.failed, decoded.exact,
            decoded.error_bound,
        )  # fmt: skip
        subtree = parent.subtree(gathered)
        length = min(parent.certified_length or job.message_length, job.message_length)
        for index, row in enumerate(rows):
            terms = len(job.rows[row].partitions)
            up = upward_message(own[row], computation.magnitude(row), terms, decoded, job.row_dtype(row), length)
            yield Message(  # its rows are computed together: the first carries the time
                row, up.vector, 0.0 if index else seconds, delay, not decoded.exact, up.decode_error, subtree,
                magnitude=up.magnitude,
            )  # fmt: skip


def _bind(observer: PartitionObserver, job_id: str, iteration: int) -> Callable[[int], None]:
    return lambda partition: observer(job_id, iteration, partition)
