"""Measuring how exact a decode is: rank checks, relative decode error, worst cases.

The decode error of a received set $F$ is measured the way it matters: draw random partial gradients
$G \\in \\mathbb{R}^{k \\times p}$, form the messages $B_F G$, decode, and compare with
$\\mathbf{1}^\\top G$ in relative 2-norm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gradcode.common.codes.base import Array, Assignment, GradientCode

__all__ = [
    "DEFAULT_MAX_DECODE_ERROR",
    "contiguous_survivor_sets",
    "decode_error",
    "ones_in_span",
    "survivor_sets",
    "worst_decode_error",
]

DEFAULT_MAX_DECODE_ERROR = 1e-9
"""Relative decode error a real- or complex-valued code must stay under (float64)."""


def ones_in_span(b_rows: Array, tolerance: float = 1e-8) -> bool:
    """Independent rank check: is the all-ones vector in the row span of ``b_rows``?"""
    k = b_rows.shape[1]
    ones = np.ones(k)
    if b_rows.shape[0] == 0:
        return False
    a, *_ = np.linalg.lstsq(b_rows.T, ones.astype(b_rows.dtype), rcond=None)
    return bool(np.linalg.norm(a @ b_rows - ones) <= tolerance * np.sqrt(k))


def decode_error(
    code: GradientCode,
    rows: Sequence[int],
    *,
    assignment: Assignment | None = None,
    p: int = 8,
    rng: np.random.Generator | None = None,
) -> float:
    """Relative error of decoding random partial gradients from ``rows`` (must be decodable)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    g = rng.standard_normal((code.k, p))
    decoding = code.decode(rows, assignment)
    messages = {r: code.B[r] @ g for r in decoding.rows}
    got = decoding.combine(messages)
    want = g.sum(axis=0)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def contiguous_survivor_sets(n: int, f: int) -> list[list[int]]:
    """The n cyclically contiguous sets of f workers: the worst case for Vandermonde-like systems."""
    return [[(start + i) % n for i in range(f)] for start in range(n)]


def survivor_sets(n: int, f: int, *, random_sets: int = 16, seed: int = 0) -> list[list[int]]:
    """The n contiguous sets of ``f`` survivors (adversarial) followed by ``random_sets`` seeded random ones."""
    rng = np.random.default_rng(seed)
    sets = contiguous_survivor_sets(n, f)
    sets += [sorted(rng.choice(n, size=f, replace=False).tolist()) for _ in range(random_sets)]
    return sets


def worst_decode_error(code: GradientCode, worker_sets: Iterable[Sequence[int]], *, seed: int = 0) -> float:
    """Largest :func:`decode_error` over the given sets of surviving workers (static assignment)."""
    assignment = code.static_assignment()
    rng = np.random.default_rng(seed)
    return max(
        (decode_error(code, assignment.rows_of(ws), assignment=assignment, rng=rng) for ws in worker_sets),
        default=0.0,
    )
