"""A job spec, validated and planned: :func:`plan_job` turns a wire JobSpec into a :class:`JobPlan`.

:func:`plan_job` fills in the defaults and builds the code, model, dataset and partitions, or raises
:class:`~gradcode.common.exceptions.JobSpecError` with the precise reason, so CreateJob can refuse a
bad spec before anything starts. Sizes are checked against the caps of :mod:`gradcode.master.limits`
before anything is built, and a ``file`` dataset must lie inside the master's data directory
(:mod:`gradcode.common.training.datafile`). A ``worker_local`` dataset is only described here
(:func:`gradcode.common.training.datasets.describe`: its labels and held-out rows); the workers load their own
partitions. The code says what the job needs (its size, its topology), so no
scheme is named here: a code with a topology (a CodedReduce tree, ``L > 1``) takes a worker process
for every node, and ``JobSpec.tree``, if given, must equal the implied topology.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import GradientCode
from gradcode.common.codes.consistency import uncheckable
from gradcode.common.codes.numerics import EXACT_TOLERANCE, FLOAT32_TOLERANCE
from gradcode.common.codes.registry import available_codes, make_code
from gradcode.common.codes.topology import Topology
from gradcode.common.exceptions import JobSpecError, NumericallyUnsafeError
from gradcode.common.gather.delivery import DEFAULT_MODEL_DELIVERY, MODEL_DELIVERIES
from gradcode.common.gather.integrity import DEFAULT_INTEGRITY, INTEGRITY_POLICIES
from gradcode.common.gather.primaries import DEFAULT_SURPLUS, SURPLUS_MODES
from gradcode.common.sim.stragglers import DELAY_MODEL_NAMES, make_delay_model
from gradcode.common.training.data import DATASET_NAMES, Dataset, load_dataset, partition_indices
from gradcode.common.training.datafile import data_file as file_in_data_dir
from gradcode.common.training.datafile import error_reason, file_error
from gradcode.common.training.datasets import FILE_OPTIONS, DataSource, LocalDescription, describe
from gradcode.common.training.models import Model, available_models, make_model
from gradcode.common.training.plugins import PluginError, model_dtype, unknown_model
from gradcode.common.transport.wire import array_from_tensor, dict_from_struct
from gradcode.master import limits
from gradcode.master.optimizer import OPTIMIZER_KINDS, make_optimizer
from gradcode.v1 import common_pb2, master_pb2

__all__ = [
    "BACKUP_PRIORITIES",
    "DEFAULT_BACKUP_PRIORITY",
    "DEFAULT_EVALUATE_EVERY",
    "DEFAULT_ITERATION_DEADLINE_SECONDS",
    "DEFAULT_SURPLUS",
    "DEFAULT_TEST_FRACTION",
    "EXACT_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "SURPLUS_MODES",
    "JobPlan",
    "JobSpecError",
    "plan_job",
]

DEFAULT_ITERATION_DEADLINE_SECONDS = 30.0
"""Used when the spec's ``iteration_deadline_seconds`` is 0."""
DEFAULT_EVALUATE_EVERY = 10
"""Used when the spec's ``evaluate_every`` is 0. One held-out pass costs about a forward pass of one worker's
gradient over the test split: 3-8 ms for Tandon et al.'s 6000 test rows of 2000 features, against 6 x 8-10 ms of
gradients per iteration at n = 6, so every 10th iteration keeps it near 1% of the machine's work; it runs in a
thread and never delays a step."""
DEFAULT_TEST_FRACTION = 0.2
"""Used when the spec's ``dataset.test_fraction`` is 0 (proto3 cannot tell "unset" from 0)."""
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
    topology: Topology | None = None
    """The code's worker layout when not every worker answers the master (a tree); None for flat jobs."""
    initial_params: np.ndarray[Any, Any] | None = None
    """Where training starts: ``JobSpec.initial_parameters``, or None for the model's own initial values."""
    local: LocalDescription | None = None
    """For worker-local data: what the workers must find (None when the master streams the partitions)."""

    def start_params(self) -> np.ndarray[Any, Any]:
        """The parameters of iteration 0."""
        return self.model.init_params() if self.initial_params is None else self.initial_params.copy()

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def num_workers(self) -> int:
        """Worker processes the job needs: the code's ``n``, or every node of its topology."""
        return self.code.n if self.topology is None else self.topology.num_workers

    @property
    def evaluate_every(self) -> int:
        """Held-out metrics every this many iterations (and at the last one)."""
        return int(self.spec.evaluate_every)

    @property
    def integrity(self) -> str:
        """The consistency policy: ``off``, ``detect`` or ``locate`` (:mod:`gradcode.common.gather.integrity`)."""
        return self.spec.integrity

    @property
    def backup_priority(self) -> str:
        """How rounds ask the workers outside their expected decoding set: ``low`` or ``normal``."""
        return self.spec.backup_priority

    @property
    def surplus(self) -> str:
        """What backups do with their computed messages: ``push``, ``hold`` or ``auto`` (:data:`SURPLUS_MODES`)."""
        return self.spec.surplus

    @property
    def model_delivery(self) -> str:
        """How each iteration's model reaches the workers: ``direct``, ``relay`` or ``auto``
        (:data:`MODEL_DELIVERIES`; :class:`gradcode.master.rounds.RoundPolicy` applies it)."""
        return self.spec.model_delivery

    @property
    def tolerance(self) -> float:
        return FLOAT32_TOLERANCE if self.message_dtype == common_pb2.DTYPE_FLOAT32 else EXACT_TOLERANCE


def _finite(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        rng = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise JobSpecError(f"JobSpec.{name} must be a finite number {rng}, not {value!r}.")
    return value


def plan_job(
    spec: master_pb2.JobSpec,
    *,
    known_worker_ids: list[int] | None = None,
    data_dir: str | Path | None = None,
    max_data_file_bytes: int = limits.MAX_DATA_FILE_BYTES,
    max_features: int = limits.MAX_FEATURES,
) -> JobPlan:
    """Validate ``spec`` and build its code, model, dataset and partitions; JobSpecError says what is wrong.

    ``known_worker_ids`` are the pool's ids, to check an explicit ``worker_ids`` list against.
    ``data_dir`` is the only directory a ``file`` dataset may be read from (None: file datasets are
    refused) and ``max_data_file_bytes`` the largest such file; ``max_features`` the most features a dataset may
    have (the master's ``--max-features``). Sizes are checked against the ``MAX_*``
    caps before anything is built. Loads (or generates) the dataset, so callers on an event loop should
    run it in a thread.
    """
    limits.check_free_form(spec)
    spec = master_pb2.JobSpec.FromString(spec.SerializeToString())  # normalised in place below
    _check_job_id(spec)
    code, topology = _plan_code(spec)
    num_workers = code.n if topology is None else topology.num_workers
    dataset, local = _plan_dataset(spec, data_dir, max_data_file_bytes, max_features)
    model = _plan_model(spec, dataset)
    _check_optimizer_and_loop(spec, model)
    initial_params = _initial_params(spec, model)
    _check_stragglers(spec, num_workers)
    _check_integrity(spec, code)
    _check_backup_priority(spec)
    _check_surplus(spec)
    _check_model_delivery(spec)
    message_dtype = _message_dtype(spec.message_dtype, code)
    spec.message_dtype = message_dtype  # type: ignore[assignment]
    _check_worker_ids(spec, num_workers, topology, known_worker_ids)
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
        topology=topology,
        initial_params=initial_params,
        local=local,
    )


def _check_job_id(spec: master_pb2.JobSpec) -> None:
    """A generated id when none is given; otherwise one that can name the history file."""
    if not spec.job_id:
        spec.job_id = f"job-{uuid.uuid4().hex[:12]}"
    elif not _JOB_ID.match(spec.job_id):
        raise JobSpecError(
            f"JobSpec.job_id {spec.job_id!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names the history file)."
        )


def _plan_code(spec: master_pb2.JobSpec) -> tuple[GradientCode, Topology | None]:
    """The gradient code and its topology: the library's own message for anything it refuses."""
    if not spec.code.name:
        raise JobSpecError(f"JobSpec.code.name is empty; available schemes: {', '.join(available_codes())}.")
    if spec.code.name not in available_codes():
        raise JobSpecError(
            f"Unknown gradient code {spec.code.name!r}; available schemes: {', '.join(available_codes())}."
        )
    code_params = dict_from_struct(spec.code.params)
    limits.check_code_size(spec.code.name, code_params)
    try:
        code = make_code(spec.code.name, **code_params)
    except (ValueError, KeyError, TypeError, NumericallyUnsafeError) as exc:
        detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise JobSpecError(f"Invalid parameters for gradient code {spec.code.name!r}: {detail}") from None
    if code.k > limits.MAX_PARTITIONS:
        raise JobSpecError(
            f"{code!r} cuts the data into {code.k} partitions; a job may use at most {limits.MAX_PARTITIONS}."
        )
    topology = _topology(spec, code)
    return code, topology


def _plan_dataset(
    spec: master_pb2.JobSpec, data_dir: str | Path | None, max_file_bytes: int, max_features: int
) -> tuple[Dataset, LocalDescription | None]:
    """The dataset (generated or loaded; for worker-local data, described), within the size caps."""
    ds = spec.dataset
    if ds.test_fraction == 0:
        ds.test_fraction = DEFAULT_TEST_FRACTION
    limits.check_dataset_size(ds, max_features)
    if ds.worker_local:
        return _plan_local_dataset(spec, data_dir, max_file_bytes, max_features)
    if ds.name not in DATASET_NAMES:
        raise JobSpecError(f"Unknown dataset {ds.name!r}; valid names are {list(DATASET_NAMES)}.")
    options = dict(ds.options)
    unknown = sorted(set(options) - (set(FILE_OPTIONS) if ds.name == "file" else set()))
    if unknown:
        raise JobSpecError(
            f"JobSpec.dataset.options {unknown} are not options of dataset {ds.name!r}; "
            f"{'it takes ' + str(list(FILE_OPTIONS)) if ds.name == 'file' else 'it takes none'}."
        )
    data_file = labels_file = None
    if ds.name == "file":
        data_file = file_in_data_dir(ds.path, data_dir, max_bytes=max_file_bytes)
        if "labels" in options:
            labels_file = file_in_data_dir(options["labels"], data_dir, max_bytes=max_file_bytes, what="Labels file")
    try:
        dataset = load_dataset(
            ds.name,
            path=data_file if data_file is not None else (ds.path or None),
            num_samples=int(ds.num_samples) or None,
            num_features=int(ds.num_features) or None,
            seed=int(ds.seed),
            test_fraction=float(ds.test_fraction),
            labels_path=labels_file,
            label_column=options.get("label"),
        )
    except MemoryError:
        raise
    except (ValueError, OSError) as exc:
        if data_file is not None:  # never echo what the library quoted from the file
            raise JobSpecError(f"Dataset 'file' {ds.path!r} refused: {file_error(exc)}.") from None
        raise JobSpecError(f"Dataset {ds.name!r} refused: {error_reason(exc)}") from None
    except Exception as exc:  # e.g. csv.Error from a file that is not text
        if data_file is None:
            raise
        raise JobSpecError(f"Dataset 'file' {ds.path!r} refused: {file_error(exc)}.") from None
    samples = dataset.num_train + len(dataset.y_test)
    if dataset.num_features > max_features or dataset.num_features * samples * 8 > limits.MAX_DATASET_BYTES:
        raise JobSpecError(
            f"Dataset {ds.name!r} has {samples} samples x {dataset.num_features} features; a job may use at most "
            f"{max_features} features (the master's --max-features) and {limits.MAX_DATASET_BYTES >> 20} MiB of "
            "features."
        )
    return dataset, None


def _plan_local_dataset(
    spec: master_pb2.JobSpec, data_dir: str | Path | None, max_file_bytes: int, max_features: int
) -> tuple[Dataset, LocalDescription]:
    """Worker-local data: its description (labels and held-out rows); the features stay on the workers."""
    ds = spec.dataset
    if spec.verify:
        raise JobSpecError(
            "JobSpec.verify compares every decoded gradient with the centralized one, which needs the training data "
            "on the master; with dataset.worker_local it stays on the workers. Turn verify off, or let the master "
            "stream the dataset (worker_local false)."
        )
    source = DataSource(
        name=ds.name, path=ds.path, options=dict(ds.options), num_samples=int(ds.num_samples) or None,
        num_features=int(ds.num_features) or None, seed=int(ds.seed),
        data_dir=None if data_dir is None else Path(data_dir), max_file_bytes=max_file_bytes, where="master",
    )  # fmt: skip
    try:
        local = describe(source, test_fraction=float(ds.test_fraction))
    except (MemoryError, JobSpecError):
        raise
    except Exception as exc:  # a plugin's or reader's error; a file's never echoes its content
        if ds.name == "file" and isinstance(exc, (ValueError, OSError)) and not isinstance(exc, PluginError):
            raise JobSpecError(f"Dataset 'file' {ds.path!r} refused: {file_error(exc)}.") from None
        reason = error_reason(exc) if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {exc}"
        raise JobSpecError(f"Dataset {ds.name!r} (worker_local) refused: {reason}") from None
    dataset = local.dataset
    if not len(dataset.y_test):
        raise JobSpecError(
            f"Dataset {ds.name!r} keeps no held-out rows (test_fraction {ds.test_fraction:g} of {local.num_rows}); "
            "worker-local data needs some for the test accuracy: raise dataset.test_fraction."
        )
    if dataset.num_features > max_features or local.num_rows > limits.MAX_SAMPLES:
        raise JobSpecError(
            f"Dataset {ds.name!r} has {local.num_rows} samples x {dataset.num_features} features; a job may use at "
            f"most {limits.MAX_SAMPLES} samples and {max_features} features (the master's --max-features)."
        )
    return dataset, local


def _plan_model(spec: master_pb2.JobSpec, dataset: Dataset) -> Model:
    """The model; its sizes default to the dataset's."""
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
    if model.num_params * 8 > limits.MAX_MODEL_BYTES:
        raise JobSpecError(
            f"Model {ms.kind!r} over {ms.num_features} features has {model.num_params} parameters "
            f"({model.num_params * 8 / 2**20:.0f} MiB); a job may use at most {limits.MAX_MODEL_BYTES // 8} "
            f"({limits.MAX_MODEL_BYTES >> 20} MiB)."
        )
    return model


def _initial_params(spec: master_pb2.JobSpec, model: Model) -> np.ndarray[Any, Any] | None:
    """``JobSpec.initial_parameters`` as float64, checked against the model's size (None when not given)."""
    if not spec.HasField("initial_parameters"):
        return None
    try:
        given = array_from_tensor(spec.initial_parameters, expected_shape=(model.num_params,))
    except ValueError as exc:  # a WireError: wrong shape or byte length
        raise JobSpecError(
            f"JobSpec.initial_parameters must be a flat vector of the model's {model.num_params} parameters: {exc}"
        ) from None
    params = np.array(given, dtype=np.float64)
    if not np.all(np.isfinite(params)):
        raise JobSpecError("JobSpec.initial_parameters contains NaN or infinite entries.")
    return params


def _check_optimizer_and_loop(spec: master_pb2.JobSpec, model: Model) -> None:
    """The optimizer (built once to validate it) and the loop parameters, with their defaults."""
    opt = spec.optimizer
    if not opt.kind:
        opt.kind = "gd"
    if opt.kind not in OPTIMIZER_KINDS:
        raise JobSpecError(f"Unknown optimizer {opt.kind!r}; valid optimizers are {list(OPTIMIZER_KINDS)}.")
    try:
        make_optimizer(opt.kind, model.init_params(), learning_rate=opt.learning_rate, momentum=opt.momentum)
    except ValueError as exc:
        raise JobSpecError(f"Optimizer refused: {exc}") from None
    if not 1 <= spec.iterations <= limits.MAX_ITERATIONS:
        raise JobSpecError(f"JobSpec.iterations must be in [1, {limits.MAX_ITERATIONS}], not {spec.iterations}.")
    _finite("target_accuracy", spec.target_accuracy, high=1.0)
    _finite("iteration_deadline_seconds", spec.iteration_deadline_seconds)
    if spec.iteration_deadline_seconds == 0:
        spec.iteration_deadline_seconds = DEFAULT_ITERATION_DEADLINE_SECONDS
    _finite("wait_for_workers_seconds", spec.wait_for_workers_seconds)
    if spec.evaluate_every == 0:
        spec.evaluate_every = DEFAULT_EVALUATE_EVERY


BACKUP_PRIORITIES = ("low", "normal")
DEFAULT_BACKUP_PRIORITY = "low"


def _check_integrity(spec: master_pb2.JobSpec, code: GradientCode) -> None:
    """The consistency policy, defaulting to the master's (:data:`~gradcode.common.gather.integrity.DEFAULT_INTEGRITY`);
    a checking policy is refused for a code with rows no surplus can ever check (every decode would be unchecked,
    never exact)."""
    _check_choice(spec, "integrity", "consistency policy", INTEGRITY_POLICIES, DEFAULT_INTEGRITY)
    never = uncheckable(code) if spec.integrity != "off" else ()
    if never:
        who = "every worker's rows" if len(never) == code.n else f"the rows of workers {list(never)}"
        raise JobSpecError(
            f"JobSpec.integrity {spec.integrity!r} cannot check {code!r}: {who} take part in no relation of the "
            "code, so no surplus message can ever check them and no iteration could be called exact. Use "
            "integrity 'off', or a scheme whose rows all overlap (cyclic, fractional, binary, reed_solomon, "
            "clustered, coded_reduce with s >= 1; `gradcode codes` lists them)."
        )


def _check_backup_priority(spec: master_pb2.JobSpec) -> None:
    """How backups are asked, defaulting to :data:`DEFAULT_BACKUP_PRIORITY`."""
    _check_choice(spec, "backup_priority", "backup priority", BACKUP_PRIORITIES, DEFAULT_BACKUP_PRIORITY)


def _check_surplus(spec: master_pb2.JobSpec) -> None:
    """What backups do with their messages, defaulting to :data:`DEFAULT_SURPLUS`."""
    _check_choice(spec, "surplus", "surplus mode", SURPLUS_MODES, DEFAULT_SURPLUS)


def _check_model_delivery(spec: master_pb2.JobSpec) -> None:
    """How the model reaches the workers (a tree's: the parents of its first layer, who forward it to their
    children), defaulting to :data:`DEFAULT_MODEL_DELIVERY`."""
    _check_choice(spec, "model_delivery", "model delivery", MODEL_DELIVERIES, DEFAULT_MODEL_DELIVERY)


def _check_choice(spec: master_pb2.JobSpec, name: str, kind: str, choices: tuple[str, ...], default: str) -> None:
    """String field ``name`` of ``spec``: ``default`` when empty, else one of ``choices`` (JobSpecError)."""
    value = getattr(spec, name)
    if not value:
        setattr(spec, name, default)
    elif value not in choices:
        raise JobSpecError(
            f"JobSpec.{name} {value!r} is not a {kind}; valid ones are {list(choices)} (empty: the default, "
            f"{default!r})."
        )


def _check_stragglers(spec: master_pb2.JobSpec, num_workers: int) -> None:
    """Straggler emulation, validated here so the workers never see a model they would refuse."""
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
        for w in range(num_workers):
            try:
                delays.delay(w, 0)
            except (ValueError, OverflowError) as exc:
                raise JobSpecError(
                    f"Straggler model {st.model!r} refused for worker {w} of this job's {num_workers} workers "
                    f"(ids 0..{num_workers - 1}): {exc}"
                ) from None


def _check_worker_ids(
    spec: master_pb2.JobSpec, num_workers: int, topology: Topology | None, known_worker_ids: list[int] | None
) -> None:
    """An explicit ``worker_ids`` list names every worker the job needs, once, among the known ones."""
    ids = list(spec.worker_ids)
    if ids:
        if len(ids) != num_workers or len(set(ids)) != len(ids):
            what = "the code's n" if topology is None else topology.describe()
            raise JobSpecError(f"JobSpec.worker_ids must list {num_workers} distinct worker ids ({what}), not {ids}.")
        if known_worker_ids is not None:
            unknown = sorted(set(ids) - set(known_worker_ids))
            if unknown:
                raise JobSpecError(
                    f"JobSpec.worker_ids names unknown worker id(s) {unknown}; known worker ids are "
                    f"{sorted(known_worker_ids)}."
                )


def _topology(spec: master_pb2.JobSpec, code: GradientCode) -> Topology | None:
    """The code's topology (None for a flat code); checks JobSpec.tree against it."""
    given = list(spec.tree.parent_of)
    try:
        tree = code.topology()
    except ValueError as exc:
        raise JobSpecError(f"Tree job refused: {exc}") from None
    if tree is None:
        if given:
            raise JobSpecError(
                f"JobSpec.tree is only for coded_reduce with L > 1 (its topology is implied); {code!r} is a flat "
                "scheme: leave JobSpec.tree empty."
            )
        return None
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
