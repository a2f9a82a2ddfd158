"""The bare iteration: a job's gradients, decode and step in n + 1 processes that do nothing else.

A gradcode iteration, with every check and all the machinery taken out, still has n workers compute their
coded messages and one master combine them and step. :class:`BarePool` runs exactly that, with the job's own
data, partitions, code, decode and optimizer: each worker is a process spawned once, holding its partitions;
per iteration the master writes the model into a shared-memory file, wakes every worker with one byte on a
pipe, each worker computes its message from the file (:meth:`GradientCode.encode` over its partitions'
gradients and statistics, as a gradcode worker does) into its own shared-memory slot and answers with one
byte, and the master feeds the answers to the code's online decoder, combines the first decodable set and
steps. No checksum, no finiteness checks, no framing, no event loop, no reports.

Its time per iteration is the floor any Python design on this machine would pay for the same work: the
wide benchmark (:mod:`gradcode.bench.wide`) quotes gradcode's time as a multiple of it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from gradcode.bench.output import cpu_seconds
from gradcode.client.sdk import code_params_for
from gradcode.common.codes.base import Array, GradientCode, OnlineDecoder
from gradcode.common.codes.registry import make_code
from gradcode.common.training.data import Dataset, load_dataset, partition_indices
from gradcode.common.training.models import Model, make_model, message_length
from gradcode.common.transport.serving import limit_blas_threads, reuse_large_buffers
from gradcode.common.transport.shared_memory import DEFAULT_ROOT
from gradcode.master.optimizer import Optimizer, make_optimizer, mean_gradient

__all__ = ["BareJob", "BarePool"]

START_TIMEOUT = 120.0
_WAKE, _STOP, _DONE = b"w", b"q", b"d"


@dataclass(frozen=True)
class BareJob:
    """What a bare pool runs: the fields of a gradcode JobSpec it shares (same defaults as the SDK's)."""

    scheme: str
    n: int
    s: int
    model: str
    dataset: str
    num_samples: int = 0
    num_features: int = 0
    learning_rate: float = 0.5
    l2: float = 1e-4
    seed: int = 0

    def code(self) -> GradientCode:
        return make_code(self.scheme, **code_params_for(self.scheme, self.n, self.s))

    def data(self) -> tuple[Dataset, Model, list[Any]]:
        """The dataset, the model and the partitions' sample indices, made as the master makes them."""
        dataset = load_dataset(
            self.dataset, num_samples=self.num_samples or None, num_features=self.num_features or None, seed=self.seed
        )
        model = make_model(dataset.model_kind, num_features=dataset.X_train.shape[1], num_classes=dataset.num_classes)
        parts = partition_indices(dataset.num_train, self.code().partition_weights, seed=self.seed)
        return dataset, model, parts


def _mapped(path: Path, length: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.memmap(path, dtype=np.float64, mode="r+", shape=(length,))


Partitions = dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]


def _partitions(code: GradientCode, dataset: Dataset, parts: list[Any], worker: int) -> Partitions:
    """Worker ``worker``'s partitions: features and labels by partition index."""
    return {j: (dataset.X_train[parts[j]], dataset.y_train[parts[j]]) for j in code.partitions_of_worker(worker)}


def _write_messages(
    code: GradientCode, model: Model, params: Array, partitions: Partitions, slots: dict[int, Array]
) -> None:
    """A worker's messages from ``params`` into ``slots`` (row -> its slot): its partitions' gradients with their
    statistics, encoded as the code says."""
    partials = {j: model.gradient_and_statistics(params, X, y) for j, (X, y) in partitions.items()}
    for row, slot in slots.items():
        message = code.encode(row, partials)
        slot[:] = message.real if np.iscomplexobj(message) else message


def _worker(job: BareJob, worker: int, directory: str, length: int, conn: Connection) -> None:
    """One bare worker: on each wake-up, its messages from the model file into its slots, then one byte back."""
    reuse_large_buffers()  # as gradcode's services: gradient-sized buffers are reused, not page-faulted afresh
    dataset, model, parts = job.data()
    code = job.code()
    partitions = _partitions(code, dataset, parts, worker)
    params = _mapped(Path(directory) / "model", model.num_params)
    slots = {row: _mapped(Path(directory) / f"row-{row}", length) for row in code.rows_for_worker(worker)}
    conn.send_bytes(_DONE)
    while conn.recv_bytes() == _WAKE:
        _write_messages(code, model, params, partitions, slots)
        conn.send_bytes(_DONE)


class BarePool:
    """n bare worker processes (spawned, one BLAS thread each) and this process as their master."""

    def __init__(self, job: BareJob) -> None:
        self.job = job
        self.code = job.code()
        dataset, self.model, parts = job.data()
        self._partitions = [_partitions(self.code, dataset, parts, w) for w in range(job.n)]
        self.num_train = dataset.num_train
        self.length = message_length(self.model, statistics=True)
        self.optimizer: Optimizer | None = None
        """The last run's optimizer (its parameters where that run left them)."""
        root = DEFAULT_ROOT if DEFAULT_ROOT.is_dir() else None
        self._directory = tempfile.TemporaryDirectory(prefix="gradcode-bare-", dir=root)
        path = Path(self._directory.name)
        for name, size in [("model", self.model.num_params)] + [
            (f"row-{r}", self.length) for r in range(self.code.num_messages)
        ]:
            with open(path / name, "wb") as f:
                f.truncate(size * 8)
        self.params = _mapped(path / "model", self.model.num_params)
        self.slots = [_mapped(path / f"row-{r}", self.length) for r in range(self.code.num_messages)]
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._processes = []
        limit_blas_threads()  # here, and in the workers it spawns: one thread each, as gradcode's processes
        reuse_large_buffers()
        for worker in range(job.n):
            here, there = context.Pipe()
            process = context.Process(target=_worker, args=(job, worker, str(path), self.length, there), daemon=True)
            process.start()
            there.close()
            self._conns.append(here)
            self._processes.append(process)
        for conn in self._conns:
            if not conn.poll(START_TIMEOUT):
                self.close()
                raise RuntimeError(f"a bare worker did not start within {START_TIMEOUT:.0f} s")
            conn.recv_bytes()

    @property
    def pids(self) -> list[int]:
        """This process's id, then the workers'."""
        return [os.getpid(), *(p.pid for p in self._processes if p.pid is not None)]

    def run(self, iterations: int, skip: int) -> dict[str, float]:
        """Run ``iterations`` from the model's initial parameters. Medians after the first ``skip``: seconds from
        the model's write to the step (``wall_s``) and to the next iteration's start, once every worker has
        answered (``period_s``); CPU seconds per iteration of the master and of all workers together."""
        optimizer = self._optimizer()
        walls: list[float] = []
        periods: list[float] = []
        cpu_start: list[float] = []
        for t in range(iterations):
            if t == skip:
                cpu_start = [cpu_seconds(pid) for pid in self.pids]
            started = time.perf_counter()
            self.params[:] = optimizer.point
            for conn in self._conns:
                conn.send_bytes(_WAKE)
            decoder = self.code.decoder()
            pending = {conn: worker for worker, conn in enumerate(self._conns)}
            while not decoder.decodable:
                for ready in multiprocessing.connection.wait(list(pending)):
                    conn = cast(Connection, ready)
                    conn.recv_bytes()
                    for row in self.code.rows_for_worker(pending.pop(conn)):
                        decoder.add(row)
            self._step(optimizer, decoder)
            stepped = time.perf_counter()
            for conn in pending:  # the rest finish before the model file changes
                conn.recv_bytes()
            walls.append(stepped - started)
            periods.append(time.perf_counter() - started)
        cpu = [cpu_seconds(pid) - before for pid, before in zip(self.pids, cpu_start, strict=True)]
        counted = iterations - skip
        return {
            "wall_s": statistics.median(walls[skip:]),
            "period_s": statistics.median(periods[skip:]),
            "cpu_master_s": cpu[0] / counted,
            "cpu_workers_s": sum(cpu[1:]) / counted,
        }

    def arithmetic(self, iterations: int, skip: int) -> float:
        """Median seconds of one iteration's arithmetic alone, in this process while the workers sleep: every
        worker's messages in turn, from the same data into the same slots, then the decode of the first n - s
        workers and the step. Over this machine's cores, the shortest an iteration could be."""
        optimizer = self._optimizer()
        slots = [{row: self.slots[row] for row in self.code.rows_for_worker(w)} for w in range(self.job.n)]
        times: list[float] = []
        for _ in range(iterations):
            started = time.perf_counter()
            self.params[:] = optimizer.point
            decoder = self.code.decoder()
            for worker, partitions in enumerate(self._partitions):
                _write_messages(self.code, self.model, self.params, partitions, slots[worker])
                for row in slots[worker]:
                    if not decoder.decodable:
                        decoder.add(row)
            self._step(optimizer, decoder)
            times.append(time.perf_counter() - started)
        return statistics.median(times[skip:])

    def _optimizer(self) -> Optimizer:
        """A fresh optimizer at the model's initial parameters, kept as :attr:`optimizer` (the last run's)."""
        self.optimizer = make_optimizer("nesterov", self.model.init_params(), learning_rate=self.job.learning_rate)
        return self.optimizer

    def _step(self, optimizer: Optimizer, decoder: OnlineDecoder) -> None:
        """The master's decode and step, as gradcode's: the decoded sum, its mean gradient, the optimizer."""
        summed = decoder.decoding().combine(dict(enumerate(self.slots)))
        gradient = mean_gradient(
            summed[: self.model.num_params], optimizer.point, num_samples=self.num_train, l2=self.job.l2
        )
        optimizer.step(gradient)

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(_STOP)
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
        self._directory.cleanup()

    def __enter__(self) -> BarePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
