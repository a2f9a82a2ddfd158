r"""Gradient coding with clustering: static (GC-SC) and dynamic (GC-DC) clusters.

Buyukates, Ozfatura, Ulukus, Gündüz — *Gradient Coding with Dynamic Clustering for Straggler-Tolerant
Distributed Learning*. Paper symbols and ours:

=================  ===========================  ==============================================
paper              here                         meaning
=================  ===========================  ==============================================
$K$                ``n`` (also ``k``)           workers = mini-batches (data partitions)
$P$                ``clusters``                 number of clusters
$\ell = K/P$       :attr:`cluster_size`         workers, codewords and partitions per cluster
$r$                ``load``                     partitions per codeword; ``r - 1`` stragglers
                                                tolerated per cluster, so ``s = r - 1``
$n$ (§IV-B)        ``clusters_per_worker``      clusters a GC-DC worker may join; its memory is
                                                $m = n\ell$ partitions
=================  ===========================  ==============================================

Both codes share one $B$ (§II-B, eqs. (4), (6), (7)): cluster $p$ owns partitions
$p\ell, \dots, p\ell + \ell - 1$ and codewords (rows) $c_{p,i}$ = row $p\ell + i$; inside a cluster the
$\ell$ codewords are Tandon et al.'s cyclic repetition code (their Algorithm 2) for $\ell$ workers and
$r - 1$ stragglers, so row $c_{p,i}$ combines the $r$ cyclically consecutive partitions
$p\ell + i, \dots, p\ell + i + r - 1 \pmod \ell$ exactly as in eq. (6). $B$ is block diagonal; every
cluster is decoded on its own (eq. (4)) and the gradient is decodable when every cluster is.

The per-cluster code is the *real* cyclic MDS construction, drawn from ``seed``: eq. (6) fixes the
cyclic support, and a 0/1 code with that support (fractional repetition) exists only when $r \mid \ell$
and changes the support, so the paper's layout needs Algorithm 2. One draw of
:func:`~gradcode.common.codes.cyclic.draw_cyclic_repetition` serves every cluster: seeded, its decode error
measured against the default bound (1e-9) and redrawn deterministically if it fails, exactly as for
the plain ``cyclic`` scheme; each cluster is decoded with the weights that guard measured
(:func:`~gradcode.common.codes.numerics.equilibrated_decoding_weights`). The two degenerate loads are 0/1
exactly: $r = 1$ gives the identity, $r = \ell$ gives all-ones rows (Algorithm 2's exact output there).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradcode.common.codes.base import (
    Array,
    Assignment,
    Decoding,
    GradientCode,
    Observation,
    OnlineDecoder,
    SpanTracker,
    check_int,
)
from gradcode.common.codes.cyclic import draw_cyclic_repetition
from gradcode.common.codes.numerics import equilibrated_decoding_weights
from gradcode.common.codes.registry import register

__all__ = [
    "ClusterPlacement",
    "ClusteredCode",
    "DynamicClusteredCode",
    "observation_from_speeds",
]


# ---- decoder: one span test per cluster -----------------------------------------------------------
class _ClusterSpanDecoder(OnlineDecoder):
    r"""Decodes each cluster on its own (eq. (4)): decodable when every cluster's rows span $\mathbf{1}_\ell$.

    Each cluster keeps a :class:`SpanTracker` of its received rows restricted to its $\ell$ partitions,
    so ``add`` costs $O(\ell^2)$ and the
    answer is an exact span test, never a count or a pattern lookup. Rows that arrive after their
    cluster is decodable get no weight (their messages are not needed).
    """

    def __init__(self, code: _ClusteredBase, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._size = size = code.cluster_size
        clusters = code.clusters
        self._spans = [SpanTracker(np.ones(size)) for _ in range(clusters)]
        self._used: list[list[int]] = [[] for _ in range(clusters)]
        self._pending = clusters
        self._enough = size - code.s

    @property
    def decodable(self) -> bool:
        return self._pending == 0

    def _on_add(self, row: int) -> None:
        size = self._size
        p = row // size
        span = self._spans[p]
        if span.contains_target:
            return
        self._used[p].append(row)
        span.add(self.code.B[row, p * size : (p + 1) * size])
        if span.contains_target:
            self._pending -= 1

    def _decoding(self) -> Decoding:
        size = self._size
        rows: list[int] = []
        weights: list[Array] = []
        for p, used in enumerate(self._used):
            local = self.code.B[np.ix_(used, range(p * size, (p + 1) * size))]
            # Up to ℓ - s rows are independent (Theorem 3), and any ℓ - s of them complete the cluster.
            weights.append(equilibrated_decoding_weights(local, independent=len(used) <= self._enough))
            rows.extend(used)
        return Decoding(tuple(rows), np.concatenate(weights), exact=True)


class _ClusteredBase(GradientCode):
    """What GC-SC and GC-DC share: parameters, the block-diagonal $B$ and the per-cluster decoder."""

    decode_cost = "O(ℓ²) per message (per-cluster span) + O(P·ℓ³) solve"

    def __init__(self, n: int, clusters: int, load: int, seed: int) -> None:
        n = check_int("n", n, 1)
        clusters = check_int("clusters", clusters, 1, n, why="at most one cluster per worker")
        if n % clusters:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise ValueError(
                f"Argument 'clusters' must divide n = {n} (equal clusters of ℓ = n / P workers); "
                f"valid values are {divisors}, not {clusters}."
            )
        size = n // clusters
        load = check_int("load", load, 1, size, why=f"a codeword combines at most the ℓ = {size} partitions")
        self._seed = check_int("seed", seed, 0)
        super().__init__(n, n, load - 1)
        self._clusters = clusters
        self._size = size
        self._load = load
        block = draw_cyclic_repetition(
            size, load - 1, seed=self._seed, advice="More, smaller clusters (a smaller ℓ = n / clusters) draw better."
        ).B
        b = np.zeros((n, n))
        for p in range(clusters):
            b[p * size : (p + 1) * size, p * size : (p + 1) * size] = block
        self._set_matrix(b)

    @property
    def clusters(self) -> int:
        """$P$, the number of clusters."""
        return self._clusters

    @property
    def cluster_size(self) -> int:
        r"""$\ell = K / P$: workers, codewords and partitions per cluster."""
        return self._size

    @property
    def load(self) -> int:
        """$r$, the partitions each codeword combines (computation load per iteration)."""
        return self._load

    def cluster_of_row(self, row: int) -> int:
        """The cluster whose codeword ``row`` is: row $p\\ell + i$ is $c_{p,i}$."""
        return self._check_row(row) // self._size

    def partitions_of_cluster(self, cluster: int) -> tuple[int, ...]:
        """The $\\ell$ partitions cluster ``cluster`` recovers."""
        p = check_int("cluster", cluster, 0, self._clusters - 1)
        return tuple(range(p * self._size, (p + 1) * self._size))

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _ClusterSpanDecoder(self, assignment or self.static_assignment())

    def _params(self) -> dict[str, object]:
        return {"n": self.n, "clusters": self._clusters, "load": self._load, "seed": self._seed}

    @staticmethod
    def _canonical_clusters(n: int, s: int) -> int:
        """Most clusters whose size still leaves room for ``s + 1`` partitions per codeword."""
        n = check_int("n", n, 1)
        s = check_int("s", s, 0, n - 1, why="a code over n workers tolerates at most n - 1 stragglers")
        return max(p for p in range(1, n + 1) if n % p == 0 and n // p >= s + 1)


@register
class ClusteredCode(_ClusteredBase):
    r"""GC with static clustering, GC-SC (§II-B): $P$ fixed clusters of $\ell = K/P$ workers.

    Worker $w$ computes codeword row $w$, so cluster $p$ is workers $p\ell, \dots, p\ell + \ell - 1$
    (the paper's eq. (5) is a relabelling of this). Each cluster runs its own cyclic code with load
    $r$ and decodes from any $\ell - r + 1$ of its workers: up to $P(r - 1)$ stragglers are tolerated
    when they are spread evenly, and ``s = r - 1`` in the worst case (all in one cluster).

    Arguments:
        n: $K$, the number of workers and of data partitions.
        clusters: $P$, a divisor of ``n``.
        load: $r$ in $[1, \ell]$, partitions per codeword.
        seed: seed of the per-cluster cyclic code draw (Tandon et al., Algorithm 2).
    """

    name = "clustered"

    def __init__(self, n: int, clusters: int, load: int, seed: int = 0) -> None:
        super().__init__(n, clusters, load, seed)

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        """Load ``s + 1`` and as many clusters as leave $\\ell \\ge s + 1$ (more clusters, more spread)."""
        clusters = cls._canonical_clusters(n, s)
        return cls(n=n, clusters=clusters, load=s + 1)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        """Every proper clustering (``1 < P < n``) with every load; ``P = 1`` is the plain cyclic code
        and ``P = n`` the uncoded one, both listed by their own schemes."""
        for n in range(4, max_n + 1):
            for clusters in range(2, n):
                if n % clusters:
                    continue
                for load in range(1, n // clusters + 1):
                    yield {"n": n, "clusters": clusters, "load": load}


# ---- GC-DC ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterPlacement:
    """The outcome of Algorithm 1 for one observation (workers and clusters are 0-based).

    Attributes:
        clusters: final members of each cluster; member ``i`` of cluster ``p`` computes $c_{p,i}$.
        phase_one: members after Phase I (placement by turns, then leftovers that still fit).
        conflicts: workers Phase I could not place (all their clusters full), in resolution order.
        swaps: one ``(k, p, k_bar, p_bar)`` per conflict: worker ``k_bar`` moved from ``p_bar`` to the
            open cluster ``p`` and the conflicted worker ``k`` took its place in ``p_bar``.
        non_straggler_order, straggler_order: the turn orders $O_f$ and $O_s$ of eq. (17), as the
            sequence of clusters taking turns.
    """

    clusters: tuple[tuple[int, ...], ...]
    phase_one: tuple[tuple[int, ...], ...]
    conflicts: tuple[int, ...]
    swaps: tuple[tuple[int, int, int, int], ...]
    non_straggler_order: tuple[int, ...]
    straggler_order: tuple[int, ...]


def observation_from_speeds(speeds: Sequence[float], threshold: float) -> Observation:
    """§VI-B: a worker whose measured rate is below ``threshold`` ($\\tau$) is treated as a straggler."""
    values = tuple(float(v) for v in speeds)
    if not math.isfinite(threshold):
        raise ValueError(f"Argument 'threshold' must be a finite rate, not {threshold!r}.")
    return Observation(straggling=tuple(v < threshold for v in values), speed=values)


@register
class DynamicClusteredCode(_ClusteredBase):
    r"""GC with dynamic clustering, GC-DC (§IV–V): every worker may join ``clusters_per_worker`` clusters.

    *Codeword distribution* (§IV-B, eq. (13)): workers are split into $\ell$ groups of $P$ consecutive
    indices; each group draws ``clusters_per_worker`` distinct cyclic shifts of $\{0, \dots, P-1\}$
    (``shifts``, or seeded), and shift $\sigma$ puts the group's $i$-th worker into cluster
    $(i + \sigma) \bmod P$. A worker stores the $\ell$ partitions of each of its clusters (memory
    $m = n\ell$) and so can compute any of their codewords. $B$ keeps one row per codeword ($K$ rows);
    each iteration, :meth:`assign` runs Algorithm 1 and gives every worker one codeword of a cluster it
    belongs to, every codeword to one worker.

    *Dynamic clustering* (§V, Algorithm 1) — see :meth:`place` for the exact rules and our readings of
    what the paper leaves open (the stopping rule of the turns, the order of $\mathcal{P}_k$).
    :meth:`static_assignment` places the first shift of every group: GC-SC with the clusters of eq. (5).

    Lemma 1 (eq. (19)): a Phase I conflict is always resolved by one swap when
    $n > P(K - 1)/(2K)$, which for integers is $2n \ge P$; the constructor refuses other values.

    Notes:
        Paper typos resolved here: §IV-B says "dividing workers into $P$ groups" but its example has
        $\ell = 3$ groups of $P = 4$ (we use $\ell$ groups of $P$); after Fig. 2 "the full recovery is
        possible for the static clustering scheme" must read "not possible" (7 < $P(\ell - r + 1)$ = 8
        non-stragglers). Algorithm 1 is a greedy heuristic: it does not always find a placement with at
        most $r - 1$ stragglers per cluster when one exists (K = 12, P = 4, r = 2, n = 2, eq. (13)
        shifts, 3 stragglers: 74.1 % of patterns placed vs 98.2 % feasible by exhaustive search).

    Arguments:
        n: $K$, workers and data partitions.
        clusters: $P$, a divisor of ``n``.
        load: $r$ in $[1, \ell]$.
        clusters_per_worker: the paper's $n$ of §IV-B, in $[\lceil P/2 \rceil, P]$ (Lemma 1).
        seed: seeds both the per-cluster code and the shifts.
        shifts: optional explicit shifts, ``shifts[g]`` the ``clusters_per_worker`` distinct shifts of
            group ``g``; ``shifts[g][0]`` defines the static (GC-SC) placement.
    """

    name = "dynamic_clustered"
    dynamic = True

    def __init__(
        self,
        n: int,
        clusters: int,
        load: int,
        clusters_per_worker: int,
        seed: int = 0,
        shifts: Sequence[Sequence[int]] | None = None,
    ) -> None:
        super().__init__(n, clusters, load, seed)
        P, size = self.clusters, self.cluster_size
        per_worker = check_int("clusters_per_worker", clusters_per_worker, 1, P, why="a worker joins distinct clusters")
        if not 2 * per_worker * n > P * (n - 1):
            raise ValueError(
                f"Argument 'clusters_per_worker' must satisfy Lemma 1, n > P(K - 1) / (2K) = "
                f"{P * (n - 1) / (2 * n):.4g} (i.e. 2 * clusters_per_worker >= clusters = {P}), so that "
                f"every placement conflict of Algorithm 1 can be resolved by a swap; not {per_worker}."
            )
        self._per_worker = per_worker
        self._shifts = self._check_shifts(shifts, size, P, per_worker)
        # A_cluster of eq. (13): block j holds shift j of every group; entry (j*ℓ + g, p) is the worker
        # of group g that shift j puts into cluster p.
        matrix = np.empty((size * per_worker, P), dtype=int)
        for j in range(per_worker):
            for g in range(size):
                for p in range(P):
                    matrix[j * size + g, p] = g * P + (p - self._shifts[g][j]) % P
        matrix.setflags(write=False)
        self._cluster_matrix = matrix
        self._clusters_of: list[tuple[int, ...]] = [
            tuple(sorted((w % P + self._shifts[w // P][j]) % P for j in range(per_worker))) for w in range(n)
        ]

    def _check_shifts(
        self, shifts: Sequence[Sequence[int]] | None, size: int, P: int, per_worker: int
    ) -> tuple[tuple[int, ...], ...]:
        if shifts is None:
            rng = np.random.default_rng([self._seed, 1])
            return tuple(tuple(int(v) for v in rng.choice(P, size=per_worker, replace=False)) for _ in range(size))
        groups = tuple(tuple(group) for group in shifts)
        ok = len(groups) == size and all(
            len(g) == per_worker
            and len(set(g)) == per_worker
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < P for v in g)
            for g in groups
        )
        if not ok:
            raise ValueError(
                f"Argument 'shifts' must hold ℓ = {size} groups of {per_worker} distinct integers in "
                f"[0, {P - 1}], not {shifts!r}."
            )
        return tuple(tuple(int(v) for v in g) for g in groups)

    # ---- parameters ----------------------------------------------------------------------------
    @property
    def clusters_per_worker(self) -> int:
        """The paper's $n$ (§IV-B): clusters each worker belongs to; memory $m = n\\ell$."""
        return self._per_worker

    @property
    def shifts(self) -> tuple[tuple[int, ...], ...]:
        """The cyclic shifts of each worker group (§IV-B)."""
        return self._shifts

    @property
    def cluster_matrix(self) -> Array:
        """$\\mathbf{A}_{cluster}$ of eq. (13), 0-based workers, shape ``(ℓ·n, P)`` (read-only)."""
        return self._cluster_matrix

    def clusters_of_worker(self, worker: int) -> tuple[int, ...]:
        """$\\mathcal{P}_k$: the clusters ``worker`` can join, ascending."""
        return self._clusters_of[check_int("worker", worker, 0, self.n - 1)]

    def candidate_rows(self, worker: int) -> tuple[int, ...]:
        """$\\mathcal{C}_k$: every codeword row ``worker`` may be assigned ($n\\ell$ of them)."""
        size = self.cluster_size
        return tuple(p * size + i for p in self.clusters_of_worker(worker) for i in range(size))

    def partitions_of_worker(self, worker: int) -> tuple[int, ...]:
        """$\\mathcal{I}_k$ with eq. (12) at equality: the partitions of all its candidate codewords."""
        return tuple(sorted({j for row in self.candidate_rows(worker) for j in self.support(row)}))

    # ---- assignments ---------------------------------------------------------------------------
    def static_assignment(self) -> Assignment:
        """GC-SC inside GC-DC: the first shift of each group, codeword $c_{p,g}$ to group $g$'s worker."""
        P, size = self.clusters, self.cluster_size
        rows = []
        for w in range(self.n):
            g, i = divmod(w, P)
            rows.append((((i + self._shifts[g][0]) % P) * size + g,))
        return Assignment(tuple(rows))

    def assign(self, observation: Observation | None = None) -> Assignment:
        """This iteration's codewords from Algorithm 1 (:meth:`place`); ``None`` means no straggler."""
        placement = self.place(observation)
        size = self.cluster_size
        rows: list[tuple[int, ...]] = [()] * self.n
        for p, members in enumerate(placement.clusters):
            for i, w in enumerate(members):
                rows[w] = (p * size + i,)
        return Assignment(tuple(rows))

    def _check_observation(self, observation: Observation | None) -> tuple[tuple[bool, ...], tuple[float, ...]]:
        if observation is None:
            return (False,) * self.n, ()
        straggling = tuple(bool(v) for v in observation.straggling)
        if len(straggling) != self.n:
            raise ValueError(
                f"Observation.straggling must have one entry per worker (n = {self.n}), not {len(straggling)}."
            )
        speed = tuple(float(v) for v in observation.speed)
        if speed and (len(speed) != self.n or not all(math.isfinite(v) for v in speed)):
            raise ValueError(
                f"Observation.speed must be empty or hold {self.n} finite rates, not {observation.speed!r}."
            )
        return straggling, speed

    def place(self, observation: Observation | None = None) -> ClusterPlacement:
        r"""Algorithm 1: form the clusters for the next iteration from the last straggler observation.

        Workers in each column of $\mathbf{A}_{cluster}$ are ranked by index (eq. (16)), or fastest
        first when ``observation.speed`` is given (§VI-B). The larger of the two groups (non-stragglers
        $\mathcal{K}_f$ when $|\mathcal{K}_f| \ge |\mathcal{K}_s|$, lines 6–9) is placed first.

        Phase I, per group: clusters take turns in the order of eq. (17) — fewest available workers of
        the group first, ties by index — and on its turn a cluster with an open spot takes its first
        available worker of the group (lines 16–23).

        *Stopping rule (our reading).* The text says the first group's placement "continues until there
        is no unassigned [worker of the group] left or a placement conflict is observed". We read a
        conflict during the turns as *a cluster with an open spot whose turn comes finds no available
        worker of the group*: the first group stops there, so it spreads evenly and leaves room in every
        cluster for the second group. The second group then fills open spots, turns cycling until it is
        placed or a whole round places nobody (the paper's "M sufficiently large" attempts). Workers left
        over that still fit an open cluster of theirs go to the one with the fewest workers of their
        kind (ties by index); the rest are Phase II conflicts. Run literally instead (the first group
        also cycles until clusters are full), the paper's example (eq. (18)) puts $w_{12}$ into
        cluster 3 and ends in a conflict of $w_5$ and 0 / 2 stragglers in clusters 3 / 4, contradicting
        the text of Fig. 2 (conflict $w_{12}$ swapped with $w_4$; one straggler per cluster except
        cluster 2). Our reading reproduces Fig. 2 and spreads stragglers better on random patterns.

        Phase II (lines 26–35): a worker whose clusters are all full conflicts with the lowest-index open
        cluster $p$; the first worker (in placement order) of a cluster $\bar p \in \mathcal{P}_k$
        that can join $p$ moves there and $k$ takes its slot. The paper does not order
        $\mathcal{P}_k$; we scan it from the cluster with the fewest workers of $k$'s kind (ties by
        index), which keeps stragglers spread and reproduces Fig. 2. Lemma 1 guarantees success.
        """
        return self._place(observation, stop_at_miss=True)

    def _place(self, observation: Observation | None, *, stop_at_miss: bool) -> ClusterPlacement:
        """:meth:`place`; ``stop_at_miss=False`` is the literal reading of lines 16–23 (for comparison)."""
        straggling, speed = self._check_observation(observation)
        P, size = self.clusters, self.cluster_size
        rank = {w: (-speed[w] if speed else 0.0, w) for w in range(self.n)}
        columns = [sorted({int(w) for w in self._cluster_matrix[:, p]}, key=rank.__getitem__) for p in range(P)]
        fast = sorted((w for w in range(self.n) if not straggling[w]), key=rank.__getitem__)
        slow = sorted((w for w in range(self.n) if straggling[w]), key=rank.__getitem__)
        members: list[list[int]] = [[] for _ in range(P)]

        def turn_order(group: list[int]) -> tuple[int, ...]:
            """Eq. (17): clusters with fewer available workers of ``group`` first, ties by index."""
            available = set(group)
            return tuple(sorted(range(P), key=lambda p: (sum(w in available for w in columns[p]), p)))

        def place_group(group: list[int], order: tuple[int, ...], stop: bool) -> tuple[list[int], list[int]]:
            """Lines 16–23 for one group; returns (workers left over, workers placed per cluster)."""
            available = set(group)
            counts = [0] * P
            progress = True
            while available and progress:
                progress = False
                for p in order:
                    if not available:
                        break
                    if len(members[p]) >= size:
                        continue
                    pick = next((w for w in columns[p] if w in available), None)
                    if pick is None:
                        if stop:
                            return [w for w in group if w in available], counts
                        continue
                    members[p].append(pick)
                    available.discard(pick)
                    counts[p] += 1
                    progress = True
            return [w for w in group if w in available], counts

        fast_first = len(fast) >= len(slow)
        first, second = (fast, slow) if fast_first else (slow, fast)
        first_order, second_order = turn_order(first), turn_order(second)
        left_first, first_counts = place_group(first, first_order, stop=stop_at_miss)
        left_second, second_counts = place_group(second, second_order, stop=False)

        conflicts: list[int] = []
        for w, counts in [(w, first_counts) for w in left_first] + [(w, second_counts) for w in left_second]:
            open_clusters = [p for p in self._clusters_of[w] if len(members[p]) < size]
            if not open_clusters:
                conflicts.append(w)
                continue
            target = min(open_clusters, key=lambda p: (counts[p], p))
            members[target].append(w)
            counts[target] += 1
        phase_one = tuple(tuple(m) for m in members)

        swaps: list[tuple[int, int, int, int]] = []
        for k in conflicts:
            p = next(q for q in range(P) if len(members[q]) < size)
            swap = self._find_swap(k, p, members, straggling)
            if swap is None:  # pragma: no cover - excluded by Lemma 1, checked in __init__
                raise RuntimeError(f"Algorithm 1: no swap resolves the conflict of worker {k} with cluster {p}.")
            p_bar, slot = swap
            k_bar = members[p_bar][slot]
            members[p_bar][slot] = k
            members[p].append(k_bar)
            swaps.append((k, p, k_bar, p_bar))
        return ClusterPlacement(
            clusters=tuple(tuple(m) for m in members),
            phase_one=phase_one,
            conflicts=tuple(conflicts),
            swaps=tuple(swaps),
            non_straggler_order=first_order if fast_first else second_order,
            straggler_order=second_order if fast_first else first_order,
        )

    def _find_swap(
        self, k: int, p: int, members: list[list[int]], straggling: tuple[bool, ...]
    ) -> tuple[int, int] | None:
        """Algorithm 1, lines 29–35: the first worker that can join ``p``, scanning $\\mathcal{P}_k$ from
        the cluster with the fewest workers of $k$'s kind (straggler or not), ties by index."""
        same_kind = {q: sum(straggling[w] == straggling[k] for w in members[q]) for q in self._clusters_of[k]}
        for p_bar in sorted(self._clusters_of[k], key=lambda q: (same_kind[q], q)):
            for slot, w in enumerate(members[p_bar]):
                if p in self._clusters_of[w]:
                    return p_bar, slot
        return None

    # ---- presentation and configurations --------------------------------------------------------
    def _params(self) -> dict[str, object]:
        return {**super()._params(), "clusters_per_worker": self._per_worker, "shifts": self._shifts}

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        """GC-SC's canonical clusters and load, with the fewest clusters per worker Lemma 1 allows."""
        clusters = cls._canonical_clusters(n, s)
        per_worker = next(m for m in range(1, clusters + 1) if 2 * m * n > clusters * (n - 1))
        return cls(n=n, clusters=clusters, load=s + 1, clusters_per_worker=per_worker)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        """Proper clusterings (``1 < P < n``), every load, every ``clusters_per_worker < P`` Lemma 1
        allows (``= P`` makes every worker eligible everywhere: no distribution left to test)."""
        for n in range(4, max_n + 1):
            for clusters in range(2, n):
                if n % clusters:
                    continue
                for per_worker in range(1, clusters):
                    if 2 * per_worker * n <= clusters * (n - 1):
                        continue
                    for load in range(1, n // clusters + 1):
                        yield {"n": n, "clusters": clusters, "load": load, "clusters_per_worker": per_worker}
