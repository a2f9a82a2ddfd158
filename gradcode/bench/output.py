"""What every benchmark shares: where results go, the machine's load, saving JSON beside a PNG (and drawing it),
waiting for a cluster's workers, and a job's medians and CPU."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient
from gradcode.v1 import master_pb2

__all__ = [
    "OOM_KILL_MARK",
    "RESULTS",
    "SKIP_ITERATIONS",
    "add_out_argument",
    "cluster_pids",
    "cpu_seconds",
    "figure",
    "free_port",
    "job_medians",
    "load_average",
    "new_oom_kills",
    "oom_kills",
    "run_with_cpu",
    "save",
    "save_json",
    "steady_periods",
    "up_workers",
]

_CHECKOUT = Path(__file__).resolve().parents[2]
RESULTS = _CHECKOUT / "docs" / "results" if (_CHECKOUT / "pyproject.toml").is_file() else Path("gradcode-results")
"""Default output directory (``--out``): in a checkout ``docs/results`` at its root, beside the committed results
of this project's development machine, outside the import package; where gradcode is installed from a wheel,
``gradcode-results`` in the current directory."""


def benchmark_parser(name: str, doc: str | None, *, quick: str) -> argparse.ArgumentParser:
    """The command line benchmark ``gradcode.bench.name`` starts from: its docstring's first line, ``--quick``
    (``quick`` says what it runs) and ``--out`` (:func:`add_out_argument`: ``name``.json and .png)."""
    parser = argparse.ArgumentParser(prog=f"python -m gradcode.bench.{name}", description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    add_out_argument(parser, name)
    return parser


def quick_or_full_main(
    name: str, doc: str | None, *, quick: str, run: Callable[..., Any], argv: Sequence[str] | None
) -> None:
    """The whole command line of a benchmark that takes only ``--quick`` and ``--out``: parse ``argv``, then
    ``run(quick=..., out=...)``."""
    args = benchmark_parser(name, doc, quick=quick).parse_args(argv)
    run(quick=args.quick, out=args.out)


def add_out_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """The ``--out`` option every benchmark has: where ``name.json`` and ``name.png`` go."""
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"directory for {name}.json and {name}.png (default: {RESULTS})"
    )


SKIP_ITERATIONS = 2
"""First iterations of a job left out of its medians (connection and cache warm-up)."""


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (``/proc/loadavg``), recorded beside every figure."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


OOM_KILL_MARK = "Killed process"
"""What the kernel's OOM killer writes in its log for each process it ends."""


def oom_kills() -> list[str] | None:
    """The kernel's log lines of processes its OOM killer ended (``dmesg``), oldest first; None where the log cannot
    be read (no ``dmesg``, or not permitted). A figure taken while the kernel killed processes is not a figure of
    the system measured: on the emulated cluster, workers ended this way looked like peers gone silent."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line for line in done.stdout.splitlines() if OOM_KILL_MARK in line]


def new_oom_kills(before: Sequence[str] | None, after: Sequence[str] | None) -> list[str] | None:
    """The kills in ``after`` that ``before`` did not hold (None if either could not be read)."""
    if before is None or after is None:
        return None
    seen = set(before)
    return [line for line in after if line not in seen]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def figure(path: Path, *grid: int, dpi: int, **subplots: Any) -> Iterator[Any]:
    """The axes of a matplotlib figure (``plt.subplots(*grid, **subplots)``, off-screen: the Agg backend; an
    axis' ``.figure`` is the figure), written to ``path`` at ``dpi`` when the block ends and closed whatever
    happens: what each benchmark's plot draws in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **subplots)
    try:
        yield axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def save_json(results: Any, path: Path) -> None:
    """Write ``results`` to ``path`` as indented JSON (its folder made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def save(results: Any, out: Path, name: str, plot: Callable[[Path], None]) -> tuple[Path, Path]:
    """Write ``out/name.json`` and draw ``out/name.png`` with ``plot``; print and return both paths."""
    data, figure = out / f"{name}.json", out / f"{name}.png"
    save_json(results, data)
    plot(figure)
    print(f"Saved {data} and {figure}")
    return data, figure


def steady_periods(elapsed: Sequence[float], skip: int = SKIP_ITERATIONS) -> list[float]:
    """Seconds between consecutive iterations (``elapsed`` since the job started), after the first ``skip``."""
    return [b - a for a, b in zip(elapsed[skip:-1], elapsed[skip + 1 :], strict=True)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def up_workers(client: GradcodeClient, count: int, timeout: float) -> list[int]:
    """The pool ids of the master's UP workers, sorted, once ``count`` are UP; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        up = sorted(w.worker_id for w in await client.list_workers() if w.state == master_pb2.WORKER_STATE_UP)
        if len(up) >= count:
            return up
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(up)} of {count} workers registered UP within {timeout:.0f} s")
        await asyncio.sleep(0.05)


def cluster_pids(cluster: LocalCluster) -> list[int]:
    """The master's process id, then the workers'."""
    if cluster.master is None:
        raise RuntimeError("the cluster has no master running")
    return [cluster.master.process.pid, *(w.process.pid for w in cluster.workers)]


async def run_with_cpu(
    client: GradcodeClient, spec: master_pb2.JobSpec, pids: list[int]
) -> tuple[list[master_pb2.IterationReport], float, float]:
    """Run a job; its reports and the CPU seconds per iteration the master (``pids[0]``) and the workers (the
    rest, together) used after the first :data:`SKIP_ITERATIONS` (job loading and warm-up left out)."""
    steady: list[float] = []

    def sample(report: master_pb2.IterationReport) -> None:
        if report.iteration == SKIP_ITERATIONS:
            steady.extend(cpu_seconds(pid) for pid in pids)

    _, reports = await client.run(spec, sample)
    used = [cpu_seconds(pid) - before for pid, before in zip(pids, steady, strict=True)]
    counted = len(reports) - SKIP_ITERATIONS
    return reports, used[0] / counted, sum(used[1:]) / counted


def job_medians(reports: Sequence[master_pb2.IterationReport]) -> dict[str, float]:
    """Medians of one job's reports after the first :data:`SKIP_ITERATIONS`."""
    kept = [r for r in reports if r.iteration > SKIP_ITERATIONS]

    def timing(pick: Callable[[Iterator[float]], float]) -> float:
        return statistics.median(pick(t.seconds for t in r.timings) if r.timings else 0.0 for r in kept)

    return {
        "iterations": len(reports),
        "wall_s": statistics.median(r.wall_seconds for r in kept),
        "decode_s": statistics.median(r.decode_seconds for r in kept),
        "first_s": timing(min),
        "gather_s": timing(max),
        "period_s": statistics.median(steady_periods([r.elapsed_seconds for r in reports])),
        "used_workers": statistics.median(len(r.used_workers) for r in kept),
    }
