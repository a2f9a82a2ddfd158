r"""The gradient-code abstraction every scheme implements.

A gradient code is a matrix $B$ whose rows are *messages* and whose columns are data partitions
(Tandon et al., §2.1, eq. (1)). A worker that computes message row $b$ evaluates the partial
gradients $g_j$ of the partitions in $\mathrm{supp}(b)$ and sends $\sum_j b_j g_j$. A receiver that
holds a set $F$ of rows can decode as soon as $\mathbf{1} \in \mathrm{rowspan}(B_F)$; it then finds
decoding weights $a$ with $a B_F = \mathbf{1}$ and outputs $\sum_i a_i m_i = \sum_j g_j$.

Three objects carry that idea:

* :class:`GradientCode` — the immutable, validated code: $B$, supports, which worker computes which
  row (:class:`Assignment`, per iteration for dynamic schemes), and a factory of decoders.
* :class:`OnlineDecoder` — fed message ids as they arrive, answers "decodable yet?" after each one in
  time independent of the number of straggler patterns, then yields a :class:`Decoding`.
* :class:`Decoding` — the weights $a$ over the rows it uses, whether the result is exact, the
  combine step $\sum_i a_i m_i$, and its error certificate (:meth:`Decoding.certify`).

The network code (master, tree parents) only ever talks to these three, never to a scheme.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from gradcode.common.codes.numerics import (
    CERTIFY_TAIL,
    RANK_TOLERANCE,
    SPAN_TOLERANCE,
    CombinationBound,
    ErrorCertificate,
    RowProfile,
    bound_combination,
    equilibrated_decoding_weights,
    span_minimal_members,
    underflow_unit,
    unit_roundoff,
    weighted_sum,
)
from gradcode.common.codes.topology import CodeSize, Topology, size_parameter
from gradcode.common.exceptions import NotDecodableError
from gradcode.common.validation import check_int

__all__ = [
    "SPAN_TOLERANCE",
    "Array",
    "Assignment",
    "Decoding",
    "GradientCode",
    "Observation",
    "OnlineDecoder",
    "SpanDecoder",
    "SpanTracker",
    "check_int",
]

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class Assignment:
    """Which message rows each worker computes in one iteration, in the order it sends them.

    ``rows[w]`` is the tuple of row ids worker ``w`` computes. Static codes use one assignment for the
    whole job; dynamic codes (GC-DC) produce a new one each iteration. A row belongs to at most one
    worker in an assignment.
    """

    rows: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for w, rows in enumerate(self.rows):
            for r in rows:
                if r in seen:
                    raise ValueError(f"Row {r} is assigned twice (again to worker {w}); a row has one owner.")
                seen.add(r)

    @cached_property
    def owner(self) -> dict[int, int]:
        """Map from row id to the worker that computes it."""
        return {r: w for w, rows in enumerate(self.rows) for r in rows}

    @property
    def num_workers(self) -> int:
        return len(self.rows)

    def rows_of(self, workers: Iterable[int]) -> list[int]:
        """All rows computed by ``workers``, in worker order."""
        return [r for w in workers for r in self.rows[w]]

    @classmethod
    def one_row_per_worker(cls, n: int) -> Assignment:
        """Row ``i`` to worker ``i``: the assignment of every single-message static code."""
        return cls(tuple((i,) for i in range(n)))


@dataclass(frozen=True)
class Observation:
    """What the master saw of each worker in the last iteration; input of dynamic codes.

    ``straggling[w]`` is True when worker ``w`` was late (not among those used to decode) or down.
    ``speed[w]`` is a throughput estimate, larger is faster (e.g. the inverse of its compute time);
    heterogeneous-worker variants order workers by it.
    """

    straggling: tuple[bool, ...]
    speed: tuple[float, ...] = ()


@dataclass(frozen=True)
class Decoding:
    """Decoding weights ``weights[i]`` for message ``rows[i]``: $\\sum_i a_i m_i = \\sum_j g_j$.

    ``exact`` is False for approximate schemes (``ignore_stragglers``) and for a decode whose
    estimated numerical error exceeds the code's bound (``cyclic``); either way the iteration is
    reported as approximate, never silently used as exact. Whether the *combined gradient* is exact
    is for :meth:`certify` to say, from the messages actually combined: exact means the certified
    bound is within the job's tolerance.
    """

    rows: tuple[int, ...]
    weights: Array
    exact: bool = True
    matrix: Array | None = field(default=None, repr=False, compare=False)
    """The code's ``B`` (rows indexed by :attr:`rows`); attached by :meth:`OnlineDecoder.decoding`."""

    def in_row_order(self) -> Decoding:
        """This decoding with its rows ascending (weights alike): the messages' arrival order then changes neither
        the combined vector's bits nor the certificate's cache key (six workers arrive in 720 orders; a profile per
        order missed the cache every round, 0.4 ms a round at n = 6)."""
        order = sorted(range(len(self.rows)), key=self.rows.__getitem__)
        if order == list(range(len(self.rows))):
            return self
        return replace(self, rows=tuple(self.rows[i] for i in order), weights=self.weights[order])

    @cached_property
    def row_profile(self) -> RowProfile:
        """What :meth:`certify` needs of the combined rows: computed once per survivor set and weights of a job
        (:func:`_cached_profile`), since each round's decoding is a new object."""
        if self.matrix is None:
            raise ValueError("This decoding carries no code matrix; build it with OnlineDecoder.decoding().")
        return _cached_profile(self.matrix, self.rows, self.weights)

    def error_bound(
        self,
        message_norms: Mapping[int, float] | Sequence[float] | Array,
        *,
        dtype: npt.DTypeLike = np.float64,
        magnitudes: Mapping[int, float] | Sequence[float] | Array | None = None,
        length: int = 0,
        sender_errors: Sequence[float] | Array | None = None,
    ) -> CombinationBound:
        r"""The error bound of the gradient :meth:`combine` will return, from what arrived with the messages
        (numerics.bound_combination); :meth:`CombinationBound.certificate` with the combination's norm certifies it.

        ``message_norms`` are $\|m_i\|$ of the received messages (by row id, or in the order of
        :attr:`rows`), which a receiver can accumulate chunk by chunk; ``dtype`` the precision the messages were
        computed and sent in. ``magnitudes`` ($\sum_j |b_{ij}| \|g_j\|$ per message, as the workers report them;
        NaN where one sent none, which leaves a row of several partitions uncertified: infinite bound) make the
        bound rigorous; ``None`` estimates them (a caller that formed the messages itself). ``length``
        (coordinates certified, 0: not known) adds the underflow term; ``sender_errors`` (absolute, per row; 0:
        none) are errors the senders certified for their own messages (leaves of several partitions, tree
        parents). ``O(f)`` after the first call on a survivor set.
        """
        return bound_combination(
            self.row_profile,
            self._per_row(message_norms, "message_norms"),
            u=unit_roundoff(dtype),
            magnitudes=None if magnitudes is None else self._per_row(magnitudes, "magnitudes"),
            length=length,
            eta=underflow_unit(dtype),
            sender_errors=None if sender_errors is None else self._per_row(sender_errors, "sender_errors"),
        )

    def certify(
        self,
        message_norms: Mapping[int, float] | Sequence[float] | Array,
        combined_norm: float,
        *,
        dtype: npt.DTypeLike = np.float64,
        magnitudes: Mapping[int, float] | Sequence[float] | Array | None = None,
        length: int = 0,
        sender_errors: Sequence[float] | Array | None = None,
    ) -> ErrorCertificate:
        """Certified relative error of the gradient :meth:`combine` returned, of norm ``combined_norm``
        (:meth:`error_bound`'s arguments)."""
        bound = self.error_bound(
            message_norms, dtype=dtype, magnitudes=magnitudes, length=length, sender_errors=sender_errors
        )
        return bound.certificate(combined_norm)

    @staticmethod
    def certify_vector(
        vector: Array, bound: CombinationBound, *, tolerance: float, length: int = 0
    ) -> tuple[ErrorCertificate, float]:
        r"""The certificate of the combined ``vector`` (its first ``length`` coordinates, all when 0) from its
        :meth:`error_bound`, and the lower bound of its norm it used.

        The bound divides by a lower bound of $\|\hat g\|$, so any lower bound keeps it sound, only looser: the
        norm of the last :data:`CERTIFY_TAIL` coordinates is tried first (64 KiB the blocked combine left in cache,
        instead of the whole vector: at $p = 10^5$ the full norm alone cost 40% of what the certificate may), and
        the whole norm only when that bound is not within ``tolerance``.
        """
        coordinates = length or vector.size
        if coordinates > CERTIFY_TAIL:
            tail_part = vector[coordinates - CERTIFY_TAIL : coordinates]
            tail = math.sqrt(float(np.dot(tail_part, tail_part)))  # np.linalg.norm's own formula, one call
            certificate = bound.certificate(tail)
            if certificate.within(tolerance):
                return certificate, tail
        norm = float(np.linalg.norm(vector[:coordinates]))
        return bound.certificate(norm), norm

    def combine_certified(
        self, messages: Mapping[int, Array], *, dtype: npt.DTypeLike | None = None
    ) -> tuple[Array, ErrorCertificate]:
        """:meth:`combine` and :meth:`certify` in one call (norms taken from the messages themselves)."""
        combined = self.combine(messages)
        norms = [float(np.linalg.norm(messages[row])) for row in self.rows]
        precision = messages[self.rows[0]].dtype if dtype is None else dtype
        return combined, self.certify(norms, float(np.linalg.norm(combined)), dtype=precision)

    def _per_row(self, values: Mapping[int, float] | Sequence[float] | Array, what: str) -> Sequence[float] | Array:
        """``values`` by row id in the order of :attr:`rows`; a sequence as it is (:func:`bound_combination` checks
        its length)."""
        if not isinstance(values, Mapping):
            return values
        missing = [r for r in self.rows if r not in values]
        if missing:
            raise KeyError(f"Argument {what!r} has no value for rows {missing} of this decoding.")
        return [float(values[r]) for r in self.rows]

    def combine(self, messages: Mapping[int, Array]) -> Array:
        """Return $\\sum_i a_i m_i$ as a real float64 vector.

        ``messages`` maps row id to its received vector (extra rows are ignored). Complex codes
        (Reed–Solomon) produce a complex sum whose imaginary part is rounding noise; it is dropped.
        """
        missing = [r for r in self.rows if r not in messages]
        if missing:
            raise KeyError(f"Messages for rows {missing} are needed to combine but were not given.")
        out = weighted_sum([messages[row] for row in self.rows], self.weights)
        return np.ascontiguousarray(out.real) if np.iscomplexobj(out) else out


_PROFILES: OrderedDict[tuple[int, tuple[int, ...], bytes], tuple[Array, RowProfile]] = OrderedDict()
_PROFILES_KEPT = 256


def _cached_profile(matrix: Array, rows: tuple[int, ...], weights: Array) -> RowProfile:
    """:meth:`RowProfile.of` the rows of ``matrix`` and ``weights``, from a small LRU cache keyed by the matrix (by
    identity: a code's ``B`` lives as long as its job), the rows and the weights' bytes. Its extended-precision
    residual costs ~3 ms at n = 128, which a job pays once per survivor set instead of every round (issue 24's
    target: the certificate within 10% of the combine)."""
    key = (id(matrix), rows, np.ascontiguousarray(weights).tobytes())
    hit = _PROFILES.get(key)
    if hit is not None and hit[0] is matrix:
        _PROFILES.move_to_end(key)
        return hit[1]
    profile = RowProfile.of(weights, matrix[list(rows)])
    _PROFILES[key] = (matrix, profile)
    if len(_PROFILES) > _PROFILES_KEPT:
        _PROFILES.popitem(last=False)
    return profile


class OnlineDecoder(ABC):
    """Fed message row ids as they arrive; decides after each one whether it can decode.

    ``add`` raises ``KeyError`` for a row that is not in this iteration's assignment and ignores a
    row it has already seen (a duplicate is never double-counted). Implementations keep the cost of
    ``add`` independent of the number of straggler patterns.
    """

    def __init__(self, code: GradientCode, assignment: Assignment) -> None:
        self.code = code
        self.assignment = assignment
        self._received: list[int] = []
        self._seen: set[int] = set()

    @property
    def received(self) -> tuple[int, ...]:
        """Rows fed so far, in arrival order, without duplicates."""
        return tuple(self._received)

    @property
    @abstractmethod
    def decodable(self) -> bool:
        """True once the received rows determine the full gradient."""

    def add(self, row: int) -> bool:
        """Record the arrival of message ``row``; return whether the received set is decodable."""
        if row not in self.assignment.owner:
            valid = sorted(self.assignment.owner)
            raise KeyError(f"Message {row!r} is not part of this iteration's assignment; valid rows are {valid}.")
        if row in self._seen:
            return self.decodable
        self._seen.add(row)
        self._received.append(row)
        self._on_add(row)
        return self.decodable

    def decoding(self) -> Decoding:
        """Return the decoding weights; raise :class:`NotDecodableError` if not yet decodable."""
        if not self.decodable:
            workers = sorted({self.assignment.owner[r] for r in self._received})
            raise NotDecodableError(
                f"{type(self.code).__name__}: messages {sorted(self._received)} from workers {workers} "
                "do not determine the full gradient yet."
            )
        decoding = self._decoding()
        if decoding.matrix is None:
            decoding = replace(decoding, matrix=self.code.B)
        return decoding.in_row_order()

    @abstractmethod
    def _on_add(self, row: int) -> None:
        """Update the decoder's state with a new, not yet seen row."""

    @abstractmethod
    def _decoding(self) -> Decoding:
        """Compute the weights; called only when decodable."""


class SpanTracker:
    r"""Incremental test of ``target`` $\in$ span(vectors added so far).

    Keeps an orthonormal basis of the added vectors (classical Gram–Schmidt, applied twice — "twice
    is enough") and the residual of ``target`` after projection onto it. ``add`` costs
    $O(d \cdot r)$ for dimension $d$ and rank $r$; a vector (numerically) in the current span is
    skipped. ``contains_target`` holds when the residual is below :data:`SPAN_TOLERANCE` relative
    to ``target``.
    """

    def __init__(self, target: Array) -> None:
        self._dim = target.shape[0]
        # Grown on demand: a decoder usually stops at far fewer than ``dim`` basis vectors.
        self._basis = np.zeros((min(self._dim, 8), self._dim), dtype=target.dtype)
        self._rank = 0
        self._residual = np.array(target, copy=True)
        self._threshold = SPAN_TOLERANCE * float(np.linalg.norm(target))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def contains_target(self) -> bool:
        return bool(np.linalg.norm(self._residual) <= self._threshold)

    def add(self, vector: Array) -> None:
        v = vector.astype(self._basis.dtype, copy=True)
        norm0 = np.linalg.norm(v)
        if norm0 == 0 or self._rank == self._dim:
            return
        q = self._basis[: self._rank]
        for _ in range(2):
            v -= q.T @ (q.conj() @ v)
        norm = np.linalg.norm(v)
        if norm <= RANK_TOLERANCE * norm0:
            return
        v /= norm
        if self._rank == self._basis.shape[0]:
            grown = np.zeros((min(self._dim, 2 * self._rank), self._dim), dtype=self._basis.dtype)
            grown[: self._rank] = self._basis
            self._basis = grown
        self._basis[self._rank] = v
        self._rank += 1
        self._residual -= v * (v.conj() @ self._residual)


class SpanDecoder(OnlineDecoder):
    r"""Generic decoder: decodable once $\mathbf{1}$ lies in the span of the received rows.

    Each ``add`` is one :class:`SpanTracker` step, $O(k \cdot r)$; the weights then come from the one
    weight solver, :func:`~gradcode.common.codes.numerics.equilibrated_decoding_weights` (Tandon et
    al., Algorithm 1, evaluated for the one set that actually arrived).
    """

    def __init__(self, code: GradientCode, assignment: Assignment) -> None:
        super().__init__(code, assignment)
        self._span = SpanTracker(np.ones(code.k, dtype=code.B.dtype))

    @property
    def decodable(self) -> bool:
        return self._span.contains_target

    def _on_add(self, row: int) -> None:
        self._span.add(self.code.B[row])

    def _decoding(self) -> Decoding:
        rows = tuple(self._received)
        weights = equilibrated_decoding_weights(self.code.B[list(rows)], independent=False)
        return Decoding(rows, weights, exact=True)


MINIMISE_BY_DECODING_UP_TO = 4096
"""Up to this many members × workers, :meth:`GradientCode.decoding_set` of a code with
:attr:`GradientCode.cheap_decodes` minimises its greedy set by decoding again without each member, not by the
span's solves (:func:`~gradcode.common.codes.numerics.span_minimal_members`): those cost 0.2-1.4 ms at n = 6-32
where the decodes cost 0.01-0.8 ms, and as much as they at n = 64 (binary, about 2 ms); at n = 200, 3-10 ms against
9-33 ms (``python -m gradcode.bench.primaries``)."""


class GradientCode(ABC):
    """An immutable, validated gradient code over ``n`` workers and ``k`` data partitions.

    Subclasses build ``B`` in their constructor (via :meth:`_set_matrix`) and may override
    :meth:`decoder` with a faster, scheme-specific online decoder, :meth:`assign` for dynamic codes,
    and :meth:`static_assignment` for codes with several messages per worker.

    Attributes:
        n: number of workers.
        k: number of data partitions.
        s: number of stragglers every decodable arrival pattern tolerates (any ``n - s`` workers
            suffice).
    """

    name: ClassVar[str]
    """Registry name, used by configuration and the CLI."""
    exact: ClassVar[bool] = True
    """False for approximate schemes; their decodings are flagged approximate."""
    dynamic: ClassVar[bool] = False
    """True when the row each worker computes changes per iteration (:meth:`assign`)."""
    decode_cost: ClassVar[str] = "O(k·f) per message + O(f²k) solve"
    """Complexity class of the online decoder, for the scheme comparison table."""
    cheap_decodes: ClassVar[bool] = False
    """True when a fresh decoder and each of its steps cost O(1) (counters, groups, union–find, no span): small
    :meth:`decoding_set` calls then decode again rather than solve (:data:`MINIMISE_BY_DECODING_UP_TO`)."""

    _B: Array

    def __init__(self, n: int, k: int, s: int) -> None:
        self._n = check_int("n", n, 1)
        self._k = check_int("k", k, 1)
        self._s = check_int("s", s, 0, self._n - 1, why="a code over n workers tolerates at most n - 1 stragglers")

    # ---- parameters ----------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._n

    @property
    def k(self) -> int:
        return self._k

    @property
    def s(self) -> int:
        return self._s

    @property
    def B(self) -> Array:  # noqa: N802 - the papers' name
        """The encoding matrix, one row per message (read-only view)."""
        return self._B

    @property
    def partition_weights(self) -> Array:
        """Relative size of each data partition (sums to 1); uniform unless a scheme says otherwise.

        The data layer splits the samples in these proportions, so that schemes with unequal
        partitions (the binary code of Charalambides et al.) still decode the gradient of all data.
        """
        return np.full(self._k, 1.0 / self._k)

    @property
    def num_messages(self) -> int:
        return int(self._B.shape[0])

    @property
    def is_complex(self) -> bool:
        return bool(np.iscomplexobj(self._B))

    def _set_matrix(self, b: Array) -> None:
        b = np.array(b, copy=True)
        if b.ndim != 2 or b.shape[1] != self._k:
            raise ValueError(f"B must have shape (messages, k={self._k}), got {b.shape}.")
        b.setflags(write=False)
        self._B = b

    # ---- messages ------------------------------------------------------------------------------
    def _check_row(self, row: int) -> int:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < self.num_messages:
            raise KeyError(f"Message row {row!r} does not exist; rows are 0..{self.num_messages - 1}.")
        return int(row)

    def support(self, row: int) -> tuple[int, ...]:
        """Partitions whose partial gradients message ``row`` combines."""
        return tuple(int(j) for j in np.flatnonzero(self._B[self._check_row(row)]))

    def coefficients(self, row: int) -> Array:
        """Coefficients of message ``row`` over :meth:`support`, in the same order."""
        r = self._check_row(row)
        return self._B[r, list(self.support(r))]

    def encode(self, row: int, partials: Mapping[int, Array]) -> Array:
        """The message for ``row``: $\\sum_{j \\in supp} b_j g_j$ from the given partial gradients."""
        sup = self.support(row)
        missing = [j for j in sup if j not in partials]
        if missing:
            raise KeyError(f"Message {row} needs the partial gradients of partitions {missing}.")
        coeffs = self.coefficients(row)
        out: Array = np.multiply(
            partials[sup[0]], coeffs[0], dtype=np.result_type(partials[sup[0]].dtype, coeffs.dtype)
        )
        for j, c in zip(sup[1:], coeffs[1:], strict=True):
            out += c * partials[j]
        return out

    # ---- who computes what ---------------------------------------------------------------------
    def static_assignment(self) -> Assignment:
        """The fixed row-to-worker map; default: one message per worker, row ``i`` to worker ``i``."""
        return Assignment.one_row_per_worker(self._n)

    def assign(self, observation: Observation | None = None) -> Assignment:
        """This iteration's assignment; static codes ignore ``observation``."""
        return self.static_assignment()

    def partitions_of_worker(self, worker: int) -> tuple[int, ...]:
        """Every partition ``worker`` must store to compute any row it may be assigned."""
        w = check_int("worker", worker, 0, self._n - 1)
        rows = self.static_assignment().rows[w]
        return tuple(sorted({j for r in rows for j in self.support(r)}))

    def data_share(self, worker: int) -> float:
        """The fraction of the training data ``worker`` stores and computes on (its partitions' weights)."""
        return float(self.partition_weights[list(self.partitions_of_worker(worker))].sum())

    def rows_for_worker(self, worker: int) -> tuple[int, ...]:
        """Every row ``worker`` can be asked for: its static rows, or (dynamic codes) every row its stored
        partitions cover."""
        w = check_int("worker", worker, 0, self._n - 1)
        if not self.dynamic:
            return self.static_assignment().rows[w]
        held = set(self.partitions_of_worker(w))
        return tuple(r for r in range(self.num_messages) if set(self.support(r)) <= held)

    # ---- what the master needs -----------------------------------------------------------------
    @classmethod
    def implied_size(cls, params: Mapping[str, object]) -> CodeSize:
        """Worker processes and partitions ``params`` imply, before building (default: ``n`` workers)."""
        return CodeSize(workers=size_parameter(params, "n"))

    def topology(self) -> Topology | None:
        """The worker layout when not every worker answers the master (a tree); None for flat codes."""
        return None

    def worker_processes(self) -> int:
        """How many worker processes the code runs on: its ``n``, or every node of its tree."""
        topology = self.topology()
        return self.n if topology is None else topology.num_workers

    # ---- decoding ------------------------------------------------------------------------------
    def decoder(self, assignment: Assignment | None = None) -> OnlineDecoder:
        """A fresh online decoder for one iteration under ``assignment`` (default: static)."""
        return SpanDecoder(self, assignment or self.static_assignment())

    def decode(self, rows: Sequence[int], assignment: Assignment | None = None) -> Decoding:
        """Convenience: feed ``rows`` to a fresh decoder and return its decoding (or raise)."""
        dec = self.decoder(assignment)
        for r in rows:
            dec.add(r)
        return dec.decoding()

    def decodes(self, workers: Iterable[int], assignment: Assignment) -> bool:
        """Whether the rows ``workers`` compute under ``assignment`` decode."""
        dec = self.decoder(assignment)
        return any(dec.add(r) for r in assignment.rows_of(workers))

    def decoding_set(
        self, assignment: Assignment, preference: Sequence[int], *, given: Sequence[int] = ()
    ) -> tuple[int, ...] | None:
        """A minimal set of the ``preference`` workers whose rows, with those of the ``given`` workers (messages in
        hand), decode, favouring the earlier ones, in ``preference`` order; None when all of them together do not
        decode.

        Greedy: workers join in ``preference`` order until the rows decode, then each member, the latest first,
        is left out when the others still decode. No member can go (minimal); a smaller set may exist. An exact
        code asks "still decode" of the span (:func:`~gradcode.common.codes.numerics.span_minimal_members`: a solve
        per block of rows, the result checked by its decoder), since a decode without each member costs O(members²)
        decoder steps (4-52 s at n = 2000); an approximate code, and a small set of a code with
        :attr:`cheap_decodes`, decode again. The
        master asks the workers outside it as backups, and asks a set completing the messages in hand when an
        expected worker is late (:class:`gradcode.common.gather.primaries.Primaries`, :meth:`Round.gather`).
        """
        chosen = self._greedy_prefix(assignment, preference, given)
        if not chosen:  # ([]: the given workers decode; None: all of them together do not)
            return None if chosen is None else ()
        cheap = self.cheap_decodes and len(chosen) * (len(given) + len(chosen)) <= MINIMISE_BY_DECODING_UP_TO
        if self.exact and not cheap:
            # decodable means 1 in the span: a solve per block of rows instead of a decode per member
            kept = span_minimal_members(self.B, [assignment.rows[w] for w in chosen], assignment.rows_of(given))
            smaller = None if kept is None else [chosen[i] for i in kept]
            if smaller is not None and (smaller == chosen or self.decodes([*given, *smaller], assignment)):
                return tuple(smaller)
        return tuple(self._minimal_by_decoding(assignment, chosen, given))

    def _greedy_prefix(
        self, assignment: Assignment, preference: Sequence[int], given: Sequence[int]
    ) -> list[int] | None:
        """The workers of ``preference`` up to the one whose rows, with those of ``given`` and the earlier ones, make
        the rows decode: what :meth:`decoding_set` minimises ([] when ``given`` decodes alone, None when nobody
        does)."""
        dec = self.decoder(assignment)
        if any(dec.add(r) for r in assignment.rows_of(given)):
            return []
        chosen: list[int] = []
        for w in preference:
            chosen.append(w)
            if any(dec.add(r) for r in assignment.rows[w]):
                return chosen
        return None

    def _minimal_by_decoding(self, assignment: Assignment, chosen: list[int], given: Sequence[int]) -> list[int]:
        """``chosen`` without each member, the latest first, whose absence the others still decode: one decode per
        member (the last one made the set decodable: it stays). What :meth:`decoding_set` falls back on where the
        decoder's rule is not the span (approximate codes) or the span's answer does not decode."""
        for w in reversed(chosen[:-1]):
            rest = [v for v in chosen if v != w]
            if self.decodes([*given, *rest], assignment):
                chosen = rest
        return chosen

    @classmethod
    def for_stragglers(cls, n: int, s: int) -> GradientCode:
        """This scheme's canonical configuration tolerating ``s`` stragglers among ``n`` workers.

        Raises ``ValueError`` saying why when the scheme has no such configuration (e.g. fractional
        repetition needs ``(s + 1) | n``). Used by the scheme comparison table and the numerics report.
        """
        return cls(n=n, s=s)  # type: ignore[call-arg]

    @classmethod
    def small_configs(cls, max_n: int) -> Iterator[dict[str, Any]]:
        """Every valid parameter set with at most ``max_n`` workers (keyword arguments of the class).

        The contract test suite decodes every arrival set of each of them; the scheme table and the
        numerical-limits report draw their examples from it too.
        """
        raise NotImplementedError(f"{cls.__name__} does not list its small configurations.")

    # ---- presentation --------------------------------------------------------------------------
    def _params(self) -> dict[str, object]:
        return {"n": self._n, "k": self._k, "s": self._s}

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self._params().items())
        return f"<{type(self).__name__}({args})>"
