"""What the consistency policies (``JobSpec.integrity``: off, detect, locate) cost in iteration time.

    python -m gradcode.bench.integrity [--rounds 3] [--iterations 15] [--quick] [--out DIR]

One master and six worker processes on loopback (a :class:`~gradcode.client.launch.LocalCluster`)
train softmax regression on the digits data with the cyclic code, n = 6, s = 2, gradient descent, all
workers honest, under each straggler model below. Every (model, policy) job runs once per round and
the policies take turns within each model (off, detect, locate, then detect, locate, off, ...), so a
change in the machine's load hits them alike. The figure of a job is the median ``wall_seconds`` of
its iterations after the first; the table quotes the median over rounds, its ratio to ``off``, how
many consistency relations were checked per iteration, and the 1-minute ``/proc/loadavg`` read
before each of those jobs (median). Saves ``integrity.json`` and ``integrity.png`` in
``docs/results/`` (or ``--out``). ``--quick`` is a smoke run.

What to expect: ``off`` decodes from the first n - s = 4 answers; ``detect`` waits for a fifth (one
relation); ``locate`` on honest messages stops there too when that relation involves every message
in hand (it does for the cyclic code), so both pay the wait for the fifth-fastest worker instead of
the fourth. Under straggler models that delay s workers by a lot, that is the whole straggler delay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.output import add_out_argument, figure, load_average, save
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec

START_TIMEOUT = 120.0
POLICIES = ("off", "detect", "locate")
N, S = 6, 2
STRAGGLERS: dict[str, dict[str, Any]] = {
    "none": {},
    "fixed": {"delay_seconds": 0.1, "every_iteration_random": True, "count": S, "num_workers": N},
    "shifted_exponential": {"shift": 0.005, "rate": 50.0},
    "pareto": {"shape": 1.5, "scale": 0.01},
}
"""Delay models (common.sim.stragglers) and their parameters: none; s random workers 100 ms slow every
iteration (Tandon et al., Fig. 4); 5 ms + Exp(mean 20 ms) per worker; Pareto with t0 = 10 ms, shape 1.5."""


async def _job(client: GradcodeClient, straggler: str, policy: str, iterations: int, seed: int) -> dict[str, Any]:
    spec = build_job_spec(
        scheme="cyclic", n=N, s=S, optimizer="gd", iterations=iterations, straggler=straggler,
        straggler_params=STRAGGLERS[straggler], straggler_seed=seed, integrity=policy,
    )  # fmt: skip
    load = load_average()
    info, reports = await client.run(spec)
    walls = [r.wall_seconds for r in reports[1:]] or [r.wall_seconds for r in reports]
    return {
        "straggler": straggler,
        "policy": policy,
        "seed": seed,
        "loadavg": load,
        "median_wall_s": statistics.median(walls),
        "checks": statistics.mean(r.consistency_checks for r in reports),
        "exact": all(r.exact for r in reports),
        "worst_error_bound": max(r.error_bound for r in reports),
        "suspects": sorted({w for r in reports for w in r.suspect_workers}),
        "job_id": info.job_id,
    }


async def _experiments(rounds: int, iterations: int, run_dir: Path) -> list[dict[str, Any]]:
    cluster = LocalCluster(N, run_dir=run_dir)
    cluster.start(START_TIMEOUT)
    rows = []
    try:
        async with GradcodeClient(cluster.master_address) as client:
            await client.wait_ready(START_TIMEOUT)
            for r in range(rounds):
                for m, straggler in enumerate(STRAGGLERS):
                    shift = (r + m) % len(POLICIES)
                    for policy in POLICIES[shift:] + POLICIES[:shift]:  # interleaved, rotated each time
                        row = await _job(client, straggler, policy, iterations, seed=r)
                        row["round"] = r
                        rows.append(row)
                        print(
                            f"round {r} {straggler:>19} {policy:>6}: {row['median_wall_s'] * 1e3:7.1f} ms/iteration, "
                            f"{row['checks']:.2f} checks, load {row['loadavg'][0]:.2f}",
                            flush=True,
                        )
    finally:
        cluster.stop()
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (straggler model, policy): median over rounds, ratio to ``off``, checks, load, exactness."""
    out = []
    for straggler in STRAGGLERS:
        base = statistics.median(
            r["median_wall_s"] for r in rows if r["straggler"] == straggler and r["policy"] == "off"
        )
        for policy in POLICIES:
            mine = [r for r in rows if r["straggler"] == straggler and r["policy"] == policy]
            median = statistics.median(r["median_wall_s"] for r in mine)
            out.append({
                "straggler": straggler,
                "policy": policy,
                "median_wall_s": median,
                "ratio_to_off": median / base if base > 0 else float("nan"),
                "checks_per_iteration": statistics.mean(r["checks"] for r in mine),
                "loadavg_1min": statistics.median(r["loadavg"][0] for r in mine),
                "all_exact": all(r["exact"] for r in mine),
                "jobs": len(mine),
            })  # fmt: skip
    return out


def format_table(summary: list[dict[str, Any]]) -> str:
    lines = [
        f"{'straggler model':>19} {'policy':>7} {'ms/iter':>8} {'vs off':>7} {'checks':>7} {'load':>6} {'exact':>6}",
    ]
    for e in summary:
        lines.append(
            f"{e['straggler']:>19} {e['policy']:>7} {e['median_wall_s'] * 1e3:8.1f} {e['ratio_to_off']:7.2f} "
            f"{e['checks_per_iteration']:7.2f} {e['loadavg_1min']:6.2f} {e['all_exact']!s:>6}"
        )
    lines.append("(median over rounds of each job's median iteration time; load = 1-min loadavg before the jobs)")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    summary = results["summary"]
    models = list(STRAGGLERS)
    width = 0.8 / len(POLICIES)
    with figure(path, figsize=(8, 4.5), dpi=110) as ax:
        for i, policy in enumerate(POLICIES):
            values = [next(e for e in summary if e["straggler"] == m and e["policy"] == policy) for m in models]
            xs = np.arange(len(models)) + (i - 1) * width
            ax.bar(xs, [v["median_wall_s"] * 1e3 for v in values], width, label=policy)
            for x, v in zip(xs, values, strict=True):
                ax.text(x, v["median_wall_s"] * 1e3, f"{v['ratio_to_off']:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(np.arange(len(models)), models)
        ax.set_ylabel("median ms per iteration")
        loads = [e["loadavg_1min"] for e in summary]
        load = f"load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cpus"
        ax.set_title(f"Consistency policies, cyclic n={N}, s={S} ({load})")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)


def run(*, rounds: int, iterations: int, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-integrity-") as tmp:
        rows = asyncio.run(_experiments(rounds, iterations, Path(tmp)))
    summary = summarise(rows)
    results = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "code": "cyclic",
            "n": N,
            "s": S,
            "model": "softmax",
            "dataset": "digits",
            "iterations": iterations,
            "rounds": rounds,
            "stragglers": STRAGGLERS,
        },
        "summary": summary,
        "raw": rows,
        "seconds": time.perf_counter() - started,
    }
    print()
    print(format_table(summary))
    save(results, out, "integrity", lambda path: plot(results, path))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.integrity", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="jobs per (straggler model, policy)")
    parser.add_argument("--iterations", type=int, default=15, help="iterations per job")
    parser.add_argument("--quick", action="store_true", help="one round of 3 iterations: a smoke run")
    add_out_argument(parser, "integrity")
    args = parser.parse_args(argv)
    rounds, iterations = (1, 3) if args.quick else (args.rounds, args.iterations)
    run(rounds=rounds, iterations=iterations, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
