"""Whom a round expects to decode from: the master's choice of primaries, which the simulator makes the same way.

The round asks the other workers as backups (:class:`~gradcode.master.hedging.Hedging` promotes them when expected
workers are late); :func:`~gradcode.common.sim.simulate.simulate` expects the same set, so a simulated iteration
waits for the messages the master would.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Sequence

from gradcode.common.codes.base import Assignment, GradientCode

__all__ = [
    "DEFAULT_SURPLUS",
    "HOLD_OVERDUE_FACTOR",
    "START_SLACK_SECONDS",
    "SURPLUS_MODES",
    "Primaries",
    "start_overdue",
]

SURPLUS_MODES = ("push", "hold", "auto")
"""JobSpec.surplus: backups stream their messages at once (push), keep them until the round pulls them (hold), or
hold where the payload would cross the network and push where it goes through shared memory (auto)."""
DEFAULT_SURPLUS = "auto"
HOLD_OVERDUE_FACTOR = 2.0
"""A held backup that is ready is pulled when an expected worker is still out this many times the round's time to
the latest expected worker that finished (:meth:`~gradcode.master.hedging.Hedging.pull_at`); with no expected worker
begun, this many times the time the latest held backup took to begin."""
START_SLACK_SECONDS = 0.003
"""The least time an expected worker may take to begin after the last of the others did before it is covered
(:func:`start_overdue`): past the wake-up of a process that waits for a core (about a millisecond on Linux, a few
under load)."""


def start_overdue(began: Sequence[float], slack: float = START_SLACK_SECONDS) -> float:
    """When expected workers that have not begun are late, from the moments the others ``began`` (seconds from the
    round's start): as long again after the last of them as between the first and the last, at least ``slack``
    (:meth:`~gradcode.master.hedging.Hedging.start_overdue_at`; the simulator's held backups are pulled by the same
    rule)."""
    first, last = min(began), max(began)
    return last + max(last - first, slack)


class Primaries:
    """The workers a round expects to decode from; the round asks the others as backups.

    The code picks a minimal decoding set (:meth:`~gradcode.common.codes.base.GradientCode.decoding_set`),
    preferring the workers that answered the last round; the set is kept while its members keep answering, so a
    persistently slow worker becomes a backup. Sets are cached by assignment, askable workers and the workers
    that missed the last round (a decoding set costs up to 1 ms to find at n = 16, 3-30 ms at n = 200).

    A set of n - s or more of the askable workers (any n - s decode a cyclic code) is no set unless the backups are
    ``held``: every worker is expected. Its s backups would save s workers' work and cost a late start whenever one
    of the many expected workers straggles. The training benchmark measured cyclic 1.13-1.17x slower with them
    (s = 1, no delay and one worker delayed 0.25 s), but its next run put the same configuration twice at 1.07 and
    1.27: within the comparison's noise, so this rests on the argument more than on the figure. Fractional, binary
    and Reed-Solomon, whose sets are n / (s + 1), ran 0.56-0.83x as long as with every worker asked alike (no delay
    and one worker delayed 0.25 s) in both runs since backups on one machine wait to be promoted. Held backups
    (they compute at once, on machines of their own, and keep their messages until the round pulls them:
    ``JobSpec.surplus``) start on time, so even an n - s set is worth having then: it saves the receiver's link s
    messages per round (a tree's surplus sub-tree message too).
    """

    CACHED = 256
    HEDGE_FACTOR = 2.0
    """A round not decoded after this many times the median of the recent rounds' gathers hedges (promotes backups)."""
    HEDGE_HISTORY = 16
    """Rounds remembered for the hedge and the start slack."""
    FIRST_HEDGE_SECONDS = 1.0
    """The hedge before any round has decoded."""

    def __init__(self, code: GradientCode) -> None:
        self.code = code
        self._seconds: collections.deque[float] = collections.deque(maxlen=self.HEDGE_HISTORY)
        self._start_spreads: collections.deque[float] = collections.deque(maxlen=self.HEDGE_HISTORY)
        self.current: frozenset[int] | None = None
        self._assignment: Assignment | None = None
        self._answered: frozenset[int] = frozenset()
        self._cache: collections.OrderedDict[
            tuple[tuple[tuple[int, ...], ...], frozenset[int], frozenset[int], bool], frozenset[int]
        ] = collections.OrderedDict()
        self._held = False

    def choose(self, assignment: Assignment, askable: Sequence[int], *, held: bool = False) -> frozenset[int]:
        """The decoding set this round expects among ``askable`` (all of them when together they do not decode, or
        when the set leaves out only s or fewer and the backups are not ``held``)."""
        everyone = frozenset(askable)
        current = self.current
        reuse = assignment == self._assignment and held == self._held
        if current is not None and reuse and current <= everyone & self._answered:
            return current
        missed = everyone - self._answered
        key = (assignment.rows, everyone, missed, held)
        chosen = self._cache.get(key)
        if chosen is None:
            found = self.code.decoding_set(assignment, sorted(everyone, key=lambda w: (w in missed, w)))
            small = found is not None and len(found) < len(everyone) - (0 if held else self.code.s)
            chosen = frozenset(found or ()) if small else everyone
            self._cache[key] = chosen
            if len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        self.current, self._assignment, self._held = chosen, assignment, held
        return chosen

    def answered(self, workers: Iterable[int], seconds: float, *, start_spread: float | None = None) -> None:
        """The workers whose messages arrived in the round just decoded, how long its gather took and, when every
        expected worker began before it decoded, how far apart they began (``start_spread``)."""
        self._answered = frozenset(workers)
        self._seconds.append(seconds)
        if start_spread is not None:
            self._start_spreads.append(start_spread)

    def start_slack(self) -> float:
        """How long an expected worker that has not begun is waited for, at least, after the last of the others
        before held backups are pulled for it (:func:`start_overdue`): the median spread of the expected workers'
        beginnings in the recent rounds where all began, at least :data:`START_SLACK_SECONDS`.

        Learnt, because across hosts workers begin as their models arrive and their CPU quotas let them: on the
        emulated cluster (n = 6, 200 Mbit/s, hosts at 25 % of a core, the model relayed) the last expected worker
        began 20-45 ms after the first in rounds without a straggler, and the fixed slack pulled a held backup's
        0.8 MB in 0.5-0.9 of them. A round whose late worker never began (a straggler the backups covered) teaches
        nothing, so a straggler's delay does not raise the slack."""
        if not self._start_spreads:
            return START_SLACK_SECONDS
        return max(START_SLACK_SECONDS, statistics.median(self._start_spreads))

    def hedge(self) -> float:
        """Seconds after which a round not yet decoded hedges (:meth:`Hedging._hedge
        <gradcode.master.hedging.Hedging._hedge>`: the backups completing it, later every one): the promotion
        :class:`~gradcode.master.hedging.Hedging` starts when expected workers end cannot start while more than
        s of them hang (frozen, or slower than anything), and deferred backups would otherwise wait for the
        iteration deadline."""
        if not self._seconds:
            return self.FIRST_HEDGE_SECONDS
        return self.HEDGE_FACTOR * statistics.median(self._seconds)
