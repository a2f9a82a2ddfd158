"""Exact under failures? Back-to-back verified jobs while workers are frozen and killed.

    python -m gradcode.bench.chaos [--minutes 5] [--workers 8] [--quick] [--out DIR]

A master and ``--workers`` worker processes on loopback run small jobs back to back (softmax regression on
the digits data, 30 iterations each, the schemes in turn: cyclic, fractional, Reed–Solomon and binary with
n = 6, s = 2, a CodedReduce tree of six nodes, n = 2, s = 1, L = 2, and fractional again with the model relayed
among the workers) with verify on: every iteration's decoded gradient is compared with the centralized one, and
a wrong one that claims to be exact fails the job. Every other worker process gets a machine id of its own, so it
is reached over the network (and can relay the model) while the others share the master's memory.
Meanwhile, every 0.5–2 s, a random live worker is either frozen (SIGSTOP for 0.5–2 s, then SIGCONT) or killed
(SIGKILL) and restarted at its address (a new process, which registers and is reloaded by the jobs that held
it; on a new port if its old one is taken). One worker at a time is frozen or down: at most the s of every job.

Prints the jobs, iterations, failed jobs, iterations reported inexact, the worst verified relative error,
the freezes and kills, with ``/proc/loadavg`` before and after, and saves ``chaos.json`` and ``chaos.png``
(the worst verified error of each job) in ``docs/results/`` (or ``--out``). ``--quick`` is a smoke run of
a few jobs. Exit status 0 when every job succeeded and every iteration was exact, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradcode.bench.output import add_out_argument, figure, load_average, save, up_workers
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.exceptions import JobFailedError

__all__ = ["main"]

SCHEMES = ("cyclic", "fractional", "reed_solomon", "binary", "tree", "fractional-relay")
N, S = 6, 2
TREE = {"n": 2, "s": 1, "L": 2}
"""The tree's code (``coded_reduce``): two first-layer nodes with two children each, six workers in all."""
JOB_ITERATIONS = 30
START_TIMEOUT = 60.0
PAUSE = (0.5, 2.0)
"""Seconds between two failures, and how long a frozen worker stays frozen (uniform)."""


@dataclass
class Tally:
    """What the run saw."""

    jobs: int = 0
    failed_jobs: list[str] = field(default_factory=list)
    iterations: int = 0
    inexact: int = 0
    job_errors: list[float] = field(default_factory=list)
    """The worst verified relative error of each job that succeeded."""
    freezes: int = 0
    kills: int = 0
    replacements_failed: int = 0

    @property
    def worst_error(self) -> float:
        return max(self.job_errors, default=0.0)


def _inflict(cluster: LocalCluster, tally: Tally, stop: threading.Event, seed: int) -> None:
    """Freeze or kill a random live worker every PAUSE seconds until ``stop``; a killed one is replaced."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(*PAUSE)):
        live = [w for w in cluster.workers if w.alive]
        if not live:
            continue
        victim = rng.choice(live)
        if rng.random() < 0.5:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.process.pid, signal.SIGSTOP)
                tally.freezes += 1
                stop.wait(rng.uniform(*PAUSE))
                os.kill(victim.process.pid, signal.SIGCONT)
            continue
        victim.kill()
        victim.stop()  # already dead: this only closes its log and output pipe
        tally.kills += 1
        cluster.workers.remove(victim)
        for listen in (victim.address, None):  # its old address, else a new port
            try:
                cluster.add_worker(listen=listen).wait_ready(START_TIMEOUT)
                break
            except RuntimeError:
                cluster.workers.pop().stop()
        else:
            tally.replacements_failed += 1


async def _jobs(cluster: LocalCluster, workers: int, seconds: float, max_jobs: int, tally: Tally) -> None:
    async with GradcodeClient(cluster.master_address) as client:
        await client.wait_ready(START_TIMEOUT)
        await up_workers(client, workers, START_TIMEOUT)
        stop = threading.Event()
        chaos = threading.Thread(target=_inflict, args=(cluster, tally, stop, 1), daemon=True)
        chaos.start()
        try:
            started = time.monotonic()
            while time.monotonic() - started < seconds and tally.jobs < max_jobs:
                scheme = SCHEMES[tally.jobs % len(SCHEMES)]
                spec = build_job_spec(
                    **_code(scheme), n=N, s=S, iterations=JOB_ITERATIONS, verify=True, seed=tally.jobs,
                    deadline_seconds=30.0, wait_for_workers_seconds=30.0,
                )  # fmt: skip
                tally.jobs += 1
                try:
                    _, reports = await client.run(spec)
                except JobFailedError as exc:
                    tally.failed_jobs.append(str(exc))
                    continue
                tally.iterations += len(reports)
                tally.inexact += sum(not r.exact for r in reports)
                tally.job_errors.append(max((r.verify_error for r in reports), default=0.0))
        finally:
            stop.set()
            chaos.join(2 * PAUSE[1] + START_TIMEOUT)


def _code(scheme: str) -> dict[str, Any]:
    """:func:`build_job_spec`'s code arguments for one of :data:`SCHEMES`."""
    if scheme == "tree":
        return {"scheme": "coded_reduce", "code_params": TREE}
    if scheme == "fractional-relay":
        return {"scheme": "fractional", "model_delivery": "relay"}
    return {"scheme": scheme}


def _own_machine_every_other(counter: Iterator[int]) -> Callable[[int], Sequence[str]]:
    """LocalCluster's ``worker_args``: every other worker process (replacements too) a machine id of its own."""
    return lambda i: ["--machine-id", f"chaos-host-{next(counter)}"] if i % 2 else []


def _plot(tally: Tally, path: Path, load: str) -> None:
    with figure(path, figsize=(8, 4), dpi=110) as ax:
        ax.semilogy(range(1, len(tally.job_errors) + 1), [max(e, 1e-18) for e in tally.job_errors], ".")
        ax.set(
            xlabel="job (succeeded)",
            ylabel="worst verified relative error",
            title=f"{tally.freezes} freezes, {tally.kills} kills, {len(tally.failed_jobs)} failed jobs ({load})",
        )
        ax.grid(alpha=0.3)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run jobs")
    parser.add_argument("--workers", type=int, default=8, help=f"worker processes (at least {N})")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few jobs")
    add_out_argument(parser, "chaos")
    args = parser.parse_args(argv)
    if args.workers < N:
        parser.error(f"--workers must be at least {N} (the jobs have n = {N}), not {args.workers}.")
    seconds, max_jobs = (45.0, len(SCHEMES)) if args.quick else (args.minutes * 60, 10**9)
    tally = Tally()
    load_before = load_average()
    with (
        tempfile.TemporaryDirectory(prefix="gradcode-chaos-") as tmp,
        LocalCluster(
            args.workers, run_dir=Path(tmp), worker_args=_own_machine_every_other(itertools.count())
        ) as cluster,
    ):
        asyncio.run(_jobs(cluster, args.workers, seconds, max_jobs, tally))
    load_after = load_average()
    load = f"load {load_before[0]:.1f} -> {load_after[0]:.1f}"
    print(
        f"{tally.jobs} jobs ({', '.join(SCHEMES)}; n = {N}, s = {S}, the tree {TREE}; {JOB_ITERATIONS} iterations,"
        " verified) on"
        f" {args.workers} workers, {tally.freezes} freezes and {tally.kills} kills; {load}"
    )
    print(f"{'iterations':>10} {'failed jobs':>11} {'inexact':>7} {'worst error':>11}")
    print(f"{tally.iterations:>10} {len(tally.failed_jobs):>11} {tally.inexact:>7} {tally.worst_error:>11.1e}")
    for message in tally.failed_jobs[:5]:
        print(f"failed: {message}")
    result = {**asdict(tally), "worst_error": tally.worst_error, "workers": args.workers, "quick": args.quick,
              "loadavg_before": load_before, "loadavg_after": load_after}  # fmt: skip
    save(result, args.out, "chaos", lambda path: _plot(tally, path, load))
    return 0 if not tally.failed_jobs and not tally.inexact else 1


if __name__ == "__main__":
    sys.exit(main())
