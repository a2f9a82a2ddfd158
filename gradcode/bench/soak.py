"""Does the master's memory level off over a long run of back-to-back jobs?

    python -m gradcode.bench.soak [--minutes 10] [--workers 4] [--quick] [--out DIR]

A master (``--metrics-port``) and ``--workers`` worker processes on loopback run small jobs back to
back (softmax regression on the digits data, ``cyclic`` with s = 1, 20 iterations, one worker 50 ms
slow) for ``--minutes``. After every job the master's resident memory is read from its own
``/metrics`` (``process_resident_memory_bytes``) with the number of jobs it holds
(``gradcode_jobs``), so the figure is what an operator's Prometheus would see.

Prints the resident memory at each tenth of the run and the growth per 100 jobs over the first and
the second half (a master that levels off grows much less in the second half), and saves
``soak.json`` and ``soak.png`` in ``docs/results/`` (or ``--out``) with ``/proc/loadavg`` before
and after. ``--quick`` is a smoke run of a few jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gradcode.bench.output import add_out_argument, figure, free_port, load_average, save
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec

JOB_ITERATIONS = 20


def scrape(port: int) -> dict[str, float]:
    """The master's resident memory and the jobs it holds (all states), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = {"rss_bytes": 0.0, "jobs_held": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_resident_memory_bytes":
                values["rss_bytes"] = sample.value
            elif sample.name == "gradcode_jobs":
                values["jobs_held"] += sample.value
    return values


async def _soak(
    master: str, metrics_port: int, num_workers: int, seconds: float, max_jobs: int
) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    spec_args: dict[str, Any] = {
        "scheme": "cyclic", "n": num_workers, "s": 1, "iterations": JOB_ITERATIONS, "optimizer": "gd",
        "straggler": "fixed", "straggler_params": {"delay_seconds": 0.05, "workers": [0]},
    }  # fmt: skip
    async with GradcodeClient(master) as client:
        samples.append({"job": 0, "seconds": 0.0, **scrape(metrics_port)})
        job = 0
        while time.monotonic() - started < seconds and job < max_jobs:
            job += 1
            info, _ = await client.run(build_job_spec(**spec_args), check=True)
            samples.append({"job": job, "seconds": time.monotonic() - started, **scrape(metrics_port)})
            del info
    return samples


def growth_per_100_jobs(samples: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """Resident-memory growth (bytes per 100 jobs) over the first and the second half of the jobs."""
    jobs = [s for s in samples if s["job"] > 0]
    if len(jobs) < 4:
        return float("nan"), float("nan")
    half = len(jobs) // 2
    first, second = jobs[: half + 1], jobs[half:]

    def slope(part: Sequence[dict[str, Any]]) -> float:
        grown = float(part[-1]["rss_bytes"]) - float(part[0]["rss_bytes"])
        return 100 * grown / max(1, int(part[-1]["job"]) - int(part[0]["job"]))

    return slope(first), slope(second)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few jobs")
    add_out_argument(parser, "soak")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error(f"--workers must be at least 2 (cyclic with s = 1), not {args.workers}.")
    seconds, max_jobs = (60.0, 4) if args.quick else (args.minutes * 60, 10**9)
    load_before = load_average()
    metrics_port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="gradcode-soak-") as tmp,
        LocalCluster(args.workers, run_dir=Path(tmp), master_args=["--metrics-port", str(metrics_port)]) as cluster,
    ):
        samples = asyncio.run(_soak(cluster.master_address, metrics_port, args.workers, seconds, max_jobs))
    load_after = load_average()

    first_half, second_half = growth_per_100_jobs(samples)
    print(f"Master memory over {samples[-1]['job']} back-to-back jobs ({samples[-1]['seconds']:.0f} s, "
          f"{args.workers} workers, {JOB_ITERATIONS} iterations each); load {load_before} -> {load_after}")  # fmt: skip
    print(f"{'job':>6} {'seconds':>8} {'RSS MiB':>8} {'jobs held':>9}")
    picks = sorted({round(i * (len(samples) - 1) / 10) for i in range(11)})
    for s in (samples[i] for i in picks):
        print(f"{s['job']:>6} {s['seconds']:>8.0f} {s['rss_bytes'] / 2**20:>8.1f} {s['jobs_held']:>9.0f}")
    print(f"growth per 100 jobs: first half {first_half / 2**20:.1f} MiB, second half {second_half / 2**20:.1f} MiB")
    median_rss = statistics.median(s["rss_bytes"] for s in samples) / 2**20
    print(f"median RSS {median_rss:.1f} MiB")

    result = {
        "quick": args.quick, "workers": args.workers, "job_iterations": JOB_ITERATIONS, "samples": samples,
        "growth_per_100_jobs_bytes": {"first_half": first_half, "second_half": second_half},
        "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count(),
    }  # fmt: skip
    save(result, args.out, "soak", lambda path: _plot(samples, path, load_before, load_after))
    return 0


def _plot(samples: Sequence[dict[str, Any]], path: Path, load_before: list[float], load_after: list[float]) -> None:
    with figure(path, figsize=(8, 4), dpi=110) as ax:
        ax.plot([s["job"] for s in samples], [s["rss_bytes"] / 2**20 for s in samples], marker=".", label="master RSS")
        load = f"load {load_before} → {load_after}"
        ax.set(
            xlabel="jobs finished", ylabel="resident memory (MiB)", title=f"Master memory, back-to-back jobs ({load})"
        )
        held = ax.twinx()
        held.plot([s["job"] for s in samples], [s["jobs_held"] for s in samples], color="tab:gray", alpha=0.5)
        held.set_ylabel("jobs held by the master", color="tab:gray")
        ax.grid(alpha=0.3)


if __name__ == "__main__":
    sys.exit(main())
