"""A cluster on one machine: flat codes, CodedReduce trees and a ring allreduce where the master's link is the
bottleneck (issue 28).

    gradcode bench cluster [--n 6 12] [--rounds 1] [--iterations 12] [--master-mbit 200] [--worker-mbit 1000]
                           [--master-cpu 50] [--worker-cpu PERCENT] [--delay 0.25] [--quick] [--out DIR]
                           [--histories DIR]
    gradcode bench cluster --cleanup          remove what a killed run left behind (namespaces, cgroups)

**The testbed** (:mod:`gradcode.bench.testbed`, needs root): one emulated host for the master and one per
worker, each a network namespace on a bridge (itself in a namespace: the machine's own network is not
touched), with its own link shaped to ``--master-mbit`` / ``--worker-mbit`` Mbit/s in each direction (token
bucket) and its own CPU quota of ``--master-cpu`` / ``--worker-cpu`` % of one core (cgroup ``cpu``). A run
reads "1 master host of X % of a core and Y Mbit/s, N worker hosts of X' % and Y' Mbit/s". Every gradcode
process runs on its host with ``--advertise <host address>:port`` and its own ``--machine-id`` (the hosts
are separate machines: backups compute at once); the master runs with ``--shared-memory off``, since the
namespaces share ``/dev/shm`` and payloads must cross the emulated network. This process reaches the master
through a Unix socket relayed inside the master's namespace.

**Systems**, for each n: ``uncoded``; the flat codes ``fractional`` and ``binary`` with s = 1; a CodedReduce
tree (``coded_reduce``, s = 1, L = 2: n = 2 children per parent for 6 workers, 3 for 12, 4 (20 workers) for
24; ``--trees`` compares other shapes, such as 2x3: two children per parent, three layers, 14 workers; ``--s`` the
flat codes at other s); and ``allreduce``, the torch.distributed (gloo) ring baseline of
:mod:`gradcode.bench.training`, one rank per worker host (it needs no master). Workload: CodedReduce's linear
regression with p = 1e5 parameters (a 0.8 MB message), :data:`NUM_SAMPLES` samples. Each with no straggler and with
one random worker delayed ``--delay`` s per iteration (the same draws for every system).

**Figures**, per row: the median and interquartile range of the time between iterations (after the first
:data:`~gradcode.bench.output.SKIP_ITERATIONS`); the master's bytes in and out per iteration, read from its
host's interface counters (frames, headers included; for the allreduce, rank 0's host); the *floor*: plain
TCP moving those same bytes between the same hosts over the same shaped links (the master and the workers it
talks to, or the ring's neighbours), all flows at once, scaled to the measured wire bytes; the iteration as a
multiple of the floor; the seconds the master host's CPU quota held it back per iteration; how one model sent
to each of those workers at once ends (``broadcast_spread``, for the simulator); and ``/proc/loadavg`` before
the job. A short ``verify`` job per scheme and n shows every gradient exact.
Prints the table and saves ``cluster.json`` and ``cluster.png`` in ``docs/results/`` (or ``--out``); while it runs,
``cluster.partial.json`` holds the rows measured so far (a run that dies keeps them, and ``cluster.failed`` its
processes' logs and its jobs' histories). Each row counts the processes the kernel's OOM killer ended during its
job (``oom_kills``; None where the kernel's log cannot be read), and the run lists them all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradcode.bench.output import (
    RESULTS,
    SKIP_ITERATIONS,
    add_out_argument,
    figure,
    load_average,
    new_oom_kills,
    oom_kills,
    save,
    save_json,
    steady_periods,
)
from gradcode.bench.testbed import Host, HostSpec, Testbed, TestbedUnavailableError, check_available, cleanup
from gradcode.bench.training import Delays, Workload, allreduce_rank, prepare_data
from gradcode.client.launch import ServiceProcess, service_env
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.codes import make_code
from gradcode.common.sim.simulate import broadcast_spread
from gradcode.common.transport.serving import BLAS_THREAD_VARIABLES
from gradcode.v1 import master_pb2

__all__ = [
    "EmulatedCluster",
    "System",
    "gradcode_job",
    "job_spec",
    "main",
    "run",
    "systems_for",
    "tree_shape",
    "verify_exact",
    "workload_at",
]

ALLREDUCE = "allreduce"
"""The gloo ring allreduce baseline (:func:`gradcode.bench.training.allreduce_rank`), one rank per worker host."""
MASTER_PORT, WORKER_PORT, RENDEZVOUS_PORT = 50050, 50051, 29500
NUM_FEATURES = 99_999
"""p = 1e5 parameters (features + bias) by default (``--features``: the master is started with ``--max-features``
to match, so p = 1e6 runs too)."""
NUM_SAMPLES = 48
"""Enough for every partition of the largest configuration (24 workers); the gradient itself is cheap."""
TREES = {6: (2, 2), 12: (3, 2), 24: (4, 2)}
"""n -> (children per parent, layers) of the CodedReduce tree compared at n (24: 4 + 16 = 20 workers)."""
START_TIMEOUT = 120.0
RUN_TIMEOUT = 900.0


@dataclass(frozen=True)
class System:
    """One compared system at one n: a gradcode scheme with its parameters, or the allreduce."""

    name: str
    scheme: str
    workers: int
    code_params: dict[str, int] = field(default_factory=dict)
    surplus: str = ""
    """JobSpec.surplus of a flat coded scheme (empty: the master's default)."""
    model_delivery: str = ""
    """JobSpec.model_delivery of a gradcode system (empty: the master's default)."""

    @property
    def first_layer(self) -> int:
        """Workers the master talks to (a tree's first layer; every worker of a flat code)."""
        return self.code_params["n"] if self.scheme == "coded_reduce" else self.workers


SCHEMES = ("uncoded", "fractional", "binary", "coded_reduce", ALLREDUCE)
"""What ``--systems`` may pick."""


def systems_for(
    n: int, surplus: Sequence[str] = ("",), schemes: Sequence[str] = SCHEMES, deliveries: Sequence[str] = ("",),
    *, redundancy: Sequence[int] = (1,), trees: Sequence[tuple[int, int]] | None = None,
) -> list[System]:  # fmt: skip
    """What is compared at n workers: uncoded, fractional and binary with each s of ``redundancy`` (each with every
    ``surplus`` mode: what their backups do with their messages), the trees (``trees``: (children per parent,
    layers) each, s = 1; None: :data:`TREES`' at n, if any), the allreduce; only those of ``schemes``. Each gradcode
    one once per model delivery of ``deliveries`` (JobSpec.model_delivery)."""
    systems = [
        System("uncoded" + (f" {way}" if way else ""), "uncoded", n, {"n": n}, model_delivery=way) for way in deliveries
    ]
    for scheme in ("fractional", "binary"):
        systems += [
            System(
                f"{scheme} s={s}" + (f" {mode}" if mode else "") + (f" {way}" if way else ""), scheme, n,
                {"n": n, "s": s}, surplus=mode, model_delivery=way,
            )
            for s in redundancy
            for mode in surplus
            for way in deliveries
        ]  # fmt: skip
    for children, layers in ([TREES[n]] if n in TREES else []) if trees is None else trees:
        size = sum(children**layer for layer in range(1, layers + 1))
        tree = {"n": children, "s": 1, "L": layers}
        systems += [
            System(f"tree n={children} L={layers}" + (f" {way}" if way else ""), "coded_reduce", size, tree,
                   model_delivery=way)
            for way in deliveries
        ]  # fmt: skip
    systems.append(System(ALLREDUCE, ALLREDUCE, n))
    return [system for system in systems if system.scheme in schemes]


def tree_shape(text: str) -> tuple[int, int]:
    """``CHILDRENxLAYERS`` (``--trees``): a CodedReduce tree's children per parent and layers of workers."""
    children, sep, layers = text.partition("x")
    if not (sep and children.isdigit() and layers.isdigit() and int(children) >= 2 and int(layers) >= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a tree shape: give CHILDRENxLAYERS, children per parent >= 2 and layers >= 1 (e.g. 4x2)."
        )
    return int(children), int(layers)


def workload_at(n: int, features: int = NUM_FEATURES, iterations: int = 12) -> Workload:
    """What every system runs at n workers: CodedReduce's linear regression on NUM_SAMPLES samples."""
    return Workload(
        num_samples=NUM_SAMPLES,
        num_features=features,
        n=n,
        iterations=iterations,
        model="linear",
        dataset="linear",
        learning_rate=1e-5,
    )


# ---- the cluster on the testbed --------------------------------------------------------------------------------
class EmulatedCluster:
    """A testbed with a master on host ``m`` and ``workers_per_host`` gradcode workers on every other host,
    started and stopped together; :attr:`client_address` reaches the master from this process."""

    def __init__(
        self, testbed: Testbed, run_dir: Path, *, workers_per_host: int = 1, max_features: int = NUM_FEATURES
    ) -> None:
        self.max_features = max_features
        """The master's ``--max-features``: the largest generated dataset it accepts."""
        self.testbed = testbed
        self.run_dir = run_dir
        self.workers_per_host = workers_per_host
        self.master: ServiceProcess | None = None
        self.workers: dict[str, ServiceProcess] = {}
        """Worker address (host:port) -> its process."""
        self.client_address = f"unix:{run_dir / 'master.sock'}"

    @property
    def master_address(self) -> str:
        return f"{self.testbed.hosts['m'].address}:{MASTER_PORT}"

    def keep_for_diagnosis(self, directory: Path) -> None:
        """Copy every process's log and every job's history into ``directory``: a run that fails keeps its evidence
        (the run directory goes with the testbed)."""
        self.copy_histories(directory)
        logs = self.run_dir / "logs"
        if logs.is_dir():
            shutil.copytree(logs, directory / "logs", dirs_exist_ok=True)

    def copy_histories(self, directory: Path) -> None:
        """Copy every job's history and spec the master wrote into ``directory`` (the run directory goes with the
        testbed): each report's timings give every node's response and its own account of it."""
        directory.mkdir(parents=True, exist_ok=True)
        for path in [*self.run_dir.glob("*.jsonl"), *self.run_dir.glob("*.spec.json")]:
            shutil.copy(path, directory / path.name)

    @property
    def worker_addresses(self) -> list[str]:
        """Every worker's address: the first port of every worker host in the testbed's order, then the second...
        (job worker j runs on host j mod hosts: a tree's first layer, workers 0..n-1, on separate hosts)."""
        return [
            f"{host.address}:{WORKER_PORT + k}"
            for k in range(self.workers_per_host)
            for host in self.testbed.hosts.values()
            if host.role != "m"
        ]

    def host_of(self, address: str) -> Host:
        """The testbed host a worker address (host:port) is on."""
        return next(h for h in self.testbed.hosts.values() if address.startswith(f"{h.address}:"))

    def start(self) -> EmulatedCluster:
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        python = [sys.executable, "-m"]
        master = self.testbed.hosts["m"]
        # --insecure: plaintext beyond loopback, on the testbed's private bridge, which nothing else reaches.
        argv = [*python, "gradcode.master", "--listen", self.master_address, "--run-dir", str(self.run_dir),
                "--shared-memory", "off", "--insecure", "--max-features", str(self.max_features)]  # fmt: skip
        self.master = ServiceProcess(master.command(argv), log_path=logs / "master.log", env=service_env())
        self.master.wait_ready(START_TIMEOUT)
        self.testbed.forward("m", self.run_dir / "master.sock", MASTER_PORT)
        for address in self.worker_addresses:
            host = self.host_of(address)
            argv = [*python, "gradcode.worker", "--listen", address, "--advertise", address, "--master",
                    self.master_address, "--machine-id", host.namespace, "--name", host.role, "--insecure"]  # fmt: skip
            name = f"worker-{host.role}-{address.rsplit(':', 1)[1]}.log"
            self.workers[address] = ServiceProcess(host.command(argv), log_path=logs / name, env=service_env())
        for worker in self.workers.values():
            worker.wait_ready(START_TIMEOUT)
        return self

    async def pool_ids(self, client: GradcodeClient, timeout: float = START_TIMEOUT) -> dict[str, int]:
        """Worker address -> the master's pool id, once every worker is UP."""
        deadline = time.monotonic() + timeout
        while True:
            up = {w.address: w.worker_id for w in await client.list_workers() if w.state == master_pb2.WORKER_STATE_UP}
            if all(a in up for a in self.workers):
                return {a: up[a] for a in self.worker_addresses}
            if time.monotonic() > deadline:
                missing = sorted(set(self.workers) - set(up))
                raise TimeoutError(f"workers {missing} did not register UP within {timeout:.0f} s")
            await asyncio.sleep(0.1)

    def master_bytes(self) -> tuple[int, int]:
        """Bytes the master's host interface has received and sent so far."""
        return self.testbed.hosts["m"].interface_bytes()

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> EmulatedCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- the allreduce ranks on the worker hosts -------------------------------------------------------------------
class _Lines:
    """Rank 0's command connection over its standard input and output: one JSON value per line."""

    def recv(self) -> Any:
        line = sys.stdin.readline()
        return json.loads(line) if line else None

    def send(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()


class AllreduceRanks:
    """``workload.n`` ranks of :func:`gradcode.bench.training.allreduce_rank`, rank r on worker host ``w<r>``."""

    def __init__(self, testbed: Testbed, workload: Workload, data_dir: Path) -> None:
        self.testbed = testbed
        self.n = workload.n
        self.roles = [f"w{r}" for r in range(workload.n)]
        init = f"tcp://{testbed.hosts['w0'].address}:{RENDEZVOUS_PORT}"
        env = service_env({"GLOO_SOCKET_IFNAME": "eth0", "TORCH_CPP_LOG_LEVEL": "ERROR"})
        self._ranks = [
            testbed.popen(
                role,
                [
                    sys.executable,
                    "-m",
                    "gradcode.bench.cluster",
                    "_rank",
                    str(rank),
                    str(self.n),
                    init,
                    str(data_dir),
                    json.dumps(asdict(workload)),
                ],
                env=env,
                stdin=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            )
            for rank, role in enumerate(self.roles)
        ]

    def run(self, delays: Delays, iterations: int) -> dict[str, Any]:
        """One run (as AllreducePool.run): elapsed seconds and losses per iteration, rank 0's bytes per iteration."""
        rank0 = self._ranks[0]
        assert rank0.stdin is not None and rank0.stdout is not None
        before = self.testbed.hosts["w0"].interface_bytes()
        command = {"model": delays.model, "params": delays.params, "seed": delays.seed, "iterations": iterations}
        rank0.stdin.write(json.dumps(command) + "\n")
        rank0.stdin.flush()
        deadline = time.monotonic() + RUN_TIMEOUT
        while not select.select([rank0.stdout], [], [], 0.5)[0]:
            dead = [p.returncode for p in self._ranks if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"the allreduce ranks failed (exit codes {dead}) or exceeded {RUN_TIMEOUT:.0f} s")
        result: dict[str, Any] = json.loads(rank0.stdout.readline())
        after = self.testbed.hosts["w0"].interface_bytes()
        result["bytes"] = [(b - a) / iterations for a, b in zip(before, after, strict=True)]
        return result

    def close(self) -> None:
        rank0 = self._ranks[0]
        with contextlib.suppress(OSError, ValueError):
            assert rank0.stdin is not None
            rank0.stdin.write("null\n")
            rank0.stdin.close()
        for process in self._ranks:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ---- measuring ---------------------------------------------------------------------------------------------------
def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        value = values[0] if values else math.nan
        return value, value, value
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def job_spec(system: System, workload: Workload, delays: Delays, iterations: int, *, verify: bool = False) -> Any:
    """The JobSpec of ``system`` on ``workload`` under ``delays`` (its worker ids left for the caller)."""
    return build_job_spec(
        scheme=system.scheme, code_params=system.code_params, model=workload.model, dataset=workload.dataset,
        num_samples=workload.num_samples, num_features=workload.num_features, test_fraction=workload.test_fraction,
        learning_rate=workload.learning_rate, l2=workload.l2, iterations=iterations, deadline_seconds=60.0,
        verify=verify, straggler=delays.model, straggler_params=delays.params, straggler_seed=delays.seed,
        seed=workload.seed, wait_for_workers_seconds=START_TIMEOUT, surplus=system.surplus,
        model_delivery=system.model_delivery,
    )  # fmt: skip


def _throttled(testbed: Testbed, roles: Sequence[str]) -> list[float]:
    """Seconds the CPU quota has held back each of these hosts so far."""
    return [testbed.hosts[role].throttled_seconds() for role in roles]


def _per_iteration(before: Sequence[float], after: Sequence[float], count: int) -> list[float]:
    return [(b - a) / count for a, b in zip(before, after, strict=True)]


async def gradcode_job(
    cluster: EmulatedCluster, client: GradcodeClient, ids: list[int], roles: list[str], system: System,
    workload: Workload, delays: Delays, iterations: int,
) -> dict[str, Any]:  # fmt: skip
    """Run one job of ``system`` on the workers ``ids`` (hosts ``roles``, in job order): its iteration times, the
    master host's bytes and the hosts' CPU throttling per steady iteration, exactness, the load before it, its id
    (the master's history is ``<run_dir>/<job_id>.jsonl``)."""
    spec = job_spec(system, workload, delays, iterations)
    spec.worker_ids[:] = ids[: system.workers]
    counters: dict[int, tuple[tuple[int, int], list[float]]] = {}
    watched = ["m", *roles[: system.workers]]

    def sample(report: master_pb2.IterationReport) -> None:
        if report.iteration in (SKIP_ITERATIONS, iterations):
            counters[report.iteration] = (cluster.master_bytes(), _throttled(cluster.testbed, watched))

    load = load_average()
    info, reports = await client.run(spec, sample)
    if info.state != master_pb2.JOB_STATE_SUCCEEDED:
        raise RuntimeError(f"{system.name} at n = {system.workers} failed: {info.message}")
    counted = iterations - SKIP_ITERATIONS
    counted_reports = [r for r in reports if r.iteration > SKIP_ITERATIONS]
    (start_bytes, start_throttled), (end_bytes, end_throttled) = counters[SKIP_ITERATIONS], counters[iterations]
    throttled = _per_iteration(start_throttled, end_throttled, counted)
    return {
        "elapsed_s": [r.elapsed_seconds for r in reports],
        "bytes": _per_iteration(start_bytes, end_bytes, counted),
        "report_bytes": [  # what the master's reports say it received and sent (counted at its streams)
            statistics.mean(r.bytes_received for r in counted_reports),
            statistics.mean(r.bytes_sent for r in counted_reports),
        ],
        "promoted": statistics.mean(len(r.promoted_workers) for r in counted_reports),
        "compute_s": _median_compute(counted_reports),
        "master_throttled_s": throttled[0],
        "worker_throttled_s": max(throttled[1:]),
        "exact": all(r.exact for r in reports),
        "load": load,
        "job_id": info.job_id,
    }


def _median_compute(reports: Sequence[master_pb2.IterationReport]) -> float:
    """The median of the seconds the workers said they computed their messages (their trailers), over every worker
    and iteration of ``reports`` (a tree parent's covers its children's round); NaN if none said."""
    seconds = [t.compute_seconds for r in reports for t in r.timings if t.compute_seconds > 0]
    return statistics.median(seconds) if seconds else math.nan


async def verify_exact(client: GradcodeClient, system: System, workload: Workload, ids: Sequence[int]) -> float:
    """A short ``verify`` job of ``system`` on the workers ``ids``: its worst relative gradient error; RuntimeError
    unless it succeeded with every iteration exact."""
    spec = job_spec(system, workload, Delays("none"), 3, verify=True)
    spec.worker_ids[:] = ids[: system.workers]
    info, reports = await client.run(spec)
    errors = [r.verify_error for r in reports]
    if info.state != master_pb2.JOB_STATE_SUCCEEDED or not all(r.exact for r in reports) or min(errors) < 0:
        raise RuntimeError(f"verify job of {system.name}, n = {system.workers}: {info.message} {errors}")
    return max(errors)


def _allreduce_job(ranks: AllreduceRanks, delays: Delays, iterations: int) -> dict[str, Any]:
    load = load_average()
    before = _throttled(ranks.testbed, ranks.roles)
    result = ranks.run(delays, iterations)
    throttled = _per_iteration(before, _throttled(ranks.testbed, ranks.roles), iterations)
    return {
        "elapsed_s": result["elapsed_s"],
        "bytes": result["bytes"],
        "master_throttled_s": math.nan,
        "worker_throttled_s": max(throttled),
        "exact": True,
        "load": load,
    }


def _floor(testbed: Testbed, system: System, roles: list[str], wire: Sequence[float]) -> dict[str, float]:
    """The testbed's floor for one iteration's measured bytes (``wire``: into and out of the master's host, or
    rank 0's): plain TCP moving them between the same hosts over the same links, :data:`FLOOR_REPEATS`
    iterations' worth on each connection (a running system's connections are warm), per iteration, scaled to
    the same wire bytes (frames, headers included).

    gradcode: the master and the workers it talks to (a tree's first layer: the floor of the master's link, the
    tree's lower links are not counted), equal shares; ``floor_s`` moves the model out and the messages in at
    once (a design that overlaps them), ``floor_phased_s`` one after the other (all models out, then all
    messages in). The allreduce: every rank sends what rank 0 sent to its ring neighbour. ``floor_rate_s``:
    the larger direction's wire bytes over the link's nominal rate."""
    received, sent = wire
    if system.scheme == ALLREDUCE:
        ring = roles[: system.workers]
        flows = [[(ring[r], ring[(r + 1) % len(ring)], sent) for r in range(len(ring))]]
        watched, rate = ring[0], testbed.hosts[ring[0]].spec.rate_mbit
        phased = flows
    else:
        peers = roles[: system.first_layer]
        out = [("m", p, sent / len(peers)) for p in peers]
        into = [(p, "m", received / len(peers)) for p in peers]
        watched, rate = "m", testbed.hosts["m"].spec.rate_mbit
        flows, phased = [out + into], [out, into]
    host = testbed.hosts[watched]

    def seconds(phase: list[tuple[str, str, float]]) -> float:
        before = host.interface_bytes()
        taken = testbed.transfer([(a, b, max(1, round(size * PAYLOAD_SHARE * FLOOR_REPEATS))) for a, b, size in phase])
        moved = _per_iteration(before, host.interface_bytes(), FLOOR_REPEATS)
        directions = [sum(size for a, _, size in phase if a == watched), sum(s for _, b, s in phase if b == watched)]
        wire_bytes, moved_bytes = max(directions), moved[1] if directions[0] >= directions[1] else moved[0]
        return taken / FLOOR_REPEATS * wire_bytes / moved_bytes

    return {
        "floor_s": sum(seconds(phase) for phase in flows),
        "floor_phased_s": sum(seconds(phase) for phase in phased),
        "floor_rate_s": max(received, sent) * 8 / (rate * 1e6),
    }


def _spread(testbed: Testbed, peers: Sequence[str], model_bytes: int) -> float:
    """How one model (``model_bytes``) sent from the master's host to each of ``peers`` at once ends
    (:func:`~gradcode.common.sim.simulate.broadcast_spread`, the median of :data:`SPREAD_REPEATS` bursts), for the
    simulator; 0 for a single peer."""
    if len(peers) < 2:
        return 0.0
    burst = [("m", p, max(1, round(model_bytes * PAYLOAD_SHARE))) for p in peers]
    return statistics.median(
        broadcast_spread(list(testbed.transfer_ends(burst).values())) for _ in range(SPREAD_REPEATS)
    )


PAYLOAD_SHARE = 0.95
"""The bare transfer sends this share of the wire bytes as payload (TCP/IP and Ethernet headers make up the
rest, roughly); its time is then scaled by the wire bytes it really moved."""
FLOOR_REPEATS = 4
"""Iterations' worth of bytes each bare connection carries (connection set-up and slow start amortised)."""
SPREAD_REPEATS = 3
"""Bursts of one model per worker measuring how the master's link ends them (``broadcast_spread``)."""


async def _measure(
    testbed: Testbed, cluster: EmulatedCluster, compared: Mapping[int, Sequence[System]], rounds: int,
    iterations: int, delay: float, data_root: Path, features: int = NUM_FEATURES,
    on_row: Callable[[list[dict[str, Any]], dict[str, float]], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:  # fmt: skip
    """Every row of the run, the ``compared`` systems at each n (``on_row`` is told the rows so far after each one),
    and each system's worst verified error."""
    rows: list[dict[str, Any]] = []
    verified: dict[str, float] = {}
    kills = oom_kills()
    async with GradcodeClient(cluster.client_address) as client:
        await client.wait_ready(START_TIMEOUT)
        by_address = await cluster.pool_ids(client)
        ids = [by_address[a] for a in cluster.worker_addresses]
        roles = [h.role for h in testbed.hosts.values() if h.role != "m"]
        for n, systems in compared.items():
            workload = workload_at(n, features, iterations)
            for system in systems:
                if system.scheme == ALLREDUCE:
                    continue
                verified[f"{system.name}, n={n}"] = error = await verify_exact(client, system, workload, ids)
                print(f"  verified {system.name:<16} n={n:<3} worst relative error {error:.1e}", flush=True)
            data_dir = data_root / f"n{n}"
            data_dir.mkdir(parents=True, exist_ok=True)
            ranks = (
                AllreduceRanks(testbed, prepare_data(workload, data_dir), data_dir)
                if any(system.scheme == ALLREDUCE for system in systems)
                else None
            )
            try:
                floors: dict[str, dict[str, float]] = {}
                spreads: dict[int, float] = {}  # by the number of workers the master sends the model to
                for round_ in range(rounds):
                    for stragglers, system in _order(round_, systems):
                        delays = (
                            Delays.random_workers(delay, 1, system.workers, seed=round_)
                            if stragglers else Delays("none")
                        )  # fmt: skip
                        if system.scheme == ALLREDUCE:
                            assert ranks is not None
                            job = await asyncio.to_thread(_allreduce_job, ranks, delays, iterations)
                        else:
                            job = await gradcode_job(cluster, client, ids, roles, system, workload, delays, iterations)
                        if system.name not in floors:
                            floors[system.name] = _floor(testbed, system, roles, job["bytes"])
                        peers = 0 if system.scheme == ALLREDUCE else system.first_layer
                        if peers not in spreads:
                            spreads[peers] = _spread(testbed, roles[:peers], 8 * (features + 1))
                        measured = {**floors[system.name], "broadcast_spread": spreads[peers]}
                        row = _row(n, system, stragglers, round_, job, measured)
                        now = oom_kills()
                        killed, kills = new_oom_kills(kills, now), now
                        row["oom_kills"] = None if killed is None else len(killed)
                        rows.append(row)
                        print(_progress(row), flush=True)
                        for line in killed or ():
                            print(f"  WARNING: the kernel's OOM killer ended a process during this job: {line}")
                        if on_row is not None:
                            on_row(rows, verified)
            finally:
                if ranks is not None:
                    ranks.close()
    return rows, verified


def _order(round_: int, systems: Sequence[System]) -> list[tuple[int, System]]:
    """Round ``round_``'s jobs: every system with no straggler and with one; odd rounds run them in the reverse order,
    so neither a system nor the straggler setting always runs first (on a shared machine the load drifts)."""
    jobs = [(stragglers, system) for stragglers in (0, 1) for system in systems]
    return jobs[::-1] if round_ % 2 else jobs


def _row(
    n: int, system: System, stragglers: int, round_: int, job: dict[str, Any], floor: dict[str, float]
) -> dict[str, Any]:
    periods = steady_periods(job["elapsed_s"])
    q1, median, q3 = _quartiles(periods)
    return {
        "n": n, "system": system.name, "scheme": system.scheme, "workers": system.workers,
        "code_params": system.code_params, "surplus": system.surplus, "model_delivery": system.model_delivery,
        "stragglers": stragglers, "round": round_,
        "median_s": median, "q1_s": q1, "q3_s": q3, "periods_s": periods,
        "master_in_bytes": job["bytes"][0], "master_out_bytes": job["bytes"][1],
        "report_in_bytes": job.get("report_bytes", [math.nan] * 2)[0],
        "report_out_bytes": job.get("report_bytes", [math.nan] * 2)[1],
        "promoted_per_iteration": job.get("promoted", math.nan), "compute_s": job.get("compute_s", math.nan),
        "master_throttled_s": job["master_throttled_s"], "worker_throttled_s": job["worker_throttled_s"],
        "exact": job["exact"], "load": job["load"],
        **floor, "over_floor": median / floor["floor_s"],
    }  # fmt: skip


def _progress(row: dict[str, Any]) -> str:
    return (
        f"  n={row['n']:<3} {'1 straggler' if row['stragglers'] else 'none':<11} {row['system']:<16}"
        f" {row['median_s'] * 1e3:8.1f} ms (IQR {row['q1_s'] * 1e3:.0f}-{row['q3_s'] * 1e3:.0f})"
        f"  master in/out {row['master_in_bytes'] / 1e6:5.2f}/{row['master_out_bytes'] / 1e6:5.2f} MB"
        f"  floor {row['floor_s'] * 1e3:6.1f} ms  x{row['over_floor']:.2f}  load {row['load'][0]:.2f}"
        f"  reports in/out {row.get('report_in_bytes', math.nan) / 1e6:.2f}/"
        f"{row.get('report_out_bytes', math.nan) / 1e6:.2f} MB"
        f"  pulled {row.get('promoted_per_iteration', math.nan):.2f}"
    )


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per (n, stragglers, system)."""
    table = []
    keys = sorted({(r["n"], r["stragglers"]) for r in rows})
    for n, stragglers in keys:
        names = list(dict.fromkeys(r["system"] for r in rows if r["n"] == n))
        for name in names:
            runs = [r for r in rows if (r["n"], r["stragglers"], r["system"]) == (n, stragglers, name)]
            entry = {k: runs[0][k] for k in ("n", "stragglers", "system", "scheme", "workers", "code_params")}
            entry.update({k: runs[0][k] for k in ("surplus", "model_delivery") if k in runs[0]})
            for key in ("median_s", "q1_s", "q3_s", "master_in_bytes", "master_out_bytes", "floor_s",
                        "floor_phased_s", "floor_rate_s", "master_throttled_s", "worker_throttled_s"):  # fmt: skip
                entry[key] = statistics.median(r[key] for r in runs)
            for key in ("broadcast_spread", "compute_s"):  # (runs before they were measured have none)
                if all(key in r for r in runs):
                    entry[key] = statistics.median(r[key] for r in runs)
            if all(isinstance(r.get("oom_kills"), int) for r in runs):
                entry["oom_kills"] = sum(r["oom_kills"] for r in runs)
            entry["over_floor"] = entry["median_s"] / entry["floor_s"]
            entry["loads"] = [r["load"][0] for r in runs]
            entry["exact"] = all(r["exact"] for r in runs)
            table.append(entry)
    return table


def format_table(result: dict[str, Any]) -> str:
    hosts = result["hosts"]
    lines = [
        f"Emulated cluster: master host {hosts['master']['cpu_percent']:g}% of a core and "
        f"{hosts['master']['rate_mbit']:g} Mbit/s; worker hosts {hosts['worker']['cpu_percent']:g}% of a core and "
        f"{hosts['worker']['rate_mbit']:g} Mbit/s each way; p = {result['p']}, {result['iterations']} iterations, "
        f"{result['rounds']} round(s); straggler = one random worker delayed {result['delay_s']:g} s per iteration",
        f"{'n':>3} {'straggler':>9} {'system':>16} {'workers':>7} {'median ms':>9} {'IQR ms':>13} {'floor ms':>8}"
        f" {'x floor':>7} {'phased':>6} {'in MB':>6} {'out MB':>6} {'thr m/w':>9}  load",
    ]
    for e in result["summary"]:
        lines.append(
            f"{e['n']:>3} {'1' if e['stragglers'] else '0':>9} {e['system']:>16} {e['workers']:>7}"
            f" {e['median_s'] * 1e3:>9.1f} {e['q1_s'] * 1e3:>6.1f}-{e['q3_s'] * 1e3:<6.1f} {e['floor_s'] * 1e3:>8.1f}"
            f" {e['over_floor']:>7.2f} {e['floor_phased_s'] * 1e3:>6.0f}"
            f" {e['master_in_bytes'] / 1e6:>6.2f} {e['master_out_bytes'] / 1e6:>6.2f}"
            f" {e['master_throttled_s'] * 1e3:>4.0f}/{e['worker_throttled_s'] * 1e3:<4.0f}"
            f"  {'/'.join(f'{x:.1f}' for x in e['loads'])}"
        )
    lines += [
        "(median/IQR: time between iterations; floor: plain TCP moving the same bytes between the same hosts over the",
        " same links, both ways at once (phased: model out, then messages in, ms); in/out MB: the master host's",
        " interface per iteration, frames (allreduce: rank 0's host); thr m/w: ms per iteration the CPU quota held",
        " back the master host / the most held back worker host; load: 1-minute loadavg before each run)",
    ]
    return "\n".join(lines)


def _series(entry: dict[str, Any], *, by_shape: bool = False) -> str:
    """The plot's line a row belongs to: its system, a tree's without its size (one line across n, one per way the
    model is delivered: "tree n=4 L=2 relay" is on "tree relay"), unless ``by_shape`` (a run comparing several tree
    shapes at one n, ``--trees``): then each shape has its own line."""
    if entry["scheme"] == "coded_reduce" and not by_shape:
        return re.sub(r" n=\d+ L=\d+", "", entry["system"])
    return str(entry["system"])


def _several_shapes(summary: Sequence[dict[str, Any]]) -> bool:
    """Whether a run compared more than one tree shape at some n."""
    shapes = {(e["n"], e["code_params"]["n"], e["code_params"]["L"]) for e in summary if e["scheme"] == "coded_reduce"}
    return len(shapes) > len({n for n, _, _ in shapes})


def plot(result: dict[str, Any], path: Path) -> None:
    summary = result["summary"]
    ns = sorted({e["n"] for e in summary})
    by_shape = _several_shapes(summary)
    names = list(dict.fromkeys(_series(e, by_shape=by_shape) for e in summary))
    with figure(path, 1, 3, figsize=(16, 4.8), dpi=110) as axes:
        for ax, stragglers in zip(axes[:2], (0, 1), strict=True):
            for name in names:
                entries = [
                    e for e in summary if e["stragglers"] == stragglers and _series(e, by_shape=by_shape) == name
                ]
                ax.errorbar(
                    [e["n"] for e in entries], [e["median_s"] * 1e3 for e in entries],
                    yerr=[[(e["median_s"] - e["q1_s"]) * 1e3 for e in entries],
                          [(e["q3_s"] - e["median_s"]) * 1e3 for e in entries]],
                    marker="o", capsize=3, label=name, linestyle="--" if name == ALLREDUCE else "-",
                )  # fmt: skip
            ax.set_xticks(ns)
            ax.set_xlabel("workers n")
            ax.set_ylabel("ms per iteration (median, IQR)")
            ax.set_title("no straggler" if not stragglers else f"one random straggler ({result['delay_s']:g} s)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        ax = axes[2]
        entries = [e for e in summary if e["stragglers"] == 0 and e["scheme"] != ALLREDUCE]
        labels = [f"{e['system']}\nn={e['n']}" for e in entries]
        xs = range(len(entries))
        ax.bar([x - 0.2 for x in xs], [e["master_in_bytes"] / 1e6 for e in entries], 0.4, label="master in")
        ax.bar([x + 0.2 for x in xs], [e["master_out_bytes"] / 1e6 for e in entries], 0.4, label="master out")
        ax.set_xticks(list(xs), labels, fontsize=6, rotation=90)
        ax.set_ylabel("MB per iteration (no straggler)")
        ax.set_title("the master's link")
        ax.legend(fontsize=8)
        hosts = result["hosts"]
        master = hosts["master"]
        axes[0].figure.suptitle(
            f"p = {result['p']}: master {master['rate_mbit']:g} Mbit/s, {master['cpu_percent']:g}% core;"
            f" workers {hosts['worker']['rate_mbit']:g} Mbit/s, {hosts['worker']['cpu_percent']:g}% core;"
            f" load {min(result['load_range']):.1f}-{max(result['load_range']):.1f}"
        )


def run(
    *, ns: Sequence[int] = (6, 12), rounds: int = 1, iterations: int = 12, master_mbit: float = 200.0,
    worker_mbit: float = 1000.0, master_cpu: float = 50.0, worker_cpu: float | None = None, delay: float = 0.25,
    out: Path = RESULTS, surplus: Sequence[str] = ("",), schemes: Sequence[str] = SCHEMES,
    features: int = NUM_FEATURES, deliveries: Sequence[str] = ("",), histories: Path | None = None,
    redundancy: Sequence[int] = (1,), trees: Sequence[tuple[int, int]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Build the testbed, measure every system at every n, remove the testbed; print, save and return.
    ``histories``: a directory to copy every job's history and spec into; ``redundancy`` and ``trees``: the flat
    codes' s and the trees' shapes (:func:`systems_for`)."""
    if features < 1:
        raise ValueError(f"features must be at least 1, not {features}.")
    if any(n < 2 for n in ns) or not ns:
        raise ValueError(f"every n must be at least 2, not {list(ns)}.")
    if rounds < 1 or iterations <= SKIP_ITERATIONS + 2:
        raise ValueError(f"rounds must be >= 1 and iterations > {SKIP_ITERATIONS + 2}, not {rounds}, {iterations}.")
    compared = {n: systems_for(n, surplus, schemes, deliveries, redundancy=redundancy, trees=trees) for n in ns}
    for n, systems in compared.items():  # a configuration the code refuses, before any host is built
        if not systems:
            raise ValueError(
                f"Nothing to compare at n = {n}: {list(schemes)} has no system there (a tree needs --trees at an n "
                f"other than {sorted(TREES)})."
            )
        for system in systems:
            if system.scheme != ALLREDUCE:
                try:
                    make_code(system.scheme, **system.code_params)
                except ValueError as exc:
                    raise ValueError(f"{system.name} at n = {n}: {exc}") from None
    hosts_needed = max(max(s.workers for s in systems) for systems in compared.values())
    cores = os.cpu_count() or 1
    if worker_cpu is None:  # every host its own share: all quotas together at most the machine's cores
        worker_cpu = max(1.0, math.floor((100 * cores - master_cpu) / hosts_needed))
    specs = [HostSpec("m", master_mbit, master_cpu)]
    specs += [HostSpec(f"w{i}", worker_mbit, worker_cpu) for i in range(hosts_needed)]
    started = time.perf_counter()
    load_start = load_average()
    kills_before = oom_kills()
    partial = out / "cluster.partial.json"

    def save_partial(rows: list[dict[str, Any]], verified: dict[str, float]) -> None:
        """The rows so far, so a run that dies (a full disk, the OOM killer) keeps what it measured."""
        save_json({"verify_max_error": verified, "rows": rows}, partial)

    with tempfile.TemporaryDirectory(prefix="gradcode-bench-cluster-") as tmp, Testbed(specs) as testbed:
        print(
            f"Testbed: master host {master_cpu:g}% of a core, {master_mbit:g} Mbit/s; {hosts_needed} worker hosts"
            f" {worker_cpu:g}% of a core, {worker_mbit:g} Mbit/s each way; load {load_start}",
            flush=True,
        )
        with EmulatedCluster(testbed, Path(tmp) / "cluster", max_features=features) as cluster:
            data = Path(tmp) / "data"
            try:
                rows, verified = asyncio.run(
                    _measure(testbed, cluster, compared, rounds, iterations, delay, data, features, on_row=save_partial)
                )  # fmt: skip
            except BaseException:
                kept = out / "cluster.failed"
                with contextlib.suppress(OSError):  # (a full disk must not hide why the run failed)
                    cluster.keep_for_diagnosis(kept)
                killed = new_oom_kills(kills_before, oom_kills())
                print(
                    f"The run failed: the processes' logs and the jobs' histories are kept in {kept}; the kernel's OOM "
                    f"killer ended {'an unknown number of' if killed is None else len(killed)} process(es) during it.",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                raise
            if histories is not None:
                cluster.copy_histories(histories)
    result: dict[str, Any] = {
        "p": features + 1,
        "num_samples": NUM_SAMPLES,
        "ns": list(ns),
        "iterations": iterations,
        "rounds": rounds,
        "delay_s": delay,
        "surplus": list(surplus),
        "model_delivery": list(deliveries),
        "systems": list(schemes),
        "redundancy": list(redundancy),
        "trees": None if trees is None else [list(t) for t in trees],
        "hosts": {
            "master": {"rate_mbit": master_mbit, "cpu_percent": master_cpu},
            "worker": {"rate_mbit": worker_mbit, "cpu_percent": worker_cpu, "count": hosts_needed},
            "cpu_period_us": testbed.cpu_period_us,
        },
        "cores": cores,
        # gradcode's links send large models one at a time (egress): the simulator takes its broadcasts as one after
        # another, and the measured spread for the relayed fetches only
        "frames_in_turn": True,
        "verify_max_error": verified,
        "summary": summarise(rows),
        "rows": rows,
        "load_range": [r["load"][0] for r in rows],
        "load_start": load_start,
        "load_end": load_average(),
        "oom_kills": new_oom_kills(kills_before, oom_kills()),
        "seconds": time.perf_counter() - started,
    }
    print()
    print(format_table(result))
    if result["oom_kills"]:
        print(
            f"WARNING: the kernel's OOM killer ended {len(result['oom_kills'])} process(es) during this run "
            "(each row's oom_kills says during which job): those rows are not figures of the system measured."
        )
    save(result, out, "cluster", lambda path: plot(result, path))
    partial.unlink(missing_ok=True)
    return result


def _rank_main(argv: Sequence[str]) -> None:  # pragma: no cover - runs on the worker hosts
    rank, world, init, data_dir, workload = argv
    for var in BLAS_THREAD_VARIABLES:
        os.environ[var] = "1"
    allreduce_rank(int(rank), int(world), init, data_dir, Workload(**json.loads(workload)), _Lines())


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["_rank"]:
        _rank_main(args_list[1:])
        return 0
    parser = argparse.ArgumentParser(prog="gradcode bench cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[6, 12], help="worker counts (default: 6 12)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every configuration")
    parser.add_argument("--iterations", type=int, default=12, help="iterations per job")
    parser.add_argument("--master-mbit", type=float, default=200.0, help="the master host's link, Mbit/s each way")
    parser.add_argument("--worker-mbit", type=float, default=1000.0, help="each worker host's link, Mbit/s")
    parser.add_argument("--master-cpu", type=float, default=50.0, help="the master host's CPU quota, %% of a core")
    parser.add_argument(
        "--worker-cpu", type=float, default=None,
        help="each worker host's CPU quota, %% of a core (default: the cores left after the master, shared out)",
    )  # fmt: skip
    parser.add_argument("--delay", type=float, default=0.25, help="the straggler's delay, seconds")
    parser.add_argument("--quick", action="store_true", help="n = 6, 6 iterations: a smoke run")
    parser.add_argument(
        "--features", type=int, default=NUM_FEATURES,
        help=f"features of the linear model (p = features + 1; default {NUM_FEATURES}: p = 1e5; 999999: p = 1e6)",
    )  # fmt: skip
    parser.add_argument(
        "--surplus", nargs="+", choices=["push", "hold", "auto"], default=[""],
        help="run fractional and binary once per mode: what their backups do with their messages (JobSpec.surplus; "
        "default: the master's, auto, which on these hosts holds)",
    )  # fmt: skip
    parser.add_argument(
        "--model-delivery", nargs="+", choices=["direct", "relay", "auto"], default=[""],
        help="run every gradcode system once per way the model reaches the workers it is sent to (a tree's: its "
        "first layer) (JobSpec.model_delivery; default: the master's, direct)",
    )  # fmt: skip
    parser.add_argument(
        "--systems", nargs="+", choices=SCHEMES, default=list(SCHEMES), help="only these systems (default: all)"
    )  # fmt: skip
    parser.add_argument(
        "--s", type=int, nargs="+", default=[1], dest="redundancy",
        help="the stragglers fractional and binary tolerate, one system per value (default: 1)",
    )  # fmt: skip
    parser.add_argument(
        "--trees", type=tree_shape, nargs="+", default=None,
        help="the CodedReduce trees compared at every n, each CHILDRENxLAYERS (e.g. 4x2 2x3; s = 1; default: "
        + ", ".join(f"{c}x{L} at n = {n}" for n, (c, L) in TREES.items()) + ")",
    )  # fmt: skip
    add_out_argument(parser, "cluster")
    parser.add_argument("--histories", type=Path, default=None, help="copy every job's history here (diagnosis)")
    parser.add_argument(
        "--cleanup", action="store_true",
        help="remove the namespaces, cgroups and processes of runs that died (by the name prefix gcb-<pid>-)",
    )  # fmt: skip
    args = parser.parse_args(args_list)
    try:
        check_available()
    except TestbedUnavailableError as error:
        print(f"gradcode bench cluster: {error}", file=sys.stderr)
        return 2
    if args.cleanup:
        removed = cleanup()
        print(json.dumps(removed))
        return 0
    if args.quick:
        run(ns=[6], rounds=1, iterations=6, out=args.out)
    else:
        run(
            ns=args.n, rounds=args.rounds, iterations=args.iterations, master_mbit=args.master_mbit,
            worker_mbit=args.worker_mbit, master_cpu=args.master_cpu, worker_cpu=args.worker_cpu, delay=args.delay,
            out=args.out, surplus=args.surplus, schemes=args.systems, features=args.features,
            deliveries=args.model_delivery, histories=args.histories, redundancy=args.redundancy, trees=args.trees,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
