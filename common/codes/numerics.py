r"""The one home of the numerics behind "exact": span test, weight solver, error measure, survivor sets.

Every scheme, the construction guards, the benchmarks and the master's verify mode use these:

* **Span test** — :func:`span_residual` / :func:`ones_in_span` with the one tolerance
  :data:`SPAN_TOLERANCE` (relative residual); :class:`~gradcode.common.codes.base.SpanTracker` is its
  incremental form with the same tolerance.
* **Weight solver** — :func:`equilibrated_decoding_weights`: least-squares $a B_F = t$ with the rows
  scaled to unit norm (Algorithm 1 of Tandon et al. evaluated for the one set that arrived).
* **Decode-error measure** — :func:`relative_error` (what verify mode compares) and
  :func:`combined_error`: draw partial gradients $G$, form the messages $B_F G$ row by row, combine
  them with :meth:`Decoding.combine` (the production path) and compare with $\mathbf{1}^\top G$.
  :func:`worst_combined_error` takes the worst over many decodings; *which* test gradients each
  decoding sees is the caller's (:func:`fresh_gaussian_gradients` or one shared draw), because that is
  what decides which random constructions a guard accepts.
* **Error certificate** — :func:`bound_combination` (behind :meth:`Decoding.certify`): a bound on
  the relative error of one combined gradient from the weights, the rows and the message norms,
  cheap enough for every iteration; the master calls a decode exact when it is within the job's
  tolerance. :data:`PROMISED_RELATIVE_ERROR` is what the recommended schemes certify in float64.
* **Survivor sets** — :func:`survivor_sets`: contiguous (the worst case of Vandermonde-like systems),
  searched-adversarial (:func:`adversarial_straggler_sets`, the worst case of random real codes) and
  seeded random, from one generator.

The module imports nothing from the code abstraction at run time (``base`` builds on it).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from gradcode.common.codes.base import Assignment, Decoding, GradientCode

__all__ = [
    "CERTIFY_TAIL",
    "COVERAGE_TOLERANCE",
    "DEFAULT_MAX_DECODE_ERROR",
    "EXACT_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "GUARD_COHERENCE",
    "GUARD_EXHAUSTIVE_SETS",
    "NULL_SPACE_TOLERANCE",
    "PROMISED_RELATIVE_ERROR",
    "RANK_TOLERANCE",
    "SPAN_TOLERANCE",
    "CombinationBound",
    "ErrorCertificate",
    "ErrorMeasurement",
    "RowProfile",
    "adversarial_straggler_sets",
    "all_finite",
    "bound_combination",
    "combined_error",
    "contiguous_survivor_sets",
    "decode_error",
    "decode_tolerance",
    "equilibrated_decoding_weights",
    "fresh_gaussian_gradients",
    "guard_certificate",
    "measure_decodings",
    "message_rounding",
    "ones_in_span",
    "relative_bound",
    "relative_error",
    "row_shape",
    "span_residual",
    "squared_norm",
    "straggler_amplification",
    "survivor_sets",
    "underflow_unit",
    "unit_roundoff",
    "weights_residual",
    "worst_combined_error",
    "worst_decode_error",
    "worst_guard_certificate",
]

Array = npt.NDArray[Any]

# Tolerances: every relative threshold gradcode's numerics compare against, in one family, here.

EXACT_TOLERANCE = 1e-9
"""Largest certified relative error of a decode called exact (float64 and complex128 messages)."""
FLOAT32_TOLERANCE = 1e-5
"""The same bound when the workers send float32 messages."""
DEFAULT_MAX_DECODE_ERROR = EXACT_TOLERANCE
"""Relative decode error a real- or complex-valued code's construction guard certifies by default (float64): the
tolerance its decodes are then certified against."""
PROMISED_RELATIVE_ERROR = 1e-12
"""Certified relative error the recommended schemes promise in float64 for n <= 128 (issue 10): binary
and fractional always, cyclic where a draw certifies it (refused otherwise, suggesting binary)."""
SPAN_TOLERANCE = 1e-9
r"""The one span tolerance: a target $t$ counts as lying in the row span of $B_F$ when the relative
residual $\|t - a B_F\| / \|t\|$ of the best weights $a$ is at most this."""
RANK_TOLERANCE = 1e-10
"""An online decoder's new row adds to the rank of the rows in hand when what it has outside their span is above
this, relative to its norm."""
NULL_SPACE_TOLERANCE = 1e-9
"""Singular values of the equilibrated received rows below this (relative) span the left null space: the
consistency relations among them."""
COVERAGE_TOLERANCE = 1e-9
"""A row takes part in a relation when its coefficient is above this, relative to the largest; a worker's decoding
weights are a combination of the relations when the least-squares residual is below this, relative to their norm
(a larger one: the worker's rows are unchecked)."""


def decode_tolerance(dtype: npt.DTypeLike) -> float:
    """The relative error a decode of messages of ``dtype`` may have and still be called exact."""
    return FLOAT32_TOLERANCE if np.dtype(dtype) == np.float32 else EXACT_TOLERANCE


ADVERSARIAL_SEARCH_POOL = 128
ADVERSARIAL_SEARCH_CLIMBERS = 4
ADVERSARIAL_SEARCH_SWAPS = 32
ADVERSARIAL_SEARCH_ROUNDS = 6
EXHAUSTIVE_SEARCH_LIMIT = 1024
"""Up to this many straggler sets, :func:`adversarial_straggler_sets` scores every one (the search
scores $n + 896$ of them anyway)."""


# ---- weight solver and span test -----------------------------------------------------------------


def equilibrated_decoding_weights(received: Array, *, independent: bool, target: Array | None = None) -> Array:
    r"""Weights $a$ with $a B_F = t$ (least squares), $t = \mathbf{1}$ unless ``target`` is given.

    The rows are scaled to unit norm first and the weights scaled back: rows can differ in norm by
    orders of magnitude (Tandon et al.'s Algorithm 2), and an unscaled solve loses accuracy in
    proportion. ``independent`` says the rows are linearly independent (e.g. at most $n - s$ rows of an
    Algorithm-2 matrix, Theorem 3); Householder QR then solves the system as accurately as SVD at a
    fraction of the cost. Otherwise the minimum-norm least-squares solution (of the scaled system) is
    returned. Zero rows get weight 0.
    """
    norms = np.linalg.norm(received, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    scaled = received / safe[:, None]
    ones = np.ones(received.shape[1], dtype=received.dtype) if target is None else target
    if independent:
        q, r = np.linalg.qr(scaled.T)
        scaled_weights = np.linalg.solve(r, q.conj().T @ ones)
    else:
        scaled_weights, *_ = np.linalg.lstsq(scaled.T, ones, rcond=None)
    weights: Array = scaled_weights / safe
    return weights


def weights_residual(weights: Array, rows: Array, target: Array | None = None) -> float:
    r"""$\|t - a B_F\| / \|t\|$: how far weights $a$ on ``rows`` are from reproducing $t$ ($\mathbf{1}$)."""
    want = np.ones(rows.shape[1]) if target is None else target
    return relative_error(np.asarray(weights) @ rows, want)


def span_residual(rows: Array, target: Array | None = None) -> float:
    """Relative residual of ``target`` (default all-ones) after projection onto the row span of ``rows``."""
    if rows.shape[0] == 0:
        return 1.0
    weights = equilibrated_decoding_weights(rows, independent=False, target=target)
    return weights_residual(weights, rows, target)


def ones_in_span(b_rows: Array, tolerance: float = SPAN_TOLERANCE) -> bool:
    """Independent rank check: is the all-ones vector in the row span of ``b_rows``?"""
    return span_residual(np.asarray(b_rows)) <= tolerance


def span_minimal_members(b: Array, members: Sequence[Sequence[int]], fixed: Sequence[int] = ()) -> list[int] | None:
    r"""Which ``members`` (each a list of rows of ``b``) stay when each, the latest first except the last, is left
    out if $\mathbf{1}$ stays in the row span of the ``fixed`` rows and the rows of the members still in: the
    indices of those that stay. The rows of all of them are to span $\mathbf{1}$ (a decodable set): None when a
    partition is covered by no row or a block's solve finds they do not (a set whose every member must stay, each
    alone in covering a partition, is not solved).

    :meth:`GradientCode.decoding_set <gradcode.common.codes.base.GradientCode.decoding_set>` minimises its greedy
    set with it instead of decoding again without each member (O(members²) decoder steps: seconds at n = 2000). A
    member alone in covering a partition stays without a solve. Rows that share no partition, even through one
    member, form independent blocks, each solved on its own: in a block of rows $T$ (scaled to unit norm), every
    $a$ with $a B_T = \mathbf{1}$ is $a_0 + Z y$, $Z$ spanning the left null space; a member is left out when some
    $y$ makes $a$ vanish on its rows (a residual below :data:`SPAN_TOLERANCE`, relative to $a_0$), and $Z$ is then
    restricted to the vectors that vanish there too.
    """
    rows_of = [list(rows) for rows in members]
    all_rows = [*fixed, *(r for rows in rows_of for r in rows)]
    support = {r: np.flatnonzero(b[r]) for r in all_rows}
    coverage = np.zeros(b.shape[1], dtype=np.int64)
    for r in all_rows:
        coverage[support[r]] += 1
    if not all_rows or not coverage.all():
        return None

    # (the last member made the set decodable: it stays)
    candidates = [i for i in range(len(rows_of) - 2, -1, -1) if not _covers_alone(rows_of[i], support, coverage)]
    if not candidates:
        return list(range(len(rows_of)))
    left_out: set[int] = set()
    for rows, latest_first in _blocks(b.shape[1], support, list(fixed), rows_of, candidates):
        if not rows:  # members of rows of zeros
            left_out.update(latest_first)
            continue
        gone = _left_out_of_block(b, rows, [rows_of[i] for i in latest_first], support, coverage)
        if gone is None:
            return None
        left_out.update(latest_first[j] for j in gone)
    return [i for i in range(len(rows_of)) if i not in left_out]


def _covers_alone(rows: Sequence[int], support: Mapping[int, Array], coverage: Array) -> bool:
    """Some partition is covered by one of ``rows`` and by no other row (``coverage``: rows covering each)."""
    return any(bool((coverage[support[r]] == 1).any()) for r in rows)


def _blocks(
    columns: int, support: Mapping[int, Array], fixed: list[int], rows_of: list[list[int]], candidates: list[int]
) -> list[tuple[list[int], list[int]]]:
    """The blocks of :func:`span_minimal_members` holding ``candidates``: each block's rows, and its candidates
    in their order (rows of zeros: no rows). Columns are joined by a union–find through each row and member."""
    parent = list(range(columns))

    def find(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    def block_of(rows: Iterable[int]) -> int | None:
        roots = [find(int(j)) for r in rows for j in support[r]]
        for j in roots[1:]:
            parent[find(j)] = find(roots[0])
        return find(roots[0]) if roots else None

    for r in fixed:
        block_of([r])
    for rows in rows_of:
        block_of(rows)
    rows_in: dict[int | None, list[int]] = {}
    for r in [*fixed, *(r for rows in rows_of for r in rows)]:
        if support[r].size:
            rows_in.setdefault(find(int(support[r][0])), []).append(r)
    held: dict[int | None, list[int]] = {}
    for i in candidates:
        held.setdefault(block_of(rows_of[i]), []).append(i)
    return [(rows_in.get(root, []), members) for root, members in held.items()]


def _left_out_of_block(
    b: Array, rows: list[int], candidates: list[list[int]], support: Mapping[int, Array], coverage: Array
) -> list[int] | None:
    """The ``candidates`` (their rows, latest first, all among ``rows``: one block of :func:`span_minimal_members`)
    left out, as positions in ``candidates``; None when ``rows`` do not span the block's part of the all-ones
    vector. ``coverage`` (rows covering each partition) is kept up to date.

    A member each of whose rows has an identical twin among the rows still in (a replica: fractional repetition's
    groups) goes without a solve, which the block gets only when a member needs one."""

    def key(r: int) -> tuple[bytes, bytes]:
        return support[r].tobytes(), b[r, support[r]].tobytes()

    active = list(rows)
    twins = collections.Counter(key(r) for r in rows)
    solved: _SpanSolve | None = None
    left_out: list[int] = []
    for position, member in enumerate(candidates):
        if _covers_alone(member, support, coverage):
            continue  # the only row left covering a partition: it stays
        needs = collections.Counter(key(r) for r in member)
        if solved is None and all(twins[k] > count for k, count in needs.items()):
            twins.subtract(needs)
        else:
            if solved is None:
                solved = _SpanSolve.of(b, active, support)
                if solved is None:
                    return None
            if not solved.leave_out(member):
                continue
        active = [r for r in active if r not in member]
        for r in member:
            coverage[support[r]] -= 1
        left_out.append(position)
    return left_out


def _svd_solve(u: Array, sigma: Array, vh: Array, rank: int, rhs: Array) -> Array:
    """The minimum-norm least-squares $x$ of $M x = $ ``rhs`` from $M$'s SVD (``u``, ``sigma``, ``vh``), its singular
    values past ``rank`` taken as zeros."""
    solution: Array = vh[:rank].conj().T @ ((u[:, :rank].conj().T @ rhs) / sigma[:rank])
    return solution


@dataclass
class _SpanSolve:
    r"""The weights $a$ with $a B_T = \mathbf{1}$ over a block's rows $T$ (scaled to unit norm) and an orthonormal
    basis of their left null space: every other such $a$ is $a + Z y$."""

    a: Array
    null: Array
    where: dict[int, int]
    tolerance: float

    @classmethod
    def of(cls, b: Array, rows: list[int], support: Mapping[int, Array]) -> _SpanSolve | None:
        """The solve over ``rows``; None when they do not span the all-ones vector on their partitions."""
        columns = np.unique(np.concatenate([support[r] for r in rows]))
        block = b[np.ix_(np.asarray(rows), columns)]
        block = block / np.linalg.norm(block, axis=1)[:, None]
        u, sigma, vh = np.linalg.svd(block.T, full_matrices=True)
        rank = int((sigma > RANK_TOLERANCE * sigma[0]).sum())
        a = _svd_solve(u, sigma, vh, rank, np.ones(len(columns), dtype=block.dtype))
        if weights_residual(a, block) > SPAN_TOLERANCE:
            return None
        where = {r: i for i, r in enumerate(rows)}
        return cls(a, vh[rank:].conj().T, where, SPAN_TOLERANCE * float(np.linalg.norm(a)))

    def leave_out(self, member: Sequence[int]) -> bool:
        """Leave ``member``'s rows out if some $a + Z y$ vanishes on them (then it is that $a$, and $Z$ the vectors
        that vanish there too); whether it could."""
        at = [self.where[r] for r in member]
        # null's columns are orthonormal: singular values of its rows at ``at`` below RANK_TOLERANCE are zeros
        u_at, s_at, vh_at = np.linalg.svd(self.null[at], full_matrices=True)
        r_at = int((s_at > RANK_TOLERANCE).sum())
        y = _svd_solve(u_at, s_at, vh_at, r_at, -self.a[at])
        if np.linalg.norm(self.a[at] + self.null[at] @ y) > self.tolerance:
            return False
        self.a = self.a + self.null @ y
        self.a[at] = 0
        self.null = self.null @ vh_at[r_at:].conj().T
        self.null[at] = 0
        return True


# ---- decode-error measure --------------------------------------------------------------------------


_SUM_BLOCK_BYTES = 256 * 1024
"""Coordinates per block of :func:`weighted_sum`: the accumulator's block stays in L2 while every vector adds."""


def weighted_sum(vectors: Sequence[Array], weights: Array) -> Array:
    r"""$\sum_i w_i v_i$ of equal-shape vectors (at least one), in the dtype they and the weights call for.

    What a decode combines (the master, a tree parent) and what a worker's coded message is. Cache blocking:
    every vector adds over one block of coordinates before the next block, so the accumulator stays in cache,
    each vector is read once and no temporary the size of a vector is made. Each coordinate still sees the same
    operations in the same order as the plain loop, so the result is bit-identical to it. A real weight of
    exactly 1 (uncoded, fractional repetition) skips its multiplication: ``x * 1.0`` is ``x``, bit for bit.
    """
    first = vectors[0]
    out = np.empty(np.shape(first), dtype=np.result_type(first.dtype, weights.dtype))
    flat_out = out.reshape(-1)
    sources = [np.reshape(v, -1) for v in vectors]
    ones = [bool(w == 1) and not np.iscomplexobj(w) for w in weights]
    block = max(1, _SUM_BLOCK_BYTES // out.itemsize)
    scratch = np.empty(min(block, flat_out.size), dtype=out.dtype)
    for lo in range(0, flat_out.size, block):
        hi = min(lo + block, flat_out.size)
        acc, tmp = flat_out[lo:hi], scratch[: hi - lo]
        if ones[0]:
            np.copyto(acc, sources[0][lo:hi])
        else:
            np.multiply(sources[0][lo:hi], weights[0], out=acc)
        for source, w, one in zip(sources[1:], weights[1:], ones[1:], strict=True):
            if one:
                acc += source[lo:hi]
            else:
                np.multiply(source[lo:hi], w, out=tmp)
                acc += tmp
    return out


def all_finite(values: Array, squares: float | None = None) -> bool:
    """Whether no entry of ``values`` is NaN or infinite, in one pass of a BLAS dot when that holds.

    A NaN or an infinity makes the sum of squares NaN or infinite, so a finite sum (``squares``, when the caller
    already has it, else computed here) proves every entry finite; only a non-finite sum (a bad entry, or an
    overflow above about 1e154) pays for the entry-by-entry scan. The dot reads the array once, where
    ``np.isfinite(values).all()`` also writes and reads a mask: half the time on the master's ingest path.
    """
    if squares is None:
        squares = float(np.vdot(values, values).real)
    return math.isfinite(squares) or bool(np.isfinite(values).all())


def squared_norm(values: Array) -> float:
    r"""$\sum |x|^2$ accumulated in float64 whatever the dtype: a float32 dot accumulates in float32, where the
    squares of entries below ~1e-19 underflow to 0 (a message of 1e-30 entries would have norm 0 and certify
    nothing) and a long sum loses digits; float64 holds the square of every float32. Float64 and complex128
    take the BLAS dot as before."""
    if values.dtype == np.float32:
        wide = values.astype(np.float64)
        return float(np.dot(wide, wide))
    return float(np.vdot(values, values).real)


def relative_error(got: Array, want: Array) -> float:
    r"""$\|got - want\| / \|want\|$ in the 2-norm (``inf`` when ``want`` is 0 and ``got`` is not).

    The one error measure: decode-error guards, benchmarks and the master's verify mode all use it.
    """
    scale = float(np.linalg.norm(want))
    difference = float(np.linalg.norm(np.asarray(got) - np.asarray(want)))
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


def combined_error(decoding: Decoding, b: Array, gradients: Array) -> float:
    r"""Relative error of ``decoding`` on partial gradients $G$ (``gradients``, $k \times p$).

    The messages $b_r G$ are formed row by row and combined with :meth:`Decoding.combine`, the path a
    real decode takes, then compared with $\mathbf{1}^\top G$ by :func:`relative_error`.
    """
    return measure_decodings(b, [decoding], [gradients], certify=False).measured


def worst_combined_error(b: Array, decodings: Iterable[Decoding], gradients: Iterable[Array]) -> float:
    """Largest :func:`combined_error` of each decoding on its own test gradients (paired in order).

    ``gradients`` is :func:`fresh_gaussian_gradients` for a new draw per decoding, or e.g.
    ``itertools.repeat(g)`` for one shared draw. A NaN (overflowing weights) propagates.
    """
    return measure_decodings(b, decodings, gradients, certify=False).measured


@dataclass(frozen=True)
class ErrorMeasurement:
    """Worst measured relative error and worst certified bound over a set of decodings (NaN: not certified)."""

    measured: float
    certified: float


def measure_decodings(
    b: Array,
    decodings: Iterable[Decoding],
    gradients: Iterable[Array],
    *,
    certify: bool = True,
    stop_above: float = math.inf,
) -> ErrorMeasurement:
    """:func:`worst_combined_error`, and with ``certify`` the worst :meth:`Decoding.certify` bound of the
    same combines (message norms and combined norm of the same test gradients). The loop stops at the
    first bound above ``stop_above`` (a guard that only needs to know whether the bound holds)."""
    worst = 0.0
    bound = 0.0 if certify else math.nan
    for decoding, g in zip(decodings, gradients, strict=False):  # gradients may be endless
        messages = {row: b[row] @ g for row in decoding.rows}
        combined = decoding.combine(messages)
        error = relative_error(combined, g.sum(axis=0))
        if not error <= worst:
            worst = error
        if certify:
            norms = np.array([float(np.linalg.norm(messages[row])) for row in decoding.rows])
            rows = b[list(decoding.rows)]
            magnitudes = np.abs(rows) @ np.linalg.norm(g, axis=1)  # what honest senders report
            profile = RowProfile.of(decoding.weights, rows)
            dtype = np.result_type(b.dtype, g.dtype)
            certificate = bound_combination(
                profile,
                norms,
                u=unit_roundoff(dtype),
                magnitudes=magnitudes,
                length=g.shape[1],
                eta=underflow_unit(dtype),
            ).certificate(float(np.linalg.norm(combined)))
            if not certificate.bound <= bound:
                bound = certificate.bound
            if bound > stop_above:
                break
    return ErrorMeasurement(worst, bound)


def fresh_gaussian_gradients(k: int, columns: int, rng: np.random.Generator) -> Iterator[Array]:
    """An endless stream of i.i.d. standard normal ``(k, columns)`` test gradients from ``rng``."""
    while True:
        yield rng.standard_normal((k, columns))


def decode_error(
    code: GradientCode,
    rows: Sequence[int],
    *,
    assignment: Assignment | None = None,
    p: int = 8,
    rng: np.random.Generator | None = None,
) -> float:
    """:func:`combined_error` of ``code``'s own decoding of ``rows`` on random gradients (must be decodable)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    g = rng.standard_normal((code.k, p))
    return combined_error(code.decode(rows, assignment), code.B, g)


def worst_decode_error(code: GradientCode, worker_sets: Iterable[Sequence[int]], *, seed: int = 0) -> float:
    """Largest :func:`decode_error` over the given sets of surviving workers (static assignment)."""
    assignment = code.static_assignment()
    decodings = (code.decode(assignment.rows_of(workers), assignment) for workers in worker_sets)
    return worst_combined_error(code.B, decodings, fresh_gaussian_gradients(code.k, 8, np.random.default_rng(seed)))


# ---- survivor sets ---------------------------------------------------------------------------------


def contiguous_survivor_sets(n: int, f: int) -> list[list[int]]:
    """The n cyclically contiguous sets of f workers: the worst case for Vandermonde-like systems."""
    return [[(start + i) % n for i in range(f)] for start in range(n)]


def survivor_sets(
    n: int,
    f: int,
    *,
    random_sets: int = 16,
    seed: int | Sequence[int] | np.random.Generator = 0,
    contiguous: bool = True,
    adversarial: Array | None = None,
    adversarial_count: int = 8,
) -> list[list[int]]:
    """Sets of ``f`` surviving workers out of ``n``: the one generator of test survivor sets.

    In this order: the ``n`` cyclically contiguous sets (``contiguous``); the ``adversarial_count``
    worst found by :func:`adversarial_straggler_sets` on the matrix ``adversarial`` (given), as sorted
    survivor sets; ``random_sets`` sorted random sets. ``seed`` (or a generator) drives both the search
    and the random sets, in that order.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    sets = contiguous_survivor_sets(n, f) if contiguous else []
    if adversarial is not None:
        everyone = set(range(n))
        found = adversarial_straggler_sets(adversarial, n - f, rng, count=adversarial_count)
        sets += [sorted(everyone - set(stragglers)) for stragglers in found]
    sets += [sorted(int(w) for w in rng.choice(n, size=f, replace=False)) for _ in range(random_sets)]
    return sets


def straggler_amplification(b: Array, stragglers: Array) -> Array:
    r"""$\sum_i |a_i| \|b_i\|$ of the unique decoding of every straggler set (rows of ``stragglers``).

    For a square $B$ with an $s$-dimensional left null space. Closed form instead of one least-squares
    per set: with $c$ any solution of $cB = \mathbf{1}$ and $Y$ a basis of the left null space of $B$
    ($YB = 0$, $s$ rows), the decoding that avoids the set $T$ is $a = c + tY$ with
    $t\,Y_{:,T} = -c_T$ — one batched $s \times s$ solve for all sets. Returns ``inf`` for every set if
    one of them is singular (the B-span condition fails).
    """
    n = b.shape[0]
    s = stragglers.shape[1]
    left, _, _ = np.linalg.svd(b)
    null_basis = left[:, n - s :].T
    particular, *_ = np.linalg.lstsq(b.T, np.ones(n), rcond=None)
    blocks = np.transpose(null_basis[:, stragglers], (1, 2, 0))  # (sets, s, s) = Y_{:,T}^T
    try:
        t = np.linalg.solve(blocks, -particular[stragglers][:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        return np.full(len(stragglers), math.inf)
    weights = particular[None, :] + t @ null_basis
    result: Array = np.abs(weights) @ np.linalg.norm(b, axis=1)
    return result


def adversarial_straggler_sets(b: Array, s: int, rng: np.random.Generator, *, count: int = 8) -> list[list[int]]:
    r"""Straggler sets of size ``s`` whose decoding amplifies rounding the most, found by search.

    Contiguous straggler sets are *not* the worst case of Algorithm 2's random $B$ (measured: random sets
    were up to ~7000× worse on $n \le 64$). This scores the $n$ contiguous sets and
    :data:`ADVERSARIAL_SEARCH_POOL` random ones by :func:`straggler_amplification`, then hill-climbs from
    the best few with random single swaps and returns the ``count`` worst found. When there are at most
    :data:`EXHAUSTIVE_SEARCH_LIMIT` straggler sets, all of them are scored instead, in one batch. Either
    way the score is a proxy for the decode error: it finds bad sets, it cannot prove there are none.
    """
    n = b.shape[0]
    if math.comb(n, s) <= EXHAUSTIVE_SEARCH_LIMIT:
        every = np.array(list(itertools.combinations(range(n), s)), dtype=np.intp).reshape(-1, s)
        worst_first = np.argsort(straggler_amplification(b, every), kind="stable")[::-1]
        return [[int(w) for w in every[index]] for index in worst_first[:count]]
    climbers_n, swaps = ADVERSARIAL_SEARCH_CLIMBERS, ADVERSARIAL_SEARCH_SWAPS
    contiguous = contiguous_survivor_sets(n, s)
    pool = np.array(contiguous + [sorted(rng.choice(n, size=s, replace=False)) for _ in range(ADVERSARIAL_SEARCH_POOL)])
    scores = straggler_amplification(b, pool)
    climbers = pool[np.argsort(scores)[-climbers_n:]]
    climber_scores = np.sort(scores)[-climbers_n:]
    found = [pool, climbers]
    found_scores = [scores, climber_scores]
    if s < n:
        for _ in range(ADVERSARIAL_SEARCH_ROUNDS):
            # One random swap (a straggler for a survivor) per candidate, `swaps` candidates each.
            candidates = np.repeat(climbers, swaps, axis=0)
            surviving = np.ones(n, dtype=bool)
            for row in candidates:
                surviving[row] = False
                survivors = np.flatnonzero(surviving)  # ascending, as the swap's draw expects
                surviving[row] = True
                row[rng.integers(s)] = survivors[rng.integers(len(survivors))]
            candidate_scores = straggler_amplification(b, candidates)
            found.append(candidates)
            found_scores.append(candidate_scores)
            grid = candidate_scores.reshape(climbers_n, swaps)
            best = grid.argmax(axis=1)
            best_scores = grid[np.arange(climbers_n), best]
            improved = best_scores > climber_scores
            picked = candidates.reshape(climbers_n, swaps, s)[np.arange(climbers_n), best]
            climbers = np.where(improved[:, None], picked, climbers)
            climber_scores = np.where(improved, best_scores, climber_scores)
    all_sets = np.concatenate(found)
    all_scores = np.concatenate(found_scores)
    worst: list[list[int]] = []
    for index in np.argsort(all_scores)[::-1]:
        candidate = sorted(int(w) for w in all_sets[index])
        if candidate not in worst:
            worst.append(candidate)
        if len(worst) == count:
            break
    return worst


# ---- error certificate -----------------------------------------------------------------------------


def unit_roundoff(dtype: npt.DTypeLike) -> float:
    """$u = \\epsilon / 2$ of a floating dtype (of its real part for complex dtypes)."""
    return float(np.finfo(np.dtype(dtype)).eps) / 2


def _gamma(terms: Array | float, u: float) -> Array:
    r"""Higham's $\gamma_m = m u / (1 - m u)$: the relative error bound of a sum or product of $m$ terms."""
    m = np.asarray(terms, dtype=np.float64) * u
    result: Array = m / np.maximum(1.0 - m, 1e-300)
    return result


@dataclass(frozen=True)
class RowProfile:
    r"""What the certificate needs of the rows a decoding combines, computed once per decoding.

    Attributes:
        magnitude: $|B_F|$, entrywise (one row per combined message).
        support: non-zeros $w_i$ of each row (terms of the worker's sum $\sum_j b_{ij} g_j$).
        spread: $\|b_i\|_1 / \|b_i\|_2 \in [1, \sqrt{w_i}]$: how much larger $\sum_j |b_{ij}| \|g_j\|$
            can be than $\|m_i\|$ when the partial gradients point in independent directions.
        residual: $|\hat a B_F - \mathbf{1}|$ per partition, computed in extended precision: the
            weights' own error (zero for 0/1 codes; large for approximate schemes).
        complex_arithmetic: the rows or weights are complex (larger rounding constants).
        weights: $|\hat a|$, the decoding weights' magnitudes (one per combined message).
    """

    magnitude: Array
    support: Array
    spread: Array
    residual: Array
    complex_arithmetic: bool
    weights: Array
    _constants: dict[tuple[float, float, int], _CertifyConstants] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """:func:`bound_combination`'s constants per (u, eta, length): a job asks for one or two."""

    @property
    def arithmetic_constants(self) -> tuple[float, int]:
        r"""The factor and the extra terms of every $\gamma$ for these rows' arithmetic: $\sqrt 2$ and $+2$ for
        complex arithmetic (Higham, Lemma 3.5), 1 and 0 for real."""
        return (math.sqrt(2.0), 2) if self.complex_arithmetic else (1.0, 0)

    def constants(self, u: float, eta: float, length: int) -> _CertifyConstants:
        """What :func:`bound_combination` needs of these rows that no message changes, computed once."""
        key = (u, eta, length)
        found = self._constants.get(key)
        if found is None:
            found = self._constants[key] = _CertifyConstants.of(self, u, eta, length)
        return found

    @classmethod
    def of(cls, weights: Array, rows: Array) -> RowProfile:
        """Profile of ``rows`` ($B_F$, one row per combined message) decoded with ``weights``."""
        magnitude, support, spread = row_shape(rows)
        # In extended precision: in float64 the residual's own rounding ($u \sum_i |a_i||b_i|$) would
        # swamp the weight error it measures (where long double is float64 it over-estimates: safe).
        complex_arithmetic = bool(np.iscomplexobj(rows) or np.iscomplexobj(weights))
        wide = np.clongdouble if complex_arithmetic else np.longdouble
        residual = np.abs(np.asarray(weights).astype(wide) @ rows.astype(wide) - 1).astype(np.float64)
        return cls(magnitude, support, spread, residual, complex_arithmetic, np.abs(np.asarray(weights)))


@dataclass(frozen=True)
class _CertifyConstants:
    """The terms of :func:`bound_combination` that depend only on the rows, ``u``, ``eta`` and ``length``: a
    job's later rounds with the same survivor set pay only for what the messages change (issue 24's target:
    the certificate within 10% of the combine)."""

    norm_inflation: float
    r"""$1 + \gamma_p(u_{64})$: the float64 sums of squares' own rounding."""
    norm_floor: float
    r"""$\sqrt{p\,\eta_{64}}$ (at least :data:`_TINY`): what squares below the float64 range may have lost."""
    combine_gamma: float
    r"""$\gamma_f$ (times $\sqrt 2$ for complex arithmetic, $\gamma_{f+2}$), of the combine's $f$ products."""
    rows: tuple[tuple[float, float, float, float, bool], ...]
    r"""Per row $i$: $|a_i|$; $\gamma_{w_i}$ (the same complex constants), of its sender's sum;
    $\sqrt{p}\,\eta\,(w_i + 1)$; its spread $\rho_i$ (:class:`RowProfile`); and whether it has at most one
    partition (its magnitude is then known from its norm). Python floats: at f <= 128 rows a loop over them costs
    less than the numpy calls it replaces, which dominated the certificate at n = 8."""
    underflow: float
    r"""$\sqrt{p}\,(f + 2)\,\eta_{64}$: the combine's products."""
    weight_terms: tuple[tuple[int, float], ...]
    r"""Per partition $l$ whose weights leave a residual $r_l$ (:class:`RowProfile`): the row $i(l)$ that bounds
    its norm, $\|g_l\| \le \mu_{i(l)} / |b_{i(l) l}|$ (:func:`bounding_rows`, the construction guard's choice), and
    $r_l / |b_{i(l) l}|$ (infinite when no row covers it)."""

    @classmethod
    def of(cls, profile: RowProfile, u: float, eta: float, length: int) -> _CertifyConstants:
        u64, eta64 = unit_roundoff(np.float64), underflow_unit(np.float64)
        f = len(profile.support)
        scale, extra = profile.arithmetic_constants
        return cls(
            norm_inflation=1 + float(_gamma(length, u64)) if length else 1.0,
            norm_floor=max(math.sqrt(length * eta64), _TINY),
            combine_gamma=scale * float(_gamma(f + extra, u)),
            rows=tuple(
                zip(
                    profile.weights.tolist(),
                    (scale * _gamma(profile.support + extra, u)).tolist(),
                    ((math.sqrt(length) * eta) * (profile.support + 1)).tolist(),
                    profile.spread.tolist(),
                    (profile.support <= 1).tolist(),
                    strict=True,
                )
            ),
            underflow=math.sqrt(length) * (f + 2) * eta64,
            weight_terms=_weight_terms(profile),
        )


_TINY = float(np.finfo(np.float64).tiny)
r"""The smallest normal float64: the floor of every norm the certificate takes, so that $\mu_i > 0$ and no term
is $0 \cdot \infty$ (raising an upper bound keeps it one)."""


def bounding_rows(magnitude: Array) -> Array:
    r"""Per partition $l$, the row $i$ whose magnitude bounds $\|g_l\|$ most tightly for data of comparable
    partition norms: least $\sum_j |b_{ij}| / |b_{il}|$ (-1 where no row covers it). The per-decode certificate
    and the construction guard use the same row, so the guard bounds what the certificate computes."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(magnitude > 0, magnitude.sum(axis=1)[:, None] / magnitude, np.inf)
    best = np.argmin(ratios, axis=0)
    covered = np.isfinite(ratios[best, np.arange(ratios.shape[1])])
    return np.where(covered, best, -1)


def _weight_terms(profile: RowProfile) -> tuple[tuple[int, float], ...]:
    """:attr:`_CertifyConstants.weight_terms` of ``profile``."""
    rows = bounding_rows(profile.magnitude)
    return tuple(
        (int(i), float(r / profile.magnitude[i, part]) if i >= 0 else math.inf)
        for part, (i, r) in enumerate(zip(rows, profile.residual, strict=True))
        if r > 0
    )


def row_shape(rows: Array) -> tuple[Array, Array, Array]:
    r"""$|b_{ij}|$, the support size $w_i$ and $
    ho_i = \|b_i\|_1 / \|b_i\|_2$ (1 for a zero row) of each row."""
    magnitude = np.abs(rows)
    support = np.count_nonzero(magnitude, axis=1).astype(np.float64)
    two = np.linalg.norm(rows, axis=1)
    spread = np.where(two > 0, magnitude.sum(axis=1) / np.where(two > 0, two, 1.0), 1.0)
    return magnitude, support, spread


def message_rounding(terms: int, magnitude: float, dtype: npt.DTypeLike, length: int) -> float:
    r"""Absolute error bound of a message $\sum_{j=1}^{w} c_j g_j$ formed in float64 (:func:`weighted_sum`) and
    rounded to ``dtype``, from its magnitude $\mu \ge \sum_j |c_j| \|g_j\|$: $\gamma_w(u_{64})\mu$ for the sum
    (Higham, *Accuracy and Stability*, 2nd ed., eq. (3.4)/(4.3)), $u (1 + \gamma_w(u_{64})) \mu$ for the cast
    when ``dtype`` is narrower, and $\sqrt{p}\,(w + 1)\,\eta$ for gradual underflow (eq. (2.8)) over the
    ``length`` $= p$ coordinates. What a worker, and a tree parent for its own part, certify about what they send."""
    u64 = unit_roundoff(np.float64)
    summed = float(_gamma(terms, u64)) * magnitude
    u = unit_roundoff(dtype)
    cast = u * (magnitude + summed) if u > u64 else 0.0
    return summed + cast + math.sqrt(length) * (terms + 1) * underflow_unit(dtype)


@dataclass(frozen=True)
class ErrorCertificate:
    r"""A bound on the relative error $\|\hat g - g\| / \|g\|$ of one combined gradient.

    ``bound`` is $E / (\|\hat g\| - E)$ with $E$ the absolute error bound (``inf`` when $E \ge \|\hat g\|$:
    nothing can be certified). ``amplification`` is $\sum_i |a_i| \|m_i\| / \|\hat g\|$, the
    condition number of the combine; ``unit_roundoff`` the $u$ it was computed for. ``magnitude`` is
    $\sum_i |a_i| \mu_i \ge \sum_j |c_j| \|g_j\|$ of the combination (its partitions' coefficients $c$): what a
    tree parent reports up for the decoded part of its message (``inf`` when a row could not be certified).
    """

    bound: float
    absolute: float
    amplification: float
    unit_roundoff: float
    magnitude: float = math.nan

    def within(self, tolerance: float) -> bool:
        """True when the certified relative error is at most ``tolerance`` (the decode may be called exact)."""
        return self.bound <= tolerance


def underflow_unit(dtype: npt.DTypeLike) -> float:
    r"""$\eta$: half the smallest subnormal of a floating dtype (of its real part), the absolute error a product
    may add under gradual underflow (Higham, *Accuracy and Stability*, 2nd ed., §2.1, eq. (2.8):
    $fl(x \operatorname{op} y) = (x \operatorname{op} y)(1 + \delta) + \eta$, $\eta = 0$ for sums)."""
    return float(np.finfo(np.dtype(dtype)).smallest_subnormal) / 2


@dataclass(frozen=True)
class CombinationBound:
    r"""What :func:`bound_combination` knows of a combination before its norm: the absolute error bound $E$,
    $\sum_i |a_i| \nu_i$ (the combine's condition numerator), the magnitude $\sum_i |a_i| \mu_i$ and $u$."""

    absolute: float
    weighted: float
    magnitude: float
    unit_roundoff: float

    def certificate(self, combined_norm: float) -> ErrorCertificate:
        """The certificate of the combination, of norm ``combined_norm`` (or a lower bound of it: looser, still a
        bound)."""
        combined_norm = float(combined_norm)
        amplification = self.weighted / combined_norm if combined_norm > 0 else math.inf
        return ErrorCertificate(
            relative_bound(self.absolute, combined_norm), self.absolute, amplification, self.unit_roundoff,
            self.magnitude,
        )  # fmt: skip


CERTIFY_TAIL = 8192
"""Coordinates whose norm is a decode's first lower bound of its norm (:meth:`Decoding.certify_vector`): its last
ones, which the blocked combine (:func:`weighted_sum`) wrote last and left in cache."""


def bound_combination(
    profile: RowProfile,
    message_norms: Sequence[float] | Array,
    *,
    u: float,
    magnitudes: Sequence[float] | Array | None = None,
    length: int = 0,
    eta: float = 0.0,
    sender_errors: Sequence[float] | Array | None = None,
) -> CombinationBound:
    r"""Bound the error of $\hat g = \sum_i a_i \hat m_i$ from the message norms $\nu_i = \|\hat m_i\|$; with
    $\|\hat g\|$ it certifies it (:meth:`CombinationBound.certificate`). Computed before the combine, it works on
    what the gather left in cache: after a combine that streamed the messages it cost three times as much.

    Four error sources, each bounded by Higham's $\gamma_m = mu/(1-mu)$ (*Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., §3.1 (Lemma 3.1, eq. (3.4)) and §4.2 (eq. (4.3), summation)):

    * the combine (:meth:`Decoding.combine`, a sum of $f$ products; float64 or complex128 arithmetic whatever
      the message dtype, bounded with the message dtype's $u$, which is larger): $\gamma_f \sum_i |a_i| \nu_i$
      (times $\sqrt 2$ with $\gamma_{f+2}$ for complex arithmetic, Higham Lemma 3.5);
    * each sender's message $\sum_j b_{ij} g_j$ ($w_i$ terms, then rounded to the message dtype of unit
      roundoff ``u``): $\gamma_{w_i} \mu_i$ with $\mu_i \ge \sum_j |b_{ij}| \|g_j\|$, propagated with
      weight $|a_i|$. $\mu_i$ is ``magnitudes[i]``, what the sender reported. A row of one partition needs
      none: $\mu_i = |b_{i}| \|g\| \le \nu_i / (1 - u)^2$ (one product, one cast). A row of several
      partitions whose sender reported none (NaN) **cannot be certified**: its $\mu_i$ is infinite, and so is
      the bound — cancellation inside that message would be invisible in $\nu_i$. Only ``magnitudes=None``
      (a caller that formed the messages itself and has no sender to ask: benchmarks, tests) estimates
      $\mu_i \approx \rho_i \nu_i$, $\rho_i = \|b_i\|_1 / \|b_i\|_2$ (the size for independent directions).
      A sender that certified its message itself (``sender_errors[i] > 0``: a worker whose row sums several
      partial gradients, which may be more than the receiver's columns show, as in a tree; a tree parent,
      whose error includes its children's decode) has that absolute error taken instead of this term and its
      underflow share;
    * the weights: $\hat a B_F = \mathbf{1} + r$ makes the combination $\sum_j (1 + r_j) g_j$, an error
      $\sum_j |r_j| \|g_j\|$, with $\|g_j\| \le \mu_{i(j)} / |b_{i(j) j}|$ for the row $i(j)$ that
      :func:`bounding_rows` picks ($r$ from :class:`RowProfile`). A partition no received row covers leaves $E$
      infinite;
    * underflow (gradual, Higham eq. (2.8)): each of the $w_i$ products of a message and its cast may add
      $\eta$ (``eta``, :func:`underflow_unit` of the message dtype) per coordinate, and each of the $f$ products
      of the combine $\eta_{64}$: $\sqrt{p}\,(\eta \sum_i |a_i| (w_i + 1) + (f + 2)\eta_{64})$ over the
      ``length`` $= p$ certified coordinates. Negligible unless the gradient itself is near the subnormal
      range, where it rightly refuses "exact".

    The norms $\nu_i$ are sums of squares accumulated in float64
    (:class:`~gradcode.common.transport.wire.MessageAssembler`),
    whose own rounding and underflow are covered by inflating them to
    $\nu_i (1 + \gamma_p) + \sqrt{p\,\eta_{64}}$ (a square below the float64 range loses at most $\eta_{64}$).

    The sum $E$ bounds $\|\hat g - g\|$ to first order in $u$; dividing by $\|g\| \ge \|\hat g\| - E$
    gives the relative bound.
    """
    terms = profile.constants(u, eta, length)
    f = len(terms.rows)
    norms = _floats(message_norms, f, "message_norms")
    reported = [math.nan] * f if magnitudes is None else _floats(magnitudes, f, "magnitudes")
    sent = [0.0] * f if sender_errors is None else _floats(sender_errors, f, "sender_errors")
    single_row = 1 / (1 - u) ** 2
    weighted = encode = magnitude = 0.0
    insides = []
    for (a, gamma, floor, spread, single), norm, mu, error in zip(terms.rows, norms, reported, sent, strict=True):
        nu = norm * terms.norm_inflation + terms.norm_floor
        if magnitudes is None:
            inside = spread * nu
        elif mu == mu:  # reported (not NaN)
            inside = max(mu, nu)
        else:
            inside = nu * single_row if single else math.inf
        insides.append(inside)
        if a:  # a zero weight on an uncertifiable row costs nothing
            weighted += a * nu
            encode += a * (error if error > 0 else gamma * inside + floor)
            magnitude += a * inside
    combine = terms.combine_gamma * weighted  # (float64 arithmetic; u >= u64 keeps it a bound)
    weight = 0.0  # partitions whose weights leave a residual r_l: r_l ||g_l|| <= r_l mu_i(l) / |b_i(l) l|
    for row, scale in terms.weight_terms:
        weight += scale * insides[row]
    return CombinationBound(combine + encode + weight + terms.underflow, weighted, magnitude, u)


def _floats(values: Sequence[float] | Array, count: int, what: str) -> list[float]:
    """``values``, one per combined row, as Python floats."""
    floats = values.astype(np.float64).tolist() if isinstance(values, np.ndarray) else [float(v) for v in values]
    if len(floats) != count or (isinstance(values, np.ndarray) and values.ndim != 1):
        shape = np.shape(values)
        raise ValueError(f"Argument {what!r} must give one value per decoded row ({count}), not shape {shape}.")
    return floats


GUARD_COHERENCE = 0.5
r"""The data a construction guard certifies for: partial gradients with $\|\sum_j g_j\| \ge$ this times
$(\sum_j \|g_j\|^2)^{1/2}$. Independent directions of equal norms give 1 on average (and rarely below 1/2
once $p \ge 16$: $\chi^2_p / p < 1/4$), aligned gradients more, one dominant partition about 1; partials that
cancel in the sum are outside it, and only the per-decode certificate can speak for them."""

GUARD_EXHAUSTIVE_SETS = 1024
"""Up to this many survivor sets, a construction guard certifies every one of them."""


def guard_certificate(weights: Array, rows: Array, *, u: float | None = None) -> float:
    r"""The largest relative bound :func:`bound_combination` can give this decoding on honest data of the guard's
    class (:data:`GUARD_COHERENCE`): what a construction guard compares with its limit, so that a code it accepts
    is one whose per-decode certificates stay within that limit (issue 24: "one guard, the certificate").

    Every term of the certificate is linear in the partition norms $x_j = \|g_j\|$ once the message norms are
    bounded by the magnitudes they are reported with ($\nu_i \le \mu_i = \sum_j |b_{ij}| x_j$):
    $E \le \sum_j C_j x_j$ with
    $C_j = \sum_i |a_i| |b_{ij}| (\gamma_f + \gamma_{w_i}) + \sum_l |r_l|\,|b_{i(l) j}| / |b_{i(l) l}|$
    ($r$ the weights' residual, $i(l)$ the row that bounds partition $l$'s norm most tightly; the complex
    constants as in :func:`bound_combination`). By Cauchy–Schwarz, $E \le \|C\|_2 (\sum_j x_j^2)^{1/2}
    \le \|C\|_2 \|g\| / c$ for data of coherence $c$; the relative bound $E / (\|\hat g\| - E)$ is then
    at most $\beta / (1 - \beta)$, $\beta = \|C\|_2 / c$. No sampling: a true upper bound over that class,
    in float64 (``u``) for message dtypes no wider.
    """
    u = unit_roundoff(np.float64) if u is None else u
    profile = RowProfile.of(np.asarray(weights), np.asarray(rows))
    a = profile.weights
    f = len(a)
    scale, extra = profile.arithmetic_constants
    per_row = scale * a * (float(_gamma(f + extra, u)) + _gamma(profile.support + extra, u))
    c = per_row @ profile.magnitude
    residual = profile.residual
    if np.any(residual > 0):
        best = bounding_rows(profile.magnitude)  # row i's bound on x_l costs sum_j |b_ij| / |b_il|
        if np.any(best < 0):
            return math.inf
        tight = profile.magnitude[best] / profile.magnitude[best, np.arange(len(best))][:, None]
        c = c + residual @ tight
    beta = float(np.linalg.norm(c)) / GUARD_COHERENCE
    return beta / (1 - beta) if beta < 1 else math.inf


def worst_guard_certificate(
    b: Array,
    f: int,
    searched: Iterable[Sequence[int]],
    weights: Callable[[Sequence[int], Array], Array],
    *,
    limit: float = math.inf,
) -> float:
    r"""A construction guard's number (issue 24, "one guard, the certificate"): the worst
    :func:`guard_certificate` of the decoder's ``weights`` (of the row ids and the rows of ``b`` they pick) over
    every set of ``f`` rows when there are at most :data:`GUARD_EXHAUSTIVE_SETS`, else over the ``searched``
    ones (contiguous, searched-adversarial, seeded random: a search, not a proof). Stops at the first set
    above ``limit``. :class:`~gradcode.common.exceptions.NumericallyUnsafeError` reports this number."""
    n = b.shape[0]
    sets = itertools.combinations(range(n), f) if math.comb(n, f) <= GUARD_EXHAUSTIVE_SETS else searched
    worst = 0.0
    for rows in sets:
        chosen = b[list(rows)]
        bound = guard_certificate(weights(rows, chosen), chosen)
        if not bound <= worst:
            worst = bound
        if worst > limit:
            break
    return worst


def relative_bound(absolute: float, combined_norm: float) -> float:
    r"""Relative error bound $E / (\|\hat g\| - E)$ from an absolute bound $E$ on $\hat g$.

    Infinite when $E \ge \|\hat g\|$; otherwise $\|g\| \ge \|\hat g\| - E > 0$ makes it a bound.
    """
    return absolute / (combined_norm - absolute) if combined_norm > absolute else math.inf
