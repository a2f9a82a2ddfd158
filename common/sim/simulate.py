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
  once. Shared fairly, the transfers would all end ``c b / B_parent`` after the parent has the model (``b`` the
  message bytes, ``B`` the link bandwidths); through a first-come-first-served queue one after another, the
  ``k``-th at ``k b / B_parent``. A real link lies between: ``Costs.broadcast_spread`` (``σ``, 0 fair, 1 one
  after another: gradcode's links, which send large models in turn; ``gradcode bench cluster`` measures plain TCP
  for the relayed fetches, ``Costs.relay_spread``) puts the ``k``-th child's model in at
  ``c b / B_parent · (1 - σ + σ k / c)``, no earlier than ``b / B_child``, children taking turns in worker order.
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
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import Array, Assignment, GradientCode, Observation
from gradcode.common.codes.registry import make_code
from gradcode.common.codes.topology import Topology
from gradcode.common.gather.delivery import relay_peers
from gradcode.common.gather.primaries import HOLD_OVERDUE_FACTOR, Primaries, start_overdue
from gradcode.common.sim.stragglers import DelayModel, NoDelay
from gradcode.common.transport.egress import LARGE_FRAME_BYTES
from gradcode.common.validation import check_int, check_number

__all__ = [
    "MODEL_DELIVERIES",
    "PRIMARIES_MAX_WORKERS",
    "SURPLUS_MODES",
    "Costs",
    "IterationOutcome",
    "ObservationPolicy",
    "SimulationResult",
    "broadcast_spread",
    "simulate",
    "straggler_observation",
]


def _check_spread(name: str, spread: object) -> None:
    if isinstance(spread, bool) or not (isinstance(spread, (int, float)) and 0 <= spread <= 1):
        raise ValueError(
            f"Argument {name!r} must be a number from 0 (transfers sharing a link fairly end together) "
            f"to 1 (they end one after another), not {spread!r}."
        )


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
    than the master's. ``broadcast_spread``: how the models sent at once end, from 0 (all together: a fairly
    shared link) to 1 (one after another: a first-come-first-served one); None (the default): as gradcode's links
    send them, in turn from :data:`~gradcode.common.transport.egress.LARGE_FRAME_BYTES` up (1), sharing the link
    below (0) (:attr:`down_spread`). ``relay_spread``: the same for the relayed fetches a peer serves at once (over
    gRPC, not in turn; None: as the models sent down). ``relay_hop_seconds``: what a relayed model's
    fetch costs besides its bytes (the peer serving it, the fetcher checking its digest).
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
    broadcast_spread: float | None = None
    relay_spread: float | None = None
    relay_hop_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("broadcast_spread", "relay_spread"):
            if getattr(self, name) is not None:
                _check_spread(name, getattr(self, name))
        for name in (
            "compute_seconds", "message_bytes", "message_overhead", "decode_seconds", "worker_seconds",
            "relay_hop_seconds",
        ):  # fmt: skip
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

    @property
    def models_take_turns(self) -> bool:
        """Whether gradcode's links send these models one at a time: a frame of
        :data:`~gradcode.common.transport.egress.LARGE_FRAME_BYTES` or more waits for its turn."""
        return self.message_bytes >= LARGE_FRAME_BYTES

    @property
    def down_spread(self) -> float:
        """The ``broadcast_spread`` the models sent down take: the given one, else gradcode's links' (in turn: 1,
        :attr:`models_take_turns`; else sharing the link: 0)."""
        if self.broadcast_spread is not None:
            return self.broadcast_spread
        return 1.0 if self.models_take_turns else 0.0

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


SURPLUS_MODES = ("push", "hold")
"""What a backup does with its messages (``JobSpec.surplus`` on hosts of their own: ``auto`` holds there)."""

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


def broadcast_spread(ends: Sequence[float]) -> float:
    """The ``Costs.broadcast_spread`` of transfers started at once that ended at ``ends`` (seconds from their start):
    with ``T`` the last end, the model's ``k``-th of ``c`` ends at ``T (1 - σ + σ k / c)``, so their mean is
    ``T (1 - σ (c - 1) / 2c)``; ``σ`` from the measured mean, within [0, 1]."""
    c = len(ends)
    if c < 2:
        raise ValueError(f"A spread needs the ends of at least 2 transfers, not {c}.")
    last = max(ends)
    if not (last > 0 and all(math.isfinite(e) for e in ends)):
        raise ValueError(f"Transfer ends must be finite and the last after their start, not {list(ends)!r}.")
    spread = (1 - statistics.fmean(ends) / last) * 2 * c / (c - 1)
    return min(max(spread, 0.0), 1.0)


def _down(
    parent_has: float, children: int, costs: Costs, parent_bandwidth: float, spread: float | None = None
) -> Array:
    """When each of ``children`` holds the model its parent starts sending at ``parent_has``: the concurrent
    transfers (one TCP connection per child) end between all together and one after another (``spread``; default
    :attr:`Costs.down_spread`), none earlier than one child's own link allows."""
    if not costs.broadcast or children == 0:
        return np.full(children, parent_has)
    b = costs.message_bytes
    spread = costs.down_spread if spread is None else spread
    turns = np.arange(1, children + 1) / children
    ends: Array = parent_has + np.maximum(
        children * b / parent_bandwidth * (1 - spread + spread * turns), b / costs.worker_bandwidth
    )
    return ends


MODEL_DELIVERIES = ("direct", "relay")
"""How the model reaches the workers a receiver asks (``JobSpec.model_delivery``; the master's ``auto`` relays a flat
code's model to three or more workers over the network, never a tree's)."""


class _Delivery:
    """When each worker a receiver asks holds the iteration's model: sent to each at once (``direct``), or to the
    first of the relay order, the others fetching it from a peer (``relay``: :func:`relay_peers`, each peer serving
    its fetchers at once over its own link, each fetch ``Costs.relay_hop_seconds`` besides its bytes). The relay
    order is the live master's (:class:`~gradcode.master.rounds.RelayOrder`): the workers whose messages came
    through in the last round first, fastest first, then the others."""

    def __init__(self, mode: str, costs: Costs, bandwidth: float, *, expected_first: bool = True) -> None:
        if mode not in MODEL_DELIVERIES:
            raise ValueError(f"Argument 'model_delivery' must be one of {', '.join(MODEL_DELIVERIES)}, not {mode!r}.")
        self.relay = mode == "relay"
        self.costs = costs
        self.bandwidth = bandwidth
        self.expected_first = expected_first
        """Direct, the expected workers' models go first (the live master's order); False: worker order."""
        self._answered: tuple[int, ...] = ()
        self._busy = 0.0
        """How far into this iteration the sender's link still carries the last one's models: a round that decoded
        before its last model left (the backups' models, sent last) hands the rest to the next."""
        self._last_sent = 0.0

    def holds(self, workers: Sequence[int], first: Collection[int] = ()) -> dict[int, float]:
        """When each of ``workers`` holds the model its sender starts sending once its link is done with the last
        iteration's; sent to each, those in ``first`` (the workers the round expects) before the others, as the live
        master asks them."""
        start = self._busy
        if not self.relay or len(workers) < 2:
            order = sorted(workers, key=lambda w: self.expected_first and w not in first)
            ends = _down(start, len(order), self.costs, self.bandwidth)
            self._last_sent = float(ends.max()) if len(order) else start
            return dict(zip(order, ends.tolist(), strict=True))
        asked = set(workers)  # relayed: the last round's answerers first (the relay's order, not ``first``)
        came = [w for w in self._answered if w in asked]
        answered = set(came)
        order = came + [w for w in workers if w not in answered]
        peers = relay_peers(order)
        holds = {order[0]: float(_down(start, 1, self.costs, self.bandwidth)[0])}
        self._last_sent = holds[order[0]]
        fetchers: dict[int, list[int]] = {}
        for w in order[1:]:
            fetchers.setdefault(peers[w], []).append(w)
        for peer in order:  # a peer comes before its fetchers in the order
            kids = fetchers.get(peer, [])
            ends = _down(holds[peer], len(kids), self.costs, self.costs.worker_bandwidth, self.costs.relay_spread)
            holds.update({w: float(end) + self.costs.relay_hop_seconds for w, end in zip(kids, ends, strict=True)})
        return holds

    def models_sent(self, workers: int) -> int:
        """Models through the sender's link per iteration."""
        return min(workers, 1) if self.relay else workers

    def answered(self, arrived: Sequence[int], seconds: float) -> None:
        """The workers whose messages came through in the round just decoded (in ``seconds``), in order."""
        self._answered = tuple(arrived)
        self._busy = max(0.0, self._last_sent - seconds)


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

    def _timeline(
        self,
        assignment: Assignment,
        ready: Mapping[int, Sequence[float]],
        expected: frozenset[int],
        sendable: Mapping[int, float],
    ) -> tuple[list[int], list[int], Array]:
        """Every message's row and sender in the order they cross the receiver's link, and when each is through (a
        worker in ``sendable`` sends nothing before that moment: a held backup, pulled then or never; at a tie the
        expected workers' messages go first)."""
        rows: list[int] = []
        senders: list[int] = []
        earliest: list[float] = []
        backup: list[bool] = []
        for w, times in ready.items():
            held_until = sendable.get(w, -math.inf)
            if held_until == math.inf:
                continue
            sent = -math.inf
            for row, ready_at in zip(assignment.rows[w], times, strict=True):
                t = max(ready_at, held_until)
                sent = max(t, sent) + self.upload  # the worker's own link sends its rows one after another
                rows.append(row)  # pipelined: through no earlier than either link allows, then processed
                backup.append(bool(expected) and w not in expected)
                senders.append(w)
                earliest.append(max(sent, t + self.receive) + self.costs.message_overhead)
        e = np.asarray(earliest)
        order = np.lexsort((np.asarray(backup), e)).tolist()
        return [rows[i] for i in order], [senders[i] for i in order], _through(e[order], self.service)

    def ends(self, assignment: Assignment, ready: Mapping[int, Sequence[float]]) -> dict[int, float]:
        """When each worker's last message is through, if the workers of ``ready`` alone send."""
        _, senders, through = self._timeline(assignment, ready, frozenset(), {})
        return dict(zip(senders, through.tolist(), strict=True))

    def run(
        self,
        assignment: Assignment,
        ready: Mapping[int, Sequence[float]],
        expected: frozenset[int] = frozenset(),
        sendable: Mapping[int, float] | None = None,
    ) -> tuple[float, tuple[int, ...], int, tuple[int, ...]]:
        """``ready[w][m]``: when worker ``w``'s ``m``-th row is computed (missing worker: never answers).

        ``expected``: the round's primaries (empty: all alike); a backup's message ready at the same moment as an
        expected one crosses the link after it. ``sendable``: held backups' pull moments (:func:`_held_pulls`).
        Returns the decodable moment (``inf`` if the rows never decode), the workers whose rows the decoding uses,
        how many messages were through by then and from whom (in the order they came through)."""
        rows, senders, through = self._timeline(assignment, ready, expected, sendable or {})
        if not rows:
            return math.inf, (), 0, ()
        decoder = self.code.decoder(assignment)
        for position, row in enumerate(rows):
            if decoder.add(row):
                owner = assignment.owner
                used = tuple(sorted({owner[r] for r in decoder.decoding().rows})) if self.report_used else ()
                arrived = tuple(dict.fromkeys(senders[: position + 1]))
                return float(through[position]) + self.costs.decode_seconds, used, position + 1, arrived
        return math.inf, (), len(rows), tuple(dict.fromkeys(senders))


def _held_pulls(
    receiver: _Round,
    assignment: Assignment,
    ready: Mapping[int, Sequence[float]],
    expected: frozenset[int],
    began: Mapping[int, float],
    slack: float,
) -> dict[int, float]:
    """When each held backup may send (``inf``: never), by the master's rules for held backups
    (:class:`~gradcode.master.hedging.Hedging` with a ``start_slack``), the first that applies:

    * every expected worker but 1..s begun and those not by :func:`start_overdue` of the others' beginnings with
      ``slack`` (:meth:`~gradcode.common.gather.primaries.Primaries.start_slack`), or none begun and
      :data:`HOLD_OVERDUE_FACTOR` times the latest held backup's beginning passed (``start_overdue_at``): the
      backups completing the expected workers that have begun are pulled;
    * 1..s expected workers out :data:`HOLD_OVERDUE_FACTOR` times the time to the latest that finished, and a
      backup ready (``pull_at``): the backups completing the finished ones, the ready ones first.

    ``began``: when each worker's computation begins (its model in, its emulated delay over), which it reports.
    The expected workers' messages are timed as if they alone crossed the link."""
    code = receiver.code
    s = code.s
    backups = sorted(w for w in ready if w not in expected)
    never = dict.fromkeys(backups, math.inf)
    if not backups:
        return never
    ends = receiver.ends(assignment, {w: ready[w] for w in expected})
    done = {w: max(times) for w, times in ready.items()}

    def waiting(t: float) -> set[int]:
        return {w for w in expected if began[w] > t and ends.get(w, math.inf) > t}

    covers = []
    by_beginning = sorted(began[w] for w in expected)
    for k in range(max(len(expected) - s, 1), len(expected)):
        t = start_overdue(by_beginning[:k], slack)
        if t < by_beginning[k]:
            covers.append(t)
    if len(expected) <= s and (t := HOLD_OVERDUE_FACTOR * max(began[w] for w in backups)) < by_beginning[0]:
        covers.append(t)
    finished = sorted(ends.values())
    pull = math.inf
    for i, end in enumerate(finished):
        if 0 < len(expected) - (i + 1) <= s:
            pull = max(HOLD_OVERDUE_FACTOR * end, min(done[w] for w in backups))
            break
    cover = min(covers, default=math.inf)
    if math.isinf(min(cover, pull)):
        return never
    if cover <= pull:
        at, given, preference = cover, sorted(expected - waiting(cover)), backups
    else:  # (the ready backups first)
        at, given = pull, sorted(w for w, end in ends.items() if end <= pull)
        preference = sorted(backups, key=lambda w: (done[w] > pull, w))
    chosen = code.decoding_set(assignment, preference, given=given) or ()
    return {**never, **dict.fromkeys(chosen, at)}


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
    surplus: str = "push",
    model_delivery: str = "direct",
    expected_first: bool = True,
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

    ``surplus`` (``JobSpec.surplus`` on hosts of their own, where ``auto`` holds): ``"push"``, backups send their
    messages when ready; ``"hold"``, they keep them until the master's rules pull them (:func:`_held_pulls`), and
    an ``n - s`` set counts as a set (a tree's surplus first-layer nodes hold too). ``model_delivery``
    (``JobSpec.model_delivery``): ``"direct"``, the model sent to every worker at once; ``"relay"``, to one, the
    others fetching it from peers (:class:`_Delivery`; a tree's first layer relays it, each parent sending it on
    to its children). ``expected_first``: the models of the workers a round expects go out before its backups', as
    the live master sends them since 2026-11-29; False: in worker order, as it did before.

    An iteration that can never decode (every worker's rows together do not)
    raises ``ValueError``.
    """
    iterations = check_int("iterations", iterations, 1)
    first_iteration = check_int("first_iteration", first_iteration, 0)
    delays = delays if delays is not None else NoDelay()
    if surplus not in SURPLUS_MODES:
        raise ValueError(f"Argument 'surplus' must be one of {', '.join(SURPLUS_MODES)}, not {surplus!r}.")
    hold = surplus == "hold"
    topology = code.topology()
    delivery = _Delivery(model_delivery, costs, costs.master_bandwidth, expected_first=expected_first)
    if topology is not None:
        return _simulate_tree(code, topology, costs, iterations, delays, first_iteration, hold=hold, delivery=delivery)
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
        if chooser is not None and static is not None:
            chosen = chooser.choose(static, range(code.n), held=hold)
            expected = frozenset() if len(chosen) == code.n else chosen  # every worker: all asked alike
        has_model = delivery.holds(range(code.n), first=expected)
        ready: dict[int, list[float]] = {}
        began: dict[int, float] = {}
        for w in range(code.n):
            if not assignment.rows[w]:
                continue
            shares = shares_cache.get(w) if static is not None else None
            if shares is None:
                shares = _row_shares(code, weights, assignment, w)
                if static is not None:
                    shares_cache[w] = shares
            before, delay = delays.parts(w, t)
            began[w] = has_model[w] + before
            start = has_model[w] + delay + costs.worker_seconds / costs.speed(w)
            per_share = costs.compute_seconds / costs.speed(w)
            ready[w] = [start + share * per_share for share in shares]
        sendable = None
        if hold and expected and chooser is not None:
            sendable = _held_pulls(receiver, assignment, ready, expected, began, chooser.start_slack())
        seconds, used, received, arrived = receiver.run(assignment, ready, expected, sendable)
        if math.isinf(seconds):
            raise ValueError(f"{code!r}: the rows of all its workers do not decode in iteration {t}.")
        if chooser is not None:
            chooser.answered(arrived, seconds, start_spread=_start_spread(began, expected, seconds) if hold else None)
        delivery.answered(arrived, seconds)
        master_bytes = costs.message_bytes * ((delivery.models_sent(code.n) if costs.broadcast else 0) + received)
        used_set = set(used)
        late = tuple(w for w in range(code.n) if w not in used_set)
        last = IterationOutcome(t, seconds, used, late, master_bytes)
        outcomes.append(last)
    return _result(outcomes)


def _start_spread(began: Mapping[int, float], expected: frozenset[int], seconds: float) -> float | None:
    """How far apart the ``expected`` workers began, when every one did before the round ended after ``seconds``
    (what the master's :meth:`~gradcode.master.hedging.Hedging.start_spread` reports)."""
    times = [began[w] for w in expected]
    return max(times) - min(times) if times and max(times) <= seconds else None


def _result(outcomes: list[IterationOutcome]) -> SimulationResult:
    return SimulationResult(
        seconds=np.array([o.seconds for o in outcomes]),
        master_bytes=np.array([o.master_bytes for o in outcomes]),
        outcomes=outcomes,
    )


def _simulate_tree(
    code: GradientCode,
    topology: Topology,
    costs: Costs,
    iterations: int,
    delays: DelayModel,
    first: int,
    *,
    hold: bool,
    delivery: _Delivery,
) -> SimulationResult:
    """Every parent runs the round of :class:`_Round` over its children with the topology's child code, bottom up;
    the master runs it over the first layer with ``code`` itself (Reisizadeh et al., CR.Execute). With ``hold`` the
    master expects ``n - s`` first-layer nodes and holds the others' messages (:func:`_held_pulls`), as the live
    master does unless ``JobSpec.surplus`` is ``push``."""
    child_ref = topology.child_code
    child_code = make_code(child_ref.name, **child_ref.params)
    total = topology.num_workers
    parent_of = topology.parent_of()
    children = [topology.children(w) for w in range(total)]
    rows = [topology.row(w) for w in range(total)]
    weights = code.partition_weights
    share = [float(weights[list(rows[w].partitions)].sum()) for w in range(total)]
    work = [(share[w] * costs.compute_seconds + costs.worker_seconds) / costs.speed(w) for w in range(total)]
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
    slots = range(len(top))
    chooser = Primaries(code) if hold else None
    outcomes: list[IterationOutcome] = []
    for t in range(first, first + iterations):
        has_model = np.zeros(total)
        expected: frozenset[int] = frozenset()
        if chooser is not None:
            chosen = chooser.choose(top_assignment, slots, held=True)
            expected = frozenset() if len(chosen) == len(top) else chosen
        top_holds = delivery.holds(top, first={top[i] for i in expected})
        has_model[top] = [top_holds[w] for w in top]
        for w in range(total):
            if children[w]:
                has_model[children[w]] = _down(float(has_model[w]), len(children[w]), costs, costs.worker_bandwidth)
        parts = [delays.parts(w, t) for w in range(total)]
        began = [float(has_model[w]) + parts[w][0] for w in range(total)]
        computed = [float(has_model[w]) + parts[w][1] + work[w] for w in range(total)]
        ready = list(computed)
        for w in deepest_first:
            kids = children[w]
            assignment = Assignment(tuple((rows[c].row,) for c in kids))
            done, _, _, _ = parent_round.run(assignment, {i: [ready[c]] for i, c in enumerate(kids)})
            ready[w] = max(done, computed[w])
        top_ready = {i: [ready[w]] for i, w in enumerate(top)}
        top_began = {i: began[w] for i, w in enumerate(top)}
        sendable = None
        if chooser is not None and expected:
            slack = chooser.start_slack()
            sendable = _held_pulls(master_round, top_assignment, top_ready, expected, top_began, slack)
        seconds, used_slots, received, arrived = master_round.run(top_assignment, top_ready, expected, sendable)
        if chooser is not None:
            spread = _start_spread(top_began, expected, seconds) if expected else None
            chooser.answered(arrived, seconds, start_spread=spread)
        delivery.answered([top[i] for i in arrived], seconds)
        if math.isinf(seconds):
            raise ValueError(f"{code!r}: the tree does not decode in iteration {t}.")
        used = tuple(top[i] for i in used_slots)
        late = tuple(w for w in top if w not in set(used))
        master_bytes = costs.message_bytes * ((delivery.models_sent(len(top)) if costs.broadcast else 0) + received)
        outcomes.append(IterationOutcome(t, seconds, used, late, master_bytes))
    return _result(outcomes)
