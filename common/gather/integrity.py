"""A receiver's consistency policy (``JobSpec.integrity``), the master's and every tree parent's: how long to wait for
surplus, what to do on a violation.

The checks themselves are the library's (:func:`~gradcode.common.codes.consistency.check_consistency`:
every linear relation $y B_R = 0$ among the received rows gives $y M_R = 0$ for honest messages); this
module decides, per round, when the messages in hand are *enough* (:class:`WaitForChecks`, the stop rule
the master hands to the round), and acts on what the checks say (:meth:`IntegrityPolicy.judge`).

Fault model (README, "Exact, or labelled"): at most one worker (or tree node) sends wrong values, of any
shape. A decode is *checked* when the decoding weights of every worker it used are a combination of the
relations in hand (:meth:`~gradcode.common.codes.consistency.ConsistencyReport.lie_bounds`); the largest
error an undetected lie could then add is added to the decode's certificate, so "exact" holds against
that one liar. A decode that used a row no relation covers is ``unchecked``: not exact.

* ``off`` — stop at the first decodable set; nothing is checked.
* ``detect`` — once decodable, wait (within the iteration deadline) until every worker the decode uses is
  checked with an undetectable-lie bound within half the tolerance, or a violation shows. A violation
  makes the iteration not exact and names the suspects; when the deadline comes first the iteration is
  ``unchecked`` (not exact).
* ``locate`` — as ``detect``, and on a violation wait until the checks single one worker out; the step is
  decoded without it (exact again when the rest is consistent). A worker singled out in
  :data:`QUARANTINE_AFTER` iterations is quarantined (marked DOWN in the pool, never asked again by this
  job), counting only iterations where no *pair* of other workers explains the violations as well: two
  colluders can never get an honest worker quarantined; when they could, the iteration says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gradcode.common.codes.base import Assignment, Decoding, GradientCode
from gradcode.common.codes.consistency import (
    ConsistencyReport,
    check_consistency,
    decode_excluding,
    involved_rows,
    uncheckable,
)
from gradcode.common.gather.round import GatherStrategy, Integrity, Round

__all__ = [
    "DEFAULT_INTEGRITY",
    "INTEGRITY_POLICIES",
    "QUARANTINE_AFTER",
    "IntegrityPolicy",
    "WaitForChecks",
    "uncheckable",
]

log = logging.getLogger(__name__)

INTEGRITY_POLICIES = ("off", "detect", "locate")
DEFAULT_INTEGRITY = "off"
"""Chosen from ``python -m gradcode.bench.integrity`` (README, "Exact, or labelled"): checking needs
n - s + 1 answers, so with s workers persistently slow it costs the whole straggler delay (6.8x the
iteration time in the benchmark), and 1.1-1.5x with no or random delays; a job opts in."""
QUARANTINE_AFTER = 2
"""Under ``locate``, a worker singled out in this many iterations of a job is quarantined."""


@dataclass(frozen=True)
class Verdict:
    """The checks of one set of messages, and what they prove about its decoding."""

    report: ConsistencyReport
    decoding: Decoding | None
    lie_bounds: Mapping[int, float]
    """Per worker the decoding uses: the largest error an undetected lie of it alone could add (inf: unchecked)."""
    gradient_norm: float

    @property
    def unchecked(self) -> tuple[int, ...]:
        return tuple(w for w, bound in self.lie_bounds.items() if not math.isfinite(bound))

    @property
    def lie_bound(self) -> float:
        """The largest finite lie bound (the unchecked workers are labelled apart)."""
        return max((b for b in self.lie_bounds.values() if math.isfinite(b)), default=0.0)

    def checked_within(self, tolerance: float) -> bool:
        """Consistent, every used worker checked, and an undetected lie within half ``tolerance`` (relative)."""
        return self.report.consistent and not self.unchecked and self.lie_bound <= 0.5 * tolerance * self.gradient_norm


class WaitForChecks(GatherStrategy):
    """The stop rule of a checking round's gather (a strategy of :meth:`Round.gather`): enough once the messages
    in hand are enough for the job's policy (module docstring)."""

    def __init__(self, policy: IntegrityPolicy, round_: Round, assignment: Assignment) -> None:
        self.policy = policy
        self.round = round_
        self.assignment = assignment

    def enough(self) -> bool:
        verdict = self.policy.verdict(self.round, self.assignment)
        if verdict.checked_within(self.round.tolerance):
            return True
        report = verdict.report
        if report.consistent:
            return False
        if self.policy.policy == "detect":
            return True
        return report.located is not None and not report.accomplices


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
        """Worker index -> iterations in which the checks singled it out (against two liars)."""
        self.quarantined: dict[int, str] = {}
        """Worker index -> why it is never asked again by this job."""
        self._last: tuple[Round, frozenset[int], Verdict] | None = None
        """The last full verdict: the gather's stop rule and :meth:`judge` look at the same messages."""

    @property
    def checking(self) -> bool:
        return self.policy != "off"

    def wait_rules(self, round_: Round, assignment: Assignment) -> tuple[WaitForChecks, ...]:
        """The strategies for ``round_``'s gather: the stop rule when checking (none: stop at the first decodable
        set)."""
        return (WaitForChecks(self, round_, assignment),) if self.checking else ()

    def verdict(self, round_: Round, assignment: Assignment) -> Verdict:
        """:func:`assess` of all ``round_``'s messages, once per set of messages."""
        rows = frozenset(round_.messages)
        if self._last is None or self._last[0] is not round_ or self._last[1] != rows:
            self._last = (round_, rows, assess(self.code, round_, assignment))
        return self._last[2]

    def judge(self, round_: Round, assignment: Assignment) -> list[int]:
        """Check ``round_``'s messages, set its :attr:`~Round.integrity` and decode around a culprit.

        Returns the workers to quarantine now (under ``locate``, singled out for the
        :data:`QUARANTINE_AFTER`-th time by this receiver's own checks); the caller marks them DOWN. Nodes a tree
        parent singled out are named among the suspects, never the parent; those it quarantined are recorded for
        this job only (:attr:`quarantined`) and not returned: the receiver has only the parent's word for it, and
        a lying parent must not get an honest child marked DOWN for every job. (The round has already refused a
        message that names a node outside its sender's subtree.)
        """
        quarantine = self._judge(round_, assignment)
        named = {c: m.worker_id for m in round_.messages.values() for c in m.subtree.singled_out}
        by_parents = sorted(
            {c for m in round_.messages.values() for c in m.subtree.quarantined} - set(self.quarantined)
        )
        if not named and not by_parents:
            return quarantine
        integrity = round_.integrity
        note = integrity.note + "".join(
            f"; {self.describe(parent)} singled out its child {self.describe(child)} and decoded without it"
            for child, parent in sorted(named.items())
        )
        for child in by_parents:
            self.quarantined[child] = "quarantined by its tree parent: its messages broke the code's relations"
            note += f"; {self.describe(child)} quarantined by its parent (in this job)"
        suspects = tuple(sorted(set(integrity.suspects) | set(named)))
        round_.integrity = replace(integrity, suspects=suspects, note=note)
        return quarantine

    def _judge(self, round_: Round, assignment: Assignment) -> list[int]:
        """:meth:`judge` of this round's own messages."""
        if not self.checking or not round_.decodable:
            round_.integrity = Integrity(note="off" if not self.checking else "not decodable")
            return []
        verdict = self.verdict(round_, assignment)
        report = verdict.report
        if report.consistent:
            round_.integrity = _consistent(verdict, round_.timed_out)
            if verdict.unchecked:
                log.warning("Iteration %d: %s.", round_.iteration, round_.integrity.note)
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
        flagged = any(m.approximate or m.subtree.singled_out for m in round_.messages.values() if
                      assignment.owner[m.row] == culprit)  # fmt: skip
        decoded_around = round_.exclude([culprit])
        rest = assess(self.code, round_, assignment, leave_out=culprit) if decoded_around else None
        cleared = self.policy == "locate" and rest is not None and rest.report.consistent
        note = (
            f"violation ({ratio}) singles out {self.describe(culprit)}"
            + (" (if only one worker lies)" if report.accomplices else "")
            + "; "
            + ("the step is decoded without it" if decoded_around else "the others are not decodable without it")
            + ("" if rest is None or rest.report.consistent else ", but the others are not consistent either")
        )
        quarantine = []
        if flagged:
            note += "; its own message says its children's decode was not clean, so it is not held against it"
        elif report.accomplices:
            pair = report.accomplices[0]
            note += (
                f"; workers {self.describe(pair[0])} and {self.describe(pair[1])} colluding would explain it as "
                "well, so it is not held against it"
            )
        else:
            offences = self.offences.setdefault(culprit, [])
            offences.append(t)
            if self.policy == "locate" and len(offences) >= QUARANTINE_AFTER:
                self.quarantined[culprit] = (
                    f"quarantined: its messages broke the code's consistency relations in iterations {offences}"
                )
                quarantine.append(culprit)
                note += f"; quarantined (singled out in iterations {offences})"
        log.warning("Iteration %d: consistency %s.", t, note)
        round_.integrity = Integrity(
            report.checks, (culprit,), trusted=cleared, note=note, singled_out=culprit, quarantined=tuple(quarantine)
        )
        return quarantine


def assess(code: GradientCode, round_: Round, assignment: Assignment, *, leave_out: int | None = None) -> Verdict:
    """Check ``round_``'s messages (without worker ``leave_out``'s) and bound what they prove of its decoding."""
    owner = assignment.owner  # the code's worker (a tree parent's child position), not the message's sender id
    messages = {r: m for r, m in round_.messages.items() if leave_out is None or owner[r] != leave_out}
    report = check_consistency(
        code,
        {r: m.vector for r, m in messages.items()},
        assignment=assignment,
        magnitudes={r: m.magnitude for r, m in messages.items()},
    )
    if leave_out is None and round_.decodable and not round_.excluded:
        decoding: Decoding | None = round_.decoding
    elif leave_out is None and not round_.excluded and round_.decoder.decodable:
        decoding = round_.decoder.decoding()
    else:
        excluded = round_.excluded | ({leave_out} if leave_out is not None else set())
        decoding = decode_excluding(code, messages, excluded, assignment)
    if decoding is None:
        return Verdict(report, None, {}, 0.0)
    vectors = {r: m.vector for r, m in messages.items()}
    norm = float(np.linalg.norm(decoding.combine(vectors)[: round_.certified_length]))
    weights = dict(zip(decoding.rows, np.asarray(decoding.weights).tolist(), strict=True))
    return Verdict(report, decoding, report.lie_bounds(weights), norm)


def _consistent(verdict: Verdict, timed_out: bool) -> Integrity:
    """The integrity of a consistent round: checked (with its lie bound), or unchecked and not exact."""
    report = verdict.report
    if verdict.unchecked:
        why = "no surplus message" if report.checks == 0 else f"consistent ({_checks(report.checks)}) but"
        note = f"unchecked: {why} no relation covers the rows the decode used of workers {list(verdict.unchecked)}" + (
            " (the iteration deadline came first)" if timed_out else ""
        )
        return Integrity(report.checks, trusted=False, note=note, unchecked=verdict.unchecked)
    return Integrity(
        report.checks,
        note=f"consistent ({_checks(report.checks)}, every worker used is checked; an undetected lie could add at "
        f"most {verdict.lie_bound:.2g} to the gradient)",
        lie_bound=verdict.lie_bound,
    )


def _checks(count: int) -> str:
    return f"{count} check" + ("" if count == 1 else "s")


def _involved(code: GradientCode, rows: Sequence[int], assignment: Assignment) -> tuple[int, ...]:
    """Workers whose received rows take part in some relation (the suspects when none is singled out)."""
    owner: Mapping[int, int] = assignment.owner
    covered = involved_rows(np.asarray(code.B)[list(rows)])
    return tuple(sorted({owner[r] for r, involved in zip(rows, covered, strict=True) if involved}))
