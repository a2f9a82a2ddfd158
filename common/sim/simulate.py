r"""Discrete-event simulation of a gradcode job, driven by the code objects the master and tree parents run.

Nothing here re-implements a code: every iteration asks the scheme for its :class:`Assignment` (dynamic schemes
such as GC-DC get an :class:`Observation` of the last iteration, as the master gives them), feeds the scheme's own
:class:`OnlineDecoder` the message rows *in arrival order* and stops at the first moment it says decodable. Trees
(a code with a :meth:`GradientCode.topology`, CodedReduce with ``L > 1``) run the same round at every parent with
the topology's child code. Straggler delays are the live system's :class:`~gradcode.common.sim.stragglers.DelayModel`
objects, called with the same ``(worker_id, iteration)`` as the workers call them, so a simulation with a job's
seed sees exactly the delays that job's workers sleep.

The time model of one iteration (all times in seconds from its start):

* **model down** (``Costs.broadcast``): each parent (the master first) sends the model to its ``c`` children at
  once, the transfers sharing its link fairly: every child holds it ``max(c b / B_parent, b / B_child)`` after
  its parent, with ``b`` the message bytes and ``B`` the link bandwidths.
* **compute**: ``delay + (share * compute_seconds + worker_seconds) / speed``, where ``share`` is the fraction
  of the data set the worker's rows cover (:meth:`GradientCode.data_share`, a tree node's own partitions),
  ``compute_seconds`` is one worker computing the gradient of the whole data set and ``worker_seconds`` what a
  worker spends whatever its share. A worker sending several rows (the two-stage partial
  straggler scheme) has its ``m``-th row ready once the partitions of rows ``0..m`` are computed.
* **up**: each worker's messages leave one after another on its own link (``b / B_worker`` each); at the
  receiver they queue first come first served on its link, each taking ``b / B_receiver + overhead`` (the
  single-port receiver of Tandon et al. §5 and Reisizadeh et al. Theorem 2; a fair-sharing link would deliver
  the first of many concurrent messages later, the last at the same moment). With
  ``e_i`` the earliest moment message ``i`` could be through (sorted), the ``i``-th is through at
  ``d_i = max(e_i, d_{i-1} + c) = i c + \max_{j \le i}(e_j - j c)`` — one vectorised cumulative maximum.
* **decode**: the receiver's online decoder is fed the rows in the order of ``d``; the iteration (or a parent's
  sub-round) ends ``decode_seconds`` after the row that made it decodable. A tree parent's own message is ready
  at the later of that and its own computation (Reisizadeh et al., §III-A.4).

Bytes through the master per iteration: the model to each of its children plus every message it received up to
the decodable moment (later ones are cancelled by the live master).

Speed: the per-message work is the decoder's ``add`` (scheme-specific decoders are O(1)..O(ℓ²) per row; the
generic span decoder O(k·r)); delays cost one seeded draw per worker and iteration (~15 µs). ``n = 2000`` flat
(binary, fractional, clustered, uncoded) runs an iteration in milliseconds; every online decoder was fast enough,
so no prefix bisection was needed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import Array, Assignment, GradientCode, Observation
from gradcode.common.codes.registry import make_code
from gradcode.common.codes.topology import Topology
from gradcode.common.gather.primaries import Primaries
from gradcode.common.sim.stragglers import DelayModel, NoDelay
from gradcode.common.validation import check_int, check_number

__all__ = [
    "PRIMARIES_MAX_WORKERS",
    "Costs",
    "IterationOutcome",
    "ObservationPolicy",
    "SimulationResult",
    "simulate",
    "straggler_observation",
]


@dataclass(frozen=True)
class Costs:
    """What one iteration costs apart from the code: calibrate from a job's history or ``gradcode bench cluster``.

    ``compute_seconds``: one worker computing the gradient of the whole data set (a worker holding a share ``x``
    of it takes ``x * compute_seconds / speed``). ``message_bytes``: one gradient message (and the model sent
    down). ``worker_bandwidth`` / ``master_bandwidth``: bytes per second of a worker's and the master's link
    (each direction; ``inf``: free). ``message_overhead``: seconds the receiver spends per message besides its
    bytes (decoder, framing). ``decode_seconds``: from the decodable moment to the end of the iteration.
    ``worker_speed``: relative compute speed per worker index (empty: all 1). ``broadcast``: whether the model
    goes down the links at the start of each iteration. ``worker_seconds``: what every worker spends per
    iteration whatever its share (decoding the model, encoding its messages), divided by its speed.
    ``parent_decode_seconds``: a tree parent's ``decode_seconds`` (None: the same), from its decodable moment
    to its message ready to go up (decode, combine, encode); a parent runs on a worker host, often with less CPU
    than the master's.
    """

    compute_seconds: float = 0.0
    message_bytes: float = 0.0
    worker_bandwidth: float = math.inf
    master_bandwidth: float = math.inf
    message_overhead: float = 0.0
    decode_seconds: float = 0.0
    worker_speed: tuple[float, ...] = ()
    broadcast: bool = True
    worker_seconds: float = 0.0
    parent_decode_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("compute_seconds", "message_bytes", "message_overhead", "decode_seconds", "worker_seconds"):
            check_number(name, getattr(self, name))
        if self.parent_decode_seconds is not None:
            check_number("parent_decode_seconds", self.parent_decode_seconds)
        for name in ("worker_bandwidth", "master_bandwidth"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
                raise ValueError(
                    f"Argument {name!r} must be a positive number of bytes per second (inf: free), not {value!r}."
                )
        speeds = tuple(float(v) for v in self.worker_speed)
        for v in speeds:
            check_number("worker_speed[i]", v, strict=True)
        object.__setattr__(self, "worker_speed", speeds)

    def speed(self, worker: int) -> float:
        """Relative compute speed of ``worker`` (1 when not given)."""
        return self.worker_speed[worker] if worker < len(self.worker_speed) else 1.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Costs:
        """From a JSON object with these field names; unknown names are refused, listing the valid ones."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ValueError(f"Unknown cost field(s) {unknown}; valid fields are {valid}.")
        given = dict(values)
        for name in ("worker_bandwidth", "master_bandwidth"):
            if given.get(name) is None or given.get(name) == "inf":
                given.pop(name, None)
        if "worker_speed" in given:
            given["worker_speed"] = tuple(given["worker_speed"])
        return cls(**given)

    @classmethod
    def from_json(cls, path: Path) -> Costs:
        """Read a calibration file: ``{"compute_seconds": 0.02, "message_bytes": 800000, ...}``."""
        values = json.loads(Path(path).read_text())
        if not isinstance(values, dict):
            raise ValueError(f"Calibration file {path} must hold a JSON object of cost fields.")
        return cls.from_mapping(values)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("worker_bandwidth", "master_bandwidth"):
            if math.isinf(out[name]):
                out[name] = None
        out["worker_speed"] = list(self.worker_speed)
        return out


@dataclass(frozen=True)
class IterationOutcome:
    """One simulated iteration: its time, the workers whose rows the decode used, those not heard by then."""

    iteration: int
    seconds: float
    used: tuple[int, ...]
    late: tuple[int, ...]
    master_bytes: float


ObservationPolicy = Callable[[int, "IterationOutcome | None"], "Observation | None"]
"""What a dynamic code is told before iteration ``t``, from the previous outcome (None before the first)."""


def straggler_observation(n: int) -> ObservationPolicy:
    """The master's own rule: a worker not used in the last decode (late, or down) counts as straggling."""

    def observe(iteration: int, last: IterationOutcome | None) -> Observation | None:
        if last is None:
            return None
        late = set(last.late)
        return Observation(straggling=tuple(w in late for w in range(n)))

    return observe


@dataclass
class SimulationResult:
    """Per-iteration times and bytes through the master of one simulated job."""

    seconds: Array
    master_bytes: Array
    outcomes: list[IterationOutcome] = field(repr=False)

    @property
    def iterations(self) -> int:
        return int(self.seconds.shape[0])

    def summary(self) -> dict[str, float]:
        """Median, p10, p90 and mean seconds per iteration, total seconds, mean bytes through the master."""
        t = self.seconds
        return {
            "iterations": float(self.iterations),
            "median_seconds": float(np.median(t)),
            "p10_seconds": float(np.percentile(t, 10)),
            "p90_seconds": float(np.percentile(t, 90)),
            "mean_seconds": float(np.mean(t)),
            "total_seconds": float(np.sum(t)),
            "master_bytes_per_iteration": float(np.mean(self.master_bytes)),
        }


PRIMARIES_MAX_WORKERS = 4096
"""Largest n for which the simulated round picks primaries. ``GradientCode.decoding_set`` is found again whenever a
member of the set is late, which under exponential delays is most iterations: an iteration then takes 14-35 ms at
n = 512 and 80-150 ms at n = 2000 (binary, fractional, clustered, s = 1; 7-20 and 34-82 ms asking every worker
alike). (Before its minimisation solved by the span, it took 4 s for uncoded and 52 s for clustered at n = 2000,
and the simulated round asked every worker alike above 128.)"""


def _through(earliest: Array, service: float) -> Array:
    """FIFO receiver: message ``i`` (``earliest`` sorted ascending) is through at ``max(e_i, d_{i-1} + c)``."""
    steps = np.arange(earliest.shape[0], dtype=float) * service
    through: Array = np.maximum.accumulate(earliest - steps) + steps
    return through


def _down(parent_has: float, children: int, costs: Costs, parent_bandwidth: float) -> Array:
    """When each of ``children`` holds the model its parent starts sending at ``parent_has``: the concurrent
    transfers share the parent's link fairly (one TCP connection per child), so all finish together, no earlier
    than one child's own link allows."""
    if not costs.broadcast or children == 0:
        return np.full(children, parent_has)
    b = costs.message_bytes
    return np.full(children, parent_has + max(children * b / parent_bandwidth, b / costs.worker_bandwidth))


class _Round:
    """One receiver's gather-and-decode: rows reach it at given moments; its code's decoder says when it is done."""

    def __init__(
        self, code: GradientCode, costs: Costs, receiver_bandwidth: float, *, report_used: bool = True
    ) -> None:
        self.code = code
        self.report_used = report_used  # a tree parent's caller needs only the moment: skip the weight solve
        self.costs = costs
        self.receive = costs.message_bytes / receiver_bandwidth
        self.service = self.receive + costs.message_overhead
        self.upload = costs.message_bytes / costs.worker_bandwidth

    def run(
        self, assignment: Assignment, ready: Mapping[int, Sequence[float]], expected: frozenset[int] = frozenset()
    ) -> tuple[float, tuple[int, ...], int, frozenset[int]]:
        """``ready[w][m]``: when worker ``w``'s ``m``-th row is computed (missing worker: never answers).

        ``expected``: the round's primaries (empty: all alike); a backup's message ready at the same moment as an
        expected one crosses the link after it. Returns the decodable moment (``inf`` if the rows never decode),
        the workers whose rows the decoding uses, how many messages were through by then and from whom."""
        rows: list[int] = []
        senders: list[int] = []
        earliest: list[float] = []
        backup: list[bool] = []
        for w, times in ready.items():
            sent = -math.inf
            for row, t in zip(assignment.rows[w], times, strict=True):
                sent = max(t, sent) + self.upload  # the worker's own link sends its rows one after another
                rows.append(row)  # pipelined: through no earlier than either link allows, then processed
                backup.append(bool(expected) and w not in expected)
                senders.append(w)
                earliest.append(max(sent, t + self.receive) + self.costs.message_overhead)
        if not rows:
            return math.inf, (), 0, frozenset()
        e = np.asarray(earliest)
        order = np.lexsort((np.asarray(backup), e))  # at a tie the expected workers' messages go first
        through = _through(e[order], self.service)
        decoder = self.code.decoder(assignment)
        for position, index in enumerate(order):
            if decoder.add(rows[int(index)]):
                owner = assignment.owner
                used = tuple(sorted({owner[r] for r in decoder.decoding().rows})) if self.report_used else ()
                arrived = frozenset(senders[int(i)] for i in order[: position + 1])
                return float(through[position]) + self.costs.decode_seconds, used, position + 1, arrived
        return math.inf, (), len(rows), frozenset(senders)


def _row_shares(code: GradientCode, weights: Array, assignment: Assignment, w: int) -> list[float]:
    """Cumulative data share computed once each of worker ``w``'s rows is ready (rows in sending order);
    ``weights`` is ``code.partition_weights`` (some schemes compute it on every access)."""
    held: set[int] = set()
    shares: list[float] = []
    for row in assignment.rows[w]:
        held.update(code.support(row))
        shares.append(float(weights[sorted(held)].sum()))
    return shares


def simulate(
    code: GradientCode,
    costs: Costs,
    iterations: int,
    delays: DelayModel | None = None,
    *,
    observe: ObservationPolicy | None = None,
    first_iteration: int = 0,
    primaries: bool = True,
) -> SimulationResult:
    """Simulate ``iterations`` synchronous iterations of ``code`` under ``costs`` and ``delays`` (None: no delay).

    ``observe`` tells a dynamic code what it saw before each iteration (default: :func:`straggler_observation`,
    the master's rule); static codes ignore it. Iterations are numbered from ``first_iteration`` (the delay
    models' ``iteration`` argument). ``primaries``: a static flat code's round expects the minimal decoding set the
    master would (:class:`~gradcode.common.gather.primaries.Primaries`: kept while its members' messages arrive
    before the decode, found again otherwise) and its
    messages cross the link before backups ready at the same moment (the live backups compute at the lowest
    priority); a set of ``n - s`` or more is no set. Above :data:`PRIMARIES_MAX_WORKERS` workers every worker is
    asked alike.

    An iteration that can never decode (every worker's rows together do not)
    raises ``ValueError``.
    """
    iterations = check_int("iterations", iterations, 1)
    first_iteration = check_int("first_iteration", first_iteration, 0)
    delays = delays if delays is not None else NoDelay()
    topology = code.topology()
    if topology is not None:
        return _simulate_tree(code, topology, costs, iterations, delays, first_iteration)
    observe = observe if observe is not None else straggler_observation(code.n)
    receiver = _Round(code, costs, costs.master_bandwidth)
    static = None if code.dynamic else code.static_assignment()
    shares_cache: dict[int, list[float]] = {}
    weights = code.partition_weights
    outcomes: list[IterationOutcome] = []
    last: IterationOutcome | None = None
    chooser = Primaries(code) if primaries and static is not None and code.n <= PRIMARIES_MAX_WORKERS else None
    expected: frozenset[int] = frozenset()
    for t in range(first_iteration, first_iteration + iterations):
        assignment = static if static is not None else code.assign(observe(t, last))
        has_model = _down(0.0, code.n, costs, costs.master_bandwidth)
        ready: dict[int, list[float]] = {}
        for w in range(code.n):
            if not assignment.rows[w]:
                continue
            shares = shares_cache.get(w) if static is not None else None
            if shares is None:
                shares = _row_shares(code, weights, assignment, w)
                if static is not None:
                    shares_cache[w] = shares
            start = float(has_model[w]) + delays.delay(w, t) + costs.worker_seconds / costs.speed(w)
            per_share = costs.compute_seconds / costs.speed(w)
            ready[w] = [start + share * per_share for share in shares]
        if chooser is not None and static is not None:
            chosen = chooser.choose(static, range(code.n))
            expected = frozenset() if len(chosen) == code.n else chosen  # every worker: all asked alike
        seconds, used, received, arrived = receiver.run(assignment, ready, expected)
        if math.isinf(seconds):
            raise ValueError(f"{code!r}: the rows of all its workers do not decode in iteration {t}.")
        if chooser is not None:
            chooser.answered(arrived, seconds)
        master_bytes = costs.message_bytes * ((code.n if costs.broadcast else 0) + received)
        used_set = set(used)
        late = tuple(w for w in range(code.n) if w not in used_set)
        last = IterationOutcome(t, seconds, used, late, master_bytes)
        outcomes.append(last)
    return _result(outcomes)


def _result(outcomes: list[IterationOutcome]) -> SimulationResult:
    return SimulationResult(
        seconds=np.array([o.seconds for o in outcomes]),
        master_bytes=np.array([o.master_bytes for o in outcomes]),
        outcomes=outcomes,
    )


def _simulate_tree(
    code: GradientCode, topology: Topology, costs: Costs, iterations: int, delays: DelayModel, first: int
) -> SimulationResult:
    """Every parent runs the round of :class:`_Round` over its children with the topology's child code, bottom up;
    the master runs it over the first layer with ``code`` itself (Reisizadeh et al., CR.Execute)."""
    child_ref = topology.child_code
    child_code = make_code(child_ref.name, **child_ref.params)
    total = topology.num_workers
    parent_of = topology.parent_of()
    children = [topology.children(w) for w in range(total)]
    rows = [topology.row(w) for w in range(total)]
    weights = code.partition_weights
    share = [float(weights[list(rows[w].partitions)].sum()) for w in range(total)]
    top = [w for w in range(total) if parent_of[w] == -1]
    depth = [0] * total
    for w in range(total):  # parents come before their children (breadth first)
        depth[w] = 0 if parent_of[w] == -1 else depth[parent_of[w]] + 1
    deepest_first = sorted((w for w in range(total) if children[w]), key=lambda w: -depth[w])
    master_round = _Round(code, costs, costs.master_bandwidth)
    at_parents = (
        costs if costs.parent_decode_seconds is None else replace(costs, decode_seconds=costs.parent_decode_seconds)
    )
    parent_round = _Round(child_code, at_parents, costs.worker_bandwidth, report_used=False)
    top_assignment = Assignment(tuple((rows[w].row,) for w in top))
    outcomes: list[IterationOutcome] = []
    for t in range(first, first + iterations):
        has_model = np.zeros(total)
        has_model[top] = _down(0.0, len(top), costs, costs.master_bandwidth)
        for w in range(total):
            if children[w]:
                has_model[children[w]] = _down(float(has_model[w]), len(children[w]), costs, costs.worker_bandwidth)
        computed = [
            float(has_model[w])
            + delays.delay(w, t)
            + (share[w] * costs.compute_seconds + costs.worker_seconds) / costs.speed(w)
            for w in range(total)
        ]
        ready = list(computed)
        for w in deepest_first:
            kids = children[w]
            assignment = Assignment(tuple((rows[c].row,) for c in kids))
            done, _, _, _ = parent_round.run(assignment, {i: [ready[c]] for i, c in enumerate(kids)})
            ready[w] = max(done, computed[w])
        seconds, used_slots, received, _ = master_round.run(top_assignment, {i: [ready[w]] for i, w in enumerate(top)})
        if math.isinf(seconds):
            raise ValueError(f"{code!r}: the tree does not decode in iteration {t}.")
        used = tuple(top[i] for i in used_slots)
        late = tuple(w for w in top if w not in set(used))
        master_bytes = costs.message_bytes * ((len(top) if costs.broadcast else 0) + received)
        outcomes.append(IterationOutcome(t, seconds, used, late, master_bytes))
    return _result(outcomes)
