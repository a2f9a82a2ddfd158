"""The wide model (n = 16, p = 1e5) against the floor of the same work on this machine.

    python -m gradcode.bench.wide [--n 16] [--rounds 3] [--iterations 200] [--quick] [--out DIR]

The issue's target for the per-iteration overhead is 5 ms plus one message transfer at n = 16 workers and
p = 1e5 parameters (linear regression on 40 samples: one worker's gradient takes well under a millisecond
alone). Every process runs on this machine's cores, so an iteration also pays for what the n + 1 processes do
together. Three jobs (one worker with five samples: the transfer; uncoded and cyclic with s = 1 on n
workers), each on three systems, in rounds interleaved job by job and system by system (A, B, C, A, B, C):

* ``gradcode``: a real job on a :class:`~gradcode.client.launch.LocalCluster` (master defaults: shared memory
  for the workers on its host, headers on their links), no stragglers; the CPU the master and the workers used
  per iteration (``/proc``);
* ``bare``: the same data, partitions, code, decode and step in n + 1 processes that do nothing else
  (:class:`gradcode.bench.floor.BarePool`: shared-memory files and a byte on a pipe): the floor of any design
  with one process per worker on this machine;
* ``arith/cores``: every worker's messages, the decode and the step computed one after the other in one
  process (:meth:`~gradcode.bench.floor.BarePool.arithmetic`), over the machine's cores: the floor of any design.

Figures are medians over rounds of each job's median period (iteration start to iteration start).
``overhead`` is the issue's measure: the period less one worker's gradient computed alone (hot caches); one
transfer is the bare one-worker job's overhead (the model down and the message up through shared memory, the
decode and the step). The 1-minute ``/proc/loadavg`` is read before every job. Prints the table and saves
``wide.json`` and ``wide.png`` in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradcode.bench.floor import BareJob, BarePool
from gradcode.bench.output import (
    RESULTS,
    SKIP_ITERATIONS,
    add_out_argument,
    cluster_pids,
    figure,
    job_medians,
    load_average,
    run_with_cpu,
    save,
    up_workers,
)
from gradcode.bench.transport import WIDE, Workload, worker_compute_time
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec

__all__ = ["main", "run"]

LEARNING_RATE = 1e-5
"""Small enough that 40 samples of 1e5 features do not diverge in a few hundred Nesterov steps."""
TARGET_S = 0.005
START_TIMEOUT = 120.0
SYSTEMS = ("gradcode", "bare", "arithmetic")
ONE_TRANSFER = dataclasses.replace(WIDE, name="linear regression, p = 1e5, 5 samples", num_samples=5)
"""The one-worker job of the transfer: the same p, almost no gradient."""


@dataclass(frozen=True)
class Configuration:
    """One row of the table: a named job."""

    name: str
    job: BareJob

    @property
    def workload(self) -> Workload:
        """The job's model and data, whose one worker's gradient alone is subtracted for the overhead."""
        job = self.job
        return Workload(self.name, job.model, job.dataset, job.num_samples, job.num_features)


def configurations(n: int) -> list[Configuration]:
    """One worker (the transfer of the target), then uncoded and cyclic (s = 1) on n workers."""

    def job(scheme: str, n: int, s: int, workload: Workload) -> BareJob:
        return BareJob(
            scheme, n, s, workload.model, workload.dataset, workload.num_samples, workload.num_features,
            learning_rate=LEARNING_RATE,
        )  # fmt: skip

    return [
        Configuration("1 worker", job("uncoded", 1, 0, ONE_TRANSFER)),
        Configuration("uncoded", job("uncoded", n, 0, WIDE)),
        Configuration("cyclic", job("cyclic", n, 1, WIDE)),
    ]


async def _gradcode(client: GradcodeClient, cluster: LocalCluster, job: BareJob, iterations: int) -> dict[str, Any]:
    spec = build_job_spec(
        scheme=job.scheme, n=job.n, s=job.s, iterations=iterations, seed=job.seed, model=job.model,
        dataset=job.dataset, num_samples=job.num_samples, num_features=job.num_features,
        learning_rate=job.learning_rate,
    )  # fmt: skip
    load = load_average()[0]
    reports, cpu_master, cpu_workers = await run_with_cpu(client, spec, cluster_pids(cluster))
    medians = job_medians(reports)
    return {
        "period_s": medians["period_s"],
        "wall_s": medians["wall_s"],
        "cpu_master_s": cpu_master,
        "cpu_workers_s": cpu_workers,
        "load": load,
    }


def _bare(pool: BarePool, iterations: int) -> dict[str, Any]:
    load = load_average()[0]
    return {**pool.run(iterations, SKIP_ITERATIONS), "load": load}


def _arithmetic(pool: BarePool, iterations: int) -> dict[str, Any]:
    load = load_average()[0]
    return {"period_s": pool.arithmetic(iterations, SKIP_ITERATIONS), "load": load}


async def _measure(n: int, rounds: int, iterations: int, run_dir: Path) -> list[dict[str, Any]]:
    """Every configuration on every system once per round, in turn; medians over the rounds."""
    configs = configurations(n)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {c.name: {s: [] for s in SYSTEMS} for c in configs}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(n, run_dir=run_dir))
        pools = {c.name: stack.enter_context(BarePool(c.job)) for c in configs}
        async with GradcodeClient(cluster.master_address) as client:
            await client.wait_ready(START_TIMEOUT)
            await up_workers(client, n, START_TIMEOUT)
            for _ in range(rounds):
                for c in configs:
                    samples[c.name]["gradcode"].append(await _gradcode(client, cluster, c.job, iterations))
                    samples[c.name]["bare"].append(_bare(pools[c.name], iterations))
                    samples[c.name]["arithmetic"].append(_arithmetic(pools[c.name], iterations))
    cores = os.cpu_count() or 1
    rows = []
    for c in configs:
        compute = worker_compute_time(c.job.n, c.job.s, 50, c.workload)
        row: dict[str, Any] = {"name": c.name, "n": c.job.n, "s": c.job.s, "compute_alone_s": compute}
        for system, runs in samples[c.name].items():
            row[system] = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "load"}
            row[system]["loads"] = [r["load"] for r in runs]
            row[system]["runs"] = runs
        row["arithmetic"]["period_s"] /= cores  # all of the arithmetic, spread over the cores
        for system in SYSTEMS:
            row[system]["overhead_s"] = row[system]["period_s"] - compute
        row["gradcode_over_bare"] = row["gradcode"]["period_s"] / row["bare"]["period_s"]
        row["gradcode_over_arithmetic"] = row["gradcode"]["period_s"] / row["arithmetic"]["period_s"]
        rows.append(row)
    return rows


def _format(result: dict[str, Any]) -> str:
    ms = 1e3
    lines = [
        f"The wide model: p = {result['p']}, {result['iterations']} iterations per job, {result['rounds']} interleaved"
        f" rounds, {result['cores']} cores (medians over rounds, ms per iteration; load = 1-minute, before each)",
        f"{'job':>9} {'n':>3} {'system':>11} {'period':>7} {'CPU master':>11} {'CPU workers':>12} {'overhead':>9}"
        f" {'load':>16}",
    ]
    for row in result["rows"]:
        for system in SYSTEMS:
            figure = row[system]
            cpu = "".join(
                f" {figure[key] * ms:>{width}.2f}" if key in figure else " " * (width + 1)
                for key, width in (("cpu_master_s", 11), ("cpu_workers_s", 12))
            )
            loads = "/".join(f"{x:.1f}" for x in figure["loads"])
            lines.append(
                f"{row['name']:>9} {row['n']:>3} {'arith/cores' if system == 'arithmetic' else system:>11}"
                f" {figure['period_s'] * ms:>7.2f}{cpu} {figure['overhead_s'] * ms:>9.2f} {loads:>16}"
            )
        lines.append(
            f"{'':>13} gradcode = {row['gradcode_over_bare']:.2f} x bare, {row['gradcode_over_arithmetic']:.2f} x"
            f" arith/cores; one gradient alone {row['compute_alone_s'] * ms:.2f} ms"
        )
    lines += [
        f"Target at n = {result['n']}: overhead <= 5 ms + one transfer = {result['target_s'] * ms:.2f} ms"
        f" (one transfer: the bare 1-worker overhead, {result['one_transfer_s'] * ms:.2f} ms)",
        "(period = iteration to iteration; overhead = period - one worker's gradient computed alone, hot caches;",
        " bare = the same data, code, decode and step in n + 1 processes that do nothing else; arith/cores = all",
        " of the iteration's arithmetic in one process, over the cores: no design on this machine is faster)",
    ]
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    labels = {"gradcode": "gradcode", "bare": "bare processes", "arithmetic": "arithmetic / cores"}
    rows = result["rows"]
    with figure(path, figsize=(7, 4), dpi=120) as ax:
        width = 0.25
        for i, system in enumerate(SYSTEMS):
            xs = [x + (i - 1) * width for x in range(len(rows))]
            ax.bar(xs, [row[system]["overhead_s"] * 1e3 for row in rows], width, label=labels[system])
        highest = max(row[system]["overhead_s"] for row in rows for system in SYSTEMS)
        ax.set_ylim(0, 1.45e3 * max(highest, result["target_s"]))  # room above the bars for the legend
        target = f"target at n = {result['n']}: 5 ms + one transfer"
        ax.axhline(result["target_s"] * 1e3, color="black", linestyle="--", label=target)
        ax.set_xticks(range(len(rows)), [f"{row['name']} (n = {row['n']})" for row in rows])
        ax.set_ylabel("overhead, ms per iteration")
        ax.set_title(f"p = {result['p']}: gradcode's overhead against the floor of the same work")
        ax.legend()


def run(*, n: int = 16, rounds: int = 3, iterations: int = 200, out: Path = RESULTS) -> dict[str, Any]:
    """Run the benchmark, print the table, save JSON and PNG under ``out``; return the results."""
    if n < 2:
        raise ValueError(f"n must be at least 2 (cyclic with s = 1 needs two workers), not {n}.")
    if rounds < 1 or iterations <= SKIP_ITERATIONS + 1:
        raise ValueError(f"rounds must be >= 1 and iterations > {SKIP_ITERATIONS + 1}, not {rounds} and {iterations}.")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-wide-") as tmp:
        rows = asyncio.run(_measure(n, rounds, iterations, Path(tmp)))
    one_transfer = rows[0]["bare"]["overhead_s"]
    result = {
        "n": n,
        "p": WIDE.num_features + 1,
        "iterations": iterations,
        "rounds": rounds,
        "cores": os.cpu_count() or 1,
        "one_transfer_s": one_transfer,
        "target_s": TARGET_S + one_transfer,
        "rows": rows,
        "machine": platform.processor() or platform.machine(),
        "load_average": load_average(),
        "seconds": time.perf_counter() - started,
    }
    print(_format(result))
    save(result, out, "wide", lambda path: _plot(result, path))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.wide", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="workers (16: the issue's target)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    parser.add_argument("--iterations", type=int, default=200, help="iterations per job")
    parser.add_argument("--quick", action="store_true", help="n = 4, one round of 10 iterations: a smoke run")
    add_out_argument(parser, "wide")
    args = parser.parse_args(argv)
    if args.quick:
        run(n=4, rounds=1, iterations=10, out=args.out)
    else:
        run(n=args.n, rounds=args.rounds, iterations=args.iterations, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
