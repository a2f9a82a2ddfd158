r"""Consistency checks from surplus messages: the code's own redundancy catches wrong messages.

When a receiver holds more messages than a minimal decodable set, honest messages satisfy linear
relations: every $y$ in the left null space of the received rows, $y B_R = 0$, gives
$y M_R = y B_R G = 0$. A well-formed but wrong message $\hat m_i = m_i + \Delta$ leaves the syndrome
$Z = Y \hat M_R = Y_{:,i} \Delta^\top$ (rounding aside): nonzero when some relation involves row $i$
(*detect*), and rank one along column $i$ of $Y$ — which names the row, hence the worker, whenever no
other worker's columns explain $Z$ as well (*locate*; needs at least two independent relations that
tell the suspects apart).

Rounding makes honest syndromes small, not zero. Each relation $t$ gets the threshold of
:func:`~gradcode.common.codes.numerics.certify_combination` applied to the combination $y_t$ (its
combine, the workers' encode errors and the residual $y_t B_R \ne 0$ of a numerically computed null
vector), times :data:`SYNDROME_SAFETY`; a relation over its threshold is a violation.

Functions, all pure (no waiting, no policy): :func:`check_consistency` checks the messages in hand and
names suspects; :func:`decode_excluding` decodes from the messages of the other workers. The policies
``off`` / ``detect`` / ``locate`` (how long to wait for surplus) belong to the receiver.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gradcode.common.codes.numerics import _gamma, row_shape, unit_roundoff

if TYPE_CHECKING:
    from gradcode.common.codes.base import Assignment, Decoding, GradientCode

__all__ = ["SYNDROME_SAFETY", "ConsistencyReport", "check_consistency", "decode_excluding", "parity_checks"]

Array = npt.NDArray[Any]

SYNDROME_SAFETY = 2.0
"""Factor on the rounding bound of each relation before a syndrome counts as a violation."""
NULL_SPACE_TOLERANCE = 1e-9
"""Singular values of the equilibrated received rows below this (relative) span the left null space."""


@dataclass(frozen=True)
class ConsistencyReport:
    """What the surplus messages say about the messages in hand.

    Attributes:
        checks: independent linear relations the received rows satisfy (0: no surplus, nothing checked).
        consistent: no relation is violated beyond rounding.
        worst_violation: largest syndrome norm over its rounding threshold (at most 1 when consistent).
        suspects: workers whose messages alone explain every violation (empty when consistent, or when
            no single worker does: several faults, or too little surplus to tell).
        located: the one suspect when exactly one worker explains the violations and the relations
            tell it apart from every other worker; otherwise None.
    """

    checks: int
    consistent: bool
    worst_violation: float
    suspects: tuple[int, ...] = ()
    located: int | None = None


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
) -> ConsistencyReport:
    r"""Check the received ``messages`` (row id → vector) against the relations of the code's rows.

    ``assignment`` says which worker sent which row (default: the code's static assignment); suspects
    are named by worker. ``dtype`` is the precision the messages were computed in (default: theirs).
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
    if checks.shape[0] == 0:
        return ConsistencyReport(0, True, 0.0)
    stacked = np.stack([np.reshape(messages[r], -1) for r in rows])
    u = unit_roundoff(stacked.dtype if dtype is None else dtype)
    syndromes = np.linalg.norm(checks @ stacked, axis=1)
    thresholds = SYNDROME_SAFETY * _rounding_thresholds(checks, b_r, np.linalg.norm(stacked, axis=1), u)
    ratios = syndromes / thresholds
    worst = float(ratios.max())
    if worst <= 1.0:
        return ConsistencyReport(checks.shape[0], True, worst)
    suspects = _explaining_workers(checks, checks @ stacked, thresholds, rows, owners)
    located = suspects[0] if len(suspects) == 1 else None
    return ConsistencyReport(checks.shape[0], False, worst, suspects, located)


def _rounding_thresholds(checks: Array, b_r: Array, norms: Array, u: float) -> Array:
    """Per relation, the bound on an honest syndrome (the certificate's three terms for weights ``y_t``)."""
    magnitude, support, spread = row_shape(b_r)
    complex_arithmetic = bool(np.iscomplexobj(b_r) or np.iscomplexobj(checks))
    scale = math.sqrt(2.0) if complex_arithmetic else 1.0
    extra = 2 if complex_arithmetic else 0
    y = np.abs(checks)
    inside = spread * norms
    combine = scale * float(_gamma(len(norms) + extra, u)) * (y @ norms)
    encode = scale * (y @ (_gamma(support + extra, u) * inside))
    wide = np.clongdouble if complex_arithmetic else np.longdouble
    residual = np.abs(checks.astype(wide) @ b_r.astype(wide)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_partition = np.where(magnitude > 0, inside[:, None] / magnitude, np.inf).min(axis=0)
        leak = np.where(residual > 0, residual * per_partition[None, :], 0.0).sum(axis=1)
    result: Array = np.maximum(combine + encode + leak, np.finfo(np.float64).tiny)
    return result


def _explaining_workers(
    checks: Array, syndromes: Array, thresholds: Array, rows: Sequence[int], owners: Mapping[int, int]
) -> tuple[int, ...]:
    """Workers whose rows alone explain the syndromes, and whose relations tell them from the others.

    For worker $w$ with received rows $S$: project the syndromes off the span of $Y_{:,S}$; $w$ explains
    them when what is left is within the rounding thresholds. A worker whose columns span every
    relation explains anything and is not a suspect (too little surplus to single it out).
    """
    d = checks.shape[0]
    # Z = R^H Q^H with Q orthonormal (p x d): projections of Z and of the d x d factor R^H leave residuals
    # of equal norm, so the loop below never touches the p coordinates (and, unlike a Gram matrix,
    # loses no precision).
    r_factor: Array = np.asarray(np.linalg.qr(syndromes.conj().T, mode="r"))
    compact = r_factor.conj().T
    noise = float(np.linalg.norm(thresholds))
    by_worker: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_worker.setdefault(owners[row], []).append(index)
    suspects = []
    for worker, indices in sorted(by_worker.items()):
        q, sigma, _ = np.linalg.svd(checks[:, indices], full_matrices=False)
        rank = int(np.sum(sigma > NULL_SPACE_TOLERANCE * float(np.abs(checks).max())))
        if rank == 0 or rank >= d:
            continue
        q = q[:, :rank]
        if float(np.linalg.norm(compact - q @ (q.conj().T @ compact))) <= noise:
            suspects.append(worker)
    return tuple(suspects)


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
