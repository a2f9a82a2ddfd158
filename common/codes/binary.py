r"""Binary gradient codes of Charalambides, Mahdavifar and Hero, *Numerically Stable Binary Gradient Coding*.

The source is a slide deck (``/work/shared/seeds/002_*.txt``); the construction below is reconstructed
from its slides 13–16 and 23–27 (Algorithms 1–3) and checked by the tests in
``tests/codes/test_binary.py``.

Construction (:class:`BinaryCode`, registered as ``binary``)
-------------------------------------------------------------
Workers are numbered $0, \dots, n - 1$ and there are $k = n$ data partitions of equal size (the slides'
"for simplicity, we assume $n = k$"). Write (slide 24)

$$n = \ell (s + 1) + r,\ 0 \le r < s + 1, \qquad r = t \ell + q,\ 0 \le q < \ell, \qquad
n = \lambda (\ell + 1) + \tilde r,\ 0 \le \tilde r < \ell + 1 .$$

* Worker $w$ belongs to the congruence class $[w \bmod (s + 1)]$ and sits in *block*
  $\lfloor w / (s + 1) \rfloor$: every block of $s + 1$ consecutive workers holds one worker of each
  class (slide 23), the last, partial block the $r$ classes $[0], \dots, [r - 1]$.
* $C_1 = \{[0], \dots, [r - 1]\}$ has $\ell + 1$ workers per class, $C_2 = \{[r], \dots, [s]\}$ has
  $\ell$ (slide 24: "$C_1$ lie in all $\ell + 1$ blocks, $C_2$ in the first $\ell$").
* The workers of one class, in block order, take consecutive runs of partitions that tile
  $\{0, \dots, k - 1\}$ exactly once, so the rows of a class sum to $\mathbf{1}$ (slide 15).
  Run lengths (Algorithms 1 and 2): a $C_1$ class gives $s + 1$ partitions to its first
  $\ell + r - s$ workers and $s$ to the rest when $\ell + r > s$, otherwise $\lambda + 1$ to the first
  $\tilde r$ and $\lambda$ to the rest; a $C_2$ class gives $s + t + 2$ to its first $q$ workers and
  $s + t + 1$ to the rest. Both cases of Algorithm 1 are the same rule, "split $n$ as evenly as
  possible, larger runs first" (when $\ell + r > s$, $\lambda = s$ and $\tilde r = \ell + r - s$);
  the tests check that the literal formulas tile every class.

Any $s$ stragglers miss at most $s$ of the $s + 1$ disjoint classes, so one class arrives complete
(pigeonhole, slide 16) and the plain sum of its messages is $\sum_j g_j$: a 0/1 decode, exact up to
float64 summation. The worked example of slide 13 ($n = k = 11$, $s = 3$: $B_{C_1}$ is $9 \times 11$
with 33 ones, $a_{\{2,6,10\}}$ sums the 1-indexed workers 2, 6, 10 of class $[1]$) is reproduced
exactly in the tests.

Readings of the slides' typos and gaps
--------------------------------------
* Algorithms 1 and 2 print "$n = \ell (s + 1)$" and "$n = \lambda (s + 1) + r$"; slide 24's
  $n = \ell (s + 1) + r$ and $n = \lambda (\ell + 1) + \tilde r$ are the readings that tile each class.
* The row indices in Algorithms 1–2 are lost in the text; "block $j$ holds the $j$-th worker of
  each class, which takes the $j$-th run" is the reading consistent with slides 13–14 (the decoding
  example $\{2, 6, 10\}$ is one class, i.e. 1-indexed workers congruent mod $s + 1 = 4$).
* Slide 13's $B_2$ shows 10 ones; its two rows carry $6 + 5 = 11$ (one "1" is lost in the text).
* Algorithm 3 scans $C_2$ before $C_1$ when $r > 0$, i.e. it prefers a complete class with fewer
  members; :class:`BinaryDecoder` does the same (fewest members, then lowest class index).

Decoding beyond complete classes
--------------------------------
Every row of these codes is the indicator of a contiguous run $[a, b)$ of partitions. Through the
injective difference map $x \mapsto (x_j - x_{j-1})_{j=0}^{k}$ such a row becomes $e_a - e_b$, the
incidence vector of an edge $a - b$ on the partition boundaries $\{0, \dots, k\}$, and $\mathbf{1}$
becomes $e_0 - e_k$. Hence $\mathbf{1} \in \mathrm{span}(B_F)$ **iff boundaries 0 and $k$ are connected
by the received rows' edges**. Sets without a complete class can be decodable (e.g. three $C_1$
workers of different classes whose runs tile the partitions), so :class:`BinaryDecoder` keeps a
union–find over the boundaries next to its per-class counters: both cost $O(1)$ (amortised) per
message, and the answer is exact, never a tolerance test. When no class is complete, the weights are
read off a path from 0 to $k$: $+1$ for a run used forwards, $-1$ backwards (forward-only paths are
tried first). Those decodings are flagged by ``BinaryDecoding.congruence_class is None`` and
``BinaryDecoding.zero_one`` says whether a $-1$ was needed; the weights are still integers.

Measured (exhaustive over every worker set, all $n \le 10$, $s < n$): 1316 of the 13253 decodable
sets (9.9%) hold no complete class; none of them needed a $-1$ weight for ``binary`` (nor in a
randomised search over ``binary_heterogeneous``), but the decoder does not rely on that: a
hand-built three-tiling code in the tests exercises the signed path. Over 3000 random arrival orders
with $n \le 64$, the first decodable moment had no complete class in 45.6% of them, and the mean
number of arrivals needed dropped from 9.92 (complete class only, Algorithm 3) to 6.42.

Heterogeneous workers (:class:`HeterogeneousBinaryCode`, registered as ``binary_heterogeneous``)
-----------------------------------------------------------------------------------------------
Slide 19: two groups $T_1, T_2$ of $\tau_1, \tau_2$ machines, $t_i$ the expected time for a machine
of $T_i$ to process one unit of data; the goal is the same expected finishing time for every worker,
so faster workers get more data, from the linear system (reconstructed; the slide's system is lost
in the text)

$$t_1 x_1 = t_2 x_2, \qquad \tau_1 x_1 + \tau_2 x_2 = (s + 1),$$

where $x_i$ is the fraction of the data each $T_i$ worker holds (the second equation says that
every datum is processed by $s + 1$ workers, one per class). This is :func:`equal_time_loads`; we use
speeds $v_i = 1 / t_i$ (larger is faster). The system only meets the binary scheme's constraint
"every class covers the data exactly once" when every class holds the same number of workers of each
group (e.g. $(s + 1) \mid \tau_1$ and $(s + 1) \mid \tau_2$). In general the construction

1. chooses how many workers of each group each class gets so as to **maximise the slowest class's
   total speed** $\min_c (a_c v_1 + b_c v_2)$ (exact: binary search over the candidate values and a
   min-plus dynamic programme over classes, $O(\log(\tau_1 \tau_2) (s + 1) \tau_1^2)$);
2. gives each worker of class $c$ the fraction $v_w / \sum_{u \in c} v_u$ of the data (so every worker
   of a class finishes at the same expected time $1 / \mathrm{speed}(c)$), as a contiguous run;
3. cuts the data at the union of all classes' run boundaries, giving $k \le n$ partitions of
   **unequal** sizes, exposed as :attr:`partition_weights` (exact fractions in
   :attr:`partition_cuts`). With equal speeds this is a homogeneous variant of ``binary`` in which
   every worker of a class holds exactly $1 / |c|$ of the data.

Assumed model: a worker's expected compute time is its data fraction divided by its speed.
Optimality (the slides' claim, made precise here and checked by brute force in the tests): among all
binary allocations built from $s + 1$ disjoint classes that each cover the data once, this one
minimises the largest expected worker time $\max_w \mathrm{load}_w / v_w$. Proof: inside a class the
loads sum to 1, so $\max_{w \in c} \mathrm{load}_w / v_w \ge 1 / \mathrm{speed}(c)$ with equality
for the proportional split of step 2; step 1 then optimises over class compositions exactly. The
minimum is
$1 / \max \min_c \mathrm{speed}(c) \ge (s + 1) / (\tau_1 v_1 + \tau_2 v_2)$, with equality — every
worker finishing together, the slides' linear-system solution — exactly when the class speeds can
be made equal.

Data layout contract
--------------------
Partition $j$ (column $j$ of $B$) must hold the fraction ``partition_weights[j]`` of the samples;
which samples does not matter, only the proportions (``gradcode.common.training.data.partition_indices`` takes these
weights directly; :meth:`BinaryCodeBase.partition_sizes` rounds the exact cut points instead). For
``binary`` the weights are uniform ($1 / n$); for ``binary_heterogeneous`` they are not, and an
equal split would overload the slow workers and break the equal-expected-time allocation (the
decoded gradient is still the full gradient either way).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from gradcode.common.codes.base import Array, Assignment, Decoding, GradientCode, OnlineDecoder
from gradcode.common.codes.registry import register
from gradcode.common.codes.topology import CodeSize, size_parameter
from gradcode.common.validation import check_int

__all__ = [
    "BinaryCode",
    "BinaryCodeBase",
    "BinaryDecoder",
    "BinaryDecoding",
    "HeterogeneousBinaryCode",
    "binary_run_lengths",
    "equal_time_loads",
]


# ---------------------------------------------------------------------------------------------------
# Parameters of the homogeneous construction (slide 24, Algorithms 1 and 2)
# ---------------------------------------------------------------------------------------------------
def binary_run_lengths(n: int, s: int) -> list[list[int]]:
    """Number of partitions each worker of each class takes, in block order (Algorithms 1 and 2).

    ``result[c][j]`` is the run length of the ``j``-th worker (block ``j``) of class ``[c]``; each
    list sums to ``n``. Implements the slides' case split literally.
    """
    n = check_int("n", n, 1)
    s = check_int("s", s, 0, n - 1, why="a code over n workers tolerates at most n - 1 stragglers")
    ell, r = divmod(n, s + 1)
    t, q = divmod(r, ell)
    lam, r_tilde = divmod(n, ell + 1)
    runs: list[list[int]] = []
    for c in range(s + 1):
        if c < r:  # C1, Algorithm 1: ell + 1 workers
            if ell + r > s:
                big = ell + r - s
                runs.append([s + 1] * big + [s] * (ell + 1 - big))
            else:
                runs.append([lam + 1] * r_tilde + [lam] * (ell + 1 - r_tilde))
        else:  # C2, Algorithm 2: ell workers
            runs.append([s + t + 2] * q + [s + t + 1] * (ell - q))
    return runs


def equal_time_loads(n1: int, n2: int, s: int, speed1: float, speed2: float) -> tuple[Fraction, Fraction]:
    """Solve the slides' linear system (slide 19): data fractions ``(x1, x2)`` per worker of each group.

    $x_1 / v_1 = x_2 / v_2$ (same expected time) and $n_1 x_1 + n_2 x_2 = s + 1$ (every datum is
    processed once per class). Exact rational arithmetic on the given floats.
    """
    v1, v2 = Fraction(speed1), Fraction(speed2)
    total = n1 * v1 + n2 * v2
    return (s + 1) * v1 / total, (s + 1) * v2 / total


def _check_speed(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"Argument {name!r} must be a positive finite number, not {value!r}.")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"Argument {name!r} must be a positive finite number, not {value!r}.")
    return v


# ---------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BinaryDecoding(Decoding):
    """A decoding of a binary code, saying how it was found.

    ``congruence_class`` is the class whose messages are summed (all weights 1, Algorithm 3), or
    None when no class was complete and the weights come from a path of runs (weights $\\pm 1$).
    """

    congruence_class: int | None = None

    @property
    def zero_one(self) -> bool:
        """True when every weight is 1, i.e. the decode is a plain sum of messages."""
        return bool(np.all(self.weights == 1.0))


class BinaryDecoder(OnlineDecoder):
    """Online decoder: per-class arrival counters plus a union–find over partition boundaries.

    ``add`` is $O(1)$ amortised. Decodable as soon as a class is complete or, exactly, as soon as the
    received runs connect boundary 0 to boundary ``k`` (module docstring); never a tolerance test.
    """

    def __init__(self, code: BinaryCodeBase, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._binary = code
        self._missing = [len(members) for members in code.classes]
        self._complete: list[int] = []
        self._parent = list(range(code.k + 1))
        self._connected = False

    @property
    def decodable(self) -> bool:
        return bool(self._complete) or self._connected

    @property
    def complete_classes(self) -> tuple[int, ...]:
        """Classes whose every message has arrived, in completion order."""
        return tuple(self._complete)

    def _find(self, x: int) -> int:
        parent = self._parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    def _on_add(self, row: int) -> None:
        c = self._binary.class_of(row)
        self._missing[c] -= 1
        if self._missing[c] == 0:
            self._complete.append(c)
        start, end = self._binary.runs[row]
        root_a, root_b = self._find(start), self._find(end)
        if root_a != root_b:
            self._parent[root_a] = root_b
        if not self._connected:
            self._connected = self._find(0) == self._find(self._binary.k)

    def _decoding(self) -> Decoding:
        if self._complete:
            # Algorithm 3: prefer the complete class with fewest members (C2 before C1).
            best = min(self._complete, key=lambda c: (len(self._binary.classes[c]), c))
            rows = self._binary.classes[best]
            return BinaryDecoding(rows, np.ones(len(rows)), exact=True, congruence_class=best)
        rows_weights = self._path(forward_only=True) or self._path(forward_only=False)
        if not rows_weights:  # unreachable: decodable guarantees a path
            raise AssertionError("connected boundaries without a path")
        rows, weights = zip(*rows_weights, strict=True)
        return BinaryDecoding(tuple(rows), np.array(weights, dtype=float), exact=True, congruence_class=None)

    def _path(self, *, forward_only: bool) -> list[tuple[int, float]]:
        """Rows and $\\pm 1$ weights along a shortest path of received runs from boundary 0 to ``k``."""
        adjacency: dict[int, list[tuple[int, int, float]]] = {}
        for row in self._received:
            a, b = self._binary.runs[row]
            adjacency.setdefault(a, []).append((b, row, 1.0))
            if not forward_only:
                adjacency.setdefault(b, []).append((a, row, -1.0))
        target = self._binary.k
        came_from: dict[int, tuple[int, int, float]] = {}
        queue = deque([0])
        seen = {0}
        while queue and target not in seen:
            node = queue.popleft()
            for nxt, row, weight in adjacency.get(node, []):
                if nxt not in seen:
                    seen.add(nxt)
                    came_from[nxt] = (node, row, weight)
                    queue.append(nxt)
        if target not in seen:
            return []
        path: list[tuple[int, float]] = []
        node = target
        while node != 0:
            prev, row, weight = came_from[node]
            path.append((row, weight))
            node = prev
        return path[::-1]


# ---------------------------------------------------------------------------------------------------
# Shared structure: s + 1 disjoint classes, each tiling the partitions with contiguous runs
# ---------------------------------------------------------------------------------------------------
class BinaryCodeBase(GradientCode):
    """A 0/1 code whose workers form $s + 1$ disjoint classes, each tiling the data with contiguous runs.

    Subclasses call :meth:`_build` with the classes (worker ids in run order) and the exact data
    fraction of each worker; this sets $k$, the cut points, $B$ and the per-row runs.
    """

    decode_cost = "O(1) per message (class counters + union-find), O(f) weights"
    cheap_decodes = True

    _classes: tuple[tuple[int, ...], ...]
    _class_of: tuple[int, ...]
    _runs: tuple[tuple[int, int], ...]
    _cuts: tuple[Fraction, ...]

    @staticmethod
    def _layout(
        n: int, classes: Sequence[Sequence[int]], fractions: Sequence[Fraction]
    ) -> tuple[tuple[Fraction, ...], list[tuple[int, int]]]:
        """Cut points (union of every class's run boundaries) and each worker's run ``[start, end)``."""
        bounds: list[tuple[Fraction, Fraction]] = [(Fraction(0), Fraction(0))] * n
        for members in classes:
            position = Fraction(0)
            for w in members:
                bounds[w] = (position, position + fractions[w])
                position += fractions[w]
            if position != 1:
                raise AssertionError(f"class {members} covers {position} of the data, not all of it")
        cuts = tuple(sorted({p for pair in bounds for p in pair}))
        index = {p: i for i, p in enumerate(cuts)}
        return cuts, [(index[a], index[b]) for a, b in bounds]

    def _build(
        self, classes: Sequence[Sequence[int]], cuts: Sequence[Fraction], runs: Sequence[tuple[int, int]]
    ) -> None:
        self._classes = tuple(tuple(members) for members in classes)
        class_of = [0] * self.n
        for c, members in enumerate(self._classes):
            for w in members:
                class_of[w] = c
        self._class_of = tuple(class_of)
        self._cuts = tuple(cuts)
        self._runs = tuple(runs)
        b = np.zeros((self.n, self.k))
        for w, (start, end) in enumerate(self._runs):
            b[w, start:end] = 1.0
        self._set_matrix(b)

    # ---- structure -----------------------------------------------------------------------------
    @property
    def classes(self) -> tuple[tuple[int, ...], ...]:
        """Worker ids of each congruence class, in run order; ``classes[c]`` sums to $\\mathbf{1}$."""
        return self._classes

    def class_of(self, worker: int) -> int:
        """The congruence class of ``worker``."""
        return self._class_of[check_int("worker", worker, 0, self.n - 1)]

    @property
    def runs(self) -> tuple[tuple[int, int], ...]:
        """Worker ``w`` holds partitions ``range(*runs[w])``."""
        return self._runs

    @property
    def partition_cuts(self) -> tuple[Fraction, ...]:
        """Exact cut points $0 = c_0 < \\dots < c_k = 1$ of the data; partition $j$ is $[c_j, c_{j+1})$."""
        return self._cuts

    @property
    def partition_weights(self) -> Array:
        """Fraction of the samples in each partition (sums to 1); the data layer must split accordingly."""
        return np.array([float(b - a) for a, b in itertools.pairwise(self._cuts)])

    @property
    def worker_loads(self) -> Array:
        """Fraction of the data each worker processes: ``B @ partition_weights``."""
        return np.array([float(self._cuts[end] - self._cuts[start]) for start, end in self._runs])

    def partition_sizes(self, num_samples: int) -> list[int]:
        """Integer sample counts per partition for ``num_samples`` samples (cut points rounded half up).

        Rounding the exact cumulative cut points (not each size) keeps the total exact and every
        size within one sample of ``num_samples * partition_weights``.
        """
        total = check_int("num_samples", num_samples, 0)
        edges = [math.floor(total * c + Fraction(1, 2)) for c in self._cuts]
        return [b - a for a, b in itertools.pairwise(edges)]

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return BinaryDecoder(self, assignment or self.static_assignment())


@register
class BinaryCode(BinaryCodeBase):
    """The binary scheme for any $0 \\le s < n$: $k = n$ equal partitions, classes $[w \\bmod (s + 1)]$.

    Arguments:
        n: number of workers (and of partitions).
        s: stragglers tolerated, ``0 <= s < n``.
    """

    name = "binary"

    def __init__(self, n: int, s: int) -> None:
        super().__init__(n, n, s)
        m = self.s + 1
        classes = [tuple(range(c, self.n, m)) for c in range(m)]
        runs = [(0, 0)] * self.n
        for members, lengths in zip(classes, binary_run_lengths(self.n, self.s), strict=True):
            position = 0
            for w, length in zip(members, lengths, strict=True):
                runs[w] = (position, position + length)
                position += length
        self._build(classes, tuple(Fraction(j, self.n) for j in range(self.n + 1)), runs)

    @property
    def ell(self) -> int:
        """$\\ell = \\lfloor n / (s + 1) \\rfloor$: members of a $C_2$ class (a $C_1$ class has $\\ell + 1$)."""
        return self.n // (self.s + 1)

    @property
    def r(self) -> int:
        """$r = n \\bmod (s + 1)$: the number of $C_1$ classes."""
        return self.n % (self.s + 1)

    def _params(self) -> dict[str, object]:
        return {"n": self.n, "s": self.s}

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        for n in range(1, max_n + 1):
            for s in range(n):
                yield {"n": n, "s": s}


# ---------------------------------------------------------------------------------------------------
# Heterogeneous workers (slide 19)
# ---------------------------------------------------------------------------------------------------
def _class_compositions(n1: int, n2: int, num_classes: int, speed1: float, speed2: float) -> list[tuple[int, int]]:
    """Workers of each group per class, maximising the slowest class's total speed exactly.

    Speeds are scaled to integers ``U, V`` (exact, through :class:`~fractions.Fraction`). The optimum
    is one of the values ``a U + b V``; binary search finds the largest target ``T`` for which some
    split exists, checked by a min-plus dynamic programme over classes ("fewest group-2 workers to
    give every class speed >= T using x group-1 workers"). Workers left over go one at a time to the
    currently slowest class (group with the larger speed first), which only raises speeds.
    """
    f1, f2 = Fraction(speed1), Fraction(speed2)
    scale = math.lcm(f1.denominator, f2.denominator)
    u, v = int(f1 * scale), int(f2 * scale)
    candidates = sorted({a * u + b * v for a in range(n1 + 1) for b in range(n2 + 1)} - {0})
    infinity = n2 + 1
    fast = np.arange(n1 + 1)
    valid = fast[None, :] <= fast[:, None]
    previous = np.clip(fast[:, None] - fast[None, :], 0, None)

    def plan(target: int) -> list[tuple[int, int]] | None:
        need = [0 if a * u >= target else min(infinity, -((a * u - target) // v)) for a in range(n1 + 1)]
        cost = np.array(need, dtype=np.int64)
        best = np.full(n1 + 1, infinity * num_classes, dtype=np.int64)
        best[0] = 0
        choices = []
        for _ in range(num_classes):
            totals = np.where(valid, best[previous] + cost[None, :], infinity * num_classes)
            choice = np.argmin(totals, axis=1)
            best = totals[fast, choice]
            choices.append(choice)
        used = int(np.argmin(best))
        if best[used] > n2:
            return None
        split: list[tuple[int, int]] = []
        for choice in reversed(choices):
            a = int(choice[used])
            split.append((a, need[a]))
            used -= a
        return split[::-1]

    low, high = 0, len(candidates) - 1  # candidates[0] = min(u, v) is feasible: every class gets one worker
    while low < high:
        mid = (low + high + 1) // 2
        if plan(candidates[mid]) is None:
            high = mid - 1
        else:
            low = mid
    split = plan(candidates[low])
    assert split is not None
    counts = [list(pair) for pair in split]
    leftovers = [(0, u, n1 - sum(a for a, _ in split)), (1, v, n2 - sum(b for _, b in split))]
    for group, _, left in sorted(leftovers, key=lambda item: -item[1]):
        for _ in range(left):
            slowest = min(range(num_classes), key=lambda c: (counts[c][0] * u + counts[c][1] * v, c))
            counts[slowest][group] += 1
    return [(a, b) for a, b in counts]


@register
class HeterogeneousBinaryCode(BinaryCodeBase):
    """The binary scheme for two groups of workers of different speeds (slide 19): faster workers get more data.

    Workers ``0..n1-1`` form group 1 (speed ``speed1``), ``n1..n1+n2-1`` group 2 (speed ``speed2``);
    a speed is a throughput, larger is faster (the inverse of the slides' $t_i$). Classes are chosen
    to maximise the slowest class's speed and each class splits the data in proportion to its
    workers' speeds, on cut points that give $k \\le n$ partitions of unequal sizes
    (:attr:`partition_weights`). See the module docstring for the optimality statement.

    Arguments:
        n1: workers in group 1 (``>= 0``).
        n2: workers in group 2 (``>= 0``, ``n1 + n2 >= 1``).
        s: stragglers tolerated, ``0 <= s < n1 + n2``.
        speed1: relative speed of a group-1 worker (positive, finite).
        speed2: relative speed of a group-2 worker (positive, finite).
    """

    name = "binary_heterogeneous"

    @classmethod
    def implied_size(cls, params: Mapping[str, object]) -> CodeSize:
        """``n1 + n2`` workers."""
        n1, n2 = size_parameter(params, "n1"), size_parameter(params, "n2")
        return CodeSize(workers=None if n1 is None or n2 is None else n1 + n2)

    def __init__(self, n1: int, n2: int, s: int, speed1: float = 2.0, speed2: float = 1.0) -> None:
        n1 = check_int("n1", n1, 0)
        n2 = check_int("n2", n2, 0)
        if n1 + n2 < 1:
            raise ValueError(f"Arguments 'n1' and 'n2' must give at least one worker (n1 + n2 >= 1), not {n1} + {n2}.")
        n = n1 + n2
        s = check_int("s", s, 0, n - 1, why="the s + 1 classes need one worker each, so s < n1 + n2")
        self._speed1 = _check_speed("speed1", speed1)
        self._speed2 = _check_speed("speed2", speed2)
        self._n1, self._n2 = n1, n2
        compositions = _class_compositions(n1, n2, s + 1, self._speed1, self._speed2)
        next_worker = [0, n1]
        classes: list[tuple[int, ...]] = []
        for a, b in compositions:
            classes.append(
                tuple(range(next_worker[0], next_worker[0] + a)) + tuple(range(next_worker[1], next_worker[1] + b))
            )
            next_worker[0] += a
            next_worker[1] += b
        speed = [Fraction(self._speed1)] * n1 + [Fraction(self._speed2)] * n2
        fractions = [Fraction(0)] * n
        for members in classes:
            class_speed = sum((speed[w] for w in members), Fraction(0))
            for w in members:
                fractions[w] = speed[w] / class_speed
        cuts, runs = self._layout(n, classes, fractions)
        super().__init__(n, len(cuts) - 1, s)
        self._build(classes, cuts, runs)

    @property
    def n1(self) -> int:
        return self._n1

    @property
    def n2(self) -> int:
        return self._n2

    @property
    def speeds(self) -> Array:
        """Relative speed of every worker."""
        return np.array([self._speed1] * self._n1 + [self._speed2] * self._n2)

    @property
    def class_speeds(self) -> Array:
        """Total speed of each class; every worker of class ``c`` finishes at expected time ``1 / class_speeds[c]``."""
        speeds = self.speeds
        return np.array([float(sum(speeds[w] for w in members)) for members in self.classes])

    @property
    def expected_times(self) -> Array:
        """Expected compute time of every worker, ``worker_loads / speeds`` (whole data at speed 1 takes 1)."""
        return self.worker_loads / self.speeds

    def _params(self) -> dict[str, object]:
        return {"n1": self._n1, "n2": self._n2, "s": self.s, "speed1": self._speed1, "speed2": self._speed2}

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        """Half the workers (rounded up) twice as fast as the others."""
        n = check_int("n", n, 1)
        return cls(n1=(n + 1) // 2, n2=n // 2, s=s)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        for n in range(1, max_n + 1):
            for s in range(n):
                yield {"n1": (n + 1) // 2, "n2": n // 2, "s": s, "speed1": 2.0, "speed2": 1.0}
                if n >= 3:
                    yield {"n1": 1, "n2": n - 1, "s": s, "speed1": 3.0, "speed2": 1.0}
