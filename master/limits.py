"""The size caps a job must fit, checked before anything is built.

An oversized spec is refused with a precise INVALID_ARGUMENT instead of exhausting the master's memory
(or dying with MemoryError). A code's size comes from the code contract
(:meth:`~gradcode.common.codes.base.GradientCode.implied_size`), so no scheme is named here. Every free-form
field a client fills (names, the dataset's path and options, the Struct fields) is capped too
(:func:`check_free_form`): the master keeps the spec for the job's life, in every JobInfo and checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

from gradcode.common.codes.registry import code_class
from gradcode.common.exceptions import JobSpecError
from gradcode.common.training.datafile import MAX_DATA_FILE_BYTES
from gradcode.common.transport.security import short
from gradcode.common.transport.wire import MAX_ITERATIONS
from gradcode.v1 import master_pb2

__all__ = [
    "MAX_DATASET_BYTES",
    "MAX_DATA_FILE_BYTES",
    "MAX_EXTRA_BYTES",
    "MAX_FEATURES",
    "MAX_ITERATIONS",
    "MAX_MODEL_BYTES",
    "MAX_NAME_CHARS",
    "MAX_OPTIONS",
    "MAX_OPTION_CHARS",
    "MAX_PARAMS_BYTES",
    "MAX_PARTITIONS",
    "MAX_PATH_CHARS",
    "MAX_SAMPLES",
    "MAX_SPEC_BYTES",
    "MAX_WORKERS",
    "check_code_size",
    "check_dataset_size",
    "check_free_form",
]

MAX_WORKERS = 1024
"""Worker processes one job may use (a tree job counts every node, n + n^2 + ... + n^L)."""
MAX_PARTITIONS = 65_536
"""Data partitions (the code's ``k``) one job may cut its training set into."""
MAX_SAMPLES = 10_000_000
"""Samples a dataset may have (``dataset.num_samples``, or the rows of a data file)."""
MAX_FEATURES = 100_000
"""Features per sample, by default: the master's ``--max-features`` sets its own (a p = 10^6 model needs it raised;
the dataset's bytes stay under :data:`MAX_DATASET_BYTES` either way)."""
MAX_DATASET_BYTES = 1 << 30
"""float64 bytes of the feature matrix, samples x features x 8 (1 GiB)."""
MAX_MODEL_BYTES = 64 << 20
"""float64 bytes of the parameter vector (64 MiB = 8M parameters): the master keeps several copies."""
MAX_NAME_CHARS = 128
"""Characters of a name a client picks from a list: code.name, model.kind, dataset.name, optimizer.kind,
straggler.model, integrity, backup_priority, surplus, model_delivery."""
MAX_PATH_CHARS = 4096
"""Characters of ``dataset.path`` (Linux's PATH_MAX)."""
MAX_OPTIONS = 64
"""Entries of ``dataset.options``."""
MAX_OPTION_CHARS = 4096
"""Characters of each key and each value of ``dataset.options``."""
MAX_PARAMS_BYTES = 1 << 20
"""Serialized bytes of ``code.params`` and of ``straggler.params`` each (1 MiB: room for the 100,000 numbers
:data:`~gradcode.master.spec_checks.MAX_STRUCT_VALUES` allows, a per-worker list of a 1024-worker code many times)."""
MAX_EXTRA_BYTES = 64 << 10
"""Serialized bytes of ``JobSpec.extra`` (64 KiB): experiment-specific notes the master only keeps and returns."""
MAX_SPEC_BYTES = MAX_MODEL_BYTES + (4 << 20)
"""Serialized bytes of a whole JobSpec: ``initial_parameters`` (at most :data:`MAX_MODEL_BYTES`) and room for the
rest, which the caps above bound."""
_SYNTHETIC_DEFAULT_SIZE = {"gaussian_mixture": (2000, 20), "linear": (1000, 50), "digits": (1797, 64)}
"""(samples, features) a dataset has when the spec leaves them 0 (see gradcode.common.training.data.load_dataset)."""


def check_code_size(name: str, params: dict[str, object]) -> None:
    """Refuse a code whose worker or partition count exceeds the caps, before building it."""
    size = code_class(name).implied_size(params)
    if size.workers is None or size.workers < 1:
        return
    if size.workers > MAX_WORKERS:
        raise JobSpecError(
            f"Gradient code {name!r} with these parameters needs {size.workers:.4g} workers; a job may use at most "
            f"{MAX_WORKERS}."
        )
    if size.partitions is not None and size.partitions > MAX_PARTITIONS:
        described = ", ".join(f"{key}={params[key]!r}" for key in sorted(params))
        advice = f" ({size.advice})" if size.advice else ""
        raise JobSpecError(
            f"Gradient code {name!r} with {described} cuts the data into {size.partitions:.4g} partitions; a job "
            f"may use at most {MAX_PARTITIONS}{advice}."
        )


def check_dataset_size(ds: master_pb2.DatasetSpec, max_features: int = MAX_FEATURES) -> None:
    """Refuse a dataset larger than the caps (``max_features``: the master's) before generating or loading it."""
    if ds.num_samples > MAX_SAMPLES:
        raise JobSpecError(f"JobSpec.dataset.num_samples is {ds.num_samples}; a job may use at most {MAX_SAMPLES}.")
    if ds.num_features > max_features:
        raise JobSpecError(
            f"JobSpec.dataset.num_features is {ds.num_features}; this master allows at most {max_features} "
            "(its --max-features)."
        )
    default_samples, default_features = _SYNTHETIC_DEFAULT_SIZE.get(ds.name, (0, 0))
    samples, features = ds.num_samples or default_samples, ds.num_features or default_features
    if samples * features * 8 > MAX_DATASET_BYTES:
        raise JobSpecError(
            f"Dataset {ds.name!r} of {samples} samples x {features} features needs "
            f"{samples * features * 8 / 2**20:.0f} MiB; a job may use at most {MAX_DATASET_BYTES >> 20} MiB."
        )


_NAMES: tuple[tuple[str, Callable[[master_pb2.JobSpec], str]], ...] = (
    ("JobSpec.code.name", lambda s: s.code.name),
    ("JobSpec.model.kind", lambda s: s.model.kind),
    ("JobSpec.dataset.name", lambda s: s.dataset.name),
    ("JobSpec.optimizer.kind", lambda s: s.optimizer.kind),
    ("JobSpec.straggler.model", lambda s: s.straggler.model),
    ("JobSpec.integrity", lambda s: s.integrity),
    ("JobSpec.backup_priority", lambda s: s.backup_priority),
    ("JobSpec.surplus", lambda s: s.surplus),
    ("JobSpec.model_delivery", lambda s: s.model_delivery),
)


def _kib(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes >> 10} KiB)" if nbytes < 1 << 20 else f"{nbytes} bytes ({nbytes >> 20} MiB)"


def check_free_form(spec: master_pb2.JobSpec) -> None:
    """Refuse a spec whose free-form fields exceed their caps (JobSpecError naming the field and its limit).

    Sizes only, checked before anything reads the fields' contents; what the fields may say is checked where
    they are used.
    """
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        raise JobSpecError(f"The JobSpec has {size} bytes; a JobSpec may have at most {_kib(MAX_SPEC_BYTES)}.")
    for name, get in _NAMES:
        value = get(spec)
        if len(value) > MAX_NAME_CHARS:
            raise JobSpecError(f"{name} has {len(value)} characters; at most {MAX_NAME_CHARS} are allowed.")
    if len(spec.dataset.path) > MAX_PATH_CHARS:
        raise JobSpecError(
            f"JobSpec.dataset.path has {len(spec.dataset.path)} characters; at most {MAX_PATH_CHARS} are allowed."
        )
    options = spec.dataset.options
    if len(options) > MAX_OPTIONS:
        raise JobSpecError(f"JobSpec.dataset.options has {len(options)} entries; at most {MAX_OPTIONS} are allowed.")
    for key, value in options.items():
        if len(key) > MAX_OPTION_CHARS or len(value) > MAX_OPTION_CHARS:
            raise JobSpecError(
                f"JobSpec.dataset.options[{short(key, 32)}] has a key of {len(key)} and a value of {len(value)} "
                f"characters; each may have at most {MAX_OPTION_CHARS}."
            )
    for name, struct, limit in (
        ("JobSpec.code.params", spec.code.params, MAX_PARAMS_BYTES),
        ("JobSpec.straggler.params", spec.straggler.params, MAX_PARAMS_BYTES),
        ("JobSpec.extra", spec.extra, MAX_EXTRA_BYTES),
    ):
        size = struct.ByteSize()
        if size > limit:
            raise JobSpecError(f"{name} has {size} bytes serialized; it may have at most {_kib(limit)}.")
