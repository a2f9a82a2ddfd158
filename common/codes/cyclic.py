r"""Cyclic repetition gradient code with a random MDS null space (Tandon et al., §3.2, Algorithm 2).

Worker $i$ (0-based) stores the $s + 1$ cyclically consecutive partitions
$S_i = \{i, i+1, \dots, i+s\} \bmod n$ (the support pattern of eq. (4)); $k = n$. Its row is chosen in
the null space $S = \{x : Hx = 0\}$ of a random $H \in \mathbb{R}^{s \times n}$ with $H\mathbf{1} = 0$:

$$b_i(i) = 1, \qquad b_i(S_i \setminus \{i\}) = -H_{S_i \setminus \{i\}}^{-1} H_i \qquad \text{(eq. (16))}.$$

Any $n - s$ rows are independent and lie in the $(n - s)$-dimensional $S \ni \mathbf{1}$, so they span
it and contain $\mathbf{1}$ (Theorem 3, with probability 1). Decoding weights are Algorithm 1 evaluated
for the one set that arrived: the least-squares solution of $a B_F = \mathbf{1}$.

Paper readings:
    * Algorithm 2 prints ``B(i, j) = [1; -H(:, j(2:s+1))] \ H(:, j(1))``; as printed the brackets
      concatenate a scalar with an $s \times s$ matrix, which only type-checks for $s = 1$. The reading
      that reproduces eq. (16) and Lemma 3 is ``[1; -(H(:, j(2:s+1)) \ H(:, j(1)))]``.
    * Lemma 2 writes $H \in \mathbb{R}^{ss \times n}$; Algorithm 2 draws ``randn(s, n)``, used here.
    * The §2.1 example $B$ is this construction with $H = [-2, 1, 1]$ up to a row scaling:
      :func:`cyclic_matrix` gives rows $(1, 2, 0), (0, 1, -1), (1/2, 0, 1)$ and the paper halves the
      first one (scaling a row leaves its span unchanged). See ``tests/codes/test_tandon_example.py``.

Numerics. "Probability 1" says nothing about conditioning, and the decode error of a survivor set
grows with $\sum_i |a_i| \|b_i\|$ (weights times row norms). Contrary to Vandermonde-like codes,
cyclically contiguous survivors are *not* the worst case here: on $n \le 64$ a random survivor set
was up to ~7000x worse than the worst contiguous one (measured with an unscaled solve; one draw at
$n = 17, s = 8$ reached 1.7e-7). So
:func:`draw_cyclic_repetition` — the one implementation of Algorithm 2 in gradcode, also behind the
per-cluster code of ``clustered`` / ``dynamic_clustered`` and CodedReduce's per-parent code — measures
the decode error (with :func:`~gradcode.common.codes.numerics.equilibrated_decoding_weights`, the
decoders' solve) of the $n$ contiguous survivor sets, the :data:`ADVERSARIAL_CHECK_SETS` worst
straggler sets found by :func:`~gradcode.common.codes.numerics.adversarial_straggler_sets` (every
straggler set is scored when there are few, so small codes are cheap to check), and
:data:`RANDOM_CHECK_SETS` seeded random sets, all from one
:func:`~gradcode.common.codes.numerics.survivor_sets`; while the worst exceeds ``max_decode_error``
it redraws $H$ from the next child of ``SeedSequence(seed)``, at most :data:`MAX_DRAWS` draws, then raises
:class:`~gradcode.common.exceptions.NumericallyUnsafeError`. After the search, random unchecked sets stayed
within 3.5x of the measured worst (7,960 sets, $n \le 64$).
Since the check is a sample, each decoding also carries an a-posteriori estimate
(:func:`estimated_decode_error`); above ``max_decode_error`` the decoding is flagged ``exact=False``
(5 of those 7,960 sets, all false alarms; none unflagged above 1e-9).

Measured limits, default seed and bound 1e-9 (``python -m gradcode.common.codes.cyclic 96 128`` and a sweep of
every $(n, s)$, $n \le 64$): every $(n, s)$ with $n \le 64$ is accepted; up to $n \approx 20$ at the
first draw, above that a growing share (1 in 10 to 1 in 3 for $n$ = 50–64) needs 1 to 3 redraws;
accepted worst errors reach 1.0e-9 (the bound). At $n = 128$: $s \in \{1, 2, 3, 32, 127\}$ at the first draw,
$s = 64$ at the fifth, $s = 16$ at the sixth. One draw costs about 0.2–0.25 s of CPU at $n = 128$
(single-threaded BLAS; a multi-threaded BLAS on a loaded machine can be several times slower), so a
construction takes between ~0.25 s and ~2 s. For bigger $n$, or when a bound must hold for every
survivor set, use the ``binary`` or ``fractional`` scheme. (Those are the measured guard's limits, before
issue 24; the certificate below refuses more, e.g. $(32, 8)$ and $(64, 3)$ at 1e-9, and certifying every
draw of a refused configuration takes seconds at $n \ge 64$: ``gradcode codes --accepted`` lists them.)

One guard, the certificate (issues 10 and 24). Those limits are of the *measured* guard. A draw must also
*certify* its limit: :func:`~gradcode.common.codes.numerics.worst_guard_certificate` is the largest bound the
per-decode certificate (:meth:`~gradcode.common.codes.base.Decoding.certify`) can give, with the decoder's
weights, on honest partial gradients whose sum keeps half their joint norm
(:data:`~gradcode.common.codes.numerics.GUARD_COHERENCE`), over every survivor set when there are at most
:data:`~gradcode.common.codes.numerics.GUARD_EXHAUSTIVE_SETS` (else the checked ones), and it must be at most
``min(max_decode_error, max_certified_error)``; :class:`~gradcode.common.exceptions.NumericallyUnsafeError`
reports that number. ``max_certified_error`` defaults to
:data:`~gradcode.common.codes.numerics.PROMISED_RELATIVE_ERROR` $= 10^{-12}$, the float64 promise of the
recommended schemes; ``max_certified_error=math.inf`` certifies ``max_decode_error`` (1e-9, the job's
tolerance) instead. Which configurations are accepted: ``gradcode codes --accepted``.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gradcode.common.codes.base import Array, Assignment, Decoding, GradientCode, OnlineDecoder, SpanDecoder
from gradcode.common.codes.numerics import (
    DEFAULT_MAX_DECODE_ERROR,
    PROMISED_RELATIVE_ERROR,
    ErrorMeasurement,
    equilibrated_decoding_weights,
    fresh_gaussian_gradients,
    measure_decodings,
    survivor_sets,
    worst_guard_certificate,
)
from gradcode.common.codes.registry import register
from gradcode.common.exceptions import NumericallyUnsafeError
from gradcode.common.validation import check_int

__all__ = [
    "ERROR_ESTIMATE_SAFETY",
    "MAX_DRAWS",
    "RANDOM_CHECK_SETS",
    "CyclicRepetitionCode",
    "CyclicRepetitionDraw",
    "ExplicitCode",
    "cyclic_matrix",
    "cyclic_supports",
    "draw_cyclic_repetition",
    "draw_null_space_matrix",
    "estimated_decode_error",
]

MAX_DRAWS = 8
"""How many seeded draws of $H$ the constructor tries before refusing the parameters."""
RANDOM_CHECK_SETS = 4
"""Seeded random survivor sets of size $n - s$ measured in addition to the contiguous and searched ones."""
ADVERSARIAL_CHECK_SETS = 8
"""Worst straggler sets found by :func:`adversarial_straggler_sets` whose decode error is measured."""
ERROR_ESTIMATE_SAFETY = 16.0
"""Factor between :func:`estimated_decode_error` and the measured spread of actual errors."""


def cyclic_supports(n: int, s: int) -> Array:
    """``(n, s + 1)`` array: row ``i`` lists $S_i = (i, i+1, \\dots, i+s) \\bmod n$ (eq. (4)), own partition first."""
    return (np.arange(n)[:, None] + np.arange(s + 1)[None, :]) % n


def draw_null_space_matrix(n: int, s: int, rng: np.random.Generator) -> Array:
    """The random $H$ of Algorithm 2, lines 1–2: i.i.d. Gaussian $s \\times n$, last column $= -$sum of the others."""
    h = rng.standard_normal((s, n))
    h[:, n - 1] = -h[:, : n - 1].sum(axis=1)
    return h


def cyclic_matrix(h: Array) -> Array:
    r"""Algorithm 2, lines 3–7, for a given $H \in \mathbb{R}^{s \times n}$: row $i$ by eq. (16).

    Solves the $n$ systems $H_{S_i \setminus \{i\}} x = H_i$ in one batched call. Raises ``ValueError``
    when one of them is singular (an $H$ without the MDS property of Lemma 2). The two degenerate
    cases are returned exactly: $s = 0$ gives $I$ and $s = n - 1$ the all-ones rows ($H\mathbf{1} = 0$
    makes every solution $-\mathbf{1}$).
    """
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] >= h.shape[1]:
        raise ValueError(f"Argument 'h' must be an s x n matrix with s < n, not shape {h.shape}.")
    s, n = h.shape
    supports = cyclic_supports(n, s)
    b = np.zeros((n, n))
    rows = np.arange(n)
    b[rows, supports[:, 0]] = 1.0
    if s == 0:  # B = I
        return b
    if s == n - 1:  # null(H) = span(1): eq. (16) gives exactly the all-ones rows; a solve only adds rounding
        return np.ones((n, n))
    others = np.transpose(h[:, supports[:, 1:]], (1, 0, 2))  # (n, s, s): H restricted to S_i \ {i}
    own = h[:, supports[:, 0]].T[:, :, None]  # (n, s, 1): column H_i
    try:
        solution = np.linalg.solve(others, own)[:, :, 0]
    except np.linalg.LinAlgError:
        raise ValueError("Argument 'h' must have every s columns independent (MDS, Lemma 2).") from None
    b[rows[:, None], supports[:, 1:]] = -solution
    return b


class ExplicitCode(GradientCode):
    """An explicit ``B`` (one message per worker) claimed to tolerate ``s`` stragglers; not registered.

    For published example matrices (e.g. Tandon et al. §2.1) and experiments. Decoded by the generic
    :class:`~gradcode.common.codes.base.SpanDecoder`; the claim about ``s`` is the caller's and is not verified.
    """

    name = "explicit"

    def __init__(self, b: Array, s: int) -> None:
        matrix = np.asarray(b)
        if matrix.ndim != 2 or 0 in matrix.shape:
            raise ValueError(f"Argument 'b' must be a non-empty 2-D matrix, not shape {matrix.shape}.")
        super().__init__(matrix.shape[0], matrix.shape[1], s)
        self._set_matrix(matrix)

    def _params(self) -> dict[str, object]:
        return {"n": self.n, "k": self.k, "s": self.s}


def estimated_decode_error(weights: Array, row_norms: Array, k: int) -> float:
    r"""A-posteriori estimate of the relative decode error of weights $a$ on rows of norms $\|b_i\|$.

    Rounding errors of the messages and of the equilibrated least-squares solve are both of order
    $\epsilon \sum_i |a_i| \|b_i\|$, against $\|\sum_j g_j\| \approx \sqrt{k}\,\|g\|$ for random gradients;
    :data:`ERROR_ESTIMATE_SAFETY` covers the measured spread (observed/estimate stayed below 13 over
    ~2,400 random survivor sets with $n \le 64$).
    """
    amplification = float(np.abs(weights) @ row_norms)
    return ERROR_ESTIMATE_SAFETY * float(np.finfo(np.float64).eps) * amplification / math.sqrt(k)


class _CyclicDecoder(SpanDecoder):
    r"""Span decoder with the two shortcuts the cyclic structure allows, both exact.

    * While some partition is not covered by the supports received so far, no row touches that
      column, so $\mathbf{1}$ is not in the span: not decodable, no linear algebra ($O(s)$ per message).
    * Any $n - s$ distinct rows span $S \ni \mathbf{1}$ (Theorem 3): decodable without a rank test.

    In between (covered, fewer than $n - s$ rows) it runs the generic Gram–Schmidt residual test, so
    a smaller set that truly contains $\mathbf{1}$ in its span is recognised.

    The weights are :func:`equilibrated_decoding_weights`, the solve the construction's guard measured.
    A decoding whose :func:`estimated_decode_error` exceeds the code's ``max_decode_error`` is returned
    with ``exact=False`` so it is reported, never silently used.
    """

    def __init__(self, code: CyclicRepetitionCode, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._supports = code.supports
        self._row_norms = code.row_norms
        self._max_error = code.max_decode_error
        self._enough = code.n - code.s
        self._covered = np.zeros(code.k, dtype=bool)
        self._uncovered = code.k
        self._pending: list[int] = []

    @property
    def decodable(self) -> bool:
        if len(self._received) >= self._enough:
            return True
        return self._uncovered == 0 and super().decodable

    def _on_add(self, row: int) -> None:
        if self._uncovered:
            support = self._supports[row]
            self._uncovered -= int(np.count_nonzero(~self._covered[support]))
            self._covered[support] = True
        if len(self._received) >= self._enough:
            return
        self._pending.append(row)
        if self._uncovered == 0:
            for pending in self._pending:
                super()._on_add(pending)
            self._pending.clear()

    def _decoding(self) -> Decoding:
        rows = list(self._received)
        weights = equilibrated_decoding_weights(self.code.B[rows], independent=len(rows) <= self._enough)
        trusted = estimated_decode_error(weights, self._row_norms[rows], self.code.k) <= self._max_error
        return Decoding(tuple(rows), weights, exact=trusted)


@dataclass(frozen=True)
class CyclicRepetitionDraw:
    """An accepted draw of Algorithm 2, as returned by :func:`draw_cyclic_repetition` (arrays read-only).

    Attributes:
        H: the $s \\times n$ matrix with $H\\mathbf{1} = 0$ the rows were solved from.
        B: the $n \\times n$ cyclic-repetition matrix (row $i$ supported on $S_i$, eq. (16)).
        draw: index of the accepted draw, 0 when the first one passed.
        measured_decode_error: worst relative decode error measured on the checked survivor sets.
        certified_decode_error: the guard's certificate
            (:func:`~gradcode.common.codes.numerics.worst_guard_certificate`).
    """

    H: Array
    B: Array
    draw: int
    measured_decode_error: float
    certified_decode_error: float = math.nan


def draw_cyclic_repetition(
    n: int,
    s: int,
    *,
    seed: int,
    max_decode_error: float = DEFAULT_MAX_DECODE_ERROR,
    max_certified_error: float = math.inf,
    advice: str = "",
) -> CyclicRepetitionDraw:
    r"""Tandon et al.'s Algorithm 2 for ``n`` workers and ``s`` stragglers, drawn from ``seed`` and checked.

    Draw ``d`` (0, 1, ...) takes $H$ from child ``d`` of ``SeedSequence(seed)``
    (:func:`draw_null_space_matrix`) and builds $B$ with :func:`cyclic_matrix`. Its decode error with
    :func:`equilibrated_decoding_weights` is measured on the $n$ contiguous survivor sets, the
    :data:`ADVERSARIAL_CHECK_SETS` worst found by :func:`adversarial_straggler_sets` (all straggler sets
    scored when there are few) and :data:`RANDOM_CHECK_SETS` seeded random ones. The first draw whose
    worst measured error is at most ``max_decode_error`` and whose guard certificate
    (:func:`~gradcode.common.codes.numerics.worst_guard_certificate`: the largest bound the per-decode
    certificate can give on honest data, over every survivor set when there are at most
    :data:`~gradcode.common.codes.numerics.GUARD_EXHAUSTIVE_SETS`, else over the same sets) is at most
    ``min(max_decode_error, max_certified_error)`` is returned; after :data:`MAX_DRAWS` draws
    :class:`~gradcode.common.exceptions.NumericallyUnsafeError`
    is raised, its message ending with ``advice``.

    ``s = 0`` ($B = I$) and ``s = n - 1`` (all-ones rows) are exact 0/1 codes that do not depend on
    $H$: they are measured (one survivor set says it all) but never redrawn.
    """
    n = check_int("n", n, 1)
    s = check_int("s", s, 0, n - 1, why="a code over n workers tolerates at most n - 1 stragglers")
    seed = check_int("seed", seed, 0)
    for name, value, finite in (
        ("max_decode_error", max_decode_error, True),
        ("max_certified_error", max_certified_error, False),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float, np.floating))
            or not value > 0
            or (finite and not value < math.inf)
        ):
            kind = "positive finite number" if finite else "positive number (math.inf: no certification)"
            raise ValueError(f"Argument {name!r} must be a {kind}, not {value!r}.")
    draws = 1 if s in (0, n - 1) else MAX_DRAWS
    best = best_certified = math.inf
    for draw, child in enumerate(np.random.SeedSequence(seed).spawn(draws)):
        h = draw_null_space_matrix(n, s, np.random.default_rng(child))
        try:
            b = cyclic_matrix(h)
        except ValueError:  # a singular block: probability 0, draw again
            continue
        measured = _measure_draw(
            b, _check_sets(b, s, seed), seed, max_decode_error=max_decode_error, max_certified_error=max_certified_error
        )
        if measured.measured <= max_decode_error:
            if measured.certified <= min(max_decode_error, max_certified_error):
                h.setflags(write=False)
                b.setflags(write=False)
                return CyclicRepetitionDraw(
                    H=h,
                    B=b,
                    draw=draw,
                    measured_decode_error=measured.measured,
                    certified_decode_error=measured.certified,
                )
            best_certified = min(best_certified, measured.certified)
        best = min(best, measured.measured)
    suffix = f" {advice}" if advice else ""
    if math.isfinite(best_certified) or (best_certified == math.inf and best <= max_decode_error):
        limit = min(max_decode_error, max_certified_error)
        which = "max_certified_error" if max_certified_error <= max_decode_error else "max_decode_error"
        promise = " (the float64 promise of the recommended schemes)" if which == "max_certified_error" else ""
        raise NumericallyUnsafeError(
            f"Algorithm 2 (cyclic repetition) for n={n}, s={s}, seed={seed}: the best of {draws} draw(s) certifies "
            f"relative error {best_certified:.2g} > {which}={limit:.2g}{promise}, on honest partial gradients "
            f"whose sum keeps half their joint norm (the guard's certificate)." + suffix,
            measured_error=best_certified,
        )
    raise NumericallyUnsafeError(
        f"Algorithm 2 (cyclic repetition) for n={n}, s={s}, seed={seed}: the best of {draws} draw(s) decodes "
        f"with relative error {best:.2g} > max_decode_error={max_decode_error:.2g}." + suffix,
        measured_error=best,
    )


def _check_sets(b: Array, s: int, seed: int) -> list[list[int]]:
    """Survivor sets of size ``n - s`` to measure: contiguous, searched-adversarial, seeded random."""
    n = b.shape[0]
    f = n - s
    if s in (0, n - 1):  # the only set (B = I), or n copies of the all-ones row
        return [list(range(f))]
    return survivor_sets(
        n,
        f,
        random_sets=RANDOM_CHECK_SETS,
        seed=[seed, n, s],
        adversarial=b,
        adversarial_count=ADVERSARIAL_CHECK_SETS,
    )


def _measure_draw(
    b: Array, sets: Sequence[Sequence[int]], seed: int, *, max_decode_error: float, max_certified_error: float
) -> ErrorMeasurement:
    """Worst :func:`~gradcode.common.codes.numerics.combined_error` of the decoders' weights over ``sets``
    (each on fresh Gaussian gradients, 8 columns, drawn from ``seed``); when that meets ``max_decode_error``,
    also the guard's certified bound (:func:`~gradcode.common.codes.numerics.worst_guard_certificate`, every
    survivor set when there are few, else ``sets``; limit ``min(max_decode_error, max_certified_error)``)."""
    decodings = [Decoding(tuple(rows), equilibrated_decoding_weights(b[list(rows)], independent=True)) for rows in sets]
    gradients = list(itertools.islice(fresh_gaussian_gradients(b.shape[1], 8, np.random.default_rng(seed)), len(sets)))
    measured = measure_decodings(b, decodings, gradients, certify=False).measured
    if not measured <= max_decode_error:
        return ErrorMeasurement(measured, math.nan)
    limit = min(max_decode_error, max_certified_error)
    return ErrorMeasurement(measured, worst_guard_certificate(b, len(sets[0]), sets, _decoder_weights, limit=limit))


def _decoder_weights(ids: Sequence[int], rows: Array) -> Array:
    """The weights :class:`_CyclicDecoder` computes for ``n - s`` rows."""
    return equilibrated_decoding_weights(rows, independent=True)


@register
class CyclicRepetitionCode(GradientCode):
    r"""Cyclic repetition (Tandon et al., §3.2): row $i$ supported on $S_i$, random $H$ (Algorithm 2).

    $H$ and $B$ come from :func:`draw_cyclic_repetition` (seeded draw, decode-error guard, redraws).

    Arguments:
        n: number of workers (and of data partitions, $k = n$).
        s: number of full stragglers to tolerate, $0 \le s < n$; any $n - s$ workers decode.
        seed: seed of the draw of $H$; redraws use the next children of ``SeedSequence(seed)``.
        max_decode_error: bound on the measured worst-case relative decode error (see module notes).
        max_certified_error: bound on the guard's certificate
            (:data:`~gradcode.common.codes.numerics.PROMISED_RELATIVE_ERROR`, 1e-12, by default: the promise
            of the recommended schemes); ``math.inf``: the guard certifies ``max_decode_error`` instead.

    Attributes:
        H: the accepted $s \times n$ matrix with $H\mathbf{1} = 0$.
        draw: index of the accepted draw (0 when the first one passed).
        measured_decode_error: worst relative decode error measured at construction.

    Raises:
        NumericallyUnsafeError: no draw within :data:`MAX_DRAWS` met ``max_decode_error``.
    """

    name = "cyclic"
    decode_cost = "O(s) per message until every partition is covered, then O(k·f); O(f²k) least-squares solve"

    def __init__(
        self,
        n: int,
        s: int,
        seed: int = 0,
        max_decode_error: float = DEFAULT_MAX_DECODE_ERROR,
        max_certified_error: float = PROMISED_RELATIVE_ERROR,
    ) -> None:
        super().__init__(n, n, s)
        accepted = draw_cyclic_repetition(
            self.n,
            self.s,
            seed=seed,
            max_decode_error=max_decode_error,
            max_certified_error=max_certified_error,
            advice="Use the 'binary' scheme (0/1 matrix, exact for any n, s) or 'fractional' (when (s + 1) "
            "divides n), or pass a larger max_decode_error / max_certified_error explicitly.",
        )
        self._seed = int(seed)
        self._max_decode_error = float(max_decode_error)
        self._max_certified_error = float(max_certified_error)
        self._certified_decode_error = accepted.certified_decode_error
        self._set_matrix(accepted.B)
        self._H = accepted.H
        self._draw = accepted.draw
        self._measured_decode_error = accepted.measured_decode_error
        self._supports = cyclic_supports(self.n, self.s)
        self._supports.setflags(write=False)
        row_norms: Array = np.linalg.norm(self._B, axis=1)
        row_norms.setflags(write=False)
        self._row_norms = row_norms

    # ---- properties ----------------------------------------------------------------------------
    @property
    def H(self) -> Array:  # noqa: N802 - the paper's name
        """The accepted $s \\times n$ matrix of Algorithm 2 (read-only)."""
        return self._H

    @property
    def supports(self) -> Array:
        """``(n, s + 1)`` array of each worker's partitions, own partition first (eq. (4))."""
        return self._supports

    @property
    def row_norms(self) -> Array:
        """Euclidean norm of each row of ``B`` (the decoder equilibrates with them)."""
        return self._row_norms

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def draw(self) -> int:
        return self._draw

    @property
    def measured_decode_error(self) -> float:
        return self._measured_decode_error

    @property
    def max_decode_error(self) -> float:
        return self._max_decode_error

    @property
    def certified_decode_error(self) -> float:
        """The guard's certificate of the accepted draw
        (:func:`~gradcode.common.codes.numerics.worst_guard_certificate`)."""
        return self._certified_decode_error

    # ---- decoding ------------------------------------------------------------------------------
    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _CyclicDecoder(self, assignment or self.static_assignment())

    def _params(self) -> dict[str, object]:
        params: dict[str, object] = {"n": self.n, "s": self.s, "seed": self._seed}
        if self._max_decode_error != DEFAULT_MAX_DECODE_ERROR:
            params["max_decode_error"] = self._max_decode_error
        if self._max_certified_error != PROMISED_RELATIVE_ERROR:
            params["max_certified_error"] = self._max_certified_error
        return params

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> CyclicRepetitionCode:
        return cls(n=n, s=s)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, float]]:
        """Every ``(n, s)`` with ``n <= max_n`` at the default seed; above ``n = 6`` (where the float64
        promise refuses some of them: ``gradcode codes --accepted``) certifying the job's tolerance only."""
        for n in range(1, max_n + 1):
            for s in range(n):
                yield {"n": n, "s": s} if n <= 6 else {"n": n, "s": s, "max_certified_error": math.inf}


def _report(sizes: Sequence[int]) -> None:
    """Print the accepted draw, measured worst error and build time (wall, CPU) for a sweep of ``(n, s)``."""
    print(f"{'n':>4} {'s':>4} {'draw':>4} {'worst error':>12} {'wall s':>7} {'cpu s':>6}")
    for n in sizes:
        for s in sorted({1, 2, 3, max(1, n // 8), max(1, n // 4), max(1, n // 2), n - 1}):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                code = CyclicRepetitionCode(n, s)
                outcome = f"{code.draw:>4} {code.measured_decode_error:>12.2e}"
            except NumericallyUnsafeError:
                outcome = f"{'-':>4} {'refused':>12}"
            print(f"{n:>4} {s:>4} {outcome} {time.perf_counter() - wall:>7.3f} {time.process_time() - cpu:>6.3f}")


if __name__ == "__main__":
    _report([int(a) for a in sys.argv[1:]] or [8, 16, 32, 64, 96, 128])
