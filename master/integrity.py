"""The master's consistency policy (``JobSpec.integrity``): how long to wait for surplus, what to do on a violation.

The checks themselves are the library's (:func:`~gradcode.common.codes.consistency.check_consistency`:
every linear relation $y B_R = 0$ among the received rows gives $y M_R = 0$ for honest messages); this
module decides, per round, when the messages in hand are *enough*, and acts on what the checks say:

* ``off`` — stop at the first decodable set; nothing is checked.
* ``detect`` — once decodable, check the messages in hand; when they hold no relation (no surplus),
  wait for at most one more message, within the iteration deadline. A violation makes the iteration
  not exact and names the suspects: the one worker the relations single out, or else every worker the
  relations involve. When one is singled out and the others are decodable the step uses the others.
* ``locate`` — wait until the checks can single a wrong worker out: stop once the messages in hand
  are consistent and every one of them takes part in a relation (a wrong one would have broken it), or
  once a violation names one worker; otherwise keep gathering until nobody is left or the deadline.
  The step is decoded without the culprit (exact again when the rest is consistent), and a worker
  singled out in :data:`QUARANTINE_AFTER` iterations is quarantined: marked DOWN in the pool, saying
  why, and never asked again by this job (a health probe may revive it for other jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gradcode.common.codes.base import Assignment, GradientCode
from gradcode.common.codes.consistency import ConsistencyReport, check_consistency, parity_checks
from gradcode.common.round import Integrity, Round

__all__ = ["DEFAULT_INTEGRITY", "INTEGRITY_POLICIES", "QUARANTINE_AFTER", "IntegrityPolicy"]

log = logging.getLogger(__name__)

INTEGRITY_POLICIES = ("off", "detect", "locate")
DEFAULT_INTEGRITY = "off"
"""Chosen from ``python -m gradcode.bench.integrity`` (README, "Exact, or labelled"): checking needs
n - s + 1 answers, so with s workers persistently slow it costs the whole straggler delay (6.8x the
iteration time in the benchmark), and 1.1-1.5x with no or random delays; a job opts in."""
QUARANTINE_AFTER = 2
"""Under ``locate``, a worker singled out in this many iterations of a job is quarantined."""
_COVERAGE = 1e-9
"""A row takes part in a relation when its coefficient is above this (relative to the largest)."""


class IntegrityPolicy:
    """One job's consistency policy: a stop rule per round, a verdict after it, and the offenders so far.

    ``describe(w)`` names worker index ``w`` for reports and logs (the pool's id and address).
    """

    def __init__(self, policy: str, code: GradientCode, *, describe: Callable[[int], str] = str) -> None:
        if policy not in INTEGRITY_POLICIES:
            raise ValueError(f"Unknown integrity policy {policy!r}; valid policies are {list(INTEGRITY_POLICIES)}.")
        self.policy = policy
        self.code = code
        self.describe = describe
        self.offences: dict[int, list[int]] = {}
        """Worker index -> iterations in which the checks singled it out."""
        self.quarantined: dict[int, str] = {}
        """Worker index -> why it is never asked again by this job."""
        self._last: tuple[Round, frozenset[int], ConsistencyReport] | None = None
        """The last full check: the gather's stop rule and :meth:`judge` look at the same messages."""

    @property
    def checking(self) -> bool:
        return self.policy != "off"

    def enough(self, round_: Round, assignment: Assignment) -> Callable[[], bool] | None:
        """The stop rule for ``round_``'s gather (None: stop at the first decodable set)."""
        if not self.checking:
            return None
        at_decodable: list[int] = []

        def enough() -> bool:
            messages = len(round_.messages)
            if not at_decodable:
                at_decodable.append(messages)
            report = self._full_check(round_, assignment)
            if self.policy == "detect":
                return report.checks > 0 or messages > at_decodable[0]
            if report.consistent:
                return report.checks > 0 and _all_covered(self.code, sorted(round_.messages))
            return report.located is not None

        return enough

    def _full_check(self, round_: Round, assignment: Assignment) -> ConsistencyReport:
        """:func:`_check` of all ``round_``'s messages, once per set of messages."""
        rows = frozenset(round_.messages)
        if self._last is None or self._last[0] is not round_ or self._last[1] != rows:
            self._last = (round_, rows, _check(self.code, round_, assignment))
        return self._last[2]

    def judge(self, round_: Round, assignment: Assignment) -> list[int]:
        """Check ``round_``'s messages, set its :attr:`~Round.integrity` and decode around a culprit.

        Returns the workers to quarantine now (under ``locate``, singled out for the
        :data:`QUARANTINE_AFTER`-th time); the caller marks them DOWN.
        """
        if not self.checking or not round_.decodable:
            round_.integrity = Integrity(note="off" if not self.checking else "not decodable")
            return []
        report = self._full_check(round_, assignment)
        if report.checks == 0:
            round_.integrity = Integrity(note="no surplus message: nothing to check")
            return []
        if report.consistent:
            round_.integrity = Integrity(checks=report.checks, note=f"consistent ({_checks(report.checks)})")
            return []
        t = round_.iteration
        ratio = f"{report.worst_violation:.3g}x the rounding bound, {_checks(report.checks)}"
        if report.located is None:
            suspects = report.suspects or _involved(self.code, sorted(round_.messages), assignment)
            note = (
                f"violation ({ratio}): the messages of workers "
                f"{[self.describe(w) for w in suspects]} break the code's relations; too little surplus to "
                "single one out, the step uses them all"
            )
            log.warning("Iteration %d: consistency %s.", t, note)
            round_.integrity = Integrity(report.checks, tuple(suspects), trusted=False, note=note)
            return []
        culprit = report.located
        offences = self.offences.setdefault(culprit, [])
        offences.append(t)
        decoded_around = round_.exclude([culprit])
        rest = _check(self.code, round_, assignment, leave_out=culprit) if decoded_around else None
        cleared = self.policy == "locate" and rest is not None and rest.consistent
        note = (
            f"violation ({ratio}) singles out {self.describe(culprit)}; "
            + ("the step is decoded without it" if decoded_around else "the others are not decodable without it")
            + ("" if rest is None or rest.consistent else ", but the others are not consistent either")
        )
        quarantine = []
        if self.policy == "locate" and len(offences) >= QUARANTINE_AFTER:
            self.quarantined[culprit] = (
                f"quarantined: its messages broke the code's consistency relations in iterations {offences}"
            )
            quarantine.append(culprit)
            note += f"; quarantined (singled out in iterations {offences})"
        log.warning("Iteration %d: consistency %s.", t, note)
        round_.integrity = Integrity(report.checks, (culprit,), trusted=cleared, note=note)
        return quarantine


def _checks(count: int) -> str:
    return f"{count} check" + ("" if count == 1 else "s")


def _check(
    code: GradientCode, round_: Round, assignment: Assignment, *, leave_out: int | None = None
) -> ConsistencyReport:
    messages = {r: m.vector for r, m in round_.messages.items() if m.worker_id != leave_out}
    return check_consistency(code, messages, assignment=assignment)


def _coverage(code: GradientCode, rows: Sequence[int]) -> Any:
    """Per received row: whether some relation among ``rows`` involves it."""
    checks = np.abs(parity_checks(np.asarray(code.B)[list(rows)]))
    if checks.size == 0:
        return np.zeros(len(rows), dtype=bool)
    return checks.max(axis=0) > _COVERAGE * checks.max()


def _all_covered(code: GradientCode, rows: Sequence[int]) -> bool:
    return bool(np.all(_coverage(code, rows)))


def _involved(code: GradientCode, rows: Sequence[int], assignment: Assignment) -> tuple[int, ...]:
    """Workers whose received rows take part in some relation (the suspects when none is singled out)."""
    owner: Mapping[int, int] = assignment.owner
    return tuple(sorted({owner[r] for r, covered in zip(rows, _coverage(code, rows), strict=True) if covered}))
