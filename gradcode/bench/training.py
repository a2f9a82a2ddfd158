"""gradcode against the allreduce users run today, on Tandon et al.'s own workload, in one run.

    python -m gradcode.bench.training [--quick] [--out DIR]      (or: gradcode bench training ...)

**Workload.** Logistic regression on the built-in Gaussian-mixture data (Tandon et al. §5) with
24000 training samples × 2000 features (30000 generated, 20% held out), n = 6 workers, Nesterov
with step 1/L (L = λ_max(XᵀX/N)/4, by power iteration) and L2 weight 1e-4; every process on this
machine. ``--quick`` shrinks everything to a smoke run of a minute or two.

**Systems.** gradcode (a :class:`~gradcode.client.launch.LocalCluster`: one master and n worker
processes, jobs through the SDK) with the schemes uncoded, fractional, cyclic, Reed–Solomon and
binary; and a synchronous allreduce baseline: n processes of ``torch.distributed`` with the gloo
backend on loopback, each holding the same partition of the same data as gradcode's uncoded worker
of that rank. Every step each rank computes its partial gradient with the same model code
(:meth:`~gradcode.common.models.Model.gradient_and_statistics`), the ranks ``all_reduce`` it, and
every rank applies the same Nesterov step (:mod:`gradcode.master.optimizer`) — a data-parallel loop
as DDP runs it. Both systems draw per-worker delays from the same :mod:`gradcode.common.stragglers`
model with the same seed: rank r sleeps ``delay(r, t)`` before computing iteration t, exactly as
gradcode's worker r does.

**Figures.**

* *Per-iteration time against injected delay* (the shape of Tandon et al.'s Figure 4): s random
  workers delayed by d ∈ {0, 0.1, 0.25, 0.5} s each iteration (``fixed`` with ``random_worker``),
  s ∈ {1, 2}; the figure is the median time between consecutive iterations (after the first
  :data:`SKIP_ITERATIONS`), over :data:`FULL_SWEEP_ITERATIONS` iterations per run. For gradcode also
  the median ``wall_seconds`` and ``tail`` = wall minus the last used worker's arrival (the time from
  the last needed message to the applied step, as the master measures it).
* *The compute floor* of each configuration: the gradients the step needed (the data of the workers whose
  messages the decode used, in partitions of 1/n of the training set: n for uncoded and the allreduce, as
  few as n for a code whose workers share groups of partitions) times the CPU one partition's gradient took
  in the allreduce's run of that configuration, every core busy, spread over the cores; and each system's
  period over that floor. No system computing those gradients on this machine at that moment steps faster.
* *Training loss against wall-clock* under Pareto delays (scale 0.05 s, shape 1.5) for 100
  iterations, and each system's time to get within 1% of the loss that 100 uncoded iterations reach.
  The loss is the regularised training loss each system reports per iteration at the point its
  gradient was evaluated (the Nesterov look-ahead): gradcode's master decodes it from the workers'
  coded statistics, and the baseline all-reduces the same statistics with its gradient.

Runs are interleaved: every round runs each configuration's systems one after the other (A, B, C, …)
and the rounds repeat (A, B, …, A, B, …); figures are medians over rounds. ``/proc/loadavg`` is
recorded before and after every run. A short ``verify`` job per scheme (the master checks every
decoded gradient against the centralized one) shows the gradients stay exact.

Prints the tables and saves ``training.json`` and ``training.png`` in ``bench/results/`` (or ``--out``).
The allreduce baseline needs torch (``pip install 'gradcode[bench]'``, pinned to the CPU build).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.output import (
    RESULTS,
    SKIP_ITERATIONS,
    free_port,
    load_average,
    save,
    steady_periods,
    up_workers,
)
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.codes.registry import make_code
from gradcode.common.data import load_dataset, partition_indices
from gradcode.common.models import make_model
from gradcode.common.serving import BLAS_THREAD_VARIABLES
from gradcode.common.wire import dict_from_struct
from gradcode.master.spec import BACKUP_PRIORITIES, DEFAULT_BACKUP_PRIORITY

__all__ = ["ALLREDUCE", "SCHEMES", "Delays", "Workload", "allreduce_rank", "main", "prepare_data", "run"]

SCHEMES = ("uncoded", "fractional", "cyclic", "reed_solomon", "binary")
ALLREDUCE = "allreduce"
"""The torch.distributed (gloo) baseline's name in the tables."""
SYSTEMS = (*SCHEMES, ALLREDUCE)
FULL_DELAYS = (0.0, 0.1, 0.25, 0.5)
QUICK_DELAYS = (0.0, 0.1)
FULL_STRAGGLERS = (1, 2)
QUICK_STRAGGLERS = (1,)
FULL_SWEEP_ITERATIONS = 12
QUICK_SWEEP_ITERATIONS = 4
FULL_ROUNDS = 2
QUICK_ROUNDS = 1
BACKUP_DELAYS = (0.0, 0.25)
"""Where the sweep also runs each coded scheme with every worker asked alike (``backup_priority`` normal), s = 1,
interleaved with the default (backups at low priority)."""
PARETO = {"shape": 1.5, "scale": 0.05}
LOSS_TOLERANCE = 0.01
"""Time to target = first moment a system's loss is within 1% of the loss 100 uncoded iterations reach."""

START_TIMEOUT = 120.0
RUN_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Workload:
    """The training problem every system solves."""

    num_samples: int
    num_features: int
    n: int
    iterations: int
    """Iterations of the Pareto (loss against time) runs."""
    test_fraction: float = 0.2
    l2: float = 1e-4
    seed: int = 0
    learning_rate: float = 0.0
    """Filled in from the data (1/L) when 0."""
    model: str = "logistic"
    dataset: str = "gaussian_mixture"
    """The model and the generated dataset (bench.cluster reuses the baseline with CodedReduce's linear model)."""

    @property
    def num_train(self) -> int:
        return self.num_samples - round(self.num_samples * self.test_fraction)


FULL = Workload(num_samples=30_000, num_features=2000, n=6, iterations=100)
QUICK = Workload(num_samples=1500, num_features=40, n=6, iterations=10)


def step_size(X: np.ndarray[Any, Any], iterations: int = 30) -> float:
    """1/L for the mean logistic loss: L = λ_max(XᵀX/N) / 4, λ_max by power iteration (seed 0)."""
    v = np.random.default_rng(0).standard_normal(X.shape[1])
    lam = 1.0
    for _ in range(iterations):
        v = X.T @ (X @ v) / len(X)
        lam = float(np.linalg.norm(v))
        v /= lam
    return 4.0 / lam


# ---- delays --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delays:
    """A straggler model both systems draw from: a :mod:`gradcode.common.stragglers` name, parameters, seed."""

    model: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    @staticmethod
    def random_workers(delay: float, count: int, n: int, seed: int = 0) -> Delays:
        if delay == 0:
            return Delays("none")
        return Delays("fixed", {"delay_seconds": delay, "random_worker": True, "num_workers": n, "count": count}, seed)


# ---- gradcode ------------------------------------------------------------------------------------------------
def _spec(
    workload: Workload,
    scheme: str,
    s: int,
    delays: Delays,
    iterations: int,
    *,
    verify: bool = False,
    backup_priority: str = "",
) -> Any:
    return build_job_spec(
        backup_priority=backup_priority,
        scheme=scheme,
        n=workload.n,
        s=0 if scheme == "uncoded" else s,
        model="logistic",
        dataset="gaussian_mixture",
        num_samples=workload.num_samples,
        num_features=workload.num_features,
        test_fraction=workload.test_fraction,
        optimizer="nesterov",
        learning_rate=workload.learning_rate,
        l2=workload.l2,
        iterations=iterations,
        deadline_seconds=120.0,
        verify=verify,
        straggler=delays.model,
        straggler_params=delays.params,
        straggler_seed=delays.seed,
        seed=workload.seed,
        wait_for_workers_seconds=START_TIMEOUT,
    )


async def _gradcode_run(
    client: GradcodeClient,
    workload: Workload,
    scheme: str,
    s: int,
    delays: Delays,
    iterations: int,
    backup_priority: str = "",
) -> dict[str, Any]:
    spec = _spec(workload, scheme, s, delays, iterations, backup_priority=backup_priority)
    pool_ids = (await up_workers(client, workload.n, START_TIMEOUT))[: workload.n]
    spec.worker_ids[:] = pool_ids  # job worker j is pool worker pool_ids[j]: reports name pool ids
    load_before = load_average()
    _, reports = await client.run(spec)
    load_after = load_average()
    kept = [r for r in reports if r.iteration > SKIP_ITERATIONS]
    # The data the decode needed, in partitions of the baseline's size (1/n of the training set each).
    code = make_code(spec.code.name, **dict_from_struct(spec.code.params))
    share = {pool_id: code.data_share(j) for j, pool_id in enumerate(pool_ids)}
    needed = [workload.n * sum(share[w] for w in r.used_workers) for r in kept]
    elapsed = [r.elapsed_seconds for r in reports]
    periods = steady_periods(elapsed)
    tails = []
    for r in kept:
        used = set(r.used_workers)
        arrivals = [t.seconds for t in r.timings if t.worker_id in used]
        if arrivals:
            tails.append(r.wall_seconds - max(arrivals))
    return {
        "system": scheme,
        "backup_priority": spec.backup_priority or DEFAULT_BACKUP_PRIORITY,
        "iterations": len(reports),
        "period_s": statistics.median(periods) if periods else math.nan,
        "wall_s": statistics.median(r.wall_seconds for r in kept) if kept else math.nan,
        "tail_s": statistics.median(tails) if tails else math.nan,
        "decode_s": statistics.median(r.decode_seconds for r in kept) if kept else math.nan,
        "partitions_needed": statistics.median(needed) if needed else math.nan,
        "elapsed_s": elapsed,
        "loss": [r.loss for r in reports],
        "exact": all(r.exact for r in reports),
        "load_before": load_before,
        "load_after": load_after,
    }


async def _verify(client: GradcodeClient, workload: Workload, scheme: str, iterations: int) -> float:
    """A short verify job: the worst relative error of the decoded gradient against the centralized one."""
    _, reports = await client.run(_spec(workload, scheme, 1, Delays("none"), iterations, verify=True))
    errors = [r.verify_error for r in reports]
    if any(e < 0 for e in errors) or not all(r.exact for r in reports):
        raise RuntimeError(f"verify job of {scheme} did not verify every iteration exactly: {errors}")
    return max(errors)


# ---- the allreduce baseline (torch.distributed, gloo) ----------------------------------------------------------
def allreduce_rank(
    rank: int, world: int, init_method: str, data_dir: str, workload: Workload, connection: Any
) -> None:  # pragma: no cover - runs in the baseline's processes
    """One rank of the baseline: load its partition, then run the configurations rank 0 receives.

    ``init_method`` is torch.distributed's rendezvous (``tcp://HOST:PORT``, rank 0's host); ``connection`` (rank
    0's only) has ``recv()`` (a command, None to stop) and ``send(result)``; the gloo interface is
    ``GLOO_SOCKET_IFNAME`` (default ``lo``)."""
    for var in BLAS_THREAD_VARIABLES:
        os.environ[var] = "1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from gradcode.common.models import training_metrics
    from gradcode.common.stragglers import make_delay_model
    from gradcode.master.optimizer import make_optimizer, mean_gradient

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    X_all = np.load(Path(data_dir) / "X_train.npy", mmap_mode="r")
    y_all = np.load(Path(data_dir) / "y_train.npy")
    index = np.load(Path(data_dir) / f"partition_{rank}.npy")
    X = np.ascontiguousarray(X_all[index])
    y = np.ascontiguousarray(y_all[index])
    model = make_model(workload.model, num_features=workload.num_features)
    try:
        while True:
            box: list[Any] = [connection.recv() if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            command = box[0]
            if command is None:
                return
            delays = make_delay_model(command["model"], command["params"], command["seed"])
            optimizer = make_optimizer("nesterov", model.init_params(), learning_rate=workload.learning_rate)
            dist.barrier()
            started = time.perf_counter()
            elapsed, losses, gradient_cpu = [], [], []
            for t in range(1, command["iterations"] + 1):
                time.sleep(max(0.0, delays.delay(rank, t)))
                point = optimizer.point
                cpu = time.thread_time()
                vector = torch.from_numpy(model.gradient_and_statistics(point, X, y))
                if t > SKIP_ITERATIONS:
                    gradient_cpu.append(time.thread_time() - cpu)
                dist.all_reduce(vector)
                metrics = training_metrics(model, vector.numpy(), point, y_all, l2=workload.l2)
                optimizer.step(mean_gradient(metrics.gradient, point, num_samples=len(y_all), l2=workload.l2))
                if rank == 0:  # the loss at the point the gradient was evaluated at, as gradcode reports it
                    elapsed.append(time.perf_counter() - started)
                    losses.append(metrics.loss)
            every_rank: list[Any] | None = [None] * world if rank == 0 else None
            dist.gather_object(gradient_cpu, every_rank, dst=0)
            if rank == 0:
                assert every_rank is not None
                cpu_s = [seconds for times in every_rank for seconds in times]
                connection.send({"elapsed_s": elapsed, "loss": losses, "gradient_cpu_s": cpu_s})
    finally:
        dist.destroy_process_group()


class AllreducePool:
    """n torch.distributed (gloo) ranks on loopback, alive for the whole benchmark; rank 0 takes commands."""

    def __init__(self, workload: Workload, data_dir: Path) -> None:
        self.n = workload.n
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        init = f"tcp://127.0.0.1:{free_port()}"
        self._processes = [
            context.Process(
                target=allreduce_rank,
                args=(rank, workload.n, init, str(data_dir), workload, child if rank == 0 else None),
                daemon=True,
            )
            for rank in range(workload.n)
        ]
        for process in self._processes:
            process.start()

    def run(self, delays: Delays, iterations: int) -> dict[str, Any]:
        self._pipe.send({"model": delays.model, "params": delays.params, "seed": delays.seed, "iterations": iterations})
        deadline = time.monotonic() + RUN_TIMEOUT
        while not self._pipe.poll(0.2):
            dead = [p.exitcode for p in self._processes if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"the allreduce ranks failed (exit codes {dead}) or exceeded {RUN_TIMEOUT:.0f} s")
        result: dict[str, Any] = self._pipe.recv()
        return result

    def close(self) -> None:
        if all(p.is_alive() for p in self._processes):
            self._pipe.send(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        self._pipe.close()


def _allreduce_run(pool: AllreducePool, delays: Delays, iterations: int) -> dict[str, Any]:
    load_before = load_average()
    result = pool.run(delays, iterations)
    load_after = load_average()
    elapsed = result["elapsed_s"]
    periods = steady_periods(elapsed)
    return {
        "system": ALLREDUCE,
        "iterations": len(elapsed),
        "period_s": statistics.median(periods) if periods else math.nan,
        "wall_s": math.nan,
        "tail_s": math.nan,
        "decode_s": math.nan,
        "elapsed_s": elapsed,
        "loss": list(result["loss"]),
        "gradient_cpu_s": statistics.median(result["gradient_cpu_s"]),
        "partitions_needed": float(pool.n),
        "exact": True,
        "load_before": load_before,
        "load_after": load_after,
    }


# ---- the experiments -------------------------------------------------------------------------------------------
def time_to_target(elapsed: Sequence[float], loss: Sequence[float], target: float) -> float:
    """Seconds until the loss first reaches ``target`` (nan if it never does)."""
    for seconds, value in zip(elapsed, loss, strict=True):
        if value <= target:
            return seconds
    return math.nan


JOBS_PER_CLUSTER = 6
"""gradcode jobs run on one LocalCluster before it is replaced: today's master keeps its most recent
finished jobs in memory, datasets included (about 0.5 GB each at full size)."""


class _Clusters:
    """A LocalCluster and its client, replaced by a fresh one every :data:`JOBS_PER_CLUSTER` jobs."""

    def __init__(self, n: int, run_dir: Path) -> None:
        self.n, self.run_dir = n, run_dir
        self.started = 0
        self.jobs = 0
        self._cluster: LocalCluster | None = None
        self._client: GradcodeClient | None = None

    async def client(self) -> GradcodeClient:
        if self._client is not None and self.jobs >= JOBS_PER_CLUSTER:
            await self.close()
        if self._client is None:
            self._cluster = LocalCluster(self.n, run_dir=self.run_dir / f"cluster-{self.started}")
            self.started += 1
            self._cluster.start(START_TIMEOUT)
            self._client = GradcodeClient(self._cluster.master_address)
            await self._client.wait_ready(START_TIMEOUT)
            self.jobs = 0
        self.jobs += 1
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._cluster is not None:
            self._cluster.stop()
        self._client, self._cluster = None, None


async def _experiments(workload: Workload, quick: bool, run_dir: Path, data_dir: Path) -> dict[str, Any]:
    delays_grid = QUICK_DELAYS if quick else FULL_DELAYS
    stragglers = QUICK_STRAGGLERS if quick else FULL_STRAGGLERS
    rounds = QUICK_ROUNDS if quick else FULL_ROUNDS
    sweep_iterations = QUICK_SWEEP_ITERATIONS if quick else FULL_SWEEP_ITERATIONS
    sweep: list[dict[str, Any]] = []
    pareto: list[dict[str, Any]] = []
    backups: list[dict[str, Any]] = []
    clusters = _Clusters(workload.n, run_dir)
    pool = AllreducePool(workload, data_dir)
    try:
        verified = {}
        for scheme in SCHEMES:
            verified[scheme] = await _verify(await clusters.client(), workload, scheme, 2 if quick else 3)

        async def one(
            system: str, s: int, delays: Delays, iterations: int, backup_priority: str = ""
        ) -> dict[str, Any]:
            if system == ALLREDUCE:
                return await asyncio.to_thread(_allreduce_run, pool, delays, iterations)
            client = await clusters.client()
            return await _gradcode_run(client, workload, system, s, delays, iterations, backup_priority)

        for round_ in range(rounds):
            for delay in delays_grid:
                for s in stragglers:
                    for system in SYSTEMS:
                        delays = Delays.random_workers(delay, s, workload.n, seed=round_)
                        row = await one(system, s, delays, sweep_iterations)
                        row.update(round=round_, delay_s=delay, s=s)
                        sweep.append(row)
                        print(_progress(row), flush=True)
                        if system in SCHEMES[1:] and s == 1 and delay in BACKUP_DELAYS:  # the same draws, alike
                            alike = await one(system, s, delays, sweep_iterations, "normal")
                            alike.update(round=round_, delay_s=delay, s=s)
                            backups.extend((row, alike))
                            print(_progress(alike), flush=True)
            for system in SYSTEMS:
                delays = Delays("pareto", dict(PARETO), seed=7)
                row = await one(system, 1, delays, workload.iterations)
                row.update(round=round_, s=1)
                pareto.append(row)
                print(_progress(row), flush=True)
    finally:
        await clusters.close()
        pool.close()
    return {"verify_max_error": verified, "sweep": sweep, "pareto": pareto, "backups": backups}


def _progress(row: dict[str, Any]) -> str:
    where = f"delay {row['delay_s']:.2f} s, s={row['s']}" if "delay_s" in row else "pareto"
    system = row["system"] + (" (alike)" if row.get("backup_priority") == "normal" else "")
    return (
        f"  round {row['round']} {where:<20} {system:<21} {row['period_s'] * 1e3:8.1f} ms/iteration"
        f"  final loss {row['loss'][-1]:.5f}  load {row['load_after'][0]:.2f}"
    )


def summarise(raw: dict[str, Any], systems: Sequence[str], cores: int) -> dict[str, Any]:
    """Medians over rounds: per-iteration times per (delay, s, system) beside each system's compute floor, and
    time to target loss per system.

    The compute floor of a configuration is the gradient work its step needed (``partitions_needed``, in
    partitions of 1/n of the data) times the CPU one such gradient took with every core busy (measured in the
    allreduce's runs of that configuration), spread perfectly over ``cores``: no system computing those
    gradients on this machine at that moment steps faster.
    """
    table = []
    keys = sorted({(r["delay_s"], r["s"]) for r in raw["sweep"]})
    for delay, s in keys:
        entry: dict[str, Any] = {"delay_s": delay, "s": s}
        runs = {
            system: [r for r in raw["sweep"] if (r["delay_s"], r["s"], r["system"]) == (delay, s, system)]
            for system in systems
        }
        for system in systems:
            entry[system] = {
                name: statistics.median(r[name] for r in runs[system])
                for name in ("period_s", "wall_s", "tail_s", "partitions_needed")
            }
            entry[system]["load"] = [r["load_after"] for r in runs[system]]
        entry["gradient_cpu_s"] = statistics.median(r["gradient_cpu_s"] for r in runs[ALLREDUCE])
        for system in systems:
            floor = entry[system]["partitions_needed"] * entry["gradient_cpu_s"] / cores
            entry[system]["floor_s"] = floor
            entry[system]["over_floor"] = entry[system]["period_s"] / floor
        base = entry[ALLREDUCE]["period_s"]
        entry["best_coded"] = min(
            (x for x in systems if x not in ("uncoded", ALLREDUCE)), key=lambda x: entry[x]["period_s"]
        )
        entry["uncoded_over_allreduce"] = entry["uncoded"]["period_s"] / base
        entry["best_coded_over_allreduce"] = entry[entry["best_coded"]]["period_s"] / base
        table.append(entry)

    uncoded = [r for r in raw["pareto"] if r["system"] == "uncoded"]
    reference = statistics.median(r["loss"][-1] for r in uncoded)
    target = reference * (1 + LOSS_TOLERANCE)
    pareto: dict[str, Any] = {
        "reference_loss": reference,
        "target_loss": target,
        "iterations": uncoded[0]["iterations"],
        "systems": {},
    }
    for system in systems:
        rows = [r for r in raw["pareto"] if r["system"] == system]
        times = [time_to_target(r["elapsed_s"], r["loss"], target) for r in rows]
        pareto["systems"][system] = {
            "time_to_target_s": statistics.median(times),
            "times_s": times,
            "period_s": statistics.median(r["period_s"] for r in rows),
            "final_loss": statistics.median(r["loss"][-1] for r in rows),
            "load": [r["load_after"] for r in rows],
        }
    base = pareto["systems"][ALLREDUCE]["time_to_target_s"]
    for system in systems:
        pareto["systems"][system]["speedup_vs_allreduce"] = base / pareto["systems"][system]["time_to_target_s"]
    return {"cores": cores, "sweep": table, "pareto": pareto, "backups": summarise_backups(raw.get("backups", []))}


def summarise_backups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (delay, scheme): median period with backups at low priority and with every worker asked alike."""
    table = []
    for delay, scheme in sorted({(r["delay_s"], r["system"]) for r in rows}):
        entry: dict[str, Any] = {"delay_s": delay, "s": 1, "system": scheme}
        for priority in BACKUP_PRIORITIES:
            runs = [r for r in rows if (r["delay_s"], r["system"], r["backup_priority"]) == (delay, scheme, priority)]
            entry[priority] = {
                "period_s": statistics.median(r["period_s"] for r in runs),
                "periods_s": [r["period_s"] for r in runs],
                "load": [r["load_after"] for r in runs],
            }
        entry["low_over_normal"] = entry["low"]["period_s"] / entry["normal"]["period_s"]
        table.append(entry)
    return table


# ---- output ----------------------------------------------------------------------------------------------------
def format_tables(summary: dict[str, Any], systems: Sequence[str]) -> str:
    lines = ["Per-iteration time (median ms between iterations) against s random workers delayed by d seconds"]
    lines.append(
        f"{'d (s)':>6} {'s':>2} " + " ".join(f"{x:>12}" for x in systems) + f" {'unc/AR':>7} {'best/AR':>8}  load"
    )
    for e in summary["sweep"]:
        cells = " ".join(f"{e[x]['period_s'] * 1e3:>12.1f}" for x in systems)
        loads = [load[0] for x in systems for load in e[x]["load"]]
        lines.append(
            f"{e['delay_s']:>6.2f} {e['s']:>2} {cells} {e['uncoded_over_allreduce']:>7.2f}"
            f" {e['best_coded_over_allreduce']:>8.2f}  {min(loads):.1f}-{max(loads):.1f}"
        )
    lines.append("(unc/AR = uncoded / allreduce; best/AR = fastest coded scheme / allreduce; load = 1-min loadavg)")
    lines.append("")
    lines.append(
        f"Against the compute floor: the gradients each step needed x the CPU of one (ms, every core busy) / "
        f"{summary['cores']} cores; cells floor ms / period over floor"
    )
    lines.append(f"{'d (s)':>6} {'s':>2} {'grad ms':>8} " + " ".join(f"{x:>12}" for x in systems))
    for e in summary["sweep"]:
        cells = " ".join(f"{e[x]['floor_s'] * 1e3:>6.1f}/{e[x]['over_floor']:>5.2f}" for x in systems)
        lines.append(f"{e['delay_s']:>6.2f} {e['s']:>2} {e['gradient_cpu_s'] * 1e3:>8.2f} {cells}")
    lines.append("")
    lines.append("gradcode master: median wall (request to step) and tail (last used arrival to step), ms")
    lines.append(f"{'d (s)':>6} {'s':>2} " + " ".join(f"{x:>17}" for x in systems if x != ALLREDUCE))
    for e in summary["sweep"]:
        cells = " ".join(
            f"{e[x]['wall_s'] * 1e3:>8.1f}/{e[x]['tail_s'] * 1e3:>8.1f}" for x in systems if x != ALLREDUCE
        )
        lines.append(f"{e['delay_s']:>6.2f} {e['s']:>2} {cells}")
    if summary.get("backups"):
        lines.append("")
        lines.append("Backups at low priority (the default) against every worker asked alike, s = 1, runs interleaved")
        lines.append(f"{'d (s)':>6} {'scheme':>13} {'low ms':>8} {'alike ms':>9} {'low/alike':>10}  load")
        for e in summary["backups"]:
            loads = [load[0] for priority in BACKUP_PRIORITIES for load in e[priority]["load"]]
            lines.append(
                f"{e['delay_s']:>6.2f} {e['system']:>13} {e['low']['period_s'] * 1e3:>8.1f}"
                f" {e['normal']['period_s'] * 1e3:>9.1f} {e['low_over_normal']:>10.2f}"
                f"  {min(loads):.1f}-{max(loads):.1f}"
            )
    p = summary["pareto"]
    lines.append("")
    lines.append(
        f"Pareto delays (scale {PARETO['scale']} s, shape {PARETO['shape']}): time to loss <= {p['target_loss']:.5f}"
        f" (1% above uncoded's loss after {p['iterations']} iterations, {p['reference_loss']:.5f})"
    )
    lines.append(f"{'system':>13} {'to target s':>12} {'ms/iter':>8} {'final loss':>11} {'AR / this':>10}  load")
    for system in systems:
        q = p["systems"][system]
        loads = [load[0] for load in q["load"]]
        lines.append(
            f"{system:>13} {q['time_to_target_s']:>12.2f} {q['period_s'] * 1e3:>8.1f} {q['final_loss']:>11.5f}"
            f" {q['speedup_vs_allreduce']:>10.2f}  {min(loads):.1f}-{max(loads):.1f}"
        )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = results["systems"]
    summary = results["summary"]
    stragglers = sorted({e["s"] for e in summary["sweep"]})
    fig, axes = plt.subplots(1, len(stragglers) + 1, figsize=(6 * (len(stragglers) + 1), 4.8))
    for ax, s in zip(axes, stragglers, strict=False):
        entries = [e for e in summary["sweep"] if e["s"] == s]
        for system in systems:
            ax.plot(
                [e["delay_s"] for e in entries], [e[system]["period_s"] * 1e3 for e in entries], marker="o",
                label=system, linestyle="--" if system == ALLREDUCE else "-",
            )  # fmt: skip
        ax.set_xlabel("injected delay per straggler (s)")
        ax.set_ylabel("median ms per iteration")
        ax.set_title(f"{s} random straggler(s) per iteration, n = {results['workload']['n']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[-1]
    first_round = min(r["round"] for r in results["raw"]["pareto"])
    for row in results["raw"]["pareto"]:
        if row["round"] == first_round:
            ax.plot(
                row["elapsed_s"],
                row["loss"],
                label=row["system"],
                linestyle="--" if row["system"] == ALLREDUCE else "-",
            )
    ax.axhline(summary["pareto"]["target_loss"], color="black", linewidth=0.8, label="target (uncoded@100 + 1%)")
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel("training loss")
    ax.set_title(f"Pareto delays (scale {PARETO['scale']} s, shape {PARETO['shape']})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def prepare_data(workload: Workload, data_dir: Path) -> Workload:
    """Generate the dataset once (as the master will), fix the step size (unless given), and write the baseline's
    partitions."""
    dataset = load_dataset(
        workload.dataset, num_samples=workload.num_samples, num_features=workload.num_features,
        seed=workload.seed, test_fraction=workload.test_fraction,
    )  # fmt: skip
    X, y = dataset.X_train, dataset.y_train
    if not workload.learning_rate:
        workload = Workload(**{**asdict(workload), "learning_rate": step_size(X)})
    np.save(data_dir / "X_train.npy", X)
    np.save(data_dir / "y_train.npy", y)
    # The uncoded code's partitions: rank r holds exactly what gradcode's uncoded worker r holds.
    for rank, index in enumerate(partition_indices(len(y), np.ones(workload.n), seed=workload.seed)):
        np.save(data_dir / f"partition_{rank}.npy", index)
    return workload


def run(*, quick: bool = False, out: Path = RESULTS) -> dict[str, Any]:
    """Run both experiments, print the tables, save JSON and PNG under ``out``; return the results."""
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("The allreduce baseline needs torch: pip install 'gradcode[bench]' (the pinned CPU build).")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-training-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        workload = prepare_data(QUICK if quick else FULL, data_dir)
        print(
            f"Workload: logistic regression, {workload.num_train} x {workload.num_features} Gaussian mixture, "
            f"n = {workload.n}, Nesterov, step {workload.learning_rate:.3g}; load {load_average()}",
            flush=True,
        )
        raw = asyncio.run(_experiments(workload, quick, Path(tmp) / "cluster", data_dir))
    summary = summarise(raw, SYSTEMS, len(os.sched_getaffinity(0)))
    import torch

    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
        },
        "quick": quick,
        "workload": {**asdict(workload), "num_train": workload.num_train},
        "systems": list(SYSTEMS),
        "summary": summary,
        "raw": raw,
        "seconds": time.perf_counter() - started,
    }
    print()
    print(format_tables(summary, SYSTEMS))
    print(f"\nWorst verified relative gradient error per scheme: {raw['verify_max_error']}")
    save(results, out, "training", lambda path: plot(results, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gradcode.bench.training", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small workload and few runs: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for training.json and training.png")
    args = parser.parse_args(argv)
    run(quick=args.quick, out=args.out)


if __name__ == "__main__":
    main()
