r"""CodedReduce (Reisizadeh, Prakash, Pedarsani, Avestimehr): gradient coding over an $(n, L)$-regular tree.

The master is the root of a tree with $L$ layers of workers below it; every non-leaf node has $n$
children, so there are $N = n + n^2 + \dots + n^L$ workers. Every parent (the master included) waits
for *any* $n - s$ of its children, decodes them with an ordinary gradient code, adds its own coded
partial gradient and forwards the result up (CR.Execute, §III-A.4 and Algorithm 2).

Allocation (CR.Allocate, Algorithm 2, and CompAlloc, Algorithm 1)
    The master splits the data set into $n$ equal consecutive *super-partitions* and gives sub-tree
    $T(1, i)$ the weighted data set $\mathcal{D}^{T(1,i)} = \bigcup_\kappa b_{i\kappa}\,\mathcal{D}_\kappa$,
    where $b_i$ is row $i$ of the per-parent code's $B$ (CompAlloc). A non-leaf worker keeps the *first*
    $r_{CR}\,d$ points of its weighted sub-tree data set as its own (coefficients included), splits the
    rest into $n$ equal consecutive super-partitions and hands them to its children with CompAlloc
    again; a leaf keeps everything it receives. Theorem 1's load (eq. (5))
    $r_{CR} = 1 / \sum_{l=1}^{L} (n/(s+1))^l$ is exactly what makes every leaf end up with $r_{CR}\,d$
    points too (tested, not assumed: leaves take what is left).

    Every cut is a rational position in the data set, so the data set is cut into $K$ equal *base
    partitions* ($K$ = least common multiple of the cut denominators; $K = 15$ for Example 2) and every
    node's own data is an exact set of base partitions with real coefficients (the products of the
    $B$ entries along its path).

Columns of the per-parent code (why each parent can use the plain :class:`OnlineDecoder`)
    For a parent $v$, column $\kappa$ of its code is its super-partition $\kappa$: the $\kappa$-th
    $n$-th of the data $v$ passes down, with the coefficients it already carries. Call its (weighted)
    gradient $P_\kappa$. By induction from the leaves, child $c_i$'s upward message equals the
    gradient of its whole weighted sub-tree data set, which by construction is
    $\sum_\kappa b_{i\kappa} P_\kappa$ - exactly message row $i$ of a gradient code over the $n$
    columns $P_1, \dots, P_n$. Decoding weights $a$ with $a B_F = \mathbf{1}$ therefore give
    $\sum_i a_i m_{c_i} = \sum_\kappa P_\kappa$ = the gradient of what $v$ passed down, and adding $v$'s
    own coded gradient gives the gradient of $v$'s sub-tree data set: the induction step. At the root
    (no own data) the super-partitions are the $n$ unweighted consecutive blocks of the data set, so
    the sum is the full gradient. :meth:`CodedReduceTree.super_partitions` gives the $n \times K$ matrix mapping
    parent $v$'s code columns to base partitions.

Readings of the printed paper (where it does not reproduce as written)
    * Example 2 says node $(1,1)$ decodes "from $(2,1)$ and $(2,1)$ using the first row in $A$",
      then uses $[2, -1, 0]$: that is the *third* row of $A$ (child $(2,3)$ straggling), with survivors
      $(2,1), (2,2)$. Tested: $2 m_{(2,1)} - m_{(2,2)} + g_{\mathcal{D}(1,1)}
      = \tfrac12 g_{\mathcal{D}_1} + g_{\mathcal{D}_2}$.
    * Algorithm 2, lines 22-23 print "$m_{(l,i)} = a_{f(l,i)} + g_{\mathcal{D}(l,i)} [m \dots]$"; the
      reading that reproduces §III-A.4 is $m_{(l,i)} = a_{f(l,i)} [m_{children}] + g_{\mathcal{D}(l,i)}$.
    * Eq. (6) prints the exponential rate as $\mu / a$; Appendix D (and the $\frac{r_{CR} d}{\mu}$
      term of Theorem 2) use rate $\mu / d_i$, i.e. mean $d_i / \mu$. The latency model here uses the
      latter: $T_i = a d_i + \mathrm{Exp}(\text{mean } d_i/\mu)$.
    * The per-parent code is Tandon et al.'s cyclic-repetition code (their Algorithm 2), which is what
      the paper cites as "Algorithm 2 in [38]" ([38] is misnumbered in the printed references).

The registered :class:`CodedReduceCode` (``make_code("coded_reduce", n=, s=, L=)``) is the *master's*
view: its ``n`` "workers" are the sub-trees $T(1, 1..n)$, message row $i$ is what node $(1, i)$ uploads
(the gradient of its whole sub-tree data set, over the $K$ base partitions), and decoding is the root's
per-parent decoder. For ``L = 1`` that is exactly an ordinary cyclic-repetition gradient code over
``n`` workers. The whole tree (every node, its partitions, every parent's decoder) is
:attr:`CodedReduceCode.tree`; :func:`simulate_coded_reduce` runs it bottom-up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from gradcode.common.codes.base import Array, Assignment, Decoding, GradientCode, OnlineDecoder, SpanDecoder
from gradcode.common.codes.cyclic import draw_cyclic_repetition
from gradcode.common.codes.numerics import equilibrated_decoding_weights, ones_in_span
from gradcode.common.codes.registry import register
from gradcode.common.codes.topology import CodeRef, CodeSize, NodeRow, size_parameter
from gradcode.common.validation import check_int

__all__ = [
    "DEFAULT_SEED",
    "CodedReduceCode",
    "CodedReduceTopology",
    "CodedReduceTree",
    "CompAllocCode",
    "LatencyBounds",
    "TreeNode",
    "coded_reduce_latency_bounds",
    "expected_order_statistic",
    "gradient_coding_latency",
    "harmonic",
    "optimal_load",
    "simulate_coded_reduce",
    "simulate_coded_reduce_latency",
    "uncoded_latency",
]

DEFAULT_SEED = 2019
"""Seed of the random cyclic-repetition draw (the year of the ISIT version, "Tree gradient coding")."""

_MAX_BASE_PARTITIONS = 1_000_000


def _check_tree_params(n: object, s: object, L: object) -> tuple[int, int, int]:
    n_ = check_int("n", n, 1)
    s_ = check_int("s", s, 0, n_ - 1, why="a parent with n children can tolerate at most n - 1 stragglers")
    L_ = check_int("L", L, 1, why="the tree needs at least one layer of workers")
    return n_, s_, L_


def optimal_load(n: int, L: int, s: int) -> Fraction:
    r"""Theorem 1, eq. (5): $r_{CR} = 1 / \sum_{l=1}^{L} (n/(s+1))^l$, the optimal per-worker load.

    The fraction of the data set every worker stores (and computes on) for an $(n, L)$-regular tree
    robust to any ``s`` stragglers per parent; no such scheme can load its workers less.
    """
    n, s, L = _check_tree_params(n, s, L)
    q = Fraction(n, s + 1)
    return Fraction(1) / sum((q**level for level in range(1, L + 1)), Fraction(0))


# ---- the per-parent code (CompAlloc) -------------------------------------------------------------


class _CompAllocDecoder(SpanDecoder):
    """The generic span test, with the equilibrated weights the draw's decode-error guard measured.

    Any ``n - s`` rows of a drawn code are independent (Theorem 3), so up to that many the weights come
    from a QR solve; more rows, or an explicit ``encoding``, take the least-squares path.
    """

    def __init__(self, code: CompAllocCode, assignment: Assignment, *, independent_up_to: int) -> None:
        super().__init__(code, assignment)
        self._independent_up_to = independent_up_to

    def _decoding(self) -> Decoding:
        rows = list(self._received)
        weights = equilibrated_decoding_weights(self.code.B[rows], independent=len(rows) <= self._independent_up_to)
        return Decoding(tuple(rows), weights, exact=True)


class CompAllocCode(GradientCode):
    r"""The gradient code every CodedReduce parent uses over its ``n`` children (CompAlloc, Algorithm 1).

    ``k = n`` columns (the parent's super-partitions), one row per child with ``s + 1`` non-zeros in a
    cyclic band. By default $B$ is Tandon et al.'s cyclic-repetition construction (their Algorithm 2):
    a seeded Gaussian $H \in \mathbb{R}^{s \times n}$ with $H\mathbf{1} = 0$ and each row the vector of
    the band's support in $\ker H$ with leading entry 1, so any $n - s$ rows span $\ker H \ni \mathbf{1}$.
    It is :func:`~gradcode.common.codes.cyclic.draw_cyclic_repetition` from ``seed``: the draw's decode error is
    measured against the default bound (1e-9) and redrawn deterministically if it fails, as for the
    ``cyclic`` scheme, and the decoder uses the weights that guard measured
    (:func:`~gradcode.common.codes.numerics.equilibrated_decoding_weights`). ``s = 0`` gives the identity and
    ``s = n - 1`` the all-ones matrix, exactly.

    ``encoding`` overrides $B$ (e.g. the paper's eq. (4) matrix for Example 2): it must be $n \times n$,
    have exactly $s + 1$ non-zeros per row (Theorem 1's load assumes it) and satisfy the B-span
    condition, which is checked over every $(n - s)$-subset once, here, never by the decoder.
    """

    decode_cost = "O(n·f) per message + O(f²n) solve"

    def __init__(self, n: int, s: int, *, seed: int = DEFAULT_SEED, encoding: Array | None = None) -> None:
        n = check_int("n", n, 1)
        s = check_int("s", s, 0, n - 1, why="a parent with n children can tolerate at most n - 1 stragglers")
        self._seed = check_int("seed", seed, 0)
        super().__init__(n, n, s)
        self._custom = encoding is not None
        if encoding is not None:
            self._set_matrix(self._checked_encoding(encoding))
        else:
            advice = "Another seed, or fewer stragglers per parent, may draw better."
            self._set_matrix(draw_cyclic_repetition(n, s, seed=self._seed, advice=advice).B)

    def _checked_encoding(self, encoding: Array) -> Array:
        n, s = self.n, self.s
        b = np.array(encoding, dtype=float)
        if b.shape != (n, n):
            raise ValueError(f"Argument 'encoding' must be an {n} x {n} matrix, not shape {b.shape}.")
        counts = np.count_nonzero(b, axis=1)
        if np.any(counts != s + 1):
            raise ValueError(
                f"Argument 'encoding' must have exactly s + 1 = {s + 1} non-zeros per row, not {counts.tolist()}."
            )
        for rows in itertools.combinations(range(n), n - s):
            if not ones_in_span(b[list(rows)]):
                raise ValueError(
                    f"Argument 'encoding' must have the all-ones vector in the span of any n - s = {n - s} rows; "
                    f"rows {list(rows)} do not span it."
                )
        return b

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        independent_up_to = 0 if self._custom else self.n - self.s
        return _CompAllocDecoder(self, assignment or self.static_assignment(), independent_up_to=independent_up_to)

    def _params(self) -> dict[str, object]:
        params: dict[str, object] = {"n": self.n, "s": self.s}
        if self._custom:
            params["encoding"] = "custom"
        else:
            params["seed"] = self._seed
        return params


# ---- the tree and its allocation (CR.Allocate) ---------------------------------------------------


@dataclass(frozen=True)
class _Segment:
    """A weighted interval ``[start, end)`` of the data set (positions as fractions of ``d``)."""

    start: Fraction
    end: Fraction
    coefficient: float

    @property
    def length(self) -> Fraction:
        return self.end - self.start


def _length(segments: Sequence[_Segment]) -> Fraction:
    return sum((seg.length for seg in segments), Fraction(0))


def _take(segments: Sequence[_Segment], length: Fraction) -> tuple[list[_Segment], list[_Segment]]:
    """Split a weighted sequence into its first ``length`` points and the rest (Example 2's "first")."""
    head: list[_Segment] = []
    tail: list[_Segment] = []
    left = length
    for seg in segments:
        if left <= 0:
            tail.append(seg)
        elif seg.length <= left:
            head.append(seg)
            left -= seg.length
        else:
            cut = seg.start + left
            head.append(_Segment(seg.start, cut, seg.coefficient))
            tail.append(_Segment(cut, seg.end, seg.coefficient))
            left = Fraction(0)
    return head, tail


def _split_equal(segments: Sequence[_Segment], parts: int) -> list[list[_Segment]]:
    """CompAlloc step 2: "uniformly partition" a weighted sequence into ``parts`` consecutive pieces."""
    piece = _length(segments) / parts
    pieces: list[list[_Segment]] = []
    rest = list(segments)
    for _ in range(parts - 1):
        head, rest = _take(rest, piece)
        pieces.append(head)
    pieces.append(rest)
    return pieces


@dataclass(frozen=True)
class TreeNode:
    r"""One node of the $(n, L)$-regular tree.

    ``id`` numbers nodes breadth-first (the master is 0); ``layer`` is 0 for the master and
    ``1..L`` for workers; ``index`` is the paper's $i$ in $(l, i)$, 0-based; ``slot`` is the node's row
    in its parent's code (its position among its siblings, -1 for the master). ``partitions`` are the
    base partitions the node stores and ``coefficients`` the weights it sums their partial gradients
    with (its coded gradient $g_{\mathcal{D}(l,i)}$); both empty for the master.
    """

    id: int
    layer: int
    index: int
    slot: int
    parent: int | None
    children: tuple[int, ...]
    partitions: tuple[int, ...]
    coefficients: tuple[float, ...]

    @property
    def is_master(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children


class CodedReduceTree:
    r"""CR.Allocate on an $(n, L)$-regular tree: every node's stored partitions and every parent's code.

    Arguments:
        n: children per parent.
        s: stragglers tolerated among the children of *every* parent.
        L: layers of workers below the master.
        seed: seed of the per-parent cyclic-repetition draw (ignored with ``encoding``).
        encoding: optional $n \times n$ per-parent matrix $B$ (see :class:`CompAllocCode`).

    All parents share one :class:`CompAllocCode` (:attr:`code`); what differs per parent is which base
    partitions its columns stand for (:meth:`super_partitions`).
    """

    def __init__(self, n: int, s: int, L: int, *, seed: int = DEFAULT_SEED, encoding: Array | None = None) -> None:
        self._n, self._s, self._L = _check_tree_params(n, s, L)
        self._code = CompAllocCode(self._n, self._s, seed=seed, encoding=encoding)
        self._load = optimal_load(self._n, self._L, self._s)
        self._allocate()

    # ---- CR.Allocate (Algorithm 2, lines 1-12) -----------------------------------------------
    def _allocate(self) -> None:
        n, L = self._n, self._L
        b = self._code.B
        own: dict[int, list[_Segment]] = {0: []}
        pieces: dict[int, list[list[_Segment]]] = {}
        subtree: dict[int, list[_Segment]] = {0: [_Segment(Fraction(0), Fraction(1), 1.0)]}
        nodes: list[tuple[int, int, int, int | None]] = [(0, 0, -1, None)]  # layer, index, slot, parent
        frontier = [0]
        for layer in range(1, L + 1):
            next_frontier = []
            for parent in frontier:
                passed_down = subtree[parent] if parent == 0 else _take(subtree[parent], self._load)[1]
                pieces[parent] = _split_equal(passed_down, n)
                parent_index = nodes[parent][1]
                for slot in range(n):
                    child = len(nodes)
                    nodes.append((layer, parent_index * n + slot, slot, parent))
                    subtree[child] = [
                        _Segment(seg.start, seg.end, seg.coefficient * float(b[slot, kappa]))
                        for kappa in np.flatnonzero(b[slot])
                        for seg in pieces[parent][kappa]
                    ]
                    next_frontier.append(child)
            for node in frontier:
                if node != 0:
                    own[node] = _take(subtree[node], self._load)[0]
            frontier = next_frontier
        for leaf in frontier:  # a leaf keeps whatever reached it; Theorem 1 says that is r_CR d
            own[leaf] = list(subtree[leaf])

        cuts = {seg.start for segs in subtree.values() for seg in segs} | {
            seg.end for segs in subtree.values() for seg in segs
        }
        cuts |= {seg.end for segs in own.values() for seg in segs}
        self._K = math.lcm(*(c.denominator for c in cuts))
        if self._K > _MAX_BASE_PARTITIONS:
            raise ValueError(
                f"The (n={n}, L={L}, s={self._s}) tree needs {self._K} equal base partitions; "
                f"at most {_MAX_BASE_PARTITIONS} are supported (use a shallower tree)."
            )

        children: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
        for node_id, (_, _, _, parent_id) in enumerate(nodes):
            if parent_id is not None:
                children[parent_id].append(node_id)
        self._nodes = tuple(
            TreeNode(
                id=node_id,
                layer=layer,
                index=index,
                slot=slot,
                parent=parent,
                children=tuple(children[node_id]),
                partitions=tuple(j for j, _ in self._expand(own[node_id])),
                coefficients=tuple(c for _, c in self._expand(own[node_id])),
            )
            for node_id, (layer, index, slot, parent) in enumerate(nodes)
        )
        self._pieces = {v: np.array([self._vector(p) for p in ps]) for v, ps in pieces.items()}
        self._subtree_vectors = np.array([self._vector(subtree[v]) for v in range(len(nodes))])
        self._leaf_lengths = {leaf: _length(own[leaf]) for leaf in frontier}

    def _expand(self, segments: Iterable[_Segment]) -> list[tuple[int, float]]:
        """Base partitions ``j`` (each ``[j/K, (j+1)/K)``) covered by ``segments``, with coefficients."""
        out: list[tuple[int, float]] = []
        for seg in segments:
            first, last = seg.start * self._K, seg.end * self._K
            assert first.denominator == 1 and last.denominator == 1, "cut not on the base grid"
            out.extend((j, seg.coefficient) for j in range(int(first), int(last)))
        return sorted(out)

    def _vector(self, segments: Iterable[_Segment]) -> Array:
        v = np.zeros(self._K)
        for j, c in self._expand(segments):
            v[j] += c
        return v

    # ---- parameters --------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._n

    @property
    def s(self) -> int:
        return self._s

    @property
    def L(self) -> int:  # noqa: N802 - the paper's name
        return self._L

    @property
    def code(self) -> CompAllocCode:
        """The gradient code every parent (the master included) decodes its children with."""
        return self._code

    @property
    def load(self) -> Fraction:
        """$r_{CR}$ of eq. (5): the fraction of the data set every worker stores."""
        return self._load

    @property
    def num_partitions(self) -> int:
        """$K$: the number of equal base partitions the data set is cut into."""
        return self._K

    @property
    def num_workers(self) -> int:
        """$N = n + \\dots + n^L$ (the master is not a worker)."""
        return len(self._nodes) - 1

    @property
    def nodes(self) -> tuple[TreeNode, ...]:
        """Every node, master first, breadth-first (``nodes[v].id == v``)."""
        return self._nodes

    @property
    def parents(self) -> tuple[int, ...]:
        """Ids of the nodes that have children (the master and every non-leaf worker)."""
        return tuple(node.id for node in self._nodes if node.children)

    def node(self, node_id: int) -> TreeNode:
        v = check_int("node_id", node_id, 0, len(self._nodes) - 1)
        return self._nodes[v]

    def node_at(self, layer: int, index: int) -> TreeNode:
        """The node the paper calls $(l, i)$, with 0-based ``index`` (the master is ``(0, 0)``)."""
        layer = check_int("layer", layer, 0, self._L)
        index = check_int("index", index, 0, self._n**layer - 1)
        first = sum(int(self._n**level) for level in range(layer))
        return self._nodes[first + index]

    def node_load(self, node_id: int) -> Fraction:
        """The fraction of the data set node ``node_id`` stores (``r_CR`` for every worker)."""
        return Fraction(len(self.node(node_id).partitions), self._K)

    def local_vector(self, node_id: int) -> Array:
        """Node's own coded gradient as a length-$K$ row over the base partitions."""
        node = self.node(node_id)
        v = np.zeros(self._K)
        v[list(node.partitions)] = node.coefficients
        return v

    def subtree_vector(self, node_id: int) -> Array:
        """Row over the base partitions of the gradient of the node's weighted sub-tree data set.

        That is what the node uploads when its sub-tree decodes (and the full-gradient all-ones row
        for the master).
        """
        row: Array = self._subtree_vectors[self.node(node_id).id].copy()
        return row

    def super_partitions(self, parent_id: int) -> Array:
        """$n \\times K$ matrix: row $\\kappa$ = parent's code column $\\kappa$ over the base partitions.

        Child ``slot`` of the parent uploads ``code.B[slot] @ super_partitions(parent) @ G``.
        """
        node = self.node(parent_id)
        if node.is_leaf:
            raise ValueError(f"Argument 'parent_id' must be a node with children, not leaf {parent_id}.")
        return self._pieces[node.id].copy()

    def leaf_load(self, node_id: int) -> Fraction:
        """What actually reached a leaf, before any rounding (Theorem 1 predicts ``load``)."""
        return self._leaf_lengths[self.node(node_id).id]

    def __repr__(self) -> str:
        return f"<CodedReduceTree(n={self._n}, s={self._s}, L={self._L}, K={self._K}, load={self._load})>"


# ---- CR.Execute --------------------------------------------------------------------------------


def simulate_coded_reduce(
    tree: CodedReduceTree,
    partial_gradients: Array,
    arrivals: Mapping[int, Sequence[int]] | None = None,
) -> Array:
    r"""Run CR.Execute bottom-up and return what the master decodes (the full gradient).

    Arguments:
        tree: the allocated tree.
        partial_gradients: $K \times p$ array, row $j$ = partial gradient of base partition $j$.
        arrivals: for a parent id, the ids of its children in the order their messages arrive (the
            rest straggle). A parent missing from the mapping hears from all children in slot order.

    Every parent feeds arrivals to a fresh online decoder of the shared per-parent code and stops at
    the first decodable moment (later children are dropped); its upward message is
    $\sum_i a_i m_{c_i} + g_{\mathcal{D}(v)}$. Only sub-trees whose message is used are evaluated.
    Raises :class:`~gradcode.common.exceptions.NotDecodableError` if a used parent cannot decode and
    ``ValueError`` for an arrival that is not a child of that parent.
    """
    g = np.asarray(partial_gradients)
    if g.ndim != 2 or g.shape[0] != tree.num_partitions:
        raise ValueError(f"Argument 'partial_gradients' must have shape ({tree.num_partitions}, p), not {g.shape}.")
    arrivals = arrivals or {}
    for parent in arrivals:
        if check_int("arrivals key", parent, 0, len(tree.nodes) - 1) not in tree.parents:
            raise ValueError(f"Node {parent} in 'arrivals' has no children.")

    def message(node_id: int) -> Array:
        node = tree.nodes[node_id]
        own = np.asarray(node.coefficients) @ g[list(node.partitions)] if node.partitions else np.zeros(g.shape[1])
        if node.is_leaf:
            return own
        order = arrivals.get(node_id, node.children)
        decoder = tree.code.decoder()
        for child in order:
            if child not in node.children:
                raise ValueError(f"Node {child} is not a child of node {node_id}; its children are {node.children}.")
            if decoder.add(tree.nodes[child].slot):
                break
        decoding = decoder.decoding()
        received = {slot: message(node.children[slot]) for slot in decoding.rows}
        return decoding.combine(received) + own

    return message(0)


# ---- the registered master's view --------------------------------------------------------------


class _RootDecoder(OnlineDecoder):
    """Decodes the master's view by running the per-parent decoder on the same row ids.

    Exact: the flat matrix is $B_{\\text{flat}} = B\\,P$ with $P$ the root's super-partitions, whose
    rows are disjoint 0/1 indicators covering every base partition, so $a B_{\\text{flat},F} = \\mathbf 1_K$
    iff $a B_F = \\mathbf 1_n$.
    """

    def __init__(self, code: CodedReduceCode, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._inner = code.tree.code.decoder()

    @property
    def decodable(self) -> bool:
        return self._inner.decodable

    def _on_add(self, row: int) -> None:
        self._inner.add(row)

    def _decoding(self) -> Decoding:
        inner = self._inner.decoding()
        return Decoding(inner.rows, inner.weights, exact=True)


@register
class CodedReduceCode(GradientCode):
    r"""CodedReduce as seen by the master: ``n`` sub-trees, any ``n - s`` of which suffice.

    Worker ``i`` of this code is the whole sub-tree $T(1, i)$ and message row ``i`` is what node
    $(1, i)$ uploads: the gradient of its weighted sub-tree data set over the ``k = K`` base
    partitions (:attr:`tree`). ``L = 1`` is an ordinary cyclic-repetition gradient code over ``n``
    workers; deeper trees keep the same decoding at the master while each worker stores only
    ``r_CR`` of the data (Theorem 1). ``partitions_of_worker(i)`` is what the sub-tree stores in
    total; a single tree node stores ``tree.node(v).partitions``.
    """

    name = "coded_reduce"
    decode_cost = "O(n·f) per message + O(f²n) solve, at every parent"

    def __init__(self, n: int, s: int, L: int = 1, seed: int = DEFAULT_SEED) -> None:
        n, s, L = _check_tree_params(n, s, L)
        seed = check_int("seed", seed, 0)
        self._tree = CodedReduceTree(n, s, L, seed=seed)
        self._L = L
        self._seed = seed
        super().__init__(n, self._tree.num_partitions, s)
        root = self._tree.nodes[0]
        self._set_matrix(np.array([self._tree.subtree_vector(child) for child in root.children]))

    @property
    def tree(self) -> CodedReduceTree:
        return self._tree

    @property
    def L(self) -> int:  # noqa: N802 - the paper's name
        return self._L

    @property
    def seed(self) -> int:
        return self._seed

    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        return _RootDecoder(self, assignment or self.static_assignment())

    def _params(self) -> dict[str, object]:
        return {"n": self.n, "s": self.s, "L": self._L, "seed": self._seed}

    @classmethod
    def implied_size(cls, params: Mapping[str, object]) -> CodeSize:
        """Every non-root node of the tree is a worker: n + n^2 + ... + n^L."""
        n, depth = size_parameter(params, "n"), size_parameter(params, "L", 1)
        if n is None or depth is None or depth <= 1:
            return CodeSize(workers=n)
        return CodeSize(workers=math.inf if depth > 64 else sum(n**layer for layer in range(1, int(depth) + 1)))

    def topology(self) -> CodedReduceTopology | None:
        """The tree's worker layout when ``L > 1`` (ValueError if the parents could not decode their children)."""
        return None if self._L == 1 else CodedReduceTopology(self)

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        """The one-layer tree (``L = 1``): a cyclic-repetition code over ``n`` workers."""
        return cls(n=n, s=s)

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        """Every ``(n, s)`` with ``L`` in 1..2, and ``L = 3`` while ``n <= 4`` (deeper trees: tests)."""
        for n in range(1, max_n + 1):
            for s in range(n):
                for L in (1, 2, 3) if n <= 4 else (1, 2):
                    yield {"n": n, "s": s, "L": L}


class CodedReduceTopology:
    """Which worker index runs which CodedReduce tree node, and what each one is loaded with.

    Every non-root node of the (n, L)-regular tree is a worker process. Worker index ``w`` (the wire
    id, also the straggler model's id) is tree node ``w + 1`` (breadth first, the master is node 0),
    so ``0..n-1`` are the first layer and the master-view code's worker ``i`` is worker ``i``. A node
    is loaded with exactly its stored base partitions and ONE row: its slot in its parent's code, over
    its own coded part. ``child_code`` is what every inner node decodes its children with:
    ``coded_reduce`` with ``L = 1`` and the tree's seed, whose matrix is the tree's per-parent code
    (checked here; ValueError otherwise). A parent at layer ``l`` waits ``deadline x (L + 1 - l) / (L + 1)``
    for its children, so a deeper parent gives up before the one above it.
    """

    def __init__(self, code: CodedReduceCode) -> None:
        self.tree: CodedReduceTree = code.tree
        self.n, self.s, self.L = code.n, code.s, code.L
        params = {"n": self.n, "s": self.s, "L": 1, "seed": code.seed}
        child = CodedReduceCode(**params)
        if not np.array_equal(child.B, self.tree.code.B):
            raise ValueError(
                f"coded_reduce(n={self.n}, s={self.s}, L=1, seed={code.seed}) does not reproduce the tree's "
                f"per-parent code {self.tree.code!r}; the tree parents could not decode their children with it."
            )
        static = child.static_assignment().rows
        slots = [self.node(w).slot for w in range(self.n)]
        if (
            any(static[i] != (i,) for i in range(self.n))
            or code.static_assignment().rows != tuple((i,) for i in range(self.n))
            or slots != list(range(self.n))
        ):
            raise ValueError(f"{code!r}: worker i of the per-parent code must compute exactly row i (its slot).")
        self.child_code = CodeRef(CodedReduceCode.name, params)

    @property
    def num_workers(self) -> int:
        """N = n + ... + n^L: every non-root node is a worker."""
        return self.tree.num_workers

    def describe(self) -> str:
        return f"every node of the n={self.n}, L={self.L} tree"

    def node(self, w: int) -> TreeNode:
        """The tree node worker index ``w`` runs."""
        return self.tree.nodes[w + 1]

    def children(self, w: int) -> list[int]:
        """Worker indices of ``w``'s children, in slot order (empty for a leaf)."""
        return [child - 1 for child in self.node(w).children]

    def parent_of(self) -> list[int]:
        """The parent worker index of every worker, -1 under the master."""
        return [-1 if node.parent in (None, 0) else int(node.parent) - 1 for node in self.tree.nodes[1:]]

    def row(self, w: int) -> NodeRow:
        """Worker ``w``'s one row: its slot in its parent's code, over its own stored partitions."""
        node = self.node(w)
        weights: dict[int, float] = {}
        for j, c in zip(node.partitions, node.coefficients, strict=True):
            weights[j] = weights.get(j, 0.0) + float(c)
        parts = tuple(sorted(weights))
        return NodeRow(row=node.slot, partitions=parts, coefficients=tuple(weights[j] for j in parts))

    def wait_seconds(self, w: int, deadline_seconds: float) -> float:
        """How long inner node ``w`` waits for its children: less the deeper it is, so it reports first."""
        return deadline_seconds * (self.L + 1 - self.node(w).layer) / (self.L + 1)


# ---- latency model (Theorem 2) -----------------------------------------------------------------


def harmonic(m: int) -> float:
    """$H_m = 1 + 1/2 + \\dots + 1/m$ ($H_0 = 0$)."""
    m = check_int("m", m, 0)
    return math.fsum(1.0 / i for i in range(1, m + 1))


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"Argument {name!r} must be a finite number {bound}, not {value!r}.")
    return v


def expected_order_statistic(count: int, rank: int, *, shift: float, mean: float) -> float:
    r"""$E[T_{(rank)}]$ of ``count`` i.i.d. $\text{shift} + \mathrm{Exp}(\text{mean})$ times.

    $= \text{shift} + \text{mean}\,(H_{count} - H_{count - rank})$ (Rényi: the gaps of exponential order
    statistics are independent exponentials; Appendix D, proof of Lemma 2).
    """
    count = check_int("count", count, 1)
    rank = check_int("rank", rank, 1, count)
    return _check_positive("shift", shift, allow_zero=True) + _check_positive("mean", mean, allow_zero=True) * (
        harmonic(count) - harmonic(count - rank)
    )


@dataclass(frozen=True)
class LatencyBounds:
    """Theorem 2's two sides with their $o(\\cdot)$ terms dropped: ``computation`` plus each communication."""

    computation: float
    lower: float
    upper: float


def coded_reduce_latency_bounds(n: int, L: int, s: int, *, d: float, a: float, mu: float, t_c: float) -> LatencyBounds:
    r"""Expected CodedReduce iteration time per Theorem 2 (eqs. (7)-(8)), $o(\cdot)$ terms dropped.

    Model (§III-C.3): worker $i$ with $d_i = r_{CR} d$ points finishes computing at
    $a d_i + \mathrm{Exp}(\text{mean } d_i/\mu)$, independently (eq. (6) with the rate read as
    $\mu/d_i$, see module docstring); a node receives one message at a time and each child-to-parent
    message takes $t_c$; every parent waits for $n - s$ children.

    * ``computation`` $= E[T_{(n-s)}] = \frac{r_{CR} d}{\mu}(H_n - H_s) + a r_{CR} d$ — the exact
      finite-$n$ quantity the proofs use; it tends to the printed $\frac{r_{CR} d}{\mu}\log\frac1\alpha
      + a r_{CR} d$ as $n \to \infty$ with $s = \alpha n$ (and stays finite for $s = 0$).
    * ``lower`` $=$ computation $+ (n - s + L - 1) t_c$ (eq. (7)): the first group's $n - s$ messages
      queue at their parent, then one hop per remaining layer.
    * ``upper`` $=$ computation $+ L (n - s) t_c$ (Appendix D: every layer's receptions pipelined).

    These are asymptotic in $n$ (fixed $L$, $d$, $\alpha$); for small $n$ they are approximations,
    not bounds — :func:`simulate_coded_reduce_latency` gives the finite-$n$ mean of the same model.
    """
    n, s, L = _check_tree_params(n, s, L)
    load_points = float(optimal_load(n, L, s)) * _check_positive("d", d)
    comp = expected_order_statistic(
        n,
        n - s,
        shift=_check_positive("a", a, allow_zero=True) * load_points,
        mean=load_points / _check_positive("mu", mu),
    )
    t_c = _check_positive("t_c", t_c, allow_zero=True)
    return LatencyBounds(computation=comp, lower=comp + (n - s + L - 1) * t_c, upper=comp + L * (n - s) * t_c)


def gradient_coding_latency(N: int, S: int, *, d: float, a: float, mu: float, t_c: float) -> float:
    r"""GC over ``N`` workers in the same model (Remark 4): load $(S+1)d/N$, master waits for $N - S$.

    $E[T_{GC}] \approx E[T_{(N-S)}] + (N - S) t_c$ — the one-layer case of
    :func:`coded_reduce_latency_bounds` (where its two sides coincide): $\Theta(1) + \Theta(N)$.
    """
    return coded_reduce_latency_bounds(N, 1, S, d=d, a=a, mu=mu, t_c=t_c).upper


def uncoded_latency(N: int, *, d: float, a: float, mu: float, t_c: float) -> float:
    r"""Uncoded master-worker: load $d/N$, the master waits for all: $\frac{d}{N\mu}H_N + \frac{a d}{N} + N t_c$."""
    return gradient_coding_latency(N, 0, d=d, a=a, mu=mu, t_c=t_c)


def simulate_coded_reduce_latency(
    n: int,
    L: int,
    s: int,
    *,
    d: float,
    a: float,
    mu: float,
    t_c: float,
    iterations: int = 1000,
    rng: np.random.Generator | None = None,
) -> Array:
    r"""Monte-Carlo iteration times of CodedReduce in Theorem 2's model, one per iteration.

    Every worker's computation time is drawn as in :func:`coded_reduce_latency_bounds`. A parent
    receives its children's messages one at a time (single port), in the order they become ready,
    each taking $t_c$; after $n - s$ receptions it decodes (instantly) and its own message is ready at
    the later of that and its own computation. The iteration ends when the master has decoded.
    """
    n, s, L = _check_tree_params(n, s, L)
    iterations = check_int("iterations", iterations, 1)
    rng = rng if rng is not None else np.random.default_rng(DEFAULT_SEED)
    load_points = float(optimal_load(n, L, s)) * _check_positive("d", d)
    shift = _check_positive("a", a, allow_zero=True) * load_points
    mean = load_points / _check_positive("mu", mu)
    t_c = _check_positive("t_c", t_c, allow_zero=True)
    # ready[..., j]: when the j-th node of the current layer has its upward message ready.
    ready = shift + rng.exponential(mean, size=(iterations, n**L))
    for layer in range(L - 1, -1, -1):
        arrivals = np.sort(ready.reshape(iterations, n**layer, n), axis=2)
        done = np.full(arrivals.shape[:2], -np.inf)
        for j in range(n - s):  # single port: receive the (j+1)-th ready message after the j-th
            done = np.maximum(done, arrivals[:, :, j]) + t_c
        if layer == 0:
            return np.asarray(done[:, 0])
        own = shift + rng.exponential(mean, size=(iterations, n**layer))
        ready = np.maximum(done, own)
    raise AssertionError("unreachable")
