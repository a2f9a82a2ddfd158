"""One training job on the master: validate the spec, load the workers, run the coded GD loop.

:func:`plan_job` turns a wire :class:`JobSpec` into a :class:`JobPlan` (the code, model, dataset and
partitions) or raises :class:`JobSpecError` with the precise reason, so CreateJob can refuse a bad
spec before anything starts; sizes are checked against the ``MAX_*`` caps (workers, partitions,
samples, features, dataset and model bytes, data-file size) before anything is built, and a ``file``
dataset must lie inside the master's data directory (``--data-dir``). :class:`JobRunner` then runs it:

1. pick the workers (``worker_ids``, or the first ``n`` UP ones, waiting up to
   ``wait_for_workers_seconds`` for them to register);
2. LoadJob every worker with exactly the partitions its rows need (streamed in chunks; each partition
   is serialised once per job, in a thread: :class:`PartitionBytes`);
3. each iteration: ``code.assign(observation)`` (dynamic codes choose rows from the stragglers seen in
   the previous iteration), one Compute stream per UP worker through :func:`gradcode.common.gather.gather`,
   which stops at the first decodable moment and cancels the rest; while undecodable it reloads
   workers that came back and keeps gathering until the iteration deadline, then fails the job
   naming the missing workers; combine, verify (optional), add the L2 term, step. The step and
   ``iterations_done`` are committed together, so GetModel never runs ahead of its iteration number;
   ``wall_seconds`` ends there. A report is ``exact`` only when the decode is exact and no message it
   used was decoded approximately by a tree parent (:attr:`GatherResult.exact`);
4. compute the full-training-set loss and accuracies in a thread *while the next iteration gathers*
   (off the critical path), then report the IterationReport to every watcher and append it to
   ``<run_dir>/<job_id>.jsonl`` (flushed every iteration, so a crash never loses what was measured).
   The next iteration commits only after that report, so a target accuracy stops the job exactly at
   the iteration that reached it.

Worker ids in reports are the pool's ids (as in ListWorkers); on the wire to the workers a job uses
the code's worker index ``0..n-1`` (the index the code's rows and the straggler model refer to).

Tree jobs (``coded_reduce`` with ``L > 1``; :class:`TreeLayout`)
    Every non-root node of the (n, L)-regular CodedReduce tree is a worker process, so the job
    takes N = n + n^2 + ... + n^L workers. Worker index ``w`` (the wire id, also the straggler
    model's id) is tree node ``w + 1`` of :class:`~gradcode.common.codes.coded_reduce.CodedReduceTree`
    (breadth first, the master is node 0), so ``0..n-1`` are the first layer and the master-view
    code's worker ``i`` is worker ``i``; the pool workers are assigned to indices in ``worker_ids``
    order (or pool order), as for flat jobs. A node is loaded with exactly its stored base
    partitions and ONE RowDefinition: row = its slot in its parent's code, partitions/coefficients =
    its own coded part. An inner node's JobSetup also carries ``parent``: the child code
    ``coded_reduce(n, s, L=1, seed)`` (the same matrix as the tree's per-parent CompAllocCode;
    checked when planning), its children's wire ids and addresses in slot order, and
    ``wait_seconds`` = deadline x (L + 1 - layer) / (L + 1), so a deeper parent gives up (UNAVAILABLE,
    naming its missing children) before the one above it. Each iteration the master asks only the
    first layer (row ``i`` of worker ``i``) and decodes with the master-view code's decoder; what
    happens below the first layer is the parents' business. A first-layer parent that answers
    UNAVAILABLE but still passes a health check is alive (its children are not decodable): it is
    not marked DOWN, only counted as failed for that iteration. Reports (used, late, failed,
    timings) are about the first layer. ``JobSpec.tree``, if given, must equal the implied
    topology (:meth:`TreeLayout.parent_of`). A deeper node the master never hears from is not
    monitored: a leaf that restarts stays missing for its parent (the parent tolerates ``s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
import numpy as np
from google.protobuf.json_format import MessageToDict

from gradcode.common.codes.base import Assignment, GradientCode, Observation
from gradcode.common.codes.coded_reduce import DEFAULT_SEED as CODED_REDUCE_SEED
from gradcode.common.codes.coded_reduce import CodedReduceCode, CodedReduceTree, TreeNode
from gradcode.common.codes.partial import naive_partitions_per_worker
from gradcode.common.codes.registry import available_codes, make_code
from gradcode.common.data import DATASET_NAMES, Dataset, load_dataset, partition_indices
from gradcode.common.exceptions import NumericallyUnsafeError
from gradcode.common.gather import GatherResult, Source, gather
from gradcode.common.models import Model, available_models, make_model
from gradcode.common.plugins import model_dtype, unknown_model
from gradcode.common.stragglers import DELAY_MODEL_NAMES, make_delay_model
from gradcode.common.wire import (
    DEFAULT_CHUNK_BYTES,
    CompletedMessage,
    dict_from_struct,
    dtype_from_wire,
    struct_from_dict,
    tensor_from_array,
)
from gradcode.master.optimizer import OPTIMIZER_KINDS, Optimizer, make_optimizer, mean_gradient
from gradcode.master.pool import PoolWorker, WorkerPool
from gradcode.v1 import common_pb2, master_pb2, worker_pb2

__all__ = [
    "DEFAULT_ITERATION_DEADLINE_SECONDS",
    "DEFAULT_TEST_FRACTION",
    "EXACT_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "MAX_DATASET_BYTES",
    "MAX_DATA_FILE_BYTES",
    "MAX_FEATURES",
    "MAX_MODEL_BYTES",
    "MAX_PARTITIONS",
    "MAX_SAMPLES",
    "MAX_WORKERS",
    "JobFailedError",
    "JobPlan",
    "JobRunner",
    "JobSpecError",
    "NotEnoughWorkersError",
    "PartitionBytes",
    "TreeLayout",
    "plan_job",
    "regularised_loss",
]

log = logging.getLogger(__name__)

DEFAULT_ITERATION_DEADLINE_SECONDS = 30.0
"""Used when the spec's ``iteration_deadline_seconds`` is 0."""
DEFAULT_TEST_FRACTION = 0.2
"""Used when the spec's ``dataset.test_fraction`` is 0 (proto3 cannot tell "unset" from 0)."""
EXACT_TOLERANCE = 1e-9
"""Largest relative error an exact decode may have against the centralized gradient (verify mode)."""
FLOAT32_TOLERANCE = 1e-5
"""The same bound when the workers send float32 messages."""
LOAD_TIMEOUT_SECONDS = 120.0
END_JOB_TIMEOUT_SECONDS = 2.0
MAX_ITERATIONS = 1_000_000

# Size caps, checked by plan_job before anything is built, so an oversized spec is refused with a
# precise INVALID_ARGUMENT instead of exhausting the master's memory (or dying with MemoryError).
MAX_WORKERS = 1024
"""Worker processes one job may use (a tree job counts every node, n + n^2 + ... + n^L)."""
MAX_PARTITIONS = 65_536
"""Data partitions (the code's ``k``) one job may cut its training set into."""
MAX_SAMPLES = 10_000_000
"""Samples a dataset may have (``dataset.num_samples``, or the rows of a data file)."""
MAX_FEATURES = 100_000
"""Features per sample."""
MAX_DATASET_BYTES = 1 << 30
"""float64 bytes of the feature matrix, samples x features x 8 (1 GiB)."""
MAX_DATA_FILE_BYTES = 256 << 20
"""Size of a ``file`` dataset on disk (256 MiB; a CSV costs several times its size to parse)."""
MAX_MODEL_BYTES = 64 << 20
"""float64 bytes of the parameter vector (64 MiB = 8M parameters): the master keeps several copies."""
_SYNTHETIC_DEFAULT_SIZE = {"gaussian_mixture": (2000, 20), "linear": (1000, 50), "digits": (1797, 64)}
"""(samples, features) a dataset has when the spec leaves them 0 (see gradcode.common.data.load_dataset)."""
DATA_DIR_ENV = "GRADCODE_DATA_DIR"
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TERMINAL = (master_pb2.JOB_STATE_SUCCEEDED, master_pb2.JOB_STATE_FAILED, master_pb2.JOB_STATE_CANCELLED)


class JobSpecError(ValueError):
    """The job spec is malformed or refused by the library (CreateJob answers INVALID_ARGUMENT)."""


class NotEnoughWorkersError(Exception):
    """Too few workers to start and the spec does not wait for more (FAILED_PRECONDITION)."""


class JobFailedError(Exception):
    """The job cannot go on; the message says why (it becomes the job's message)."""

    def __init__(self, message: str, report: master_pb2.IterationReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# ---- tree layout ------------------------------------------------------------------------------------
class TreeLayout:
    """Which worker index runs which CodedReduce tree node, and what each one is loaded with.

    Worker index ``w`` is tree node ``w + 1`` (see the module docstring). ``child_code`` is the
    CodeSpec every inner node decodes its children with: ``coded_reduce`` with ``L = 1`` and the
    tree's seed, whose matrix is the tree's per-parent code (checked here; ValueError otherwise).
    """

    def __init__(self, code: CodedReduceCode, *, seed: int) -> None:
        self.tree: CodedReduceTree = code.tree
        self.n, self.s, self.L = code.n, code.s, code.L
        params = {"n": self.n, "s": self.s, "L": 1, "seed": seed}
        child = make_code("coded_reduce", **params)
        if not np.array_equal(child.B, self.tree.code.B):
            raise ValueError(
                f"coded_reduce(n={self.n}, s={self.s}, L=1, seed={seed}) does not reproduce the tree's per-parent "
                f"code {self.tree.code!r}; the tree parents could not decode their children with it."
            )
        static = child.static_assignment().rows
        slots = [self.node(w).slot for w in range(self.n)]
        if (
            any(static[i] != (i,) for i in range(self.n))
            or code.static_assignment().rows != tuple((i,) for i in range(self.n))
            or slots != list(range(self.n))
        ):
            raise ValueError(f"{code!r}: worker i of the per-parent code must compute exactly row i (its slot).")
        self.child_code = common_pb2.CodeSpec(name="coded_reduce", params=struct_from_dict(params))

    @property
    def num_workers(self) -> int:
        """N = n + ... + n^L: every non-root node is a worker."""
        return self.tree.num_workers

    def node(self, w: int) -> TreeNode:
        """The tree node worker index ``w`` runs."""
        return self.tree.nodes[w + 1]

    def children(self, w: int) -> list[int]:
        """Worker indices of ``w``'s children, in slot order (empty for a leaf)."""
        return [child - 1 for child in self.node(w).children]

    def parent_of(self) -> list[int]:
        """``TreeSpec.parent_of``: the parent worker index of every worker, -1 under the master."""
        return [-1 if node.parent in (None, 0) else int(node.parent) - 1 for node in self.tree.nodes[1:]]

    def row(self, w: int) -> worker_pb2.RowDefinition:
        """Worker ``w``'s one row: its slot in its parent's code, over its own stored partitions."""
        node = self.node(w)
        weights: dict[int, float] = {}
        for j, c in zip(node.partitions, node.coefficients, strict=True):
            weights[j] = weights.get(j, 0.0) + float(c)
        parts = sorted(weights)
        return worker_pb2.RowDefinition(row=node.slot, partitions=parts, coefficients_real=[weights[j] for j in parts])

    def wait_seconds(self, w: int, deadline_seconds: float) -> float:
        """How long inner node ``w`` waits for its children: less the deeper it is, so it reports first."""
        return deadline_seconds * (self.L + 1 - self.node(w).layer) / (self.L + 1)

    def parent_role(self, w: int, addresses: list[str], deadline_seconds: float) -> worker_pb2.ParentRole | None:
        """The JobSetup.parent of worker ``w`` (None for a leaf); ``addresses[v]`` is worker ``v``'s."""
        children = self.children(w)
        if not children:
            return None
        return worker_pb2.ParentRole(
            child_code=self.child_code,
            children=[worker_pb2.ChildSpec(worker_id=c, address=addresses[c]) for c in children],
            wait_seconds=self.wait_seconds(w, deadline_seconds),
        )


# ---- planning ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class JobPlan:
    """A validated job: the normalised spec and everything built from it."""

    spec: master_pb2.JobSpec
    """The spec with defaults filled in (job id, model kind and sizes, optimizer kind, deadline)."""
    code: GradientCode
    model: Model
    dataset: Dataset
    partitions: list[np.ndarray[Any, Any]]
    """Training-sample indices of each of the code's ``k`` partitions."""
    message_dtype: int
    """Wire dtype of the workers' messages."""
    tree: TreeLayout | None = None
    """The node layout of a tree job (coded_reduce with L > 1); None for flat jobs."""

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def num_workers(self) -> int:
        """Worker processes the job needs: the code's ``n``, or every tree node for a tree job."""
        return self.code.n if self.tree is None else self.tree.num_workers

    @property
    def tolerance(self) -> float:
        return FLOAT32_TOLERANCE if self.message_dtype == common_pb2.DTYPE_FLOAT32 else EXACT_TOLERANCE


def _finite(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        rng = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise JobSpecError(f"JobSpec.{name} must be a finite number {rng}, not {value!r}.")
    return value


def plan_job(
    spec: master_pb2.JobSpec, *, known_worker_ids: list[int] | None = None, data_dir: str | Path | None = None
) -> JobPlan:
    """Validate ``spec`` and build its code, model, dataset and partitions; JobSpecError says what is wrong.

    ``known_worker_ids`` are the pool's ids, to check an explicit ``worker_ids`` list against.
    ``data_dir`` is the only directory a ``file`` dataset may be read from (None: file datasets are
    refused). Sizes are checked against the ``MAX_*`` caps before anything is built. Loads (or
    generates) the dataset, so callers on an event loop should run it in a thread.
    """
    spec = master_pb2.JobSpec.FromString(spec.SerializeToString())
    if not spec.job_id:
        spec.job_id = f"job-{uuid.uuid4().hex[:12]}"
    elif not _JOB_ID.match(spec.job_id):
        raise JobSpecError(
            f"JobSpec.job_id {spec.job_id!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names the history file)."
        )

    # The gradient code: the library's own message for anything it refuses.
    if not spec.code.name:
        raise JobSpecError(f"JobSpec.code.name is empty; available schemes: {', '.join(available_codes())}.")
    if spec.code.name not in available_codes():
        raise JobSpecError(
            f"Unknown gradient code {spec.code.name!r}; available schemes: {', '.join(available_codes())}."
        )
    code_params = dict_from_struct(spec.code.params)
    _check_code_size(spec.code.name, code_params)
    try:
        code = make_code(spec.code.name, **code_params)
    except (ValueError, KeyError, TypeError, NumericallyUnsafeError) as exc:
        detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise JobSpecError(f"Invalid parameters for gradient code {spec.code.name!r}: {detail}") from None
    if code.k > MAX_PARTITIONS:
        raise JobSpecError(f"{code!r} cuts the data into {code.k} partitions; a job may use at most {MAX_PARTITIONS}.")
    tree = _tree_layout(spec, code)

    # Dataset, then model (its sizes default to the dataset's).
    ds = spec.dataset
    if ds.name not in DATASET_NAMES:
        raise JobSpecError(f"Unknown dataset {ds.name!r}; valid names are {list(DATASET_NAMES)}.")
    if ds.test_fraction == 0:
        ds.test_fraction = DEFAULT_TEST_FRACTION
    _check_dataset_size(ds)
    data_file = _data_file(ds.path, data_dir) if ds.name == "file" else None
    try:
        dataset = load_dataset(
            ds.name,
            path=data_file if data_file is not None else (ds.path or None),
            num_samples=int(ds.num_samples) or None,
            num_features=int(ds.num_features) or None,
            seed=int(ds.seed),
            test_fraction=float(ds.test_fraction),
        )
    except MemoryError:
        raise
    except (ValueError, OSError) as exc:
        if data_file is not None:  # never echo what the library quoted from the file
            raise JobSpecError(f"Dataset 'file' {ds.path!r} refused: {_file_error(exc)}.") from None
        raise JobSpecError(f"Dataset {ds.name!r} refused: {exc}") from None
    except Exception as exc:  # e.g. csv.Error from a file that is not text
        if data_file is None:
            raise
        raise JobSpecError(f"Dataset 'file' {ds.path!r} refused: {_file_error(exc)}.") from None
    if dataset.num_features > MAX_FEATURES or dataset.num_features * (dataset.num_train + len(dataset.y_test)) * 8 > (
        MAX_DATASET_BYTES
    ):
        raise JobSpecError(
            f"Dataset {ds.name!r} has {dataset.num_train + len(dataset.y_test)} samples x {dataset.num_features} "
            f"features; a job may use at most {MAX_FEATURES} features and {MAX_DATASET_BYTES >> 20} MiB of features."
        )
    ms = spec.model
    if not ms.kind:
        ms.kind = dataset.model_kind
    if ms.kind not in available_models():  # built-ins and the plugins installed here
        raise JobSpecError(str(unknown_model(ms.kind)))
    if ms.num_features and ms.num_features != dataset.num_features:
        raise JobSpecError(
            f"JobSpec.model.num_features is {ms.num_features} but dataset {dataset.name!r} has "
            f"{dataset.num_features} features (leave it 0 to use the dataset's)."
        )
    ms.num_features = dataset.num_features
    if ms.kind == "linear":
        ms.num_classes = 0
    else:
        if dataset.num_classes < 2:
            raise JobSpecError(
                f"Model {ms.kind!r} needs class labels but dataset {dataset.name!r} is a regression set; "
                f"use model kind {dataset.model_kind!r}."
            )
        if ms.num_classes and ms.num_classes != dataset.num_classes:
            raise JobSpecError(
                f"JobSpec.model.num_classes is {ms.num_classes} but dataset {dataset.name!r} has "
                f"{dataset.num_classes} classes (leave it 0 to use the dataset's)."
            )
        ms.num_classes = dataset.num_classes
    _finite("model.l2", ms.l2)
    try:
        dtype = model_dtype(spec.message_dtype)  # what a plugin computes in
        model = make_model(ms.kind, num_features=ms.num_features, num_classes=max(ms.num_classes, 2), dtype=dtype)
    except ValueError as exc:
        raise JobSpecError(f"Model refused: {exc}") from None
    if model.num_params * 8 > MAX_MODEL_BYTES:
        raise JobSpecError(
            f"Model {ms.kind!r} over {ms.num_features} features has {model.num_params} parameters "
            f"({model.num_params * 8 / 2**20:.0f} MiB); a job may use at most {MAX_MODEL_BYTES // 8} "
            f"({MAX_MODEL_BYTES >> 20} MiB)."
        )

    # Optimizer and loop parameters.
    opt = spec.optimizer
    if not opt.kind:
        opt.kind = "gd"
    if opt.kind not in OPTIMIZER_KINDS:
        raise JobSpecError(f"Unknown optimizer {opt.kind!r}; valid optimizers are {list(OPTIMIZER_KINDS)}.")
    try:
        make_optimizer(opt.kind, model.init_params(), learning_rate=opt.learning_rate, momentum=opt.momentum)
    except ValueError as exc:
        raise JobSpecError(f"Optimizer refused: {exc}") from None
    if not 1 <= spec.iterations <= MAX_ITERATIONS:
        raise JobSpecError(f"JobSpec.iterations must be in [1, {MAX_ITERATIONS}], not {spec.iterations}.")
    _finite("target_accuracy", spec.target_accuracy, high=1.0)
    _finite("iteration_deadline_seconds", spec.iteration_deadline_seconds)
    if spec.iteration_deadline_seconds == 0:
        spec.iteration_deadline_seconds = DEFAULT_ITERATION_DEADLINE_SECONDS
    _finite("wait_for_workers_seconds", spec.wait_for_workers_seconds)

    # Straggler emulation (validated here so the workers never see a model they would refuse).
    st = spec.straggler
    if st.model and st.model != "none":
        if st.model not in DELAY_MODEL_NAMES:
            raise JobSpecError(f"Unknown straggler model {st.model!r}; valid models are {list(DELAY_MODEL_NAMES)}.")
        try:
            delays = make_delay_model(st.model, dict_from_struct(st.params), int(st.seed))
        except ValueError as exc:
            raise JobSpecError(f"Straggler model {st.model!r} refused: {exc}") from None
        # Every worker evaluates its own delay each iteration: one it would refuse (e.g. 'fixed' with
        # num_workers smaller than the job's) must refuse the job now, not fail every Compute later.
        num_workers = code.n if tree is None else tree.num_workers
        for w in range(num_workers):
            try:
                delays.delay(w, 0)
            except (ValueError, OverflowError) as exc:
                raise JobSpecError(
                    f"Straggler model {st.model!r} refused for worker {w} of this job's {num_workers} workers "
                    f"(ids 0..{num_workers - 1}): {exc}"
                ) from None

    # Message dtype: complex codes send complex128; real codes float64 (default) or float32.
    message_dtype = _message_dtype(spec.message_dtype, code)
    spec.message_dtype = message_dtype  # type: ignore[assignment]

    # Workers.
    ids = list(spec.worker_ids)
    if ids:
        needed = code.n if tree is None else tree.num_workers
        if len(ids) != needed or len(set(ids)) != len(ids):
            what = "the code's n" if tree is None else f"every node of the n={tree.n}, L={tree.L} tree"
            raise JobSpecError(f"JobSpec.worker_ids must list {needed} distinct worker ids ({what}), not {ids}.")
        if known_worker_ids is not None:
            unknown = sorted(set(ids) - set(known_worker_ids))
            if unknown:
                raise JobSpecError(
                    f"JobSpec.worker_ids names unknown worker id(s) {unknown}; known worker ids are "
                    f"{sorted(known_worker_ids)}."
                )

    try:
        partitions = partition_indices(dataset.num_train, code.partition_weights, seed=int(spec.seed))
    except ValueError as exc:
        split = f"Cannot split the {dataset.num_train} training samples into {code.k} partitions"
        raise JobSpecError(f"{split}: {exc}") from None
    return JobPlan(
        spec=spec,
        code=code,
        model=model,
        dataset=dataset,
        partitions=partitions,
        message_dtype=message_dtype,
        tree=tree,
    )


def _number(value: object) -> float | None:
    """A finite plain number, or None (a parameter that is not one is make_code's to refuse)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _check_code_size(name: str, params: dict[str, object]) -> None:
    """Refuse a code whose worker or partition count exceeds the caps, before building it."""
    n = _number(params.get("n"))
    if name == "binary_heterogeneous":
        n1, n2 = _number(params.get("n1")), _number(params.get("n2"))
        n = None if n1 is None or n2 is None else n1 + n2
    if n is None or n < 1:
        return
    workers = n
    depth = _number(params.get("L", 1)) if name == "coded_reduce" else 1.0
    if depth is not None and depth > 1:  # every node of the tree is a worker: n + n^2 + ... + n^L
        workers = math.inf if depth > 64 else sum(n**layer for layer in range(1, int(depth) + 1))
    if workers > MAX_WORKERS:
        raise JobSpecError(
            f"Gradient code {name!r} with these parameters needs {workers:.4g} workers; a job may use at most "
            f"{MAX_WORKERS}."
        )
    if name == "partial_stragglers":
        s, alpha = _number(params.get("s")), _number(params.get("alpha", 2.0))
        if s is not None and alpha is not None and s >= 0 and alpha > 1:
            partitions = n * (naive_partitions_per_worker(int(s), alpha) + 1)
            if partitions > MAX_PARTITIONS:
                raise JobSpecError(
                    f"Gradient code 'partial_stragglers' with n={n:g}, s={s:g}, alpha={alpha!r} cuts the data into "
                    f"{partitions:.4g} partitions; a job may use at most {MAX_PARTITIONS} (use a larger alpha)."
                )


def _check_dataset_size(ds: master_pb2.DatasetSpec) -> None:
    """Refuse a dataset larger than the caps before generating or loading it."""
    if ds.num_samples > MAX_SAMPLES:
        raise JobSpecError(f"JobSpec.dataset.num_samples is {ds.num_samples}; a job may use at most {MAX_SAMPLES}.")
    if ds.num_features > MAX_FEATURES:
        raise JobSpecError(f"JobSpec.dataset.num_features is {ds.num_features}; a job may use at most {MAX_FEATURES}.")
    default_samples, default_features = _SYNTHETIC_DEFAULT_SIZE.get(ds.name, (0, 0))
    samples, features = ds.num_samples or default_samples, ds.num_features or default_features
    if samples * features * 8 > MAX_DATASET_BYTES:
        raise JobSpecError(
            f"Dataset {ds.name!r} of {samples} samples x {features} features needs "
            f"{samples * features * 8 / 2**20:.0f} MiB; a job may use at most {MAX_DATASET_BYTES >> 20} MiB."
        )


def _data_file(path: str, data_dir: str | Path | None) -> Path:
    """The file a ``file`` dataset names, which must resolve inside ``data_dir``; JobSpecError otherwise."""
    if data_dir is None:
        raise JobSpecError(
            "Dataset 'file' is disabled on this master: start it with --data-dir DIR (or the environment variable "
            f"{DATA_DIR_ENV}=DIR) to allow .npz/.csv files from DIR, then give dataset.path relative to DIR."
        )
    if not path:
        raise JobSpecError("Dataset 'file' needs dataset.path: a .npz or .csv file in the master's data directory.")
    try:
        root = Path(data_dir).resolve(strict=True)
        file = (root / path).resolve()
    except (OSError, ValueError, RuntimeError):
        raise JobSpecError(f"Dataset path {path!r} cannot be resolved in the master's data directory.") from None
    if not file.is_relative_to(root):
        raise JobSpecError(
            f"Dataset path {path!r} is outside the master's data directory; give a path inside it (relative to it; "
            "'..' and symbolic links may not lead out)."
        )
    if file.suffix.lower() not in (".npz", ".csv"):
        raise JobSpecError(f"Dataset path {path!r} must name a .npz or .csv file.")
    if not file.is_file():
        raise JobSpecError(f"Dataset path {path!r} is not a file in the master's data directory.")
    size = file.stat().st_size
    if size > MAX_DATA_FILE_BYTES:
        raise JobSpecError(
            f"Dataset file {path!r} has {size} bytes; a job may load at most {MAX_DATA_FILE_BYTES >> 20} MiB."
        )
    return file


_FILE_ERRORS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), text)
    for p, text in (
        (r"line (\d+): non-numeric value", "line {0} holds a non-numeric value"),
        (r"line (\d+): (\d+) columns, expected (\d+)", "line {0} has {1} columns, expected {2}"),
        (r"needs at least one feature and a label", "each line needs at least one feature and the label (last)"),
        (r"holds no data rows", "it holds no data rows"),
        (r"has (\d+) samples; at least 2", "it has {0} samples; at least 2 are needed"),
        (r"NaN or infinite", "it contains NaN or infinite values"),
        (r"not a readable \.npz archive", "it is not a readable .npz archive"),
        (r"single \.npy array", "it is a single .npy array, not an .npz archive with arrays 'X' and 'y'"),
        (r"must contain arrays 'X' and 'y'", "it must contain arrays 'X' and 'y'"),
        (r"cannot read 'X'/'y'", "its arrays 'X'/'y' cannot be read (object arrays are refused)"),
        (r"must be numeric", "its arrays 'X' and 'y' must be numeric"),
        (r"'X' must be 2-D", "its array 'X' must be 2-D (samples, features)"),
        (r"'y' must have shape", "its array 'y' must hold one label per row of 'X'"),
        (r"has (\d+) features; 'num_features'", "it has {0} features; leave dataset.num_features 0 or give that"),
        (r"'num_samples' must be at most (\d+)", "dataset.num_samples must be at most {0} (the file's rows)"),
        (r"too few to keep any for training", "too few samples are left for training"),
        (r"needs integer class labels", "a classification model needs integer class labels (or -1/+1)"),
        (r"'logistic' needs two classes, the labels have (\d+)", "'logistic' needs two classes, the labels have {0}"),
    )
]


def _file_error(exc: Exception) -> str:
    """What is wrong with a data file, from a fixed list of reasons: never text quoted from the file."""
    text = str(exc)
    for pattern, reason in _FILE_ERRORS:
        match = pattern.search(text)
        if match:
            return reason.format(*match.groups())
    if isinstance(exc, OSError):
        return "it cannot be read"
    return "it is not a .npz archive with numeric arrays 'X' and 'y', nor a numeric .csv with the label last"


def _tree_layout(spec: master_pb2.JobSpec, code: GradientCode) -> TreeLayout | None:
    """The layout of a tree job (coded_reduce with L > 1), None for a flat one; checks JobSpec.tree."""
    given = list(spec.tree.parent_of)
    if not isinstance(code, CodedReduceCode) or code.L == 1:
        if given:
            raise JobSpecError(
                f"JobSpec.tree is only for coded_reduce with L > 1 (its topology is implied); {code!r} is a flat "
                "scheme: leave JobSpec.tree empty."
            )
        return None
    seed = int(dict_from_struct(spec.code.params).get("seed", CODED_REDUCE_SEED))
    try:
        tree = TreeLayout(code, seed=seed)
    except ValueError as exc:
        raise JobSpecError(f"Tree job refused: {exc}") from None
    if given and given != tree.parent_of():
        raise JobSpecError(
            f"JobSpec.tree.parent_of {given} does not match the {code!r} tree; leave it empty or give "
            f"{tree.parent_of()} (worker w is tree node w + 1, breadth first)."
        )
    return tree


def _message_dtype(requested: int, code: GradientCode) -> int:
    names = common_pb2.DType.Name
    if code.is_complex:
        if requested not in (common_pb2.DTYPE_UNSPECIFIED, common_pb2.DTYPE_COMPLEX128):
            raise JobSpecError(
                f"Gradient code {code.name!r} has complex coefficients; its messages are DTYPE_COMPLEX128, "
                f"not {names(requested)}."
            )
        return common_pb2.DTYPE_COMPLEX128
    if requested in (common_pb2.DTYPE_UNSPECIFIED, common_pb2.DTYPE_FLOAT64):
        return common_pb2.DTYPE_FLOAT64
    if requested == common_pb2.DTYPE_FLOAT32:
        return common_pb2.DTYPE_FLOAT32
    raise JobSpecError(
        f"JobSpec.message_dtype {names(requested) if requested in common_pb2.DType.values() else requested} "
        "is not valid for a real code; use DTYPE_FLOAT64 (default) or DTYPE_FLOAT32."
    )


def regularised_loss(
    model: Model, params: np.ndarray[Any, Any], X: np.ndarray[Any, Any], y: np.ndarray[Any, Any], l2: float
) -> float:
    """The objective the optimizer minimises: mean loss plus ``l2 / 2 * ||params||^2``."""
    return model.loss(params, X, y) / max(len(y), 1) + 0.5 * l2 * float(params @ params)


# ---- running ----------------------------------------------------------------------------------------
def _status_name(reason: str) -> str:
    """The gRPC status name that :func:`gradcode.common.gather.gather` put in front of a failure reason."""
    return reason.split(":", 1)[0]


@dataclass(frozen=True)
class _Decoded:
    """One iteration gathered, decoded and verified, waiting to be committed (:meth:`JobRunner._commit`)."""

    started: float
    result: GatherResult
    assignment: Assignment
    finished: dict[int, float]
    failed: dict[int, str]
    late: set[int]
    point: np.ndarray[Any, Any]
    decoded: np.ndarray[Any, Any]
    exact: bool
    verify_error: float


class PartitionBytes:
    """Each data partition's features and labels as little-endian float64 bytes, for LoadJob.

    A partition is serialised once per job (however many workers hold it, and however often a
    restarted worker is reloaded), in a thread so the event loop keeps serving; concurrent requests
    for the same partition share one serialisation. :meth:`clear` frees the bytes when the job ends.
    """

    def __init__(self, dataset: Dataset, partitions: list[np.ndarray[Any, Any]]) -> None:
        self._dataset = dataset
        self._partitions = partitions
        self._cache: dict[int, asyncio.Task[tuple[bytes, bytes]]] = {}
        self.serialisations = 0
        """How many partitions have been serialised (each at most once)."""

    async def get(self, j: int) -> tuple[bytes, bytes]:
        """Partition ``j``'s (features, labels) bytes."""
        task = self._cache.get(j)
        if task is None:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._serialise, j))
            self._cache[j] = task
        return await asyncio.shield(task)  # a cancelled LoadJob must not cancel the shared serialisation

    def _serialise(self, j: int) -> tuple[bytes, bytes]:
        idx = self._partitions[j]
        self.serialisations += 1
        features = np.ascontiguousarray(self._dataset.X_train[idx], dtype="<f8").tobytes()
        labels = np.ascontiguousarray(self._dataset.y_train[idx], dtype="<f8").tobytes()
        return features, labels

    def clear(self) -> None:
        self._cache.clear()


class JobRunner:
    """Runs one planned job against the pool; watchers get every IterationReport."""

    def __init__(self, plan: JobPlan, pool: WorkerPool, *, run_dir: Path | None = None) -> None:
        self.plan = plan
        self.pool = pool
        self.state: int = master_pb2.JOB_STATE_PENDING
        self.message = "waiting for workers"
        self.history: list[master_pb2.IterationReport] = []
        self.iterations_done = 0
        self.workers: list[PoolWorker] = []
        """The pool worker behind each of the code's worker indices."""
        self.history_path = None if run_dir is None else Path(run_dir) / f"{plan.job_id}.jsonl"
        spec = plan.spec
        self.optimizer: Optimizer = make_optimizer(
            spec.optimizer.kind,
            plan.model.init_params(),
            learning_rate=spec.optimizer.learning_rate,
            momentum=spec.optimizer.momentum,
        )
        code = plan.code
        static = code.static_assignment()
        self._rows_of_worker: list[tuple[int, ...]] = (
            [self._candidate_rows(w) if code.dynamic else static.rows[w] for w in range(code.n)]
            if plan.tree is None
            else [(plan.tree.node(w).slot,) for w in range(plan.tree.num_workers)]
        )
        self._spent: set[int] = set()
        """Tree parents that answered this iteration that their children are not decodable (not asked again)."""
        self._observation: Observation | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._history_file: TextIO | None = None
        self._started = 0.0
        self._pending: asyncio.Task[bool] | None = None
        """Publishes the last committed iteration's report once its metrics are computed (see _loop)."""
        self._partition_bytes = PartitionBytes(plan.dataset, plan.partitions)
        self.finished_at: float | None = None
        """time.monotonic() when the job reached its final state (None while it runs)."""
        self._on_done: Callable[[JobRunner], None] | None = None

    # ---- public surface ----------------------------------------------------------------------------
    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def done(self) -> bool:
        return self.state in _TERMINAL

    def info(self) -> master_pb2.JobInfo:
        return master_pb2.JobInfo(
            job_id=self.job_id,
            state=self.state,  # type: ignore[arg-type]
            message=self.message,
            iterations_done=self.iterations_done,
            spec=self.plan.spec,
        )

    def model_reply(self) -> master_pb2.ModelReply:
        return master_pb2.ModelReply(
            job_id=self.job_id,
            iteration=self.iterations_done,
            parameters=tensor_from_array(self.optimizer.params),
            model=self.plan.spec.model,
        )

    def start(self, on_done: Callable[[JobRunner], None] | None = None) -> None:
        """Run the job in the background; ``on_done(self)`` is called as soon as it has reached its final state."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"job-{self.job_id}")
            self._on_done = on_done

    async def cancel(self) -> None:
        """Cancel the job (no-op once it has ended) and wait until it has stopped."""
        if self._task is not None and not self.done:
            self._task.cancel()
        await self.wait()

    async def wait(self) -> None:
        """Wait until the job has ended."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def watch(self) -> AsyncIterator[master_pb2.IterationReport]:
        """The reports so far, then each new one, until the job has ended."""
        sent = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda n=sent: len(self.history) > n or self.done)  # type: ignore[misc]
                batch = self.history[sent:]
                finished = self.done
            for report in batch:
                yield report
            sent += len(batch)
            if finished and sent == len(self.history):
                return

    # ---- the job -----------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            self._open_history()
            self.workers = await self._select_workers()
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "loading workers")
            self._started = time.perf_counter()
            await asyncio.gather(*(self._load(w) for w in range(self.plan.num_workers)))
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "running")
            await self._loop()
        except asyncio.CancelledError:
            await self._drain()  # the last committed iteration's report still goes out
            if not self.done:
                await self._set_state(
                    master_pb2.JOB_STATE_CANCELLED, f"cancelled after {self.iterations_done} iterations"
                )
        except JobFailedError as exc:
            if not await self._drain():  # unless the previous iteration already ended the job
                if exc.report is not None:
                    exc.report.state = master_pb2.JOB_STATE_FAILED
                    exc.report.message = str(exc)
                    await self._publish(exc.report)
                await self._set_state(master_pb2.JOB_STATE_FAILED, str(exc))
        except Exception as exc:
            log.exception("job %s crashed", self.job_id)
            await self._set_state(master_pb2.JOB_STATE_FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._partition_bytes.clear()
            await self._end_on_workers()
            if self._history_file is not None:
                self._history_file.close()
                self._history_file = None

    async def _loop(self) -> None:
        """Gather, decode and commit each iteration; its report's metrics overlap the next gather.

        The full-training-set loss/accuracy of iteration ``t`` is computed in a thread while iteration
        ``t + 1`` gathers, and its report is published as soon as they are known. Iteration ``t + 1``
        commits its step only after that report: if iteration ``t`` reached the target accuracy the
        job ends there (iteration ``t + 1`` is cancelled or discarded, never stepped).
        """
        spec = self.plan.spec
        for t in range(1, spec.iterations + 1):
            task = asyncio.get_running_loop().create_task(self._iteration(t), name=f"job-{self.job_id}-{t}")
            try:
                pending = self._pending
                if pending is not None:
                    await asyncio.wait({task, pending}, return_when=asyncio.FIRST_COMPLETED)
                    if pending.done() and await self._settle():
                        return  # iteration t - 1 reached the target while t was gathering
                decoded = await task
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if await self._settle():
                return
            report, params = self._commit(t, decoded)
            self._pending = asyncio.get_running_loop().create_task(
                self._complete_report(report, params, last=t == spec.iterations), name=f"job-{self.job_id}-report-{t}"
            )
        await self._settle()

    async def _settle(self) -> bool:
        """Wait for the previous iteration's report to be published; True when that iteration ended the job."""
        pending = self._pending
        if pending is None:
            return False
        ended = await asyncio.shield(pending)  # shielded and kept until done: a cancel drains it (_drain)
        self._pending = None
        return ended

    async def _drain(self) -> bool:
        """:meth:`_settle` on the way out (cancel or failure): never raises."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:  # cancelled again while draining: give up on that report
            return False
        except Exception:
            log.exception("job %s: the report of iteration %d failed", self.job_id, self.iterations_done)
            return False

    async def _complete_report(
        self, report: master_pb2.IterationReport, params: np.ndarray[Any, Any], *, last: bool
    ) -> bool:
        """Fill in the metrics of a committed iteration and publish it; True when the job ends with it."""
        spec = self.plan.spec
        report.loss, report.train_accuracy, report.test_accuracy = await asyncio.to_thread(self._metrics, params)
        reached = spec.target_accuracy > 0 and _score(report) >= spec.target_accuracy
        if not (last or reached):
            report.state = master_pb2.JOB_STATE_RUNNING
            await self._publish(report)
            return False
        report.state = master_pb2.JOB_STATE_SUCCEEDED
        report.message = (
            f"reached target accuracy {spec.target_accuracy:g} after {report.iteration} iterations"
            if reached
            else f"completed {report.iteration} iterations"
        )
        self.state, self.message = report.state, report.message
        await self._publish(report)
        self._ended()
        return True

    async def _select_workers(self) -> list[PoolWorker]:
        """The pool workers for the job's worker indices, waiting up to ``wait_for_workers_seconds``."""
        spec, n = self.plan.spec, self.plan.num_workers
        deadline = time.monotonic() + spec.wait_for_workers_seconds
        while True:
            if spec.worker_ids:
                chosen = [self.pool.get(i) for i in spec.worker_ids]
                if all(w.is_up for w in chosen):
                    return chosen
            else:
                up = self.pool.up()
                if len(up) >= n:
                    return up[:n]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.pool.wait_changed(min(remaining, 0.5))
        if spec.worker_ids:
            return [self.pool.get(i) for i in spec.worker_ids]  # go on; DOWN ones count as failed
        known = sorted(self.pool.workers, key=lambda w: (not w.is_up, w.worker_id))
        if len(known) >= n:
            return known[:n]
        raise JobFailedError(
            f"Gradient code {self.plan.code!r} needs {n} workers but only {len(known)} registered "
            f"(ids {[w.worker_id for w in known]}) within wait_for_workers_seconds = "
            f"{spec.wait_for_workers_seconds:g}; start more workers or choose a smaller n."
        )

    # ---- loading -----------------------------------------------------------------------------------
    def _candidate_rows(self, w: int) -> tuple[int, ...]:
        """Every row worker ``w`` can compute from the partitions it stores (dynamic codes)."""
        code = self.plan.code
        held = set(code.partitions_of_worker(w))
        return tuple(r for r in range(code.num_messages) if set(code.support(r)) <= held)

    def _job_setup(self, w: int) -> worker_pb2.JobSetup:
        """Worker ``w``'s JobSetup: its rows (and, for a tree parent, its children)."""
        plan, code = self.plan, self.plan.code
        setup = worker_pb2.JobSetup(
            job_id=plan.job_id,
            worker_id=w,
            model=plan.spec.model,
            straggler=plan.spec.straggler,
            message_dtype=plan.message_dtype,  # type: ignore[arg-type]
        )
        if plan.tree is not None:
            setup.rows.append(plan.tree.row(w))
            addresses = [worker.address for worker in self.workers]
            role = plan.tree.parent_role(w, addresses, plan.spec.iteration_deadline_seconds)
            if role is not None:
                setup.parent.CopyFrom(role)
        else:
            for r in self._rows_of_worker[w]:
                coefficients = np.asarray(code.coefficients(r))
                row = setup.rows.add(row=r, partitions=code.support(r), coefficients_real=coefficients.real.tolist())
                if np.iscomplexobj(coefficients):
                    row.coefficients_imag.extend(coefficients.imag.tolist())
        setup.num_partitions_sent = len({j for row in setup.rows for j in row.partitions})
        return setup

    async def _load_chunks(self, w: int) -> AsyncIterator[worker_pb2.LoadJobChunk]:
        setup = self._job_setup(w)
        parts = sorted({j for row in setup.rows for j in row.partitions})
        yield worker_pb2.LoadJobChunk(setup=setup)
        step = DEFAULT_CHUNK_BYTES - DEFAULT_CHUNK_BYTES % 8
        for j in parts:
            features, labels = await self._partition_bytes.get(j)
            count = max(1, -(-len(features) // step), -(-len(labels) // step))
            for i in range(count):
                lo = i * step
                yield worker_pb2.LoadJobChunk(
                    data=worker_pb2.PartitionData(
                        partition=j,
                        num_samples=len(self.plan.partitions[j]),
                        features_offset=min(lo, len(features)),
                        features=features[lo : lo + step],
                        labels_offset=min(lo, len(labels)),
                        labels=labels[lo : lo + step],
                    )
                )

    async def _load(self, w: int) -> bool:
        """LoadJob worker ``w``; on failure mark it DOWN and return False (the job goes on)."""
        worker = self.workers[w]
        if not worker.is_up:
            return False
        try:
            await worker.stub.LoadJob(self._load_chunks(w), timeout=LOAD_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            self.pool.mark_down(worker, f"LoadJob for job {self.job_id!r}: {exc.code().name}: {exc.details()}")
            return False
        worker.jobs.add(self.job_id)
        self.pool.mark_seen(worker)
        return True

    async def _end_on_workers(self) -> None:
        async def end(worker: PoolWorker) -> None:
            worker.jobs.discard(self.job_id)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await worker.stub.EndJob(worker_pb2.EndJobRequest(job_id=self.job_id), timeout=END_JOB_TIMEOUT_SECONDS)

        holders = [w for w in self.workers if w.is_up and w.has_job(self.job_id)]
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.gather(*(end(w) for w in holders), return_exceptions=True))

    # ---- one iteration -----------------------------------------------------------------------------
    async def _iteration(self, t: int) -> _Decoded:
        """Gather and decode iteration ``t`` (and verify it); nothing is committed here."""
        plan, code = self.plan, self.plan.code
        started = time.perf_counter()
        assignment = code.assign(self._observation) if code.dynamic else code.static_assignment()
        decoder = code.decoder(assignment)
        point = self.optimizer.point.copy()
        model_bytes = worker_pb2.ComputeRequest(model=tensor_from_array(point)).SerializeToString()
        deadline = started + plan.spec.iteration_deadline_seconds
        needed = [w for w in range(code.n) if assignment.rows[w]]
        result: GatherResult | None = None
        received: dict[int, CompletedMessage] = {}
        finished: dict[int, float] = {}
        failed: dict[int, str] = {}
        late: set[int] = set()
        self._spent.clear()
        if plan.tree is not None:  # deeper nodes that came back UP (e.g. after a failed LoadJob) get the job again
            deeper = [w for w in range(code.n, plan.num_workers) if self.workers[w].is_up]
            await asyncio.gather(*(self._load(w) for w in deeper if not self.workers[w].has_job(self.job_id)))
        while True:
            askable = [w for w in needed if w not in finished and w not in self._spent and self.workers[w].is_up]
            reload = [w for w in askable if not self.workers[w].has_job(self.job_id)]
            if reload:
                await asyncio.gather(*(self._load(w) for w in reload))
            ask = [w for w in askable if self.workers[w].is_up and self.workers[w].has_job(self.job_id)]
            for w in needed:
                if w not in finished and not self.workers[w].is_up:
                    failed.setdefault(w, f"DOWN: {self.workers[w].last_error or 'not reachable'}")
            remaining = deadline - time.perf_counter()
            if ask and remaining > 0:
                offset = time.perf_counter() - started
                sources = [self._source(w, t, assignment.rows[w], model_bytes) for w in ask]
                result = await gather(
                    decoder,
                    sources,
                    job_id=self.job_id,
                    iteration=t,
                    length=plan.model.num_params,
                    dtypes=(dtype_from_wire(plan.message_dtype),),
                    timeout=remaining,
                    received=received,
                )
                received = result.messages
                finished.update({w: offset + s for w, s in result.finished.items()})
                for w in result.finished:
                    failed.pop(w, None)
                    self.pool.mark_seen(self.workers[w])
                late = set(result.late)
                for w, reason in result.failed.items():
                    failed[w] = reason
                    await self._handle_failure(w, reason)
                if result.decoding is not None:
                    break
                if result.timed_out:
                    remaining = 0.0
            if deadline - time.perf_counter() <= 0:
                raise JobFailedError(self._undecodable_message(t, needed, finished, failed, late, received),
                                     self._failure_report(t, started, finished, failed, late))  # fmt: skip
            if not ask:
                await self.pool.wait_changed(min(deadline - time.perf_counter(), 0.25))
        assert result is not None and result.decoding is not None
        return await self._decoded(t, started, result, assignment, finished, failed, late, point)

    def _source(self, w: int, t: int, rows: tuple[int, ...], model_bytes: bytes) -> Source:
        """Worker ``w``'s Compute call: its own fields serialized, followed by the shared model bytes."""
        head = worker_pb2.ComputeRequest(job_id=self.job_id, iteration=t, worker_id=w, rows=rows)
        request = head.SerializeToString() + model_bytes
        worker = self.workers[w]
        return Source(worker_id=w, rows=tuple(rows), open=lambda: worker.compute(request))

    async def _handle_failure(self, w: int, reason: str) -> None:
        worker = self.workers[w]
        status = _status_name(reason)
        if status == "NOT_FOUND":  # the worker restarted and lost the job: reload it
            worker.jobs.discard(self.job_id)
        elif self.plan.tree is not None and status == "UNAVAILABLE" and await self.pool.probe(worker):
            # A live tree parent whose children are not decodable: not DOWN, just failed this iteration.
            self._spent.add(w)
        else:
            self.pool.mark_down(worker, f"Compute for job {self.job_id!r}: {reason}")

    def _name(self, w: int) -> str:
        return self.workers[w].describe()

    def _undecodable_message(
        self,
        t: int,
        needed: list[int],
        finished: dict[int, float],
        failed: dict[int, str],
        late: set[int],
        received: dict[int, CompletedMessage],
    ) -> str:
        missing = sorted((w for w in needed if w not in finished), key=lambda w: self.workers[w].worker_id)
        detail = "; ".join(
            f"{self._name(w)}: {failed.get(w) or ('no answer (late)' if w in late else 'not asked')}" for w in missing
        )
        got = sorted({self.workers[m.worker_id].worker_id for m in received.values()})
        return (
            f"Iteration {t}: not decodable within the iteration deadline of "
            f"{self.plan.spec.iteration_deadline_seconds:g} s; missing workers "
            f"{[self.workers[w].worker_id for w in missing]} ({detail}). Messages arrived from workers {got}; "
            f"{self.plan.code!r} tolerates {self.plan.code.s} straggler(s)"
            + ("." if self.plan.tree is None else " among the children of every parent.")
        )

    def _failure_report(
        self, t: int, started: float, finished: dict[int, float], failed: dict[int, str], late: set[int]
    ) -> master_pb2.IterationReport:
        nan = math.nan
        return master_pb2.IterationReport(
            job_id=self.job_id,
            iteration=t,
            loss=nan,
            train_accuracy=nan,
            test_accuracy=nan,
            wall_seconds=time.perf_counter() - started,
            elapsed_seconds=time.perf_counter() - self._started,
            late_workers=sorted(self.workers[w].worker_id for w in late),
            failed_workers=sorted(self.workers[w].worker_id for w in failed),
            timings=[
                master_pb2.WorkerTiming(worker_id=self.workers[w].worker_id, seconds=s) for w, s in finished.items()
            ],
            exact=self.plan.code.exact,
            verify_error=-1.0,
        )

    async def _decoded(
        self,
        t: int,
        started: float,
        result: GatherResult,
        assignment: Assignment,
        finished: dict[int, float],
        failed: dict[int, str],
        late: set[int],
        point: np.ndarray[Any, Any],
    ) -> _Decoded:
        """Combine the decodable set and (verify mode) check it against the centralized gradient."""
        plan = self.plan
        assert result.decoding is not None
        decoded = np.asarray(result.combine(), dtype=np.float64)
        # Exact only if the decode is exact AND no message it used was decoded approximately by a tree parent.
        exact = result.exact
        verify_error = -1.0
        if plan.spec.verify:
            central = await asyncio.to_thread(plan.model.gradient, point, plan.dataset.X_train, plan.dataset.y_train)
            verify_error = float(np.linalg.norm(decoded - central) / max(float(np.linalg.norm(central)), 1e-300))
            if exact and not verify_error <= plan.tolerance:
                raise JobFailedError(
                    f"Iteration {t}: the decoded gradient differs from the centralized one by relative error "
                    f"{verify_error:.3e} > {plan.tolerance:g} (rows {list(result.decoding.rows)} from workers "
                    f"{[self.workers[w].worker_id for w in result.used_workers]}); refusing to step with a wrong "
                    "gradient."
                )
        return _Decoded(started, result, assignment, finished, failed, late, point, decoded, exact, verify_error)

    def _commit(self, t: int, it: _Decoded) -> tuple[master_pb2.IterationReport, np.ndarray[Any, Any]]:
        """Step and record iteration ``t`` as done, together (no await in between, so a cancel sees both or
        neither); the step runs on a copy of the optimizer, so a failed step leaves the model untouched.
        Returns the report (metrics still NaN) and the new parameters."""
        plan = self.plan
        gradient = mean_gradient(it.decoded, it.point, num_samples=plan.dataset.num_train, l2=plan.spec.model.l2)
        stepped = copy.deepcopy(self.optimizer)
        try:
            params = stepped.step(gradient)
        except ValueError as exc:
            raise JobFailedError(f"Iteration {t}: {exc}") from None
        self.optimizer, self.iterations_done = stepped, t
        wall = time.perf_counter() - it.started
        # Observation for dynamic codes: late, failed or unasked workers straggled; speed = 1 / time.
        n, finished = plan.code.n, it.finished
        self._observation = Observation(
            straggling=tuple(w not in finished for w in range(n)),
            speed=tuple(1.0 / finished[w] if finished.get(w) else 0.0 for w in range(n)),
        )
        pool_id = [w.worker_id for w in self.workers]
        nan = math.nan
        report = master_pb2.IterationReport(
            job_id=self.job_id,
            iteration=t,
            loss=nan,
            train_accuracy=nan,
            test_accuracy=nan,
            wall_seconds=wall,
            elapsed_seconds=time.perf_counter() - self._started,
            decode_seconds=it.result.decode_seconds,
            used_workers=sorted(pool_id[w] for w in it.result.used_workers),
            late_workers=sorted(pool_id[w] for w in it.late),
            failed_workers=sorted(pool_id[w] for w in it.failed if w not in finished and it.assignment.rows[w]),
            timings=[master_pb2.WorkerTiming(worker_id=pool_id[w], seconds=s) for w, s in sorted(finished.items())],
            exact=it.exact,
            verify_error=it.verify_error,
        )
        return report, params

    def _metrics(self, params: np.ndarray[Any, Any]) -> tuple[float, float, float]:
        ds, model, l2 = self.plan.dataset, self.plan.model, self.plan.spec.model.l2
        loss = regularised_loss(model, params, ds.X_train, ds.y_train, l2)
        train = model.accuracy(params, ds.X_train, ds.y_train)
        test = model.accuracy(params, ds.X_test, ds.y_test) if len(ds.y_test) else math.nan
        return loss, train, test

    # ---- reporting ---------------------------------------------------------------------------------
    def _open_history(self) -> None:
        if self.history_path is None:
            return
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.history_path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(MessageToDict(self.plan.spec, preserving_proto_field_name=True), indent=2))
        self._history_file = self.history_path.open("a", encoding="utf-8")

    async def _publish(self, report: master_pb2.IterationReport) -> None:
        if self._history_file is not None:
            row = MessageToDict(report, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            self._history_file.write(json.dumps(row) + "\n")
            self._history_file.flush()
        async with self._changed:
            self.history.append(report)
            self._changed.notify_all()

    async def _set_state(self, state: int, message: str) -> None:
        async with self._changed:
            self.state, self.message = state, message
            self._changed.notify_all()
        self._ended()

    def _ended(self) -> None:
        """Once the state is final: note when, and tell ``on_done`` (the servicer evicts old jobs then)."""
        if self.done and self.finished_at is None:
            self.finished_at = time.monotonic()
            if self._on_done is not None:
                self._on_done(self)


def _score(report: master_pb2.IterationReport) -> float:
    """Test accuracy, or train accuracy when the dataset has no test split."""
    return report.train_accuracy if math.isnan(report.test_accuracy) else report.test_accuracy
