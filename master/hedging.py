"""The master's backups and hedges inside one round's gather: a :class:`~gradcode.common.gather.round.GatherStrategy`.

The round (:mod:`gradcode.common.gather.round`) only collects; every decision the master takes while it gathers,
beyond whom to ask (:class:`~gradcode.common.gather.primaries.Primaries`), is here: which backups to promote when
expected workers are late, promoting every backup at the hedge, asking a silent worker again, and pulling a held
backup's messages once they are needed, each through the gather's actions
(:class:`~gradcode.common.gather.round.Gathering`: ``promote``, ``reopen``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from gradcode.common.gather.primaries import HOLD_OVERDUE_FACTOR, START_SLACK_SECONDS, start_overdue
from gradcode.common.gather.round import Gathering, GatherStrategy, Source, WorkerFailure

__all__ = ["Hedging"]


def hedge_step_at(step: int) -> float:
    """When the hedge's ``step``-th step comes (from 1), in ``promote_after`` from the round's start: 1, 2, 4, 8, ...
    (:meth:`Hedging._hedge`)."""
    return float(2 ** (step - 1))


class Hedging(GatherStrategy):
    """One gather's backups and hedges (a fresh one per :meth:`Round.gather
    <gradcode.common.gather.round.Round.gather>`).

    The sources not asked as backups (:attr:`Source.backup`) are the ones the round expects to decode from. When
    an expected worker ends without the round decoding, and at most ``s`` of the expected workers still out have
    not said their computation began (:meth:`Gathering.began`; one that did is finishing, not straggling), the
    backups that complete the messages in hand and those being computed
    (:meth:`~gradcode.common.codes.base.GradientCode.decoding_set`) are promoted: they compute on at normal
    priority, on the CPU the expected workers that answered left; should an expected worker then fail, the backups
    that complete the messages without it are promoted too. The same backups are promoted sooner, before any
    expected worker ended, when every expected worker but at most ``s`` has begun and those have not by
    :meth:`start_overdue_at`: late to begin by more than the others' own spread (a worker that waits for a core
    begins within it), they are delayed, not slow. While every expected worker still out has begun,
    nothing is promoted: backups would only take its CPU. ``promote_after`` seconds after the round started, a
    round still not decodable promotes the backups that complete the messages in hand as if every expected worker
    still out were lost (more than ``s`` of them may hang, or one that began may never finish), twice that long
    after those completing them with the workers still computing, and at four, eight, sixteen, ... times one, two,
    four, ... sets of the backups not promoted yet that each complete them as if every worker still out were lost,
    every backup left once no such set remains (:meth:`_hedge`).

    ``reask_after(worker)`` (None: never) is how long an expected worker may stay silent: one from which nothing at
    all has come that long after it was asked, while the round is not decodable, has its call cancelled and its
    source opened again, once per gather (:meth:`Gathering.reopen`): a request lost on its way or stuck in a worker
    then costs that bound, not the iteration. Backups are silent by design and never are.

    A backup asked to ``hold`` its messages (``JobSpec.surplus``) computes them but sends only a notice that they
    are ready (:meth:`Gathering.ready`) until promoted, which pulls them: every rule above pulls the held backups it
    promotes, and while the round is not decodable, a held backup is ready and at most ``s`` expected workers are
    still out past :meth:`pull_at`, the backups that complete the messages in hand are pulled too, the ready ones
    first (once per gather).

    A ``start_slack`` (held backups: :meth:`~gradcode.common.gather.primaries.Primaries.start_slack`, the spread of
    recent rounds' beginnings) is the least time an expected worker that has not begun is waited for after the
    last of the others, and an expected worker that ends no longer covers the ones not begun at once: they are
    covered when that time has passed. A pulled backup costs the receiver's link a whole message, and across hosts
    workers begin as their models arrive, tens of milliseconds apart. Without one (backups computing beside the
    expected workers, whose promotion costs only the CPU those left), the slack is
    :data:`~gradcode.common.gather.primaries.START_SLACK_SECONDS` and an ending covers at once.
    """

    def __init__(
        self,
        *,
        promote_after: float | None = None,
        reask_after: Callable[[int], float | None] | None = None,
        start_slack: float | None = None,
    ) -> None:
        self.promote_after = promote_after
        self.reask_after = reask_after
        self.start_slack = start_slack
        self._gathering: Gathering | None = None
        self._out: set[int] = set()
        """Expected workers still out: the trigger of the backups' promotion (none: no backups to promote)."""
        self._expected: frozenset[int] = frozenset()
        """Every expected worker of the gather."""
        self._hedge_at: float | None = None
        self._hedges = 0
        """The hedge's steps taken (:meth:`_hedge`)."""
        self._promoted = False
        """This gather has promoted the backups completing the expected workers' messages."""
        self._reask_at: dict[int, float] = {}
        """When each expected worker, silent until then, is asked again (once)."""
        self._pulled = False
        """This gather has pulled held backups for overdue expected workers."""

    @property
    def gathering(self) -> Gathering:
        if self._gathering is None:
            raise RuntimeError("Hedging is used before its gather began.")
        return self._gathering

    def begin(self, gathering: Gathering) -> None:
        self._gathering = gathering
        backups = gathering.backups
        self._out = gathering.pending - backups if backups else set()
        self._expected = frozenset(self._out)
        if backups and self.promote_after is not None:
            self._hedge_at = gathering.round.started + hedge_step_at(1) * self.promote_after
        now = gathering.now()
        for source in gathering.sources.values():
            self._bound(source, now)

    def joined(self, source: Source) -> None:
        self._bound(source, self.gathering.now())

    def _bound(self, source: Source, now: float) -> None:
        """When ``source``, if it stays silent, is asked again."""
        if self.reask_after is None or source.backup:
            return
        bound = self.reask_after(source.worker_id)
        if bound is not None:
            self._reask_at[source.worker_id] = now + bound

    def wake_at(self) -> float | None:
        times = (self._hedge_at, self.pull_at(), self.start_overdue_at(), *self._reask_at.values())
        return min((t for t in times if t is not None), default=None)

    def start_overdue_at(self) -> float | None:
        """When the expected workers that have not begun are covered although none ended (None: not now): at
        most ``s`` of them, every other expected worker began (or ended), and as long again has passed since the
        last of those began as between the first and the last of them, at least
        :data:`~gradcode.common.gather.primaries.START_SLACK_SECONDS`.

        The others' spread is the measure on purpose: workers that share cores begin as the scheduler lets them,
        a few milliseconds apart under load, and a worker waiting for a core is within that; an emulated or
        real delay before the computation (a busy or paused host, a request held up on its way) is not.

        When no expected worker began (the round expects one, as a tree of two first-layer nodes does), the held
        backups that began and are still out (they compute at once and say so) are the measure: the expected ones
        are covered :data:`HOLD_OVERDUE_FACTOR` times the time the latest of those took to begin, past its
        request's own way (the model crossing the link). Without it such a round waited for its one expected
        worker's delay, or the hedge: on the emulated cluster a tree of n = 2, L = 2 took 444 ms per iteration with
        one 0.25 s straggler against 280 without."""
        gathering = self.gathering
        began_at, s = gathering.began_at, gathering.round.decoder.code.s
        if self._promoted or gathering.decodable or not self._out or len(began_at) + s < len(self._expected):
            return None  # (the last test is cheap and necessary: it spares the loop's every turn the sets below)
        waiting = self._waiting()
        if not 0 < len(waiting) <= s:
            return None
        others = self._expected - waiting
        if not others:  # no expected worker began: held backups that did are the measure
            held = [t for w, t in began_at.items() if w in gathering.backups and w in gathering.pending]
            return gathering.round.started + HOLD_OVERDUE_FACTOR * max(held) if held else None
        if not others <= began_at.keys():
            return None
        slack = START_SLACK_SECONDS if self.start_slack is None else self.start_slack
        return gathering.round.started + start_overdue([began_at[w] for w in others], slack)

    def start_spread(self) -> float | None:
        """How far apart the expected workers began (seconds), when every one did and none failed (None otherwise,
        or when the gather expected every worker alike): what :meth:`Primaries.start_slack
        <gradcode.common.gather.primaries.Primaries.start_slack>` learns from; None too before the gather began."""
        gathering, expected = self._gathering, self._expected
        if gathering is None or not expected or not expected <= gathering.began_at.keys():
            return None
        if expected & gathering.failures.keys():
            return None
        times = [gathering.began_at[w] for w in expected]
        return max(times) - min(times)

    def pull_at(self) -> float | None:
        """When the held backups that are ready get pulled (None: not now, or not before an expected worker finished:
        the hedge covers that): :data:`HOLD_OVERDUE_FACTOR` times the round's time to the latest expected worker that
        finished, while the round is not decodable and at most ``s`` expected workers are still out.

        A simple rule on purpose: the expected workers share the receiver's link, so on a slow link the last of them
        finishes up to one message's transfer after the one before; twice the time the others took is past that, yet
        a frozen worker (one that began, so the rules before hold wait for it) costs at most that time plus the
        pulled message's transfer, instead of the hedge's twice the median round."""
        gathering = self.gathering
        if self._pulled or gathering.decodable or not 0 < len(self._out) <= gathering.round.decoder.code.s:
            return None
        if not gathering.ready():
            return None
        round_ = gathering.round
        times = [t for w, t in round_.finished.items() if w not in gathering.backups]
        return round_.started + HOLD_OVERDUE_FACTOR * max(times) if times else None

    def tick(self, now: float) -> None:
        gathering = self.gathering
        start_overdue_at = self.start_overdue_at()
        if start_overdue_at is not None and now >= start_overdue_at:
            self._cover_stragglers()
        if self._hedge_at is not None and now >= self._hedge_at:
            self._hedge()
        pull_at = self.pull_at()
        if pull_at is not None and now >= pull_at:  # a held backup waits, an expected worker is overdue
            self._promote_completing(gathering.pending & gathering.backups, set(), first=gathering.ready())
            self._pulled = True
        if self._reask_at:
            if gathering.decodable:  # gathering surplus (integrity): nobody is needed any more
                self._reask_at.clear()
            else:  # (the loop ticks only when every item that arrived is taken: a silent worker is silent)
                self._reask(now)

    def _hedge(self) -> None:
        """The hedge, in steps at 1, 2, 4, 8, ... times ``promote_after`` from the round's start: at 1x, the backups
        that complete the messages in hand as if every expected worker still out were lost; at 2x, those that
        complete them with the workers computing (expected or promoted, begun and still out) as if every other were
        lost; from 4x on, sets among the backups not promoted yet that each complete the messages in hand as if every
        worker still out were lost (one that began may never finish), one set at 4x, two at 8x, four at 16x, ...,
        and every backup left once no such set remains. Never every backup at once while fewer complete: a promoted
        backup that holds its messages sends a whole one across the receiver's link, so what is pulled grows with the
        time the round has waited. On the emulated cluster (fractional s = 11, n = 24, 8 MB messages, a
        200 Mbit/s master link) the hedges of the first two iterations pulled all 22 backups each; 132 and 184 MB
        reached the master in iterations 2 and 3 (6.3 and 7.4 s, against 1.8-2.3 s after), where two messages
        complete the round. With every backup at 4x, a verify job's first iteration (hedge at 1 s, before any round
        had decoded, on hosts that took 2-3 s a round) still pulled 21 backups: 78 MB in its round and 138 MB in the
        next, 7.4 and 5.9 s."""
        gathering = self.gathering
        if self.promote_after is None:
            return
        self._hedges += 1
        backups = gathering.pending & gathering.backups
        promoted = gathering.round.promoted  # (the round's own set: it grows as this promotes)
        if self._hedges == 1:
            self._promote_completing(backups, set())
        elif self._hedges == 2:  # the promoted backups that have not begun count as lost
            began = {w for w in promoted & gathering.pending if gathering.began(w)}
            computing = (self._out - self._waiting()) | began
            self._promote_completing((backups - promoted) | began, computing)
        else:  # 1, 2, 4, ... more sets each step: the bytes pulled grow with the time the round has waited
            for _ in range(2 ** (self._hedges - 3)):
                if not self._promote_completing(backups - promoted, set()):
                    gathering.promote(sorted(backups))
                    break
        left = backups - promoted
        later = hedge_step_at(self._hedges + 1) if left else None
        self._hedge_at = None if later is None else gathering.round.started + later * self.promote_after

    def _reask(self, now: float) -> None:
        """Reopen the calls of the expected workers silent past their bound (once each)."""
        gathering = self.gathering
        for worker_id in [w for w, at in self._reask_at.items() if at <= now]:
            del self._reask_at[worker_id]
            if worker_id in gathering.pending and worker_id not in gathering.heard:
                gathering.reopen(worker_id)

    def ended(self, worker_id: int, failure: WorkerFailure | None) -> None:
        """An expected worker ended: promote the backups that complete the messages, unless too many are out.
        After the first promotion, again only when an expected worker failed (it may have been counted on)."""
        out = self._out
        if worker_id not in out:
            return
        out.discard(worker_id)
        gathering = self.gathering
        if gathering.decodable or (self._promoted and failure is None):
            return
        at_once = self.start_slack is None or failure is not None  # else start_overdue_at covers them in time
        if not out or (at_once and 0 < len(self._waiting()) <= gathering.round.decoder.code.s):
            self._cover_stragglers()

    def _waiting(self) -> set[int]:
        """The expected workers still out that have not begun."""
        gathering = self.gathering
        return {w for w in self._out if not gathering.began(w)}

    def _cover_stragglers(self) -> None:
        """Promote the backups that complete the messages in hand and those of the expected workers computing."""
        self._promote_completing(self.gathering.pending - self._out, self._out - self._waiting())
        self._promoted = True

    def _promote_completing(self, backups: set[int], computing: set[int], first: Collection[int] = ()) -> bool:
        """Promote the ``backups`` that complete the messages of the workers that answered and of those still
        ``computing`` (a minimal set), preferring those in ``first`` (held backups whose messages are ready), then
        those promoted already; False when none do."""
        gathering = self.gathering
        round_, decoder = gathering.round, gathering.round.decoder
        given = [*round_.finished, *computing]
        preference = sorted(backups, key=lambda w: (w not in first, w not in round_.promoted, w))
        chosen = decoder.code.decoding_set(decoder.assignment, preference, given=given)
        gathering.promote(chosen or ())
        return chosen is not None
