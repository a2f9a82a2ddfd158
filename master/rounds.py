"""The master's use of a :class:`~gradcode.common.gather.round.Round`: whom to ask, when to retry, when to give up.

Each iteration the master asks every UP worker that has rows (one Compute each, a request on the
worker's Session, through one round, which stops at the first decodable moment and cancels the rest).
While the round is not decodable it reloads workers that came back (a restarted worker lost the job:
NOT_FOUND) and asks them again, until the iteration deadline; then the job fails naming the missing
workers. A worker whose call fails is marked DOWN, except a worker that lost the job (reloaded) and, for
a code with a topology, a parent that answers UNAVAILABLE but passes a health check: it is alive but its
children are not decodable, so it only counts as failed for this iteration. A tree parent names its
children that lost the job (they restarted: their Compute answered NOT_FOUND) in its message or its
error; they are reloaded at once, so a node that restarts anywhere in the tree comes back into the job
(its parent is reloaded too when the node was issued a new call token).

The job's consistency policy (:mod:`gradcode.common.gather.integrity`) says how long a decodable round goes on
gathering surplus messages and judges them; a worker it quarantines is marked DOWN and never asked
again by this job.

Without such checks, a flat static code's round expects to decode from a minimal decoding set (:class:`Primaries`)
and asks the other workers as backups (``JobSpec.backup_priority``). A backup on a machine of its own
computes at low OS priority; one that shares its machine with other workers of the job
(:func:`sharing_a_machine`) computes nothing until promoted, since even idle-priority work would take memory
bandwidth and cache from theirs. When expected workers are late, the round promotes the backups that
replace them (:class:`~gradcode.master.hedging.Hedging`, the round's strategy); one not decoded by its hedge
(:meth:`Primaries.hedge`) promotes them all. A backup asked to hold (``JobSpec.surplus``: "hold", or "auto" for a
worker whose messages cross the network rather than shared memory) computes at once but sends its messages only
when the round pulls them (promotes it), so surplus messages cost the master's link nothing.
Dynamic codes are asked alike: they place each iteration from what every worker did in the last.

The model reaches the workers of a flat code directly, or relayed (``JobSpec.model_delivery``; :class:`_ModelRequest`
builds each worker's model fields, :class:`RelayOrder` picks the peers): the first gather of an iteration sends it
inline to the first worker of the relay order, and worker j of that order fetches it from worker
(j - 1) // :data:`~gradcode.common.gather.delivery.RELAY_FANOUT`, checking its digest. A relayed request that ends
FAILED_PRECONDITION (its peer was dead, frozen or lying: :mod:`gradcode.worker.relay`) is not the worker's fault: it
is asked again at once, in the same gather, with the model inline, and its peer and those upstream of it serve no
relay for :data:`RELAY_SUSPEND_ITERATIONS` iterations. Every later request of the iteration (a retry, a join, a
request asked again after silence) carries the model inline: the relay saves the bytes of the common case and never
delays a recovery.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import grpc

from gradcode.common.codes.base import Array, Assignment
from gradcode.common.codes.topology import descendants
from gradcode.common.exceptions import JobFailedError
from gradcode.common.gather.delivery import relay_peers, relays
from gradcode.common.gather.integrity import IntegrityPolicy
from gradcode.common.gather.primaries import Primaries
from gradcode.common.gather.round import ChunkStream, FailureKind, GatherStrategy, Round, Source, WorkerFailure
from gradcode.common.tasks import TaskOwner
from gradcode.common.training.models import message_length
from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.common.transport.wire import dtype_from_wire, model_digest, model_request_bytes
from gradcode.master.hedging import Hedging
from gradcode.master.liveness import BackgroundLoads, LatenessWatch
from gradcode.master.loading import WorkerLoader
from gradcode.master.pool import PoolWorker, WorkerPool
from gradcode.master.reporting import failure_report
from gradcode.master.spec import JobPlan
from gradcode.v1 import worker_pb2
from gradcode.worker.straggling import StragglerEmulation

__all__ = ["AnswerTimes", "Primaries", "RelayOrder", "RoundPolicy"]

log = logging.getLogger(__name__)

RELAY_SUSPEND_ITERATIONS = 10
"""How long a peer whose fetcher could not get a correct model from it (it was dead, frozen, or lied) serves no
relay."""


class AnswerTimes:
    """How long each worker took to answer lately, and from it how long it may stay silent before it is asked again.

    A worker that sends nothing at all for :meth:`bound` seconds after it was asked has its request cancelled and
    asked again as a Compute call of its own (:class:`~gradcode.master.hedging.Hedging`'s ``reask_after``,
    :meth:`PoolWorker.compute_call`):
    a request lost on the worker's Session or link, or stuck in the worker, then costs this bound, not the whole
    iteration deadline (issue 25: a reloaded worker that never answered failed cyclic n = 8, s = 2 jobs whose two other
    missing workers were down). The bound is :data:`FACTOR` times the worker's median answer time (all workers'
    before it has :data:`MIN_SAMPLES` of its own), at least :data:`FLOOR_SECONDS`, plus the delay the job's
    straggler emulation gives it this iteration (an emulated straggler is slow, not lost).
    """

    HISTORY = 16
    MIN_SAMPLES = 3
    FACTOR = 4.0
    FLOOR_SECONDS = 2.0

    def __init__(self, straggler: StragglerEmulation | None = None) -> None:
        self.straggler = straggler
        self._seconds: dict[int, collections.deque[float]] = {}

    def answered(self, round_: Round) -> None:
        """Record the answer times of a decodable round (not of workers asked again: their time is the bound's)."""
        for w, seconds in round_.finished.items():
            if w not in round_.reasked:
                self._seconds.setdefault(w, collections.deque(maxlen=self.HISTORY)).append(seconds)

    def bound(self, w: int, iteration: int) -> float | None:
        """Seconds worker ``w`` may stay silent in ``iteration``; None before any worker has a history."""
        own = self._seconds.get(w)
        if own is not None and len(own) >= self.MIN_SAMPLES:
            typical = statistics.median(own)
        else:
            everyone = [t for times in self._seconds.values() for t in times]
            if len(everyone) < self.MIN_SAMPLES:
                return None
            typical = statistics.median(everyone)
        delay = 0.0
        if self.straggler is not None:
            with contextlib.suppress(ValueError):  # the worker refuses such a model; nothing to wait for
                delay = self.straggler.delay(w, iteration)
        return max(self.FLOOR_SECONDS, self.FACTOR * typical) + delay


def sharing_a_machine(workers: Sequence[PoolWorker]) -> set[int]:
    """The indices of ``workers`` whose machine (a known machine id) runs another of them: where they share cores,
    even a backup's low-priority work takes memory bandwidth and cache from the others' (with five live workers
    on 2 cores, backups computing at niceness 19 took 31 ms of CPU per iteration and made binary, fractional
    and Reed-Solomon 1.2-1.3x slower than backups that waited to be promoted), so such a backup is deferred."""
    counts = collections.Counter(w.machine_id for w in workers if w.machine_id)
    return {i for i, w in enumerate(workers) if w.machine_id and counts[w.machine_id] > 1}


class RelayOrder:
    """Which workers serve the relayed model (``JobSpec.model_delivery``): the relay order puts first the workers that
    answered fastest in the last decodable round (a worker that did not answer, e.g. frozen or a backup never pulled,
    comes after every one that did), and last the peers blamed lately (:meth:`blame`), so seeds and peers are the
    workers most likely to hold the model in time."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}
        self._blamed_until: dict[int, int] = {}

    def answered(self, finished: Mapping[int, float]) -> None:
        """The answer times (seconds by worker) of the round just decoded."""
        self._seconds = dict(finished)

    def blame(self, peer: int, iteration: int) -> None:
        """A fetcher could not get iteration ``iteration``'s model from ``peer``: it serves no relay for a while."""
        self._blamed_until[peer] = iteration + RELAY_SUSPEND_ITERATIONS

    def order(self, workers: Iterable[int], iteration: int) -> list[int]:
        """``workers`` in relay order for ``iteration``."""
        return sorted(
            workers,
            key=lambda w: (self._blamed_until.get(w, -1) >= iteration, self._seconds.get(w, math.inf), w),
        )


class RoundPolicy:
    """Runs one iteration's round against the job's workers under the iteration deadline.

    Its background tasks (loads, probes, the rounds' late streams) are the job's (``tasks``; by default an owner of
    the policy's own)."""

    def __init__(self, loader: WorkerLoader, pool: WorkerPool, *, tasks: TaskOwner | None = None) -> None:
        self.loader = loader
        self.pool = pool
        self.tasks = TaskOwner(f"rounds of job {loader.plan.job_id}") if tasks is None else tasks
        self.loads = BackgroundLoads(pool, tasks=self.tasks)
        """(Re)loads run beside the rounds: a slow or hung LoadJob never delays the others' gather."""
        self.lateness = LatenessWatch(pool, tasks=self.tasks)
        """Probes a worker late several iterations in a row, so a cut link does not eat the tolerance."""
        self.integrity = IntegrityPolicy(
            loader.plan.integrity, loader.plan.code, describe=lambda w: loader.workers[w].describe()
        )
        plan = loader.plan
        backups = (
            plan.backup_priority == "low"
            and (plan.topology is None or plan.surplus != "push")  # a tree's parents compute at once: held, or none
            and not self.integrity.checking
            and not plan.code.dynamic  # it places the next iteration from what every worker did in this one
        )
        self.primaries = Primaries(plan.code) if backups else None
        """Whom each round expects to decode from (None: every worker is asked alike)."""
        self.answer_times = AnswerTimes(StragglerEmulation(plan.spec.straggler))
        """When a silent worker is asked again within the round."""
        self.relay_order = RelayOrder()
        """Who serves the relayed model (``JobSpec.model_delivery``)."""
        self.start_slack = 0.0
        """The last decoded round's wait for a held backup's expected worker not yet begun (:class:`Hedging`'s
        ``start_slack``, learnt by :meth:`Primaries.start_slack`); 0 when that round held no backups."""
        self._joining: Callable[[int], None] | None = None
        """Asks a worker in the round under way (:meth:`run`) once its reload is done; None between rounds."""
        topology = plan.topology
        self.subtrees = [frozenset[int]() if topology is None else descendants(topology, w) for w in range(plan.code.n)]
        """The nodes below each worker the master asks: all its messages' trailers may name."""

    @property
    def plan(self) -> JobPlan:
        """The loader's plan (one copy: a job that drops its data replaces it there)."""
        return self.loader.plan

    async def close(self) -> None:
        """Stop the probes and loads under way (the job ended)."""
        self.lateness.close()
        await self.loads.close()

    def _reload(self, indices: Iterable[int]) -> None:
        """Start, in the background, a LoadJob for each of these workers that is UP and lacks the job."""
        workers, job_id = self.loader.workers, self.plan.job_id
        for w in indices:
            if workers[w].is_up and not workers[w].has_job(job_id) and self.loader.may_load(w):
                self.loads.start(w, functools.partial(self._load_and_join, w))

    async def _load_and_join(self, w: int) -> bool:
        """Load worker ``w``; once loaded, it joins the round under way, if any (a gather waiting for a slow or
        silent worker must not keep one that is ready out of the iteration)."""
        loaded = await self.loader.load(w)
        if loaded and self._joining is not None:
            self._joining(w)
        return loaded

    async def run(self, t: int, assignment: Assignment, point: Array, *, started: float, job_started: float) -> Round:
        """Gather iteration ``t`` (begun at ``started``, the model at ``point``) until decodable; JobFailedError
        at the deadline."""
        plan = self.plan
        round_ = Round(
            plan.code.decoder(assignment),
            job_id=plan.job_id,
            iteration=t,
            length=message_length(plan.model, statistics=True),
            dtypes=(dtype_from_wire(plan.message_dtype),),
            started=started,
            certified_length=plan.model.num_params,
            tolerance=plan.tolerance,
            shared=self.loader.shared,
            tasks=self.tasks,
        )
        it = _Iteration(
            round_, assignment, _ModelRequest(t, point, self.loader.shared, self.loader.relay_peer),
            job_started=job_started,
            needed=[w for w in range(plan.code.n) if assignment.rows[w]],
            wait_rules=self.integrity.wait_rules(round_, assignment),
        )  # fmt: skip
        if plan.topology is not None:  # deeper nodes that came back UP (e.g. after a failed LoadJob) get the job again
            self.loader.drop_stale_parents()  # and parents get their restarted children's new call tokens
            self._reload(range(plan.code.n, plan.num_workers))
        self._joining = functools.partial(self._join, it)
        try:
            return await self._until_decodable(it)
        finally:
            self._joining = None

    def _join(self, it: _Iteration, w: int) -> None:
        """Ask worker ``w`` (just loaded) in the gather under way, if the round still needs it."""
        needed = w < self.plan.code.n and it.assignment.rows[w] and w not in it.round.finished
        wanted = needed and w not in it.spent and w not in self.integrity.quarantined
        if wanted and self.loader.workers[w].has_job(self.plan.job_id):
            it.model.inline(w)
            it.round.join(self._source(it, w, backups=set(), deferred=False))

    async def _until_decodable(self, it: _Iteration) -> Round:
        """:meth:`run`'s gathers, retries and reloads until the round is decodable; JobFailedError at the deadline."""
        round_ = it.round
        deadline = round_.started + self.plan.spec.iteration_deadline_seconds
        first = True
        while True:
            ask = self._askable(it)
            remaining = deadline - time.perf_counter()
            if ask and remaining > 0:
                await self._gather(it, ask, remaining, first=first)
                first = False
                if round_.decodable:
                    self._decoded(it)
                    return round_
            if deadline - time.perf_counter() <= 0:
                raise self._deadline_error(it)
            if not ask:
                await self.pool.wait_changed(min(deadline - time.perf_counter(), 0.25))

    def _askable(self, it: _Iteration) -> list[int]:
        """The workers to ask now; the round records why the others are not asked (quarantined, DOWN). Workers that
        lack the job are reloaded in the background (their load wakes :meth:`WorkerPool.wait_changed`)."""
        round_, workers, quarantined = it.round, self.loader.workers, self.integrity.quarantined
        for w in it.needed:
            if w in quarantined:
                round_.fail(w, WorkerFailure.worker_down(quarantined[w]))
        askable = [
            w for w in it.needed
            if w not in round_.finished and w not in it.spent and w not in quarantined and workers[w].is_up
        ]  # fmt: skip
        self._reload(askable)
        for w in it.needed:
            if w not in round_.finished and not workers[w].is_up:
                round_.fail(w, WorkerFailure.worker_down(workers[w].last_error or "not reachable"))
        return [w for w in askable if workers[w].is_up and workers[w].has_job(self.plan.job_id)]

    async def _gather(self, it: _Iteration, ask: list[int], remaining: float, *, first: bool) -> None:
        """One gather of ``ask``: on the first, the workers outside the expected decoding set are backups (a retry
        asks everyone left alike); then act on its failures."""
        backups: set[int] = set()
        """Workers asked at low priority: the round expects to decode without them."""
        deferred: set[int] = set()
        hedge = start_slack = None
        if self.primaries is not None and first:
            tree = self.plan.topology is not None
            sharing = set() if tree else sharing_a_machine(self.loader.workers[: self.plan.code.n])
            held = all(w not in sharing and self._holds(w in self.loader.shared_workers) for w in ask)
            backups = set(ask) - self.primaries.choose(it.assignment, ask, held=held)
            deferred = backups & sharing
            hedge = self.primaries.hedge()
            start_slack = self.primaries.start_slack() if backups and held else None
        it.backups, it.deferred = backups, deferred
        ask = sorted(ask, key=lambda w: w in backups)  # large models leave in turn (egress): the expected set's first
        if first:
            ask = self._relay(it, ask)
        else:
            it.model.inline(*ask)
        sources = [self._source(it, w, backups=backups, deferred=w in deferred) for w in ask]
        hedging = Hedging(
            promote_after=hedge,
            reask_after=functools.partial(self.answer_times.bound, iteration=it.t),
            start_slack=start_slack,
        )
        if first:
            it.hedging = hedging
        strategies, lost = (hedging, *it.wait_rules), functools.partial(self._lost, it)
        failures = await it.round.gather(sources, timeout=remaining, strategies=strategies, on_failure=lost)
        await self._after_gather(it, failures)

    def _relay(self, it: _Iteration, ask: list[int]) -> list[int]:
        """Plan iteration ``it``'s relay (``JobSpec.model_delivery``) among the workers of ``ask`` reached over the
        network (shared-memory workers keep shared memory); ``ask`` in the order to send the requests, the seed's
        first."""
        network = [w for w in ask if w not in self.loader.shared_workers]
        if not relays(self.plan.model_delivery, network=len(network), tree=self.plan.topology is not None):
            return ask
        order = self.relay_order.order(network, it.t)
        it.model.relay(order)
        return order + [w for w in ask if w not in network]

    async def _after_gather(self, it: _Iteration, failures: dict[int, WorkerFailure]) -> None:
        """Who answered is seen; the nodes lost are reloaded; a live parent whose children failed is spent. A worker
        whose relayed model failed is not at fault (it was asked again inline); its peer, or one upstream of it, is:
        they are all blamed (a peer waiting for its own model answers its fetchers that it holds none, whoever failed;
        blaming an innocent one only makes it a leaf of the relay for a while)."""
        workers = self.loader.workers
        for w in it.round.finished:
            self.pool.mark_seen(workers[w])
        self._reload_lost(it.round, failures.values())
        for _, peer in it.relay_failures.values():
            for p in it.model.upstream(peer):
                self.relay_order.blame(p, it.t)
        for w, failure in failures.items():
            if it.relay_failures.get(w, (None, -1))[0] is failure:
                continue
            if await self._alive_parent(w, failure):
                it.spent.add(w)

    def _decoded(self, it: _Iteration) -> None:
        """What a decodable round teaches: lateness, the expected set and answer times; integrity's verdict, whose
        quarantined workers are marked DOWN."""
        round_, workers, plan = it.round, self.loader.workers, self.plan
        self.lateness.observe(
            on_time=[workers[w] for w in round_.finished], late=[workers[w] for w in round_.stragglers]
        )
        hedging = it.hedging
        self.start_slack = 0.0 if hedging is None or hedging.start_slack is None else hedging.start_slack
        if self.primaries is not None:
            spread = None if hedging is None else hedging.start_spread()
            self.primaries.answered(round_.finished, time.perf_counter() - round_.started, start_spread=spread)
        self.answer_times.answered(round_)
        self.relay_order.answered(round_.finished)
        if round_.reasked:
            log.info("iteration %d: asked %s again after silence", it.t,
                     ", ".join(workers[w].describe() for w in sorted(round_.reasked)))  # fmt: skip
        for w in self.integrity.judge(round_, it.assignment):
            self.pool.mark_down(workers[w], f"{self.integrity.quarantined[w]} (job {plan.job_id!r})")

    def _deadline_error(self, it: _Iteration) -> JobFailedError:
        """The job's failure: iteration ``it`` was not decodable within its deadline."""
        plan, round_ = self.plan, it.round
        pool_ids = [w.worker_id for w in self.loader.workers]
        return JobFailedError(
            self._undecodable_message(round_, it.needed),
            failure_report(
                plan.job_id, it.t, round_, pool_ids=pool_ids, exact=plan.code.exact,
                elapsed_seconds=time.perf_counter() - it.job_started,
                wall_seconds=time.perf_counter() - round_.started,
            ),
        )  # fmt: skip

    def _lost(self, it: _Iteration, w: int, failure: WorkerFailure) -> None:
        """A worker that lost the job (it restarted: NOT_FOUND) is reloaded at once, within the gather, and joins it
        once loaded (:meth:`_load_and_join`). A worker that could not get its relayed model from its peer
        (FAILED_PRECONDITION) is asked again at once with the model inline."""
        if failure.lost_job:
            self.loader.workers[w].lost_job(self.plan.job_id)
            self._reload([w])
        elif failure.status is grpc.StatusCode.FAILED_PRECONDITION and it.model.relayed(w):
            peer = it.model.inline(w)[0]
            it.relay_failures[w] = (failure, peer)
            workers = self.loader.workers
            log.info("iteration %d: %s could not fetch the model from %s (%s); sending it inline", it.t,
                     workers[w].describe(), workers[peer].describe(), failure.details)  # fmt: skip
            # A backup this round promoted already is asked to send at once: the round promotes a worker once, and
            # a promotion that crossed the failure on the wire found no request to apply to on the worker, which
            # would then hold the new request's messages until the deadline.
            backups = it.backups - it.round.promoted
            it.round.join(self._source(it, w, backups=backups, deferred=w in it.deferred))

    def _reload_lost(self, round_: Round, failures: Iterable[WorkerFailure]) -> None:
        """Reload the tree nodes the parents say lost the job (in their messages, or their errors)."""
        lost = {c for m in round_.messages.values() for c in m.subtree.lost}
        lost.update(c for f in failures for c in f.children_lost)
        workers, job_id = self.loader.workers, self.plan.job_id
        lost = {c for c in lost if 0 <= c < len(workers)}
        for c in lost:
            workers[c].lost_job(job_id)
        self._reload(sorted(lost))

    def _source(self, it: _Iteration, w: int, *, backups: set[int], deferred: bool) -> Source:
        """Worker ``w``'s Compute: its own fields, followed by the iteration's model fields. In a round with
        ``backups``, an expected worker (and a held backup: a measure of when they should) says when it begins
        computing, so the round promotes backups only for the expected workers that have not begun
        (:class:`~gradcode.master.hedging.Hedging`)."""
        backup = w in backups
        rows = it.assignment.rows[w]
        in_shared = w in self.loader.shared_workers
        body, shared = it.model.fields(w, shared=in_shared)
        hold = backup and self._holds(shared)
        head = worker_pb2.ComputeRequest(
            job_id=self.plan.job_id, iteration=it.t, worker_id=w, rows=rows, backup=backup, deferred=deferred,
            report_start=bool(backups) and (hold or not backup), hold=hold,
        )  # fmt: skip
        worker = self.loader.workers[w]
        opened = 0

        def open_() -> ChunkStream:
            """On the worker's Session (or link); asked again after silence, as a call of its own (with the model
            inline if it was relayed)."""
            nonlocal opened, body
            opened += 1
            if opened == 1:
                return worker.compute(head, body)
            if it.model.inline(w):
                body = it.model.fields(w, shared=in_shared)[0]
            return worker.compute_call(head, body)

        return Source(worker_id=w, rows=tuple(rows), open=open_, shared=shared, backup=backup, subtree=self.subtrees[w])

    def _holds(self, shared: bool) -> bool:
        """Whether a backup keeps its messages until pulled (``JobSpec.surplus``: "hold", or "auto" for a worker whose
        messages cross the network rather than ``shared`` memory)."""
        surplus = self.plan.surplus
        return surplus == "hold" or (surplus == "auto" and not shared)

    async def _alive_parent(self, w: int, failure: WorkerFailure) -> bool:
        """Act on worker ``w``'s failure; True when it is a live parent whose children are not decodable."""
        worker = self.loader.workers[w]
        match failure:
            case WorkerFailure(lost_job=True):
                worker.lost_job(self.plan.job_id)  # the worker restarted and lost the job: reload it
                return False
            case WorkerFailure(kind=FailureKind.STATUS, status=grpc.StatusCode.ABORTED):
                # This job's request was abandoned (the job replaced on the worker by a reload, say): about the job,
                # not the worker, which the next gather asks again.
                return False
            case WorkerFailure(kind=FailureKind.STATUS, status=grpc.StatusCode.UNAVAILABLE) if (
                self.plan.topology is not None and await self.pool.probe(worker)
            ):
                return True
        self.pool.mark_down(worker, f"Compute for job {self.plan.job_id!r}: {failure}")
        return False

    def _undecodable_message(self, round_: Round, needed: list[int]) -> str:
        plan, workers = self.plan, self.loader.workers
        late = set(round_.late)
        missing = sorted((w for w in needed if w not in round_.finished), key=lambda w: workers[w].worker_id)
        detail = "; ".join(
            f"{workers[w].describe()}: "
            + (str(round_.failed[w]) if w in round_.failed else "no answer (late)" if w in late else "not asked")
            for w in missing
        )
        got = sorted({workers[m.worker_id].worker_id for m in round_.messages.values()})
        return (
            f"Iteration {round_.iteration}: not decodable within the iteration deadline of "
            f"{plan.spec.iteration_deadline_seconds:g} s; missing workers "
            f"{[workers[w].worker_id for w in missing]} ({detail}). Messages arrived from workers {got}; "
            f"{plan.code!r} tolerates {plan.code.s} straggler(s)"
            + ("." if plan.topology is None else " among the children of every parent.")
        )


class _Iteration:
    """One iteration as :class:`RoundPolicy` runs it: its round, assignment and model, and what it learnt so far."""

    def __init__(
        self,
        round_: Round,
        assignment: Assignment,
        model: _ModelRequest,
        *,
        job_started: float,
        needed: list[int],
        wait_rules: tuple[GatherStrategy, ...],
    ) -> None:
        self.round = round_
        self.assignment = assignment
        self.model = model
        self.job_started = job_started
        self.needed = needed
        """The workers with rows this iteration."""
        self.wait_rules = wait_rules
        """Integrity's stop rule for the round's gathers (:meth:`IntegrityPolicy.wait_rules`)."""
        self.spent: set[int] = set()
        """Parents that answered this iteration that their children are not decodable (not asked again)."""
        self.backups: set[int] = set()
        self.deferred: set[int] = set()
        """The workers the gather under way asked as backups, and the deferred ones among them (a worker asked again
        inline after its relay failed keeps its part)."""
        self.relay_failures: dict[int, tuple[WorkerFailure, int]] = {}
        """Workers whose relayed model failed: the failure, and the peer they fetched from."""
        self.hedging: Hedging | None = None
        """The first gather's backups and hedges: how far apart its expected workers began."""

    @property
    def t(self) -> int:
        return self.round.iteration


class _ModelRequest:
    """Iteration ``t``'s model as serialized ComputeRequest fields: inline (``model``); for workers that accepted the
    job's shared-memory directory, ``shared_model`` (the parameters written there once); or, for workers of the
    iteration's relay (:meth:`relay`), ``relayed_model``: the peer to fetch it from, its length and digest. Each form
    is built at most once (the relayed one once per worker, a few dozen bytes), when a worker first needs it."""

    def __init__(
        self,
        t: int,
        point: Array,
        shared: SharedDirectory | None,
        relay_peer: Callable[[int], tuple[str, str]] | None = None,
    ) -> None:
        self.t = t
        self.point = point
        self.shared = shared
        self.relay_peer = relay_peer
        """A peer's address and the relay token to present to it (:meth:`WorkerLoader.relay_peer`); None: no relay."""
        self._inline: bytes | None = None
        self._in_shared: bytes | None = None
        self._asked_shared: set[int] = set()
        self._peer_of: dict[int, int] = {}
        """The relayed workers (until :meth:`inline`) and the peer each fetches the model from."""
        self._planned: dict[int, int] = {}
        """The relay as planned (:meth:`relay`)."""
        self._digest: bytes | None = None

    def relay(self, order: Sequence[int]) -> None:
        """Relay the model along ``order``: its first worker gets it inline, worker ``order[j]`` fetches it from
        ``order[(j - 1) // RELAY_FANOUT]`` (:func:`~gradcode.common.gather.delivery.relay_peers`)."""
        self._peer_of = relay_peers(order)
        self._planned = dict(self._peer_of)

    def upstream(self, peer: int) -> list[int]:
        """``peer`` and the peers the model reached it through in the relay planned, up to the seed."""
        chain = [peer]
        while chain[-1] in self._planned:
            chain.append(self._planned[chain[-1]])
        return chain

    def relayed(self, worker: int) -> bool:
        """Worker ``worker``'s request carries the relayed form."""
        return worker in self._peer_of

    def inline(self, *workers: int) -> list[int]:
        """Send these workers the model inline from now on (their relay failed, or they are asked again); the peers
        those that were relayed fetched from."""
        return [self._peer_of.pop(w) for w in workers if w in self._peer_of]

    def fields(self, worker: int, *, shared: bool) -> tuple[bytes, bool]:
        """Worker ``worker``'s model request fields, and whether they are the shared-memory form (which then wants
        shared payloads back). A worker gets that form once per round: the round checks and decodes shared
        messages in their slots (:meth:`SharedDirectory.message`), and a worker asked again, perhaps a restarted
        process, must not rewrite a slot the round already holds. A failed write to shared memory falls back to
        the inline form for this iteration."""
        peer = self._peer_of.get(worker)
        if peer is not None and self.relay_peer is not None:
            if self._digest is None:
                self._digest = model_digest(self.point)
            address, bearer = self.relay_peer(peer)
            relayed = worker_pb2.RelayedModel(
                address=address, bearer=bearer, length=int(self.point.size), digest=self._digest,
                hops=len(self.upstream(peer)),  # the fetches the model passes to reach ``worker``
            )  # fmt: skip
            return worker_pb2.ComputeRequest(relayed_model=relayed).SerializeToString(), False
        if shared and self.shared is not None and worker not in self._asked_shared:
            self._asked_shared.add(worker)
            if self._in_shared is None:
                try:
                    reference = self.shared.write_model(self.point)
                except (OSError, ValueError) as exc:  # a full tmpfs; a slot of another size (WireError)
                    log.warning("iteration %d: writing the model to shared memory failed (%s); sending it inline",
                                self.t, exc)  # fmt: skip
                    self.shared = None
                    return self.fields(worker, shared=False)
                self._in_shared = worker_pb2.ComputeRequest(shared_model=reference).SerializeToString()
            return self._in_shared, True
        if self._inline is None:
            self._inline = model_request_bytes(self.point)
        return self._inline, False
