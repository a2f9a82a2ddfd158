r"""Which configuration should a cluster run? Fit each worker's time from a job's history, simulate the candidates.

A history (the master's ``<run_dir>/<job>.jsonl``, one :class:`IterationReport` per line, or the ``.json`` list
``gradcode run --out`` saves) holds per iteration the seconds each worker took until its last message reached the
master (``timings``) and the workers still computing when the round decoded (``late_workers``, cancelled: their
time is only known to exceed the round's). The planner:

1. **removes the emulated straggler law** the job ran with (its spec's ``straggler``, :func:`straggler_from_spec`):
   each worker slept exactly ``delay(i, t)`` in iteration ``t`` (``i`` its code index), a law of the job and not
   of the host, so it is subtracted from the worker's times (and from a late worker's censoring time) and added
   back, draw for draw from the same model, when the candidates are simulated;
2. **fits** each worker's own time as a shifted exponential, $T_w = c_w + \mathrm{Exp}(\lambda_w)$, by maximum
   likelihood with right censoring: $\hat c_w$ = its fastest observed time, $\hat\lambda_w$ = (observed
   iterations) / (sum over all its iterations, late ones at the round's last reported time, of the time above
   $\hat c_w$). A late worker thus counts as "at least this slow" instead of being dropped (dropping it would
   make a straggler look fast). The whole of that time is the worker's for the history's data share $x_{hist}$
   (its rows under the history's code: ``--spec``, or ``<job>.spec.json`` beside the history), and under a
   configuration giving it share $x$ it becomes $(x / x_{hist}) (c_w + E_w)$: the load-scaled shifted
   exponential of Lee et al. (2018) and Buyukates et al. (GC-DC) eq. (21), $X = r(\alpha + E)$ with $r$ the
   worker's load. Scaling the shift alone would keep the variable part of a worker's time fixed; on the emulated
   cluster (``gradcode bench cluster-plan``: CPU-quota hosts, gradients of tens of ms) a worker's median time at
   twice the share was twice its median, not its shift doubled plus the same excess, and the shift-only model
   predicted the configurations of share 2/8 and 3/8 at 0.68-0.85 of what they measured.
   :class:`~gradcode.common.sim.simulate.Costs`' ``compute_seconds`` and ``worker_speed`` carry $c_w x / x_{hist}$,
   :class:`FittedDelays` the scaled excess and the emulated law. The excess is drawn from the worker's own
   history, not from the exponential: the Kaplan-Meier estimate of its observed and censored excesses
   (:class:`Excess`), continued beyond its last observed value by the fitted exponential's tail. CPU-quota hosts
   answer in a narrow band well above their fastest time; an exponential from that fastest time let a group of
   two such hosts decode at their minimum (binary and clustered s = 1 predicted at 0.75-0.80 of what they
   measured; with the estimate, 0.87-0.92);
3. **simulates** every exact configuration with the history's number of worker processes — each registered
   exact scheme for every s its ``for_stragglers`` accepts, and CodedReduce trees whose ``n + ... + n^L``
   workers fit — with :func:`~gradcode.common.sim.simulate.simulate` and ranks them by mean seconds per iteration;
   also the smaller trees, and (``leave_out``) the flat codes that leave the slowest hosts idle, each on the
   fastest hosts (:func:`candidate_configurations`, :func:`fastest_hosts`).
   Backups hold or push as the master will run them (:func:`surplus_from_spec`), and a host's fitted excess is
   time it spends computing (:meth:`FittedDelays.parts`): held backups are pulled for it by the live rules. On
   the emulated cluster's uneven hosts, pushed backups predicted the recommendation 13 % fast; held, 4 %.
4. **bootstraps** the leaders: the history's iterations are resampled with replacement, the fit and simulation
   repeated, and the 5th-95th percentiles of the mean are the uncertainty shown.

Worker ids in a history are the master's pool ids; the planner gives code index ``i`` to the ``i``-th smallest
id (the fit is per worker, so a heterogeneous cluster keeps its slow hosts). Messages' transfer is inside the
measured times; extra costs (``message_overhead``, bandwidths) can be added on top.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.registry import available_codes, code_class, make_code
from gradcode.common.gather.delivery import DEFAULT_MODEL_DELIVERY, MODEL_DELIVERIES, relays
from gradcode.common.gather.primaries import DEFAULT_SURPLUS, SURPLUS_MODES
from gradcode.common.sim.simulate import Costs, simulate
from gradcode.common.sim.stragglers import DELAY_MODEL_NAMES, DelayModel, make_delay_model
from gradcode.common.validation import check_int

__all__ = [
    "Excess",
    "FittedDelays",
    "PlanRow",
    "WorkerFit",
    "candidate_codes",
    "candidate_configurations",
    "data_shares",
    "delivery_from_spec",
    "fastest_hosts",
    "fit_workers",
    "plan",
    "plan_for_spec",
    "read_history",
    "straggler_from_spec",
    "surplus_from_spec",
    "trees",
]

_STREAM_FITTED = 11


def read_history(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The reports of a history file (``.jsonl`` or ``.json``) and the job spec beside it (None if absent)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            loaded = json.loads(text)
            rows = loaded if isinstance(loaded, list) else [loaded]
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not a history gradcode wrote (JSON reports, a .json list or one per line): {exc}"
        ) from None
    reports = [r for r in rows if isinstance(r, dict) and "timings" in r]
    if not reports:
        raise ValueError(f"{path} holds no iteration reports (lines with 'timings'); give a job's history file.")
    spec_path = path.with_suffix(".spec.json")
    spec = json.loads(spec_path.read_text(encoding="utf-8")) if spec_path.is_file() else None
    return reports, spec


def code_from_spec(spec: Mapping[str, Any]) -> GradientCode:
    """The gradient code a saved job spec (``message_to_dict`` of a JobSpec) ran."""
    code = spec.get("code")
    if not isinstance(code, Mapping) or "name" not in code:
        raise ValueError("The job spec has no 'code' with a 'name'; give --spec of the job that wrote the history.")
    return make_code(str(code["name"]), **dict(code.get("params") or {}))


def surplus_from_spec(spec: Mapping[str, Any]) -> str:
    """What the job's backups would do with their messages on hosts of their own (``JobSpec.surplus``): "push" or
    "hold" as the spec says; "auto" (its default) holds there, as the master does for every worker whose messages
    cross the network. (On one machine, where workers share the master's memory, ``auto`` pushes: plan such a job
    with ``surplus="push"``.)"""
    return "push" if _spec_choice(spec, "surplus", SURPLUS_MODES, DEFAULT_SURPLUS) == "push" else "hold"


def delivery_from_spec(spec: Mapping[str, Any]) -> str:
    """How the job would send its model (``JobSpec.model_delivery``): "direct" (its default), "relay" or "auto"."""
    return _spec_choice(spec, "model_delivery", MODEL_DELIVERIES, DEFAULT_MODEL_DELIVERY)


def _spec_choice(spec: Mapping[str, Any], field: str, choices: Sequence[str], default: str) -> str:
    """The saved spec's ``field``, one of ``choices`` (``default`` when empty); ValueError naming them otherwise."""
    value = spec.get(field) or default
    if value not in choices:
        raise ValueError(f"The spec's {field} must be one of {', '.join(choices)}, not {value!r}.")
    return str(value)


def straggler_from_spec(spec: Mapping[str, Any] | None) -> DelayModel | None:
    """The emulated straggler law a saved job spec ran with (its ``straggler``), None when it had none."""
    straggler = (spec or {}).get("straggler") or {}
    model = str(straggler.get("model") or "none")
    if model == "none":
        return None
    if model not in DELAY_MODEL_NAMES:
        raise ValueError(f"The job spec's straggler model {model!r} is unknown; valid models are {DELAY_MODEL_NAMES}.")
    return make_delay_model(model, dict(straggler.get("params") or {}), int(straggler.get("seed") or 0))


@dataclass(frozen=True)
class WorkerFit:
    """One worker's fitted time: ``shift`` + Exp(``rate``), from ``observed`` times and ``censored`` late rounds."""

    worker_id: int
    shift: float
    rate: float
    observed: int
    censored: int

    @property
    def mean(self) -> float:
        return self.shift + (1.0 / self.rate if self.rate > 0 else math.inf)


def _samples(
    reports: Sequence[Mapping[str, Any]], injected: DelayModel | None = None
) -> dict[int, tuple[list[float], list[float]]]:
    """Per worker id: its observed seconds, and the censoring times of the rounds it was late in, each less the
    delay ``injected`` made it sleep (the worker with the ``i``-th smallest id is code index ``i``)."""
    ids = sorted(
        {int(t["worker_id"]) for r in reports for t in r.get("timings", [])}
        | {int(w) for r in reports for w in r.get("late_workers", [])}
    )
    index = {w: i for i, w in enumerate(ids)}

    def slept(w: int, report: Mapping[str, Any]) -> float:
        return 0.0 if injected is None else injected.delay(index[w], int(report.get("iteration", 0)))

    out: dict[int, tuple[list[float], list[float]]] = {}
    for report in reports:
        times = {int(t["worker_id"]): float(t["seconds"]) for t in report.get("timings", [])}
        horizon = max(times.values(), default=math.nan)
        for w, seconds in times.items():
            out.setdefault(w, ([], []))[0].append(max(seconds - slept(w, report), 0.0))
        for w in report.get("late_workers", []):
            if int(w) not in times and math.isfinite(horizon):
                out.setdefault(int(w), ([], []))[1].append(max(horizon - slept(int(w), report), 0.0))
    return out


def fit_workers(reports: Sequence[Mapping[str, Any]], injected: DelayModel | None = None) -> list[WorkerFit]:
    """Censored maximum-likelihood shifted exponential per worker, in ascending worker id; with ``injected`` (the
    job's emulated straggler law) of each worker's time less the delay that law made it sleep."""
    return [fit for fit, _ in _fit(_samples(reports, injected))]


def _fit(samples: Mapping[int, tuple[list[float], list[float]]]) -> list[tuple[WorkerFit, Excess]]:
    fitted = []
    for w, (seen, late) in sorted(samples.items()):
        if not seen:
            raise ValueError(f"Worker {w} was late in every iteration of the history; its time cannot be fitted.")
        shift = min(seen)
        excess = sum(x - shift for x in seen) + sum(max(c - shift, 0.0) for c in late)
        rate = len(seen) / excess if excess > 0 else math.inf
        fit = WorkerFit(w, shift, rate, len(seen), len(late))
        fitted.append((fit, Excess.estimate([x - shift for x in seen], [c - shift for c in late], rate)))
    return fitted


@dataclass(frozen=True)
class Excess:
    """One worker's time above its shift, as the history shows it: the Kaplan-Meier estimate from its observed
    excesses and the censored ones of the rounds it was late in (Kaplan and Meier, 1958), whose mass beyond the
    last observed value -- the late rounds' -- continues as the fitted exponential's memoryless tail.

    A fitted shape alone misleads where a host's time is not exponential: CPU-quota hosts answered within a
    narrow band well above their fastest time, so two of them as a fractional group decode at about the band,
    where two exponentials of the same mean and shift would give the group their minimum, far below it.
    Without observations (``values`` empty) it is the exponential of ``rate``."""

    values: tuple[float, ...]
    """The distinct observed excesses, ascending."""
    cumulative: tuple[float, ...]
    """The estimated probability of an excess at most ``values[i]``."""
    rate: float

    @classmethod
    def estimate(cls, observed: Sequence[float], censored: Sequence[float], rate: float) -> Excess:
        """The product-limit estimate: at each observed value, the survival shrinks by the share of those still
        at risk (observed or censored at or beyond it) that ended there."""
        seen = np.sort(np.maximum(np.asarray(observed, dtype=float), 0.0))
        late = np.asarray(censored, dtype=float)
        values, counts = np.unique(seen, return_counts=True)
        survival, cumulative = 1.0, []
        for value, count in zip(values, counts, strict=True):
            at_risk = int(np.count_nonzero(seen >= value) + np.count_nonzero(late >= value))
            survival *= 1.0 - count / at_risk
            cumulative.append(1.0 - survival)
        return cls(tuple(float(v) for v in values), tuple(cumulative), rate)

    def draw(self, rng: np.random.Generator) -> float:
        """One excess: the estimate's quantile of a uniform draw, or the tail's beyond the last observed value."""
        u = float(rng.random())
        i = bisect.bisect_left(self.cumulative, u)
        if i < len(self.values):
            return self.values[i]
        last = self.values[-1] if self.values else 0.0
        return last + (0.0 if math.isinf(self.rate) else float(rng.exponential(1.0 / self.rate)))

    def mean(self) -> float:
        probabilities = np.diff((0.0, *self.cumulative))
        tail = 1.0 - (self.cumulative[-1] if self.cumulative else 0.0)
        last = self.values[-1] if self.values else 0.0
        beyond = last + (0.0 if math.isinf(self.rate) else 1.0 / self.rate)
        return float(np.dot(probabilities, self.values)) + tail * beyond


class FittedDelays(DelayModel):
    """Per-worker excesses above the fitted shifts (code index ``i`` = the ``i``-th fit's :class:`Excess`), each
    multiplied by the worker's ``scales`` entry (its share over its history share; none: 1), plus the ``injected``
    law the history's job ran with, which the live job would run with too; seeded like every :class:`DelayModel`,
    so configurations compared on the same seed see the same draws."""

    name = "fitted"

    def __init__(
        self,
        excess: Sequence[Excess],
        *,
        scales: Sequence[float] = (),
        injected: DelayModel | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(seed=seed)
        self.excess = tuple(excess)
        self.scales = tuple(float(x) for x in scales) or (1.0,) * len(self.excess)
        if len(self.scales) != len(self.excess):
            raise ValueError(f"scales has {len(self.scales)} entries for {len(self.excess)} fitted workers.")
        self.injected = injected

    def _delay(self, worker_id: int, iteration: int) -> float:
        return self.parts(worker_id, iteration)[1]

    def parts(self, worker_id: int, iteration: int) -> tuple[float, float]:
        """Only the injected law passes before the worker begins: a host's fitted excess is time spent computing.
        (The fitted model's own ``time_scale`` is always 1.)"""
        before = 0.0 if self.injected is None else self.injected.delay(worker_id, iteration)
        excess, scale = self.excess[worker_id % len(self.excess)], self.scales[worker_id % len(self.scales)]
        return before, before + scale * excess.draw(self._rng(_STREAM_FITTED, worker_id, iteration))

    def _mean(self) -> float:
        fitted = [x * e.mean() for e, x in zip(self.excess, self.scales, strict=True)]
        return float(np.mean(fitted)) + (0.0 if self.injected is None else self.injected.mean())


def calibrate(
    fits: Sequence[WorkerFit],
    shares: Sequence[float],
    base: Costs,
    *,
    target: Sequence[float] | None = None,
    injected: DelayModel | None = None,
    excess: Sequence[Excess] | None = None,
) -> tuple[Costs, FittedDelays]:
    """Costs whose compute reproduces each worker's shift at its history share, and its excess (``excess``; None:
    the fitted exponentials) scaled to the ``target`` shares (a candidate configuration's; None: the history's
    own) over the ``injected`` law."""
    if len(shares) != len(fits):
        raise ValueError(f"The history's code has {len(shares)} workers but the history names {len(fits)}.")
    full = [f.shift / x if x > 0 else math.nan for f, x in zip(fits, shares, strict=True)]
    known = [v for v in full if math.isfinite(v) and v > 0]
    reference = float(np.median(known)) if known else 0.0
    speeds = tuple(reference / v if math.isfinite(v) and v > 0 else 1.0 for v in full)
    costs = replace(base, compute_seconds=reference, worker_speed=speeds)
    scales: list[float] = []
    if target is not None:
        if len(target) != len(fits):
            raise ValueError(f"The configuration has {len(target)} workers but the history names {len(fits)}.")
        scales = [y / x if x > 0 else 1.0 for x, y in zip(shares, target, strict=True)]
    excess = list(excess) if excess is not None else [Excess((), (), f.rate) for f in fits]
    return costs, FittedDelays(excess, scales=scales, injected=injected, seed=0)


def candidate_codes(workers: int, *, exclude: Iterable[str] = ()) -> list[GradientCode]:
    """Every exact configuration with ``workers`` worker processes: each exact scheme's ``for_stragglers`` for every
    s it accepts, and the CodedReduce trees (L >= 2) with that many nodes."""
    workers = check_int("workers", workers, 1)
    found: dict[str, GradientCode] = {}
    skip = set(exclude)
    for name in available_codes():
        cls = code_class(name)
        if not cls.exact or name in skip:
            continue
        for s in range(workers):
            try:
                code = cls.for_stragglers(workers, s)
            except (ValueError, NotImplementedError):
                continue
            found.setdefault(repr(code), code)
    if "coded_reduce" not in skip:
        for code in trees(workers, workers):
            found.setdefault(repr(code), code)
    return list(found.values())


def trees(fewest: int, most: int) -> list[GradientCode]:
    """The CodedReduce trees (L >= 2, every s the code accepts) of ``fewest`` to ``most`` nodes."""
    found = []
    for n in range(2, most):
        for depth in range(2, 8):
            if not fewest <= sum(n**level for level in range(1, depth + 1)) <= most:
                continue
            for s in range(n):
                try:
                    found.append(make_code("coded_reduce", n=n, s=s, L=depth))
                except ValueError:
                    continue
    return found


def candidate_configurations(hosts: int, *, leave_out: int = 0, exclude: Iterable[str] = ()) -> list[GradientCode]:
    """What a cluster of ``hosts`` may run: every exact configuration of ``hosts - leave_out`` to ``hosts`` worker
    processes (:func:`candidate_codes`: a flat code using all hosts but the slowest few), and the CodedReduce trees
    of fewer nodes (no regular tree has 24 nodes, yet at n = 24 hosts behind a slow master link a tree of 6 was the
    fastest measured: ``docs/cluster.md``). Flat codes of far fewer hosts are not tried: building every exact code
    of every size takes minutes at 24 hosts (cyclic and partial-straggler codes search their coefficients)."""
    hosts = check_int("hosts", hosts, 1)
    leave_out = check_int("leave_out", leave_out, 0)
    if leave_out >= hosts:
        raise ValueError(f"leave_out is {leave_out}; at {hosts} hosts at most {hosts - 1} can be left out.")
    found: dict[str, GradientCode] = {}
    for workers in range(hosts, hosts - leave_out - 1, -1):
        for code in candidate_codes(workers, exclude=exclude):
            found.setdefault(repr(code), code)
    if "coded_reduce" not in set(exclude):
        for code in trees(1, hosts - leave_out - 1):
            found.setdefault(repr(code), code)
    return list(found.values())


@dataclass(frozen=True)
class PlanRow:
    """A ranked configuration: predicted mean seconds per iteration, its bootstrap interval, time for K;
    ``code_params`` are what :func:`~gradcode.common.codes.registry.make_code` takes to build it, ``worker_ids``
    the hosts it runs on."""

    rank: int
    scheme: str
    parameters: str
    code_params: dict[str, Any]
    workers: int
    worker_ids: tuple[int, ...]
    """The history's worker ids it runs on, code index ``i`` on the ``i``-th: all of them, or the fastest."""
    mean_seconds: float
    low_seconds: float
    high_seconds: float
    total_seconds: float


def _describe(code: GradientCode) -> str:
    return " ".join(f"{k}={v}" for k, v in code._params().items() if k not in ("seed", "shifts"))


def data_shares(code: GradientCode) -> list[float]:
    """The data share of each of ``code``'s worker processes (a tree node: its own partitions)."""
    topology = code.topology()
    if topology is None:
        return [code.data_share(w) for w in range(code.n)]
    weights = code.partition_weights
    return [float(weights[list(topology.row(w).partitions)].sum()) for w in range(topology.num_workers)]


def _mean_time(
    code: GradientCode,
    fitted: Sequence[tuple[WorkerFit, Excess]],
    shares: Sequence[float],
    base: Costs,
    iterations: int,
    injected: DelayModel | None,
    surplus: str,
    delivery: str,
) -> float:
    fits, excess = [f for f, _ in fitted], [e for _, e in fitted]
    costs, delays = calibrate(fits, shares, base, target=data_shares(code), injected=injected, excess=excess)
    # the master's rule, on hosts apart: its first gather asks the code's n workers (a tree's first layer)
    relayed = relays(delivery, network=code.n, tree=code.topology() is not None)
    run = simulate(code, costs, iterations, delays, surplus=surplus, model_delivery="relay" if relayed else "direct")
    return float(run.seconds.mean())


def plan(
    reports: Sequence[Mapping[str, Any]],
    history_code: GradientCode,
    *,
    base: Costs | None = None,
    iterations: int = 100,
    bootstrap: int = 10,
    top: int = 5,
    seed: int = 0,
    candidates: Sequence[GradientCode] | None = None,
    injected: DelayModel | None = None,
    surplus: str = "hold",
    delivery: str = "direct",
    leave_out: int = 0,
) -> tuple[list[PlanRow], list[WorkerFit]]:
    """Rank the candidate configurations by simulated mean seconds per iteration (``iterations`` = K each), with
    bootstrap 5-95 % intervals for the ``top`` leaders (the others get their point estimate as both ends).
    ``injected``: the emulated straggler law the history's job ran with (:func:`straggler_from_spec`), taken out
    of the fits and simulated as it is. ``surplus``: what the backups will do, as the master runs them
    (:func:`surplus_from_spec`; "hold" on hosts of their own); ``delivery``: ``JobSpec.model_delivery``
    (:func:`delivery_from_spec`), relayed or not per candidate by the master's rule (it matters when ``base``
    has a master bandwidth). Candidates (default: :func:`candidate_configurations` with ``leave_out``) of fewer
    workers than the history's run on its fastest hosts (:func:`fastest_hosts`)."""
    iterations = check_int("iterations", iterations, 1)
    bootstrap = check_int("bootstrap", bootstrap, 0)
    base = base or Costs(broadcast=False)
    fitted = _fit(_samples(reports, injected))
    fits = [f for f, _ in fitted]
    share_of = {f.worker_id: x for f, x in zip(fits, data_shares(history_code), strict=True)}
    codes = list(candidates) if candidates is not None else candidate_configurations(len(fits), leave_out=leave_out)
    fastest = fastest_hosts(fitted, share_of)
    for code in codes:
        if code.worker_processes() > len(fits):
            raise ValueError(
                f"{code!r} needs {code.worker_processes()} workers; the history has {len(fits)}: give candidates "
                "of at most that many."
            )
    hosts = {repr(c): tuple(sorted(fastest[: c.worker_processes()])) for c in codes}

    def mean_time(code: GradientCode, fitted: Sequence[tuple[WorkerFit, Excess]]) -> float:
        ids = hosts[repr(code)]
        chosen = [x for x in fitted if x[0].worker_id in ids]
        if len(chosen) != len(ids):
            raise ValueError(
                f"the history has no iteration of workers {sorted(set(ids) - {f.worker_id for f, _ in chosen})}"
            )
        shares = [share_of[f.worker_id] for f, _ in chosen]
        return _mean_time(code, chosen, shares, base, iterations, injected, surplus, delivery)

    point = {repr(c): mean_time(c, fitted) for c in codes}
    ranked = sorted(codes, key=lambda c: point[repr(c)])
    rng = np.random.default_rng(seed)
    intervals: dict[str, tuple[float, float]] = {}
    for code in ranked[:top]:
        means = []
        for _ in range(bootstrap):
            sample = [reports[int(i)] for i in rng.integers(0, len(reports), size=len(reports))]
            try:
                means.append(mean_time(code, _fit(_samples(sample, injected))))
            except ValueError:  # a resample where some worker was never seen: skip it
                continue
        if means:
            intervals[repr(code)] = (float(np.percentile(means, 5)), float(np.percentile(means, 95)))
    rows = []
    for rank, code in enumerate(ranked, start=1):
        mean = point[repr(code)]
        low, high = intervals.get(repr(code), (mean, mean))
        params = dict(code._params())
        rows.append(
            PlanRow(
                rank, type(code).name, _describe(code), params, code.worker_processes(), hosts[repr(code)], mean,
                low, high, mean * iterations,
            )
        )  # fmt: skip
    return rows, fits


def fastest_hosts(fitted: Sequence[tuple[WorkerFit, Excess]], share_of: Mapping[int, float]) -> list[int]:
    """The history's worker ids, fastest first: by the fitted mean time per unit of data share (shift plus mean
    excess, over the share the worker held), ties by id; a configuration of ``m`` workers runs on the first ``m``."""

    def per_share(item: tuple[WorkerFit, Excess]) -> tuple[float, int]:
        fit, excess = item
        share = share_of[fit.worker_id]
        return ((fit.shift + excess.mean()) / share if share > 0 else math.inf, fit.worker_id)

    return [fit.worker_id for fit, _ in sorted(fitted, key=per_share)]


def plan_for_spec(
    reports: Sequence[Mapping[str, Any]],
    spec: Mapping[str, Any],
    *,
    surplus: str | None = None,
    base: Costs | None = None,
    iterations: int = 100,
    bootstrap: int = 10,
    top: int = 5,
    leave_out: int = 0,
) -> tuple[list[PlanRow], list[WorkerFit]]:
    """:func:`plan` for the job ``spec`` (a saved ``JobSpec``, as the master writes it beside its history) that
    wrote ``reports``: its code, its emulated straggler law, its surplus (``surplus`` overrides it) and its model
    delivery come from the spec."""
    return plan(
        reports, code_from_spec(spec), base=base, iterations=iterations, bootstrap=bootstrap, top=top,
        injected=straggler_from_spec(spec), surplus=surplus_from_spec(spec) if surplus is None else surplus,
        delivery=delivery_from_spec(spec), leave_out=leave_out,
    )  # fmt: skip
