r"""Consistency checks from surplus messages: the code's own redundancy catches wrong messages.

When a receiver holds more messages than a minimal decodable set, honest messages satisfy linear
relations: every $y$ in the left null space of the received rows, $y B_R = 0$, gives
$y M_R = y B_R G = 0$. A well-formed but wrong message $\hat m_i = m_i + \Delta$ leaves the syndrome
$Z = Y \hat M_R = Y_{:,i} \Delta^\top$ (rounding aside): nonzero when some relation involves row $i$
(*detect*), and rank one along column $i$ of $Y$ — which names the row, hence the worker, whenever no
other worker's columns explain $Z$ as well (*locate*; needs at least two independent relations that
tell the suspects apart).

Rounding makes honest syndromes small, not zero. Each relation $t$ gets the threshold of
:func:`~gradcode.common.codes.numerics.bound_combination` applied to the combination $y_t$ (its
combine, the workers' encode errors and the residual $y_t B_R \ne 0$ of a numerically computed null
vector; the encode errors from the magnitudes $\sum_j |b_j| \|g_j\|$ the workers report, so partial
gradients that cancel inside an honest message raise no alarm), times :data:`SYNDROME_SAFETY`; a
relation over its threshold is a violation.

What a check proves is measured in gradient space (:meth:`ConsistencyReport.lie_bounds`): if worker
$w$ alone lied, by $\Delta$ on its rows $S$, then $Y_{:,S} \Delta = Z - Z_{honest}$, so each relation
bounds $\|y_{t,S} \Delta\| \le \|Z_t\| + h_t$ ($h_t$ the honest rounding bound). When the decoding
weights $a_S$ are a combination $x^\top Y_{:,S}$ of the relations, the lie moves the decoded gradient
by $a_S^\top \Delta = x^\top Y_{:,S} \Delta$, at most $\sum_t |x_t| (\|Z_t\| + h_t)$: a bound that a
receiver adds to the certificate, whatever the lie's shape. When $a_S$ is not such a combination, a
lie along the rest passes every relation: the worker's rows are *unchecked*.

Functions, all pure (no waiting, no policy): :func:`check_consistency` checks the messages in hand and
names suspects; :func:`decode_excluding` decodes from the messages of the other workers. The policies
``off`` / ``detect`` / ``locate`` (how long to wait for surplus) belong to the receiver.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gradcode.common.codes.numerics import COVERAGE_TOLERANCE, NULL_SPACE_TOLERANCE, _gamma, row_shape, unit_roundoff

if TYPE_CHECKING:
    from gradcode.common.codes.base import Assignment, Decoding, GradientCode

__all__ = [
    "SYNDROME_SAFETY",
    "ConsistencyReport",
    "check_consistency",
    "coverable_rows",
    "decode_excluding",
    "parity_checks",
    "uncheckable",
]

Array = npt.NDArray[Any]

SYNDROME_SAFETY = 2.0
"""Factor on the rounding bound of each relation before a syndrome counts as a violation."""


@dataclass(frozen=True)
class ConsistencyReport:
    """What the surplus messages say about the messages in hand.

    Attributes:
        checks: independent linear relations the received rows satisfy (0: no surplus, nothing checked).
        consistent: no relation is violated beyond rounding.
        worst_violation: largest syndrome norm over its rounding threshold (at most 1 when consistent).
        suspects: workers whose messages alone explain every violation, or whose rows span every relation
            (then they could be the one as well); empty when consistent or when no single worker does.
        located: the one suspect when exactly one worker explains the violations and the relations
            tell it apart from every other worker; otherwise None.
        accomplices: when ``located`` is set, pairs of *other* workers that together explain the
            violations as well (two colluders could frame ``located``): then the evidence does not single
            it out against two liars.
    """

    checks: int
    consistent: bool
    worst_violation: float
    suspects: tuple[int, ...] = ()
    located: int | None = None
    accomplices: tuple[tuple[int, int], ...] = ()
    rows: tuple[int, ...] = ()
    """The received rows, in the order of the columns of :attr:`relations`."""
    relations: Array = field(default_factory=lambda: np.zeros((0, 0)), compare=False, repr=False)
    """$Y$: one relation per row over the received rows."""
    margins: Array = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
    r"""Per relation $\|Z_t\| + h_t$: what it bounds $\|y_{t,S} \Delta\|$ by for a single liar's $\Delta$."""
    owners: tuple[int, ...] = ()
    """The worker that sent each received row."""

    def lie_bounds(self, weights: Mapping[int, complex]) -> dict[int, float]:
        r"""Per worker whose rows ``weights`` (row → decoding weight) use: the largest error (Euclidean norm)
        a lie of that worker alone could add to the decoded gradient and still pass every relation
        (``inf``: the worker's rows are unchecked; module docstring)."""
        index = {r: i for i, r in enumerate(self.rows)}
        by_worker: dict[int, list[int]] = {}
        for row, weight in weights.items():
            if weight != 0:
                by_worker.setdefault(self.owners[index[row]], []).append(row)
        bounds: dict[int, float] = {}
        for worker in sorted(by_worker):
            mine = [i for i, owner in enumerate(self.owners) if owner == worker]
            a = np.array([weights.get(self.rows[i], 0.0) for i in mine])
            bounds[worker] = _lie_bound(self.relations[:, mine], a, self.margins)
        return bounds


def _lie_bound(relations: Array, weights: Array, margins: Array) -> float:
    r"""$\min \sum_t |x_t| m_t$ over $x$ with $Y^\top x = a$ (least-squares $x$; ``inf`` when none exists)."""
    scale = float(np.linalg.norm(weights))
    if scale == 0:
        return 0.0
    if relations.shape[0] == 0:
        return math.inf
    # Weighted least squares: x = D u with D = 1/margins, minimise ||u|| (a proxy for sum |x_t| m_t).
    weighting = 1.0 / np.maximum(margins, np.finfo(np.float64).tiny)
    scaled = relations.T * weighting[None, :]
    u, *_ = np.linalg.lstsq(scaled, weights, rcond=None)
    if float(np.linalg.norm(scaled @ u - weights)) > COVERAGE_TOLERANCE * scale:
        return math.inf
    x = weighting * u
    return float(np.abs(x) @ margins)


def parity_checks(b_received: Array) -> Array:
    r"""Orthonormal basis $Y$ (rows) of the left null space of ``b_received``: $Y B_R \approx 0$.

    Rows are equilibrated first (a relation among scaled rows is one among the rows, rescaled back),
    so the rank decision does not depend on row norms.
    """
    norms = np.linalg.norm(b_received, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    u_mat, sigma, _ = np.linalg.svd(b_received / safe[:, None])
    rank = int(np.sum(sigma > NULL_SPACE_TOLERANCE * (sigma[0] if sigma.size else 0.0)))
    checks: Array = u_mat[:, rank:].conj().T / safe[None, :]
    return checks


def check_consistency(
    code: GradientCode,
    messages: Mapping[int, Array],
    *,
    assignment: Assignment | None = None,
    dtype: npt.DTypeLike | None = None,
    magnitudes: Mapping[int, float] | None = None,
) -> ConsistencyReport:
    r"""Check the received ``messages`` (row id → vector) against the relations of the code's rows.

    ``assignment`` says which worker sent which row (default: the code's static assignment); suspects
    are named by worker. ``dtype`` is the precision the messages were computed in (default: theirs).
    ``magnitudes`` (row → $\sum_j |b_j| \|g_j\|$ as the worker reported it; NaN or missing: estimated from
    the message's norm) bound each worker's own rounding.
    Cost: an SVD of the $|R| \times k$ received rows and $O(d\,|R|\,p)$ for $d$ relations on
    $p$-coordinate messages.
    """
    rows = sorted(messages)
    if not rows:
        return ConsistencyReport(0, True, 0.0)
    owners = (assignment or code.static_assignment()).owner
    unknown = [r for r in rows if r not in owners]
    if unknown:
        raise KeyError(f"Messages for rows {unknown} are not part of the assignment.")
    shapes = {np.shape(messages[r]) for r in rows}
    if len(shapes) > 1:
        raise ValueError(f"Argument 'messages' must hold vectors of one shape; got shapes {sorted(shapes)}.")
    b_r = np.asarray(code.B)[rows]
    checks = parity_checks(b_r)
    row_owners = tuple(owners[r] for r in rows)
    if checks.shape[0] == 0:
        return ConsistencyReport(0, True, 0.0, rows=tuple(rows), relations=checks, owners=row_owners)
    stacked = np.stack([np.reshape(messages[r], -1) for r in rows])
    u = unit_roundoff(stacked.dtype if dtype is None else dtype)
    norms = np.linalg.norm(stacked, axis=1)
    reported = np.array([math.nan if magnitudes is None else magnitudes.get(r, math.nan) for r in rows], dtype=float)
    honest = _rounding_thresholds(checks, b_r, norms, reported, u)
    syndromes = checks @ stacked
    syndrome_norms = np.linalg.norm(syndromes, axis=1)
    thresholds = SYNDROME_SAFETY * honest
    ratios = syndrome_norms / thresholds
    worst = float(ratios.max())
    suspects: tuple[int, ...] = ()
    located = None
    accomplices: tuple[tuple[int, int], ...] = ()
    if worst > 1.0:
        explain = _Explanations(checks, syndromes, thresholds, rows, owners)
        suspects = explain.singles()
        located = suspects[0] if len(suspects) == 1 else None
        accomplices = explain.pairs(excluding=located) if located is not None else ()
    return ConsistencyReport(
        checks.shape[0], worst <= 1.0, worst, suspects, located, accomplices,
        rows=tuple(rows), relations=checks, margins=syndrome_norms + honest, owners=row_owners,
    )  # fmt: skip


def coverable_rows(code: GradientCode) -> tuple[int, ...]:
    """The rows of ``code`` some relation among all its rows involves: the only rows a check can ever cover.

    A row outside (every row of an uncoded scheme, partial_stragglers' naive rows) is never checked, whatever
    surplus arrives.
    """
    return tuple(int(r) for r in np.flatnonzero(involved_rows(np.asarray(code.B))))


def involved_rows(b_rows: Array) -> npt.NDArray[np.bool_]:
    """Per row of ``b_rows``: whether some relation among these rows involves it (a check can cover it)."""
    checks = np.abs(parity_checks(b_rows))
    if checks.size == 0:
        return np.zeros(b_rows.shape[0], dtype=bool)
    covered: npt.NDArray[np.bool_] = checks.max(axis=0) > COVERAGE_TOLERANCE * checks.max()
    return covered


def _rounding_thresholds(checks: Array, b_r: Array, norms: Array, magnitudes: Array, u: float) -> Array:
    r"""Per relation, the bound on an honest syndrome (the certificate's three terms for weights ``y_t``).

    ``magnitudes`` are the workers' reported $\sum_j |b_j| \|g_j\|$ (NaN: estimated from the norm, as the
    certificate does)."""
    magnitude, support, spread = row_shape(b_r)
    complex_arithmetic = bool(np.iscomplexobj(b_r) or np.iscomplexobj(checks))
    scale = math.sqrt(2.0) if complex_arithmetic else 1.0
    extra = 2 if complex_arithmetic else 0
    y = np.abs(checks)
    inside = np.where(np.isnan(magnitudes), spread * norms, np.maximum(np.nan_to_num(magnitudes), norms))
    combine = scale * float(_gamma(len(norms) + extra, u)) * (y @ norms)
    encode = scale * (y @ (_gamma(support + extra, u) * inside))
    wide = np.clongdouble if complex_arithmetic else np.longdouble
    residual = np.abs(checks.astype(wide) @ b_r.astype(wide)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_partition = np.where(magnitude > 0, inside[:, None] / magnitude, np.inf).min(axis=0)
        leak = np.where(residual > 0, residual * per_partition[None, :], 0.0).sum(axis=1)
    result: Array = np.maximum(combine + encode + leak, np.finfo(np.float64).tiny)
    return result


def uncheckable(code: GradientCode) -> tuple[int, ...]:
    """Workers of ``code``'s static assignment with a row no surplus can ever check (:func:`coverable_rows`):
    under ``--integrity detect|locate`` a decode that uses such a row is never exact."""
    coverable = set(coverable_rows(code))
    owner = code.static_assignment().owner
    rows = range(np.asarray(code.B).shape[0])
    return tuple(sorted({owner[r] for r in rows if r not in coverable and r in owner}))


class _Explanations:
    """Which workers' rows alone explain the syndromes (within the rounding thresholds).

    For a set of workers with received rows $S$: project the syndromes off the span of $Y_{:,S}$; the set
    explains them when what is left is within the thresholds. A set whose columns span every relation
    explains anything (too little surplus to tell).
    """

    def __init__(
        self, checks: Array, syndromes: Array, thresholds: Array, rows: Sequence[int], owners: Mapping[int, int]
    ) -> None:
        self.checks = checks
        # Z = R^H Q^H with Q orthonormal (p x d): projections of Z and of the d x d factor R^H leave residuals
        # of equal norm, so nothing below touches the p coordinates (and, unlike a Gram matrix, loses no
        # precision).
        r_factor: Array = np.asarray(np.linalg.qr(syndromes.conj().T, mode="r"))
        self.compact = r_factor.conj().T
        self.noise = float(np.linalg.norm(thresholds))
        self.by_worker: dict[int, list[int]] = {}
        for index, row in enumerate(rows):
            self.by_worker.setdefault(owners[row], []).append(index)

    def _explains(self, indices: list[int]) -> bool | None:
        """True/False; None when the columns span every relation (explain anything, tell nothing)."""
        d = self.checks.shape[0]
        q, sigma, _ = np.linalg.svd(self.checks[:, indices], full_matrices=False)
        rank = int(np.sum(sigma > NULL_SPACE_TOLERANCE * float(np.abs(self.checks).max())))
        if rank == 0:
            return False
        if rank >= d:
            return None
        q = q[:, :rank]
        return float(np.linalg.norm(self.compact - q @ (q.conj().T @ self.compact))) <= self.noise

    def singles(self) -> tuple[int, ...]:
        """Workers whose rows alone explain the syndromes (or span every relation: then they might be the one)."""
        return tuple(w for w, indices in sorted(self.by_worker.items()) if self._explains(indices) is not False)

    def pairs(self, *, excluding: int | None) -> tuple[tuple[int, int], ...]:
        """Pairs of workers (neither of them ``excluding``) that together explain the syndromes, or span them."""
        workers = [w for w in sorted(self.by_worker) if w != excluding]
        if all(len(self.by_worker[w]) == 1 for w in workers):
            return self._single_row_pairs(workers)
        found = []
        for i, a in enumerate(workers):
            for b in workers[i + 1 :]:
                if self._explains(self.by_worker[a] + self.by_worker[b]) is not False:
                    found.append((a, b))
                    if len(found) >= 8:  # enough to say that two explanations fit
                        return tuple(found)
        return tuple(found)

    def _single_row_pairs(self, workers: list[int]) -> tuple[tuple[int, int], ...]:
        r""":meth:`pairs` when every worker sent one row: per worker $a$, $Z$ off $\hat y_a$, then off every
        $\hat y_b$'s component orthogonal to $\hat y_a$ at once (explicit residuals: their norms are far below
        $\|Z\|$ when a pair explains, where a difference of squared norms would lose them to rounding)."""
        if len(workers) < 2:
            return ()
        columns = self.checks[:, [self.by_worker[w][0] for w in workers]]
        lengths = np.linalg.norm(columns, axis=0)
        live = lengths > NULL_SPACE_TOLERANCE * float(np.abs(self.checks).max())
        unit = columns / np.where(live, lengths, 1.0)[None, :]
        z = self.compact
        found: list[tuple[int, int]] = []
        for i in np.flatnonzero(live[:-1]).tolist():
            a = unit[:, i]
            off_a = z - np.outer(a, a.conj() @ z)
            rest = unit[:, i + 1 :]
            rest = rest - np.outer(a, a.conj() @ rest)
            norms = np.linalg.norm(rest, axis=0)
            spans = norms > 1e-8
            e = rest / np.where(spans, norms, 1.0)[None, :]
            coefficients = e.conj().T @ off_a  # (others, d')
            residual = off_a[None, :, :] - np.where(spans, 1.0, 0.0)[:, None, None] * (
                e.T[:, :, None] * coefficients[:, None, :]
            )
            fits = np.linalg.norm(residual.reshape(residual.shape[0], -1), axis=1) <= self.noise
            for j in np.flatnonzero(fits & live[i + 1 :]).tolist():
                found.append((workers[i], workers[i + 1 + j]))
                if len(found) >= 8:  # enough to say that two explanations fit
                    return tuple(found)
        return tuple(found)


def decode_excluding(
    code: GradientCode, rows: Iterable[int], excluded_workers: Iterable[int], assignment: Assignment | None = None
) -> Decoding | None:
    """The decoding of ``rows`` without the rows of ``excluded_workers``; None when the rest is not decodable."""
    assignment = assignment or code.static_assignment()
    excluded = set(excluded_workers)
    decoder = code.decoder(assignment)
    for row in rows:
        if assignment.owner[row] not in excluded:
            decoder.add(row)
    return decoder.decoding() if decoder.decodable else None
