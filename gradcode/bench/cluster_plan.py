"""Does ``gradcode plan``'s recommendation hold on heterogeneous hosts? Probe, plan, then measure the ranked
configurations in one interleaved run (issue 29's third target).

    gradcode bench cluster-plan [--n 8] [--slow-hosts 2] [--fast-cpu 20] [--slow-cpu 6] [--delayed 1]
                                [--delay-mean 0.05] [--probe-iterations 30] [--iterations 20] [--rounds 3]
                                [--top 4] [--histories DIR] [--quick] [--out DIR]

**The cluster** (:class:`~gradcode.bench.cluster.EmulatedCluster` on :mod:`gradcode.bench.testbed`, needs root):
a master host and ``n`` worker hosts, each a network namespace with its own shaped link and its own CPU quota;
``--slow-hosts`` of the worker hosts get ``--slow-cpu`` % of a core, the others ``--fast-cpu`` % (all quotas
together within the machine's cores). On top, a straggler law on ``--delayed`` of the fast hosts: a
shifted-exponential extra delay of mean ``--delay-mean`` s per iteration (the job's straggler spec,
Gilbert-Elliot with both transition probabilities 0: those workers are always in the slow state, the others
never delayed). Workload: the linear model on :data:`NUM_SAMPLES` samples of :data:`NUM_FEATURES` features,
so a worker's gradient costs milliseconds of CPU, tens of ms at its quota; the 8 KB messages leave the links idle.

**The run**, all on one cluster:

1. a *probe*: ``uncoded`` on all n workers for ``--probe-iterations``, with the workers in ascending pool id
   (the planner gives code index i to the i-th smallest id, so the order is the one it assumes);
2. :func:`~gradcode.common.sim.plan.plan` on the probe's history (the master's ``<run_dir>/<job>.jsonl`` and
   its ``.spec.json``, exactly what ``gradcode plan`` reads, less its warm-up iterations, which the measured
   figures leave out too): the recommendation, the runners-up up to ``--top`` configurations, and the probe's
   own configuration;
3. each of those measured in interleaved rounds (A, B, C, A, B, C, ...), the same worker order, each first
   checked exact by a ``verify`` job; an inexact iteration in any job ends the run (RuntimeError).

**Figures.** The planner predicts the *mean* seconds per iteration, so a job's figure is its mean time between
iterations after the first :data:`~gradcode.bench.output.SKIP_ITERATIONS` (the median of those means over
the rounds, the min-max over rounds as the spread; the median period is kept beside it). The table gives
predicted (with its bootstrap 5-95 % interval), measured, their ratio, the predicted and measured ranks and
``/proc/loadavg`` before each job; then the two targets: the recommendation within 15 % of its prediction,
and no slower than the best measured alternative — strictly (its median is the smallest) and within the
spread (its median is at most the best alternative's slowest round). Saves ``cluster-plan.json`` and
``cluster-plan.png`` (predicted against measured) in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gradcode.bench.cluster import START_TIMEOUT, EmulatedCluster, System, gradcode_job, verify_exact
from gradcode.bench.output import RESULTS, SKIP_ITERATIONS, add_out_argument, figure, load_average, save, steady_periods
from gradcode.bench.testbed import HostSpec, Testbed, TestbedUnavailableError, check_available
from gradcode.bench.training import Delays, Workload
from gradcode.client.sdk import GradcodeClient
from gradcode.common.sim.plan import PlanRow, WorkerFit, plan_for_spec, read_history

__all__ = ["Layout", "judge", "main", "run"]

NUM_FEATURES = 999
"""p = 1000 parameters: 8 KB messages, so the links stay idle and compute decides."""
NUM_SAMPLES = 48_000
"""38400 training rows (307 MB of float64): an eighth of the gradient is about 5 ms of CPU, 25-30 ms at 20 % of a
core. (With a quarter of that, 1 ms of CPU, the 6 % hosts answered an uncoded round about as fast as the 20 % ones
-- the work fits in the CPU quota's period -- and took three times as long at twice the share.)"""
PLAN_ITERATIONS = 100
"""Iterations each simulated configuration runs to estimate its mean (``gradcode plan``'s default K)."""
TOLERANCE = 0.15
"""The issue's target: the recommendation measured within 15 % of its prediction."""


@dataclass(frozen=True)
class Layout:
    """The heterogeneous hosts: ``n`` worker hosts, ``slow_hosts`` of them (the last) at ``slow_cpu`` % of a
    core and the rest at ``fast_cpu`` %; ``delayed`` fast hosts with an exponential extra delay of mean
    ``delay_mean`` s per iteration; the master host at ``master_cpu`` %; links of ``master_mbit`` / ``worker_mbit``."""

    n: int = 8
    slow_hosts: int = 2
    fast_cpu: float = 20.0
    slow_cpu: float = 6.0
    delayed: int = 1
    delay_mean: float = 0.05
    master_cpu: float = 40.0
    master_mbit: float = 1000.0
    worker_mbit: float = 1000.0

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"n must be at least 2 worker hosts, not {self.n}.")
        if not 0 <= self.slow_hosts < self.n:
            raise ValueError(f"slow_hosts must be in [0, {self.n}) (some host must be fast), not {self.slow_hosts}.")
        if not 0 <= self.delayed <= self.n - self.slow_hosts:
            raise ValueError(
                f"delayed must be in [0, {self.n - self.slow_hosts}] (the fast hosts), not {self.delayed}."
            )
        if self.delay_mean <= 0 and self.delayed:
            raise ValueError(f"delay_mean must be > 0 seconds when hosts are delayed, not {self.delay_mean}.")
        cores = os.cpu_count() or 1
        total = self.master_cpu + self.fast_cpu * (self.n - self.slow_hosts) + self.slow_cpu * self.slow_hosts
        if total > 100 * cores:
            raise ValueError(
                f"the quotas add up to {total:g} % of a core, more than this machine's {cores} cores: lower "
                "--fast-cpu, --slow-cpu or --master-cpu."
            )

    def specs(self) -> list[HostSpec]:
        """The master host, then worker hosts w0..w(n-1); the last ``slow_hosts`` are the slow ones."""
        cpus = [self.fast_cpu] * (self.n - self.slow_hosts) + [self.slow_cpu] * self.slow_hosts
        return [HostSpec("m", self.master_mbit, self.master_cpu)] + [
            HostSpec(f"w{i}", self.worker_mbit, cpu) for i, cpu in enumerate(cpus)
        ]

    def delays(self, order: Sequence[str], seed: int) -> Delays:
        """The straggler law of a job whose code index i runs on host ``order[i]``: the first ``delayed`` fast
        hosts (w0, w1, ...) always slow in a frozen Gilbert-Elliot chain (exponential delays of mean
        ``delay_mean``), every other worker never delayed."""
        if not self.delayed:
            return Delays("none")
        hosts = {f"w{i}" for i in range(self.delayed)}
        params = {
            "p_fast_to_slow": 0.0, "p_slow_to_fast": 0.0, "slow_delay": self.delay_mean, "fast_delay": 0.0,
            "initial_slow_workers": [i for i, role in enumerate(order) if role in hosts], "exponential": True,
        }  # fmt: skip
        return Delays("gilbert_elliot", params, seed)


def _system(row: PlanRow | None, n: int) -> System:
    """The bench's System for a plan row (None: the probe, uncoded on all n)."""
    if row is None:
        return System("uncoded", "uncoded", n, {"n": n})
    name = f"{row.scheme} {row.parameters}".strip()
    return System(name, row.scheme, row.workers, dict(row.code_params))


def _placement(row: PlanRow | None, ids: list[int], host_of: dict[int, str]) -> tuple[list[int], list[str]]:
    """The pool ids a plan row runs on (the probe, None: all) in code-index order, and their hosts."""
    on = ids if row is None else list(row.worker_ids)
    return on, [host_of[i] for i in on]


def judge(entries: Sequence[dict[str, Any]], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The targets on the summary ``entries`` (each with ``predicted_s``, ``measured_s``, ``rounds_s`` and
    ``recommended``): the recommendation within ``tolerance`` of its prediction; no slower than the best
    alternative strictly (the smallest median) and within the spread (at most that alternative's slowest round)."""
    recommended = [e for e in entries if e["recommended"]]
    if len(recommended) != 1:
        raise ValueError(f"exactly one entry must be the recommendation, not {len(recommended)}.")
    rec = recommended[0]
    others = [e for e in entries if not e["recommended"]]
    ratio = rec["measured_s"] / rec["predicted_s"]
    verdict: dict[str, Any] = {
        "tolerance": tolerance,
        "ratio": ratio,
        "within_tolerance": abs(ratio - 1.0) <= tolerance,
    }
    if others:
        best = min(others, key=lambda e: e["measured_s"])
        verdict.update(
            best_alternative=best["system"],
            versus_best=rec["measured_s"] / best["measured_s"],
            no_slower_strict=rec["measured_s"] <= best["measured_s"],
            no_slower_within_spread=rec["measured_s"] <= max(best["rounds_s"]),
        )
    return verdict


def _summary(
    systems: Sequence[System], rows: Sequence[PlanRow | None], jobs: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    entries = []
    for system, row in zip(systems, rows, strict=True):
        runs = [j for j in jobs if j["system"] == system.name]
        means = [j["mean_s"] for j in runs]
        entries.append(
            {
                "system": system.name, "scheme": system.scheme, "code_params": system.code_params,
                "predicted_rank": row.rank if row is not None else None,
                "predicted_s": row.mean_seconds if row is not None else math.nan,
                "predicted_low_s": row.low_seconds if row is not None else math.nan,
                "predicted_high_s": row.high_seconds if row is not None else math.nan,
                "measured_s": statistics.median(means), "rounds_s": means,
                "median_period_s": statistics.median(j["median_s"] for j in runs),
                "loads": [j["load"][0] for j in runs], "exact": all(j["exact"] for j in runs),
                "worker_throttled_s": statistics.median(j["worker_throttled_s"] for j in runs),
                "recommended": row is not None and row.rank == 1,
                "worker_ids": list(row.worker_ids) if row is not None else None,  # None: the probe's, all
            }
        )  # fmt: skip
    for e in entries:
        e["ratio"] = e["measured_s"] / e["predicted_s"] if e["predicted_rank"] is not None else math.nan
    for rank, e in enumerate(sorted(entries, key=lambda e: e["measured_s"]), start=1):
        e["measured_rank"] = rank
    return entries


def _probe_row(rows: Sequence[PlanRow], n: int) -> PlanRow | None:
    """The plan's row of the probe's configuration (uncoded on n), if it ranked it."""
    return next((r for r in rows if r.scheme == "uncoded" and r.code_params.get("n") == n), None)


async def _measure(
    cluster: EmulatedCluster, layout: Layout, workload: Workload, probe_iterations: int,
    iterations: int, rounds: int, top: int, bootstrap: int, leave_out: int = 0,
) -> dict[str, Any]:  # fmt: skip
    async with GradcodeClient(cluster.client_address) as client:
        await client.wait_ready(START_TIMEOUT)
        by_address = await cluster.pool_ids(client)
        host_of = {by_address[a]: cluster.host_of(a).role for a in cluster.worker_addresses}
        ids = sorted(host_of)  # code index i = the i-th smallest pool id, as the planner assumes
        order = [host_of[i] for i in ids]
        print("  code index -> host: " + ", ".join(f"{i}:{r}" for i, r in enumerate(order)), flush=True)
        probe = _system(None, layout.n)
        await verify_exact(client, probe, workload, ids)
        job = await gradcode_job(
            cluster, client, ids, order, probe, workload, layout.delays(order, 100), probe_iterations
        )
        if not job["exact"]:
            raise RuntimeError("the probe job had an inexact iteration")
        history = cluster.run_dir / f"{job['job_id']}.jsonl"
        reports, spec = read_history(history)
        if spec is None:
            raise RuntimeError(f"the master wrote no spec beside {history}")
        # like the measured figures, the fit leaves out the warm-up iterations (connections, first touches of the
        # data): their one-off costs are not draws of a worker's time per iteration
        reports = [r for r in reports if int(r["iteration"]) > SKIP_ITERATIONS]
        started = time.perf_counter()
        plan_rows, fits = plan_for_spec(
            reports, spec, iterations=PLAN_ITERATIONS, bootstrap=bootstrap, top=top, leave_out=leave_out
        )
        print(f"  planned in {time.perf_counter() - started:.1f} s from {len(reports)} iterations", flush=True)
        chosen: list[PlanRow | None] = list(plan_rows[:top])
        probe_row = _probe_row(plan_rows, layout.n)
        if probe_row is None or probe_row.rank > top:
            chosen.append(probe_row)
        systems = [_system(r, layout.n) for r in chosen]
        placed = [_placement(r, ids, host_of) for r in chosen]
        for system, (on, _) in zip(systems, placed, strict=True):
            error = await verify_exact(client, system, workload, on)
            print(f"  verified {system.name:<28} worst relative error {error:.1e}", flush=True)
        jobs: list[dict[str, Any]] = []
        for round_ in range(rounds):
            for system, (on, roles) in zip(systems, placed, strict=True):
                delays = layout.delays(roles, round_)
                job = await gradcode_job(cluster, client, on, roles, system, workload, delays, iterations)
                if not job["exact"]:
                    raise RuntimeError(f"{system.name}, round {round_}: an iteration was not exact")
                periods = steady_periods(job["elapsed_s"])
                entry = {
                    "system": system.name, "round": round_, "mean_s": statistics.mean(periods),
                    "median_s": statistics.median(periods), "periods_s": periods, "exact": job["exact"],
                    "load": job["load"], "worker_throttled_s": job["worker_throttled_s"],
                    "master_throttled_s": job["master_throttled_s"],
                }  # fmt: skip
                entry.update(_history_figures(cluster.run_dir / f"{job['job_id']}.jsonl", on))
                jobs.append(entry)
                print(
                    f"  round {round_} {system.name:<28} mean {entry['mean_s'] * 1e3:7.1f} ms"
                    f" median {entry['median_s'] * 1e3:7.1f} ms  wall {entry['wall_s'] * 1e3:5.1f} decode"
                    f" {entry['decode_s'] * 1e3:4.1f} used {entry['used']:g} late {entry['late']:.1f} promoted"
                    f" {entry['promoted']:.1f}  workers "
                    + " ".join(f"{x * 1e3:.0f}" for x in entry["worker_median_s"])
                    + f"  exact {job['exact']}  load {job['load'][0]:.2f}",
                    flush=True,
                )
    return {
        "order": order,
        "probe_history": [dict(r) for r in reports],
        "fits": [_fit_dict(f) for f in fits],
        "plan": [asdict(r) for r in plan_rows],
        "summary": _summary(systems, chosen, jobs),
        "jobs": jobs,
    }


def _history_figures(path: Path, ids: Sequence[int]) -> dict[str, Any]:
    """What a measured job's history says beyond its periods (steady iterations): medians of the master's wall and
    decode seconds per iteration, of the workers it used, of the late and promoted ones, and each code index's
    median seconds (NaN where it never answered): where the time went when a prediction misses."""
    reports = [r for r in read_history(path)[0] if int(r["iteration"]) > SKIP_ITERATIONS]
    index = {w: i for i, w in enumerate(ids)}
    seconds: list[list[float]] = [[] for _ in ids]
    for r in reports:
        for t in r["timings"]:
            seconds[index[int(t["worker_id"])]].append(float(t["seconds"]))
    return {
        "wall_s": statistics.median(float(r["wall_seconds"]) for r in reports),
        "decode_s": statistics.median(float(r.get("decode_seconds", 0.0)) for r in reports),
        "used": statistics.median(len(r.get("used_workers", [])) for r in reports),
        "late": statistics.mean(len(r.get("late_workers", [])) for r in reports),
        "promoted": statistics.mean(len(r.get("promoted_workers", [])) for r in reports),
        "worker_median_s": [statistics.median(x) if x else math.nan for x in seconds],
    }


def _fit_dict(fit: WorkerFit) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(fit).items()}


def format_table(result: dict[str, Any]) -> str:
    layout = result["layout"]
    lines = [
        f"{layout['n']} worker hosts: {layout['n'] - layout['slow_hosts']} at {layout['fast_cpu']:g}% of a core, "
        f"{layout['slow_hosts']} at {layout['slow_cpu']:g}%; {layout['delayed']} of the fast with Exp delays of mean"
        f" {layout['delay_mean'] * 1e3:g} ms; master {layout['master_cpu']:g}%, links {layout['master_mbit']:g}/"
        f"{layout['worker_mbit']:g} Mbit/s; p = {result['p']}, {result['num_samples']} samples; probe "
        f"{result['probe_iterations']} iterations; {result['iterations']} iterations x {result['rounds']} rounds",
        "code index -> host: " + " ".join(f"{i}:{r}" for i, r in enumerate(result["order"])),
        f"{'configuration':<30} {'pred ms':>8} {'5-95% ms':>13} {'meas ms':>8} {'rounds ms':>17} {'median':>7}"
        f" {'meas/pred':>9} {'rank p/m':>8} {'thr ms':>6}  load",
    ]
    for e in result["summary"]:
        rank = f"{e['predicted_rank'] if e['predicted_rank'] is not None else '-'}/{e['measured_rank']}"
        lines.append(
            f"{e['system'] + (' *' if e['recommended'] else ''):<30} {e['predicted_s'] * 1e3:>8.1f}"
            f" {e['predicted_low_s'] * 1e3:>6.1f}-{e['predicted_high_s'] * 1e3:<6.1f}"
            f" {e['measured_s'] * 1e3:>8.1f} {min(e['rounds_s']) * 1e3:>8.1f}-{max(e['rounds_s']) * 1e3:<8.1f}"
            f" {e['median_period_s'] * 1e3:>7.1f} {e['ratio']:>9.2f} {rank:>8} {e['worker_throttled_s'] * 1e3:>6.1f}"
            f"  {'/'.join(f'{x:.1f}' for x in e['loads'])}"
        )
    v = result["verdict"]
    lines += [
        "(* the recommendation; pred: the planner's mean s/iteration and its bootstrap interval; meas: median over"
        " rounds of each job's mean time between iterations, rounds: min-max of those; median: median period;"
        " thr: ms per iteration the CPU quota held back the most throttled worker host; load: 1-min loadavg"
        " before each job)",
        f"recommendation measured/predicted = {v['ratio']:.3f}: within {v['tolerance']:.0%}: {v['within_tolerance']}",
    ]
    if "best_alternative" in v:
        lines.append(
            f"against the best measured alternative ({v['best_alternative']}): x{v['versus_best']:.3f}; no slower"
            f" strictly: {v['no_slower_strict']}; within its spread over rounds: {v['no_slower_within_spread']}"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    entries = [e for e in result["summary"] if e["predicted_rank"] is not None]
    with figure(path, figsize=(7.5, 6), dpi=100) as ax:
        for e in entries:
            x, y = e["predicted_s"] * 1e3, e["measured_s"] * 1e3
            ax.errorbar(
                x, y,
                # a percentile bootstrap's interval need not hold the full history's point estimate: clamp the bars
                xerr=[[max(0.0, x - e["predicted_low_s"] * 1e3)], [max(0.0, e["predicted_high_s"] * 1e3 - x)]],
                yerr=[[max(0.0, y - min(e["rounds_s"]) * 1e3)], [max(0.0, max(e["rounds_s"]) * 1e3 - y)]],
                marker="*" if e["recommended"] else "o", markersize=14 if e["recommended"] else 7, capsize=3,
                label=f"{e['system']} (rank {e['predicted_rank']}/{e['measured_rank']})",
            )  # fmt: skip
        values = [v * 1e3 for e in entries for v in (e["predicted_s"], e["measured_s"], *e["rounds_s"])]
        low, high = 0.8 * min(values), 1.2 * max(values)
        ax.plot([low, high], [low, high], "k-", lw=0.8, label="measured = predicted")
        ax.fill_between([low, high], [low * 0.85, high * 0.85], [low * 1.15, high * 1.15], color="grey", alpha=0.15,
                        label="within 15 %")  # fmt: skip
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("predicted ms per iteration (mean; bootstrap 5-95 %)")
        ax.set_ylabel("measured ms per iteration (median of job means; rounds min-max)")
        layout = result["layout"]
        ax.set_title(
            f"gradcode plan on {layout['n']} heterogeneous hosts ({layout['slow_hosts']} at {layout['slow_cpu']:g}%,"
            f" {layout['delayed']} delayed)\nrank predicted/measured; load {min(result['load_range']):.1f}-"
            f"{max(result['load_range']):.1f}",
            fontsize=10,
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)


def run(
    layout: Layout | None = None, *, probe_iterations: int = 30, iterations: int = 20, rounds: int = 3, top: int = 4,
    bootstrap: int = 10, num_samples: int = NUM_SAMPLES, features: int = NUM_FEATURES, out: Path = RESULTS,
    histories: Path | None = None, leave_out: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Build the testbed, probe, plan, measure the ranked configurations in interleaved rounds; print, save and
    return the result; ``histories``: a directory to copy every job's history and spec into; ``leave_out``: the
    plan also considers flat codes leaving that many of the slowest hosts idle."""
    layout = layout or Layout()
    if probe_iterations < 5 or iterations < 5:
        raise ValueError(f"probe_iterations and iterations must be >= 5, not {probe_iterations}, {iterations}.")
    if rounds < 1 or top < 1 or bootstrap < 1:
        raise ValueError(f"rounds, top and bootstrap must be >= 1, not {rounds}, {top}, {bootstrap}.")
    workload = Workload(
        num_samples=num_samples, num_features=features, n=layout.n, iterations=iterations, model="linear",
        dataset="linear", learning_rate=1e-6,
    )  # fmt: skip
    started = time.perf_counter()
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-cluster-plan-") as tmp, Testbed(layout.specs()) as testbed:
        print(f"Testbed: {[(h.role, h.cpu_percent) for h in layout.specs()]}; load {load_start}", flush=True)
        with EmulatedCluster(testbed, Path(tmp) / "cluster", max_features=features) as cluster:
            measured = asyncio.run(
                _measure(cluster, layout, workload, probe_iterations, iterations, rounds, top, bootstrap, leave_out)
            )
            if histories is not None:
                cluster.copy_histories(histories)
        cpu_period_us = testbed.cpu_period_us
    result: dict[str, Any] = {
        "layout": asdict(layout),
        "p": features + 1,
        "num_samples": num_samples,
        "probe_iterations": probe_iterations,
        "iterations": iterations,
        "rounds": rounds,
        "top": top,
        "bootstrap": bootstrap,
        "leave_out": leave_out,
        "cpu_period_us": cpu_period_us,
        "cores": os.cpu_count(),
        **measured,
        "verdict": judge(measured["summary"]),
        "load_range": [j["load"][0] for j in measured["jobs"]],
        "load_start": load_start,
        "load_end": load_average(),
        "seconds": time.perf_counter() - started,
    }
    print()
    print(format_table(result))
    save(result, out, "cluster-plan", lambda path: plot(result, path))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gradcode bench cluster-plan", description=__doc__.splitlines()[0])
    default = Layout()
    parser.add_argument("--n", type=int, default=default.n, help="worker hosts (default: %(default)s)")
    parser.add_argument("--slow-hosts", type=int, default=default.slow_hosts, help="hosts at --slow-cpu")
    parser.add_argument("--fast-cpu", type=float, default=default.fast_cpu, help="%% of a core of the other hosts")
    parser.add_argument("--slow-cpu", type=float, default=default.slow_cpu, help="%% of a core of the slow hosts")
    parser.add_argument("--delayed", type=int, default=default.delayed, help="fast hosts with exponential delays")
    parser.add_argument("--delay-mean", type=float, default=default.delay_mean, help="their mean delay, seconds")
    parser.add_argument("--master-cpu", type=float, default=default.master_cpu, help="%% of a core of the master")
    parser.add_argument("--master-mbit", type=float, default=default.master_mbit, help="the master's link, Mbit/s")
    parser.add_argument("--worker-mbit", type=float, default=default.worker_mbit, help="each worker's link, Mbit/s")
    parser.add_argument("--probe-iterations", type=int, default=30, help="iterations of the probe job")
    parser.add_argument("--iterations", type=int, default=20, help="iterations per measured job")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    parser.add_argument("--top", type=int, default=4, help="configurations of the plan measured (its top ones)")
    parser.add_argument("--bootstrap", type=int, default=10, help="bootstrap resamples for the plan's intervals")
    parser.add_argument("--samples", type=int, default=NUM_SAMPLES, help="samples of the linear model's data")
    parser.add_argument("--features", type=int, default=NUM_FEATURES, help="its features (p = features + 1)")
    parser.add_argument("--quick", action="store_true", help="n = 4, small data, 1 round, top 2: a smoke run")
    parser.add_argument("--histories", type=Path, default=None, help="copy every job's history here (diagnosis)")
    parser.add_argument(
        "--leave-out", type=int, default=0, help="the plan also considers flat codes leaving this many of the slowest "
        "hosts idle (gradcode plan --leave-out)",
    )  # fmt: skip
    add_out_argument(parser, "cluster-plan")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        check_available()
    except TestbedUnavailableError as error:
        print(f"gradcode bench cluster-plan: {error}", file=sys.stderr)
        return 2
    if args.quick:
        quick = Layout(n=4, slow_hosts=1, fast_cpu=30, slow_cpu=10, delayed=1, delay_mean=0.03)
        run(quick, probe_iterations=8, iterations=6, rounds=1, top=2, bootstrap=2, num_samples=2000, out=args.out)
        return 0
    layout = Layout(
        n=args.n, slow_hosts=args.slow_hosts, fast_cpu=args.fast_cpu, slow_cpu=args.slow_cpu, delayed=args.delayed,
        delay_mean=args.delay_mean, master_cpu=args.master_cpu, master_mbit=args.master_mbit,
        worker_mbit=args.worker_mbit,
    )  # fmt: skip
    run(
        layout, probe_iterations=args.probe_iterations, iterations=args.iterations, rounds=args.rounds, top=args.top,
        bootstrap=args.bootstrap, num_samples=args.samples, features=args.features, out=args.out,
        histories=args.histories, leave_out=args.leave_out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
