"""The size caps a job must fit, checked before anything is built.

An oversized spec is refused with a precise INVALID_ARGUMENT instead of exhausting the master's memory
(or dying with MemoryError). A code's size comes from the code contract
(:meth:`~gradcode.common.codes.base.GradientCode.implied_size`), so no scheme is named here.
"""

from __future__ import annotations

from gradcode.common.codes.registry import code_class
from gradcode.common.datafile import MAX_DATA_FILE_BYTES
from gradcode.common.exceptions import JobSpecError
from gradcode.v1 import master_pb2

__all__ = [
    "MAX_DATASET_BYTES",
    "MAX_DATA_FILE_BYTES",
    "MAX_FEATURES",
    "MAX_ITERATIONS",
    "MAX_MODEL_BYTES",
    "MAX_PARTITIONS",
    "MAX_SAMPLES",
    "MAX_WORKERS",
    "check_code_size",
    "check_dataset_size",
]

MAX_ITERATIONS = 1_000_000
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
MAX_MODEL_BYTES = 64 << 20
"""float64 bytes of the parameter vector (64 MiB = 8M parameters): the master keeps several copies."""
_SYNTHETIC_DEFAULT_SIZE = {"gaussian_mixture": (2000, 20), "linear": (1000, 50), "digits": (1797, 64)}
"""(samples, features) a dataset has when the spec leaves them 0 (see gradcode.common.data.load_dataset)."""


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


def check_dataset_size(ds: master_pb2.DatasetSpec) -> None:
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
