"""This checkout's CPU per iteration against another commit's, on ``bench wide``'s jobs or a tree, interleaved.

    python -m gradcode.bench.versus BASE [--job uncoded|cyclic|tree] [--n N] [--pairs 5] [--iterations 400] [--out DIR]

What issue 26's target asks ("master CPU per message in ``gradcode bench wide`` at most 0.6x today's, measured
interleaved with today's code") and what catches a commit that makes the master dearer without anyone noticing
(the suite cannot: this machine is shared). ``BASE`` is any commit of this repository; it is checked out in a
throw-away git worktree, and this side is the checkout this module was imported from, uncommitted changes
included. Each pair runs both sides one after the other, the order swapped every pair (A B, B A, ...): a fresh
:class:`~gradcode.client.launch.LocalCluster` of the side's own code, a 10-iteration warm-up job, then one job of
``--iterations`` on ``bench wide``'s workload (n = 16 workers, p = 1e5, no stragglers;
:func:`gradcode.bench.wide.configurations`), measured by :mod:`gradcode.bench.versus_run`: the ``/proc`` CPU of the
master, of the workers and of the busiest worker per iteration after the first
:data:`~gradcode.bench.output.SKIP_ITERATIONS`, the median period, the 1-minute load before the job. ``--job tree``
runs ``bench cluster``'s CodedReduce tree at ``--n`` (default 24: 20 workers) at p = 10⁶ with the model relayed,
where a parent is the busiest worker and bytes, not messages, cost the CPU. Every job sends each worker the same
requests on both sides, so the master's CPU per message is its CPU per iteration over n and their ratio is the
same. Prints each pair's ratios (this / base) and their median and range; saves ``versus.json`` and ``versus.png``
in ``docs/results/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradcode.bench.cluster import TREES, systems_for, workload_at
from gradcode.bench.output import SKIP_ITERATIONS, add_out_argument, figure, load_average, save, steady_periods
from gradcode.bench.wide import START_TIMEOUT, configurations

__all__ = ["main", "run"]

CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository this module runs from: the side measured against ``BASE``."""
RUN_JOB = Path(__file__).with_name("versus_run.py")
WARMUP_ITERATIONS = 10
RUN_TIMEOUT = 900.0
"""Seconds one side's cluster and jobs may take before the comparison stops with an error."""
FIGURES = ("cpu_master_s", "cpu_workers_s", "cpu_busiest_worker_s", "period_s")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {CHECKOUT}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


TREE_JOB = "tree"
TREE_FEATURES = 999_999
"""The tree job's p = 10⁶ (features + bias): where a parent's and a leaf's bytes, not their messages, cost CPU."""


def _job(name: str, n: int | None, iterations: int) -> dict[str, Any]:
    """``bench wide``'s job ``name`` at ``n`` workers (default 16), or ``tree``: ``bench cluster``'s CodedReduce tree at
    ``n`` (default 24: 4 children per parent, 2 layers, 20 workers) at p = 10⁶, the model relayed; as the fields
    :mod:`versus_run` passes to ``build_job_spec`` (and the master's ``--max-features``)."""
    common = {"iterations": iterations, "warmup": WARMUP_ITERATIONS, "skip": SKIP_ITERATIONS, "timeout": START_TIMEOUT}
    if name == TREE_JOB:
        n = 24 if n is None else n
        if n not in TREES:
            raise ValueError(f"No tree at n = {n}; bench cluster's trees are at n = {sorted(TREES)}.")
        (tree,) = systems_for(n, schemes=("coded_reduce",), deliveries=("relay",))
        workload = workload_at(n, TREE_FEATURES)
        return {
            "scheme": tree.scheme, "code_params": tree.code_params, "n": tree.workers, "s": tree.code_params["s"],
            "seed": workload.seed, "model": workload.model, "dataset": workload.dataset,
            "num_samples": workload.num_samples, "num_features": workload.num_features,
            "learning_rate": workload.learning_rate, "model_delivery": tree.model_delivery,
            "master_args": ["--max-features", str(TREE_FEATURES + 1)], **common,
        }  # fmt: skip
    n = 16 if n is None else n
    jobs = {c.name: c.job for c in configurations(n) if c.job.n == n}
    if name not in jobs:
        raise ValueError(f"No job {name!r} at n = {n}; the jobs are {sorted([*jobs, TREE_JOB])}.")
    job = jobs[name]
    return {
        "scheme": job.scheme, "n": job.n, "s": job.s, "seed": job.seed, "model": job.model, "dataset": job.dataset,
        "num_samples": job.num_samples, "num_features": job.num_features, "learning_rate": job.learning_rate, **common,
    }  # fmt: skip


def _measure(side: Path, job: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One job on a fresh cluster of the code in ``side`` (a checkout's root, first on ``PYTHONPATH``)."""
    env = {**os.environ, "PYTHONPATH": str(side)}
    done = subprocess.run(
        [sys.executable, "-P", str(RUN_JOB), json.dumps({**job, "run_dir": str(run_dir)})],
        env=env, cwd=run_dir.parent, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the job on {side} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    measured = dict(json.loads(lines[-1]))
    if Path(measured["checkout"]) != side.resolve():  # e.g. an install that shadows PYTHONPATH
        raise RuntimeError(f"the job meant for {side} ran the code in {measured['checkout']}")
    measured["period_s"] = statistics.median(steady_periods(measured.pop("elapsed_s"), job["skip"]))
    return measured


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(base: str, *, job_name: str, n: int | None, pairs: int, iterations: int, out: Path) -> dict[str, Any]:
    """Compare this checkout with commit ``base`` on ``bench wide``'s job ``job_name`` at ``n`` workers over ``pairs``
    interleaved pairs of ``iterations``-iteration jobs; print the table, save ``versus.{json,png}`` in ``out``, return
    the results. ValueError (nothing run) for a commit that does not exist or a job it cannot run."""
    if pairs < 1 or iterations < SKIP_ITERATIONS + 3:
        raise ValueError(f"pairs must be >= 1 and iterations >= {SKIP_ITERATIONS + 3}; got {pairs} and {iterations}.")
    job = _job(job_name, n, iterations)
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except ValueError:
        raise ValueError(f"{base!r} names no commit of {CHECKOUT} (give a hash, tag or branch).") from None
    this = {"head": _git("rev-parse", "HEAD"), "changed": bool(_git("status", "--porcelain", "--untracked-files=no"))}
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gradcode-versus-") as tmp:
        worktree = Path(tmp) / "base"
        _git("worktree", "add", "--detach", "--quiet", str(worktree), commit)
        try:
            sides = {"base": worktree, "this": CHECKOUT}
            for pair in range(pairs):
                for side in ("base", "this") if pair % 2 == 0 else ("this", "base"):
                    measured = _measure(sides[side], job, Path(tmp) / f"run-{pair}-{side}")
                    runs.append({"pair": pair, "side": side, **measured})
                    print(_progress(runs[-1]), flush=True)
        finally:
            _git("worktree", "remove", "--force", str(worktree))
    ratios = {f: [_side(runs, p, "this")[f] / _side(runs, p, "base")[f] for p in range(pairs)] for f in FIGURES}
    result = {
        "base": commit, "this": this, "job": job, "pairs": pairs, "runs": runs,
        "ratios": {f: {"pairs": r, **_spread(r)} for f, r in ratios.items()},
        "medians": {
            side: {f: statistics.median(r[f] for r in runs if r["side"] == side) for f in FIGURES}
            for side in ("base", "this")
        },
        "load_average": load_average(), "seconds": time.perf_counter() - started,
    }  # fmt: skip
    print(_format(result))
    save(result, out, "versus", lambda path: _plot(result, path))
    return result


def _side(runs: list[dict[str, Any]], pair: int, side: str) -> dict[str, Any]:
    return next(r for r in runs if r["pair"] == pair and r["side"] == side)


def _progress(r: dict[str, Any]) -> str:
    return (
        f"pair {r['pair']} {r['side']:>4}: master {1e3 * r['cpu_master_s']:.2f} ms/iteration, workers "
        f"{1e3 * r['cpu_workers_s']:.2f} (busiest {1e3 * r['cpu_busiest_worker_s']:.2f}), period "
        f"{1e3 * r['period_s']:.2f} ms (load {r['load']:.1f})"
    )


def _format(result: dict[str, Any]) -> str:
    job, this = result["job"], result["this"]
    changed = " with uncommitted changes" if this["changed"] else ""
    lines = [
        f"{job['scheme']} s = {job['s']}, n = {job['n']}, p = {job['num_features'] + 1}, {job['iterations']} "
        f"iterations, {result['pairs']} pairs; this = {this['head'][:10]}{changed}, base = {result['base'][:10]}",
        f"{'':>26} {'base':>9} {'this':>9}   this / base: median (min-max)",
    ]
    names = {"cpu_master_s": "master CPU ms/iteration", "cpu_workers_s": "workers CPU ms/iteration",
             "cpu_busiest_worker_s": "busiest worker ms/iteration", "period_s": "period ms"}  # fmt: skip
    for f in FIGURES:
        ratio = result["ratios"][f]
        lines.append(
            f"{names[f]:>26} {1e3 * result['medians']['base'][f]:>9.2f} {1e3 * result['medians']['this'][f]:>9.2f}"
            f"   {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"
        )
    loads = [r["load"] for r in result["runs"]]
    lines.append(f"load (1 min) before each job: {min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    pairs = range(result["pairs"])
    with figure(path, 1, 2, dpi=110, figsize=(10, 3.8)) as (cpu, ratio):
        commits = {"base": result["base"][:8], "this": result["this"]["head"][:8]}
        for side, marker in (("base", "o"), ("this", "s")):
            values = [1e3 * _side(result["runs"], p, side)["cpu_master_s"] for p in pairs]
            cpu.plot(list(pairs), values, marker=marker, label=f"{side} ({commits[side]})")
        cpu.set(
            xlabel="pair", ylabel="master CPU per iteration (ms)", title="Master CPU, each pair", xticks=list(pairs)
        )
        cpu.legend()
        for f, marker in zip(FIGURES, ("o", "^", "v", "s"), strict=True):
            ratio.plot(list(pairs), result["ratios"][f]["pairs"], marker=marker, label=f.removesuffix("_s"))
        ratio.axhline(1.0, color="grey", lw=0.8)
        ratio.set(xlabel="pair", ylabel="this / base", title="Ratios (1 = unchanged)", xticks=list(pairs))
        ratio.legend()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.versus", description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare this checkout with (a hash, tag or branch)")
    parser.add_argument(
        "--job", default="uncoded",
        help="bench wide's job, uncoded (default) or cyclic, or tree: bench cluster's CodedReduce tree (p = 1e6)",
    )  # fmt: skip
    parser.add_argument(
        "--n", type=int, default=None,
        help="workers (default 16, bench wide's); for tree, bench cluster's n: 6, 12 or 24 (default; 20 workers)",
    )  # fmt: skip
    parser.add_argument("--pairs", type=int, default=5, help="interleaved pairs of runs (default 5)")
    parser.add_argument("--iterations", type=int, default=400, help="iterations of each measured job (default 400)")
    add_out_argument(parser, "versus")
    args = parser.parse_args(argv)
    try:
        run(args.base, job_name=args.job, n=args.n, pairs=args.pairs, iterations=args.iterations, out=args.out)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
