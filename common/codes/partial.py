r"""Two-stage scheme for $\alpha$-partial stragglers (Tandon et al., §4, Figure 3).

A partial straggler is at most $\alpha > 1$ times slower than any other worker. The data is cut into
$n + n m$ equal partitions: $n$ *coded* partitions placed by a full-straggler code $B_c$ (cyclic or
fractional repetition, robust to $s$ stragglers) and $n m$ *naive* partitions, $m$ per worker,
disjoint. Each worker first sends the sum of its naive partial gradients, then its coded message.

The paper takes $m = (s + 1)/(\alpha - 1)$: a straggler finishing its naive part (time $\alpha m$) is
then never later than a fast worker finishing both parts (time $m + s + 1$). When that ratio is not an
integer we round it *up* (:attr:`PartialStragglerCode.naive_per_worker`): a larger naive part keeps
$\alpha m \ge m + s + 1$ and so keeps the guarantee. Each worker then holds a fraction
$(m + s + 1)/(n(m + 1))$ of the data, which is $\frac{s+1}{n}\cdot\frac{\alpha}{s+\alpha}$ when $m$ is
exact (Figure 3: $n = 3, s = 1, \alpha = 2$ gives $4/9$).

Indexing (our choice; the paper does not fix one):
    * partitions (columns of $B$): naive partitions first, worker $w$ owning columns
      $wm, \dots, wm + m - 1$; then coded partition $j$ at column $nm + j$, $j < n$;
    * messages (rows of $B$): row $w$ is worker $w$'s naive sum, row $n + w$ its coded message
      (row $w$ of $B_c$ on the coded columns); worker $w$ sends ``(w, n + w)`` in that order.

Decoding: $B$ is block diagonal, and each naive column is touched by one row only, so the received
rows contain $\mathbf{1}$ exactly when every naive row arrived *and* the received coded rows decode
under $B_c$. The decoding is then the naive rows with weight 1 plus $B_c$'s own decoding. A worker
that never answers loses its naive data: in the full-straggler sense the scheme tolerates none, so
:attr:`GradientCode.s` is 0 and the tolerated partial stragglers are :attr:`partial_stragglers`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Literal

import numpy as np

from gradcode.common.codes.base import Assignment, Decoding, GradientCode, OnlineDecoder
from gradcode.common.codes.cyclic import CyclicRepetitionCode
from gradcode.common.codes.fractional import FractionalRepetitionCode, valid_fractional_stragglers
from gradcode.common.codes.registry import register
from gradcode.common.codes.topology import CodeSize, size_parameter
from gradcode.common.validation import check_int

__all__ = ["INNER_CODES", "PartialStragglerCode", "naive_partitions_per_worker"]

InnerCode = Literal["cyclic", "fractional"]
INNER_CODES: tuple[InnerCode, ...] = ("cyclic", "fractional")
"""Full-straggler codes that can place the coded partitions."""

_RATIO_SLACK = 1e-9
"""Relative slack when rounding $(s+1)/(\\alpha-1)$ up, so that e.g. $\\alpha = 1.2$ gives 10, not 11."""


def naive_partitions_per_worker(s: int, alpha: float) -> int:
    """$m = \\lceil (s+1)/(\\alpha-1) \\rceil$: naive partitions per worker (§4, rounded up to an integer)."""
    ratio = (s + 1) / (alpha - 1)
    return max(1, math.ceil(ratio * (1 - _RATIO_SLACK)))


class _TwoStageDecoder(OnlineDecoder):
    """Counts naive rows and feeds coded rows to the inner code's own decoder (exact, see module)."""

    def __init__(self, code: PartialStragglerCode, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._workers = code.n
        self._naive_received = 0
        self._inner = code.inner_code.decoder()

    @property
    def decodable(self) -> bool:
        return self._naive_received == self._workers and self._inner.decodable

    def _on_add(self, row: int) -> None:
        if row < self._workers:
            self._naive_received += 1
        else:
            self._inner.add(row - self._workers)

    def _decoding(self) -> Decoding:
        inner = self._inner.decoding()
        rows = tuple(range(self._workers)) + tuple(r + self._workers for r in inner.rows)
        weights = np.concatenate([np.ones(self._workers, dtype=inner.weights.dtype), inner.weights])
        return Decoding(rows, weights, exact=inner.exact)


@register
class PartialStragglerCode(GradientCode):
    r"""Two-stage code for $\alpha$-partial stragglers (§4): naive part plus a coded part, two messages.

    Arguments:
        n: number of workers.
        s: number of partial stragglers the coded part tolerates ($0 \le s < n$).
        alpha: slowdown bound of a partial straggler, $\alpha > 1$.
        inner: the code placing the coded partitions, ``"cyclic"`` or ``"fractional"`` (the latter
            needs $(s+1) \mid n$).
        seed: seed of the cyclic inner code (unused for ``"fractional"``).

    Examples:
        >>> code = PartialStragglerCode(3, 1, alpha=2)   # Figure 3
        >>> code.k, code.naive_per_worker, code.load_fraction
        (9, 2, 0.4444444444444444)
    """

    name = "partial_stragglers"
    decode_cost = "O(1) per naive message + the inner code's decoder on the coded messages"

    @classmethod
    def implied_size(cls, params: Mapping[str, object]) -> CodeSize:
        """``n`` workers and ``n * (naive_partitions_per_worker(s, alpha) + 1)`` partitions."""
        n, s, alpha = size_parameter(params, "n"), size_parameter(params, "s"), size_parameter(params, "alpha", 2.0)
        if n is None or s is None or alpha is None or s < 0 or alpha <= 1:
            return CodeSize(workers=n)
        partitions = n * (naive_partitions_per_worker(int(s), alpha) + 1)
        return CodeSize(workers=n, partitions=partitions, advice="use a larger alpha")

    def __init__(self, n: int, s: int, alpha: float = 2.0, inner: InnerCode = "cyclic", seed: int = 0) -> None:
        n = check_int("n", n, 1)
        s = check_int("s", s, 0, n - 1, why="a code over n workers tolerates at most n - 1 stragglers")
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float, np.integer, np.floating))
            or not 1 < alpha < math.inf
        ):
            raise ValueError(
                f"Argument 'alpha' must be a finite real number > 1 (how many times slower a partial "
                f"straggler may be), not {alpha!r}."
            )
        seed = check_int("seed", seed, 0)
        if inner not in INNER_CODES:
            raise ValueError(f"Argument 'inner' must be one of {list(INNER_CODES)}, not {inner!r}.")
        # The inner cyclic code keeps its measured guard only: the float64 promise (certified 1e-12) is made
        # by the recommended schemes; every decode of this one still carries its own certificate.
        self._inner_code: CyclicRepetitionCode | FractionalRepetitionCode = (
            CyclicRepetitionCode(n, s, seed=seed, max_certified_error=math.inf)
            if inner == "cyclic"
            else FractionalRepetitionCode(n, s)
        )
        self._alpha = float(alpha)
        self._inner_name: InnerCode = inner
        self._seed = seed
        self._partial_stragglers = s
        m = naive_partitions_per_worker(s, self._alpha)
        self._naive_per_worker = m
        super().__init__(n, n * m + n, 0)
        b = np.zeros((2 * n, n * m + n), dtype=self._inner_code.B.dtype)
        for w in range(n):
            b[w, w * m : (w + 1) * m] = 1.0
        b[n:, n * m :] = self._inner_code.B
        self._set_matrix(b)

    # ---- properties ----------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def partial_stragglers(self) -> int:
        """The $s$ of §4: partial stragglers tolerated (``GradientCode.s`` counts full ones: 0)."""
        return self._partial_stragglers

    @property
    def inner_code(self) -> CyclicRepetitionCode | FractionalRepetitionCode:
        """The full-straggler code over the $n$ coded partitions."""
        return self._inner_code

    @property
    def naive_per_worker(self) -> int:
        return self._naive_per_worker

    @property
    def load_fraction(self) -> float:
        """Fraction of all data each worker processes: $(m + s + 1)/(n(m + 1))$."""
        return (self._naive_per_worker + self._partial_stragglers + 1) / self.k

    @property
    def coded_fraction(self) -> float:
        """Fraction of the data that is replicated (the coded partitions): $1/(m + 1)$."""
        return self.n / self.k

    def naive_row(self, worker: int) -> int:
        """Row id of ``worker``'s first message (sum of its naive partial gradients)."""
        return check_int("worker", worker, 0, self.n - 1)

    def coded_row(self, worker: int) -> int:
        """Row id of ``worker``'s second message (its coded combination)."""
        return self.n + check_int("worker", worker, 0, self.n - 1)

    # ---- assignment and decoding ---------------------------------------------------------------
    def static_assignment(self) -> Assignment:
        """Worker ``w`` sends row ``w`` (naive) first, then row ``n + w`` (coded)."""
        return Assignment(tuple((w, self.n + w) for w in range(self.n)))

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _TwoStageDecoder(self, assignment or self.static_assignment())

    def _params(self) -> dict[str, object]:
        params: dict[str, object] = {
            "n": self.n,
            "s": self._partial_stragglers,
            "alpha": self._alpha,
            "inner": self._inner_name,
        }
        if self._inner_name == "cyclic":
            params["seed"] = self._seed
        return params

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> PartialStragglerCode:
        """Figure 3's setting: $\\alpha = 2$ with a cyclic inner code."""
        return cls(n=n, s=s)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, object]]:
        """Every ``(n, s)`` with ``alpha = 2`` and a cyclic inner code, plus fractional where valid and
        ``alpha = 1.5`` for ``n <= 4`` (alpha only changes how many naive partitions there are)."""
        for n in range(1, max_n + 1):
            for s in range(n):
                yield {"n": n, "s": s, "alpha": 2.0}
                if n <= 4:
                    yield {"n": n, "s": s, "alpha": 1.5}
            for s in valid_fractional_stragglers(n):
                yield {"n": n, "s": s, "alpha": 2.0, "inner": "fractional"}
