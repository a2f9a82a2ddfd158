r"""What a worker computes, without any gRPC: its job's data and the coded messages of one iteration.

A job arrives as a :class:`~gradcode.v1.worker_pb2.JobSetup` followed by the data of every
partition its rows need, in :class:`~gradcode.v1.worker_pb2.PartitionData` chunks; or, with
``JobSetup.local_data``, the setup alone, and the worker loads its partitions from its own data
directory (:mod:`gradcode.common.training.datasets`).
:class:`JobBuilder` validates each piece as it arrives (offsets, sizes, which partitions the rows
need, a cap on the total bytes) and :meth:`JobBuilder.finish` returns the immutable :class:`WorkerJob`.

Per iteration, message row $r$ with support $S_r$ and coefficients $c$ is
$m_r = \sum_{j \in S_r} c_j g_j$, where $g_j$ is the summed gradient of the model over partition $j$.
:class:`IterationComputation` computes each $g_j$ at most once per iteration, even when two rows
share a partition, and checks a cancellation flag between partitions, so a call the receiver has
given up on stops early instead of delaying the next iteration.

With ``JobSetup.append_statistics`` each $g_j$ is extended to $[g_j, \ell_j, c_j]$
(:meth:`~gradcode.common.training.models.Model.gradient_and_statistics`: the partition's summed loss and
score), so every message carries the coded training statistics too and is
:attr:`WorkerJob.message_length` long.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gradcode.common.codes.base import Array
from gradcode.common.codes.numerics import message_rounding, squared_norm, weighted_sum
from gradcode.common.exceptions import ComputeCancelledError, JobSetupError, JobSpecError
from gradcode.common.training.datafile import MAX_DATA_FILE_BYTES, error_reason, file_error
from gradcode.common.training.datasets import DataSource, load_partitions
from gradcode.common.training.models import Model, make_model, message_length
from gradcode.common.training.plugins import PluginError, model_dtype
from gradcode.common.transport.wire import (
    COMPLEX128,
    FLOAT32,
    FLOAT64,
    MAX_ITERATIONS,
    MAX_JOB_ID_CHARS,
    MESSAGE_DTYPES,
)
from gradcode.v1 import common_pb2, worker_pb2

__all__ = [
    "MAX_JOB_BYTES",
    "ComputeCancelledError",
    "IterationComputation",
    "JobBuilder",
    "JobSetupError",
    "JobStats",
    "JobTooLargeError",
    "RowSpec",
    "WorkerJob",
    "build_job",
]

MAX_JOB_BYTES = 8 * 1024**3
"""Default cap on the features + labels bytes one job may hold on a worker (8 GiB)."""


class JobTooLargeError(JobSetupError):
    """The job's data would exceed the bytes this worker allows one job (the per-job cap)."""


class CancelFlag(Protocol):
    """Anything with ``is_set()``; :class:`threading.Event` in practice."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class RowSpec:
    """One message row this worker may compute: ``sum(coefficients[i] * g[partitions[i]])``."""

    row: int
    partitions: tuple[int, ...]
    coefficients: Array
    """float64, or complex128 when the row has imaginary coefficients."""

    @property
    def is_complex(self) -> bool:
        return bool(np.iscomplexobj(self.coefficients))

    @classmethod
    def from_wire(cls, definition: worker_pb2.RowDefinition) -> RowSpec:
        row = int(definition.row)
        partitions = tuple(int(p) for p in definition.partitions)
        real = np.asarray(definition.coefficients_real, dtype=np.float64)
        imag = np.asarray(definition.coefficients_imag, dtype=np.float64)
        if len(set(partitions)) != len(partitions):
            raise JobSetupError(f"Row {row} lists a partition twice: {list(partitions)}.")
        if real.size != len(partitions):
            raise JobSetupError(
                f"Row {row} has {len(partitions)} partitions but {real.size} real coefficients; they must match."
            )
        if imag.size not in (0, len(partitions)):
            raise JobSetupError(
                f"Row {row} has {len(partitions)} partitions but {imag.size} imaginary coefficients; "
                "give one per partition or none (real code)."
            )
        coefficients: Array = real if imag.size == 0 or not imag.any() else real + 1j * imag
        if not np.all(np.isfinite(coefficients)):
            raise JobSetupError(f"Row {row} has non-finite coefficients {coefficients.tolist()}.")
        coefficients.setflags(write=False)
        return cls(row=row, partitions=partitions, coefficients=coefficients)


@dataclass
class JobStats:
    """Counters a worker keeps per job (read by tests and logs; updated from compute threads)."""

    iterations_completed: int = 0
    iterations_cancelled: int = 0
    """Computations that stopped early because their flag was set."""
    partitions_computed: int = 0
    calls_cancelled: int = 0
    """Compute calls the receiver cancelled (seen by the service)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **increments: int) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self, name, getattr(self, name) + value)


class WorkerJob:
    """One job's model, rows and partition data on a worker; immutable once built."""

    def __init__(
        self,
        setup: worker_pb2.JobSetup,
        model: Model,
        rows: dict[int, RowSpec],
        partitions: dict[int, tuple[Array, Array]],
        message_dtype: np.dtype[Any],
        bytes_received: int,
    ) -> None:
        self.setup = setup
        self.job_id: str = setup.job_id
        self.worker_id: int = int(setup.worker_id)
        self.model = model
        self.rows = rows
        self.partitions = partitions
        self.message_dtype = message_dtype
        self.bytes_received = bytes_received
        self.append_statistics = bool(setup.append_statistics)
        self.message_length = message_length(model, statistics=self.append_statistics)
        """Elements of every message: the parameters, plus loss and score with ``append_statistics``."""
        self.stats = JobStats()

    @property
    def num_params(self) -> int:
        return int(self.model.num_params)

    def row_dtype(self, row: int) -> np.dtype[Any]:
        """Wire dtype of ``row``'s message: complex128 for complex rows, else the job's message dtype."""
        return COMPLEX128 if self.rows[row].is_complex else self.message_dtype

    def check_params(self, params: Array) -> Array:
        """Return ``params`` as float64 if it is a flat vector of the model's length; else ValueError."""
        p = np.asarray(params)
        if p.ndim != 1 or p.shape[0] != self.num_params:
            raise ValueError(
                f"The model has {p.size} parameters (shape {p.shape}); job {self.job_id!r} "
                f"({self.model!r}) expects {self.num_params}."
            )
        if p.dtype != FLOAT64:
            raise ValueError(f"The model parameters must be float64, not {p.dtype}.")
        return p

    def check_rows(self, rows: Sequence[int]) -> tuple[int, ...]:
        """Return ``rows`` if every one is a row of this worker, once each; else ValueError listing them."""
        if not rows:
            raise ValueError(f"No rows requested; worker {self.worker_id} of job {self.job_id!r} has {self.row_ids}.")
        unknown = [r for r in rows if r not in self.rows]
        if unknown:
            raise ValueError(
                f"Row(s) {unknown} were not given to worker {self.worker_id} in job {self.job_id!r}; "
                f"it has rows {self.row_ids}."
            )
        if len(set(rows)) != len(rows):
            raise ValueError(f"Rows {list(rows)} name a row twice; ask for each row once.")
        return tuple(int(r) for r in rows)

    @property
    def iterations(self) -> int:
        """The last iteration this job may compute: its JobSetup's length, else the wire's MAX_ITERATIONS."""
        return int(self.setup.iterations) or MAX_ITERATIONS

    def check_iteration(self, iteration: int) -> int:
        """``iteration`` if the job reaches it; else ValueError saying the job's length.

        An iteration beyond the job's end would become the newest one started, and every real one after it would
        be refused as older."""
        if iteration > self.iterations:
            raise ValueError(
                f"iteration {iteration} is beyond job {self.job_id!r}'s last iteration, {self.iterations} "
                "(JobSetup.iterations); iterations are numbered from 1 to the job's length."
            )
        return iteration

    @property
    def row_ids(self) -> list[int]:
        return sorted(self.rows)

    def start(
        self,
        params: Array,
        *,
        cancelled: CancelFlag | None = None,
        on_partition: Callable[[int], None] | None = None,
    ) -> IterationComputation:
        """A computation for one iteration at ``params`` (validated)."""
        return IterationComputation(self, self.check_params(params), cancelled=cancelled, on_partition=on_partition)


class IterationComputation:
    """The partial gradients of one iteration, each computed at most once, and the messages built from them.

    Runs in a worker thread (``asyncio.to_thread``), or on the event loop when its messages or partitions are
    known to be short (:data:`gradcode.worker.runtime.INLINE_MESSAGE_SECONDS`,
    :data:`~gradcode.worker.runtime.INLINE_PARTITION_SECONDS`); :meth:`message` checks ``cancelled`` before every
    partition and raises :class:`ComputeCancelledError` when it is set.
    """

    def __init__(
        self,
        job: WorkerJob,
        params: Array,
        *,
        cancelled: CancelFlag | None = None,
        on_partition: Callable[[int], None] | None = None,
    ) -> None:
        self.job = job
        self.params = params
        self.cancelled = cancelled
        self.on_partition = on_partition
        self.partials: dict[int, Array] = {}
        self.longest_partition_seconds = 0.0
        """CPU seconds (of the thread computing it) of the longest partial gradient this computation computed (0
        before the first): how long it holds the event loop when run there, whatever other processes share the
        cores meanwhile. Wall time would count the waits for a core, three times the CPU for six workers on two."""
        self._cancel_counted = False

    def sharing(self, cancelled: CancelFlag) -> IterationComputation:
        """This computation under another cancel flag, sharing its partial gradients: a backup's attempt that stops
        at its next partition once promoted, the partitions it finished kept for the promoted one."""
        other = IterationComputation(self.job, self.params, cancelled=cancelled, on_partition=self.on_partition)
        other.partials = self.partials
        other._cancel_counted = True  # its stop is no cancelled iteration
        return other

    def partial(self, partition: int) -> Array:
        """$g_j$: the summed gradient over ``partition``, with its loss and score appended when the job
        asks for statistics (cached for this iteration)."""
        cached = self.partials.get(partition)
        if cached is not None:
            return cached
        if self.cancelled is not None and self.cancelled.is_set():
            if not self._cancel_counted:
                self._cancel_counted = True
                self.job.stats.add(iterations_cancelled=1)
            raise ComputeCancelledError(f"Iteration cancelled before partition {partition} was computed.")
        started = time.thread_time()
        X, y = self.job.partitions[partition]
        model = self.job.model
        g = (
            model.gradient_and_statistics(self.params, X, y)
            if self.job.append_statistics
            else model.gradient(self.params, X, y)
        )
        self.partials[partition] = g
        self.job.stats.add(partitions_computed=1)
        if self.on_partition is not None:
            self.on_partition(partition)
        self.longest_partition_seconds = max(self.longest_partition_seconds, time.thread_time() - started)
        return g

    def message(self, row: int) -> tuple[Array, float]:
        """Row ``row``'s message in its wire dtype, and the seconds computing it took (its partial gradients not
        computed for an earlier row, and their combination)."""
        started = time.perf_counter()
        spec = self.job.rows[row]
        partials = [self.partial(partition) for partition in spec.partitions]
        if not partials:
            out = np.zeros(self.job.message_length, dtype=np.complex128 if spec.is_complex else np.float64)
        elif len(partials) == 1 and spec.coefficients[0] == 1 and not spec.is_complex:
            out = partials[0]  # uncoded: the partial gradient is the message, not a copy of it
        else:
            out = weighted_sum(partials, spec.coefficients)
        seconds = time.perf_counter() - started
        return out.astype(self.job.row_dtype(row), copy=False), seconds

    def magnitude(self, row: int) -> float:
        r"""$\sum_j |c_j| \|g_j\|$ of row ``row`` (after :meth:`message`) over the gradient elements (not the appended
        statistics): what makes the receiver's error certificate a bound even when the partial gradients cancel
        inside the message, and bounds each partition's norm for its weight term.

        Norms accumulate in float64 whatever the gradients' dtype (:func:`~gradcode.common.codes.numerics.squared_norm`:
        float32 squares of 1e-30 entries underflow to 0). Sent for every row, one partition included: in a tree the
        receiver's row may stand for several partitions, so it cannot tell one partition from a missing value."""
        spec, n = self.job.rows[row], self.job.num_params
        norms = [math.sqrt(squared_norm(self.partials[j][:n])) for j in spec.partitions]
        return float(np.abs(spec.coefficients) @ norms) if norms else 0.0

    def rounding(self, row: int, magnitude: float) -> float:
        r"""Certified absolute error of row ``row``'s message (0 for a row of at most one partition: its receiver
        bounds that itself): the float64 sum of $w$ products, $\gamma_w(u_{64}) \mu$, its cast to the wire dtype,
        $u \mu (1 + \gamma_w)$, and underflow, $\sqrt{p}\,(w + 1)\,\eta$ (Higham, *Accuracy and Stability*, 2nd
        ed., eqs. (2.8), (3.4), (4.3); :func:`~gradcode.common.codes.numerics.bound_combination` takes it in
        place of its own estimate of this term, which counts the receiver's columns, not the sender's terms)."""
        spec = self.job.rows[row]
        terms = len(spec.partitions)
        if terms <= 1:
            return 0.0
        return message_rounding(terms, magnitude, self.job.row_dtype(row), self.job.num_params)


@dataclass
class _PartitionBuffer:
    num_samples: int
    features: Array
    labels: Array
    features_filled: int = 0
    labels_filled: int = 0

    @property
    def complete(self) -> bool:
        return self.features_filled == self.features.nbytes and self.labels_filled == self.labels.nbytes


class JobBuilder:
    """Validates a JobSetup, then assembles the partition data chunk by chunk.

    Chunks of one partition arrive in byte order (``features_offset``/``labels_offset`` equal to the
    bytes of that partition received so far); partitions may interleave. ``num_samples`` must be the
    same on every chunk of a partition (0 on a later chunk means "as before"). Features are
    ``num_samples x num_features`` float64, labels ``num_samples`` float64, little-endian.
    """

    def __init__(
        self,
        setup: worker_pb2.JobSetup,
        *,
        max_bytes: int = MAX_JOB_BYTES,
        data_dir: Path | None = None,
        max_file_bytes: int = MAX_DATA_FILE_BYTES,
        reserve: Callable[[int], None] | None = None,
    ) -> None:
        if not setup.job_id:
            raise JobSetupError("JobSetup.job_id is empty; give the job a name.")
        if len(setup.job_id) > MAX_JOB_ID_CHARS:
            raise JobSetupError(
                f"JobSetup.job_id has {len(setup.job_id)} characters; a job id may have at most {MAX_JOB_ID_CHARS}."
            )
        self.setup = setup
        self.max_bytes = max_bytes
        self.reserve = reserve
        """Told each partition's declared bytes before its buffer is allocated (the worker's budget across jobs);
        it raises to refuse them."""
        spec = setup.model
        try:
            self.model = make_model(
                spec.kind,
                num_features=int(spec.num_features),
                num_classes=spec.num_classes or 2,
                dtype=model_dtype(setup.message_dtype),
            )
        except ValueError as exc:
            raise JobSetupError(f"JobSetup.model is invalid: {exc}") from None
        if not setup.rows:
            raise JobSetupError(f"JobSetup for job {setup.job_id!r} has no rows; a worker needs at least one.")
        if setup.iterations > MAX_ITERATIONS:
            raise JobSetupError(
                f"JobSetup.iterations is {setup.iterations}; a job may run at most {MAX_ITERATIONS} iterations."
            )
        self.rows: dict[int, RowSpec] = {}
        for definition in setup.rows:
            row = RowSpec.from_wire(definition)
            if row.row in self.rows:
                raise JobSetupError(f"Row {row.row} is defined twice in JobSetup.rows.")
            self.rows[row.row] = row
        if setup.message_dtype not in MESSAGE_DTYPES:
            valid = [common_pb2.DType.Name(d) for d in MESSAGE_DTYPES if d]
            raise JobSetupError(
                f"JobSetup.message_dtype {common_pb2.DType.Name(setup.message_dtype)} is not a message type; "
                f"valid: {valid}."
            )
        self.message_dtype = MESSAGE_DTYPES[setup.message_dtype]
        complex_rows = sorted(r for r, spec_ in self.rows.items() if spec_.is_complex)
        if complex_rows and self.message_dtype == FLOAT32:
            raise JobSetupError(
                f"Rows {complex_rows} have complex coefficients, which DTYPE_FLOAT32 messages cannot carry; "
                "use DTYPE_FLOAT64 (complex rows are then sent as complex128)."
            )
        self.needed = sorted({p for row in self.rows.values() for p in row.partitions})
        self.local = setup.local_data if setup.HasField("local_data") else None
        self.data_dir, self.max_file_bytes = data_dir, max_file_bytes
        if self.local is not None and setup.num_partitions_sent:
            raise JobSetupError(
                f"JobSetup has local_data but announces {setup.num_partitions_sent} partitions sent; a worker-local "
                "job loads its partitions here, so it must announce 0."
            )
        if self.local is None and setup.num_partitions_sent != len(self.needed):
            raise JobSetupError(
                f"JobSetup announces {setup.num_partitions_sent} partitions, but its rows need exactly "
                f"{len(self.needed)}: {self.needed}."
            )
        self._buffers: dict[int, _PartitionBuffer] = {}
        self.bytes_received = 0
        self._bytes_declared = 0

    def add(self, data: worker_pb2.PartitionData) -> None:
        """Copy one chunk into place, refusing anything that does not fit."""
        p = int(data.partition)
        if self.local is not None:
            raise JobSetupError(
                f"Data for partition {p} arrived, but this job's data is worker-local (JobSetup.local_data): "
                "the worker loads its partitions itself and takes no PartitionData."
            )
        if p not in self.rows_partitions:
            raise JobSetupError(f"Data for partition {p}, which no row of this worker needs; it needs {self.needed}.")
        buffer = self._buffers.get(p)
        if buffer is None:
            buffer = self._allocate(p, int(data.num_samples))
        elif data.num_samples not in (0, buffer.num_samples):
            raise JobSetupError(
                f"Partition {p}: a chunk says num_samples={data.num_samples}, an earlier one {buffer.num_samples}."
            )
        buffer.features_filled = self._copy(p, "features", buffer.features, buffer.features_filled, data)
        buffer.labels_filled = self._copy(p, "labels", buffer.labels, buffer.labels_filled, data)

    @property
    def rows_partitions(self) -> frozenset[int]:
        return frozenset(self.needed)

    def _allocate(self, partition: int, num_samples: int) -> _PartitionBuffer:
        num_features = int(self.setup.model.num_features)
        size = num_samples * (num_features + 1) * 8
        if self._bytes_declared + size > self.max_bytes:
            raise JobTooLargeError(
                f"Partition {partition} ({num_samples} samples x {num_features} features) would bring job "
                f"{self.setup.job_id!r} to {self._bytes_declared + size} bytes, over this worker's limit of "
                f"{self.max_bytes} bytes."
            )
        if self.reserve is not None:
            self.reserve(size)
        self._bytes_declared += size
        buffer = _PartitionBuffer(
            num_samples=num_samples,
            features=np.empty((num_samples, num_features), dtype=FLOAT64),
            labels=np.empty(num_samples, dtype=FLOAT64),
        )
        self._buffers[partition] = buffer
        return buffer

    def _copy(self, partition: int, what: str, target: Array, filled: int, data: worker_pb2.PartitionData) -> int:
        payload: bytes = getattr(data, what)
        offset = int(getattr(data, f"{what}_offset"))
        if not payload:
            return filled
        if offset != filled:
            raise JobSetupError(
                f"Partition {partition}: {what} chunk at byte offset {offset}, expected {filled} (chunks must arrive "
                "in order without gaps or overlaps)."
            )
        end = filled + len(payload)
        if end > target.nbytes:
            raise JobSetupError(
                f"Partition {partition}: {what} overflow, {end} bytes received but {target.nbytes} expected "
                f"for {target.shape[0]} samples."
            )
        target.reshape(-1).view(np.uint8)[filled:end] = np.frombuffer(payload, dtype=np.uint8)
        self.bytes_received += len(payload)
        return end

    def _load_local(self, local: worker_pb2.LocalData) -> None:
        """Load every needed partition from this worker's data
        (:func:`gradcode.common.training.datasets.load_partitions`)."""
        source = DataSource(
            name=local.dataset, path=local.path, options=dict(local.options),
            num_samples=int(local.num_samples) or None, num_features=int(local.num_features) or None,
            seed=int(local.dataset_seed), data_dir=self.data_dir,
            max_file_bytes=self.max_file_bytes, where="worker",
        )  # fmt: skip
        num_features = int(self.setup.model.num_features)

        def budget(samples: dict[int, int]) -> None:
            for p, n in samples.items():
                self._allocate(p, n)  # checks the job's byte cap before anything is read

        try:
            loaded = load_partitions(
                source, test_fraction=float(local.test_fraction), partition_seed=int(local.partition_seed),
                weights=list(local.partition_weights), wanted=self.needed, num_rows=int(local.num_rows),
                num_features=num_features, signed=bool(local.signed_labels), check_bytes=budget,
            )  # fmt: skip
        except (JobSetupError, JobSpecError, PluginError):
            raise
        except Exception as exc:  # a reader's or plugin's error; a file's never echoes its content
            if local.dataset == "file" and isinstance(exc, (ValueError, OSError)):
                raise JobSetupError(
                    f"Dataset 'file' {local.path[:64]!r} refused on this worker: {file_error(exc)}."
                ) from None
            raise JobSetupError(f"Dataset {local.dataset[:64]!r} refused on this worker: {error_reason(exc)}") from None
        for p, (X, y) in loaded.items():
            buffer = self._buffers[p]
            buffer.features[...] = X
            buffer.labels[...] = y
            buffer.features_filled, buffer.labels_filled = buffer.features.nbytes, buffer.labels.nbytes
            self.bytes_received += X.nbytes + y.nbytes

    def finish(self) -> WorkerJob:
        """Check that every needed partition is complete and valid (loading it first when worker-local), and
        return the job."""
        if self.local is not None:
            self._load_local(self.local)
        missing = [p for p in self.needed if p not in self._buffers]
        if missing:
            raise JobSetupError(f"No data arrived for partition(s) {missing}; the rows need {self.needed}.")
        partitions: dict[int, tuple[Array, Array]] = {}
        for p in self.needed:
            buffer = self._buffers[p]
            if not buffer.complete:
                raise JobSetupError(
                    f"Partition {p} is incomplete: {buffer.features_filled} of {buffer.features.nbytes} feature bytes "
                    f"and {buffer.labels_filled} of {buffer.labels.nbytes} label bytes arrived."
                )
            if not (np.all(np.isfinite(buffer.features)) and np.all(np.isfinite(buffer.labels))):
                raise JobSetupError(f"Partition {p} holds NaN or infinite values.")
            try:  # one gradient at the initial point validates the labels for this model now, not mid-job
                self.model.gradient(self.model.init_params(), buffer.features, buffer.labels)
            except ValueError as exc:
                raise JobSetupError(f"Partition {p}: {exc}") from None
            buffer.features.setflags(write=False)
            buffer.labels.setflags(write=False)
            partitions[p] = (buffer.features, buffer.labels)
        return WorkerJob(self.setup, self.model, self.rows, partitions, self.message_dtype, self.bytes_received)


def build_job(setup: worker_pb2.JobSetup, data: Sequence[worker_pb2.PartitionData]) -> WorkerJob:
    """Convenience for tests and tools: validate ``setup``, add every chunk, finish."""
    builder = JobBuilder(setup)
    for chunk in data:
        builder.add(chunk)
    return builder.finish()
