r"""Datasets for gradcode jobs and the deterministic split of samples into data partitions.

:func:`load_dataset` returns a :class:`Dataset` (train/test arrays plus the model it suits):

* ``"digits"`` — scikit-learn's bundled 8×8 handwritten digits (1797 samples, 64 features scaled to
  $[0, 1]$, 10 classes); the default demo, a small stand-in for Halbawi et al.'s MNIST softmax run.
* ``"gaussian_mixture"`` — Tandon et al.'s artificial logistic-regression data (§5).
* ``"linear"`` — CodedReduce's artificial linear-regression data (Reisizadeh et al., §VI eq. (10)).
* ``"file"`` — a user's ``.npz`` (arrays ``X`` and ``y``), ``.csv`` (label in the last column), ``.npy``
  (features, memory-mapped, with a second ``.npy`` of labels) or ``.parquet`` (one label column).

:func:`split_rows` is the seeded train/test split and :func:`partition_indices` splits the training
samples into the ``k`` partitions of a gradient code in the proportions ``code.partition_weights``:
a worker that loads its own partitions (:mod:`gradcode.common.training.datasets`) uses both exactly as the
master does, so the same seeds give the same partitions. :func:`open_data_file` reads a data file's
shape, labels or selected rows (a memory-mapped ``.npy`` reads only those rows).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
import zipfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from gradcode.common.training.models import MODEL_KINDS
from gradcode.common.validation import check_int

__all__ = [
    "DATASET_NAMES",
    "DataTable",
    "Dataset",
    "DeclaredArray",
    "check_data",
    "check_num_features",
    "generate",
    "infer_task",
    "load_dataset",
    "npz_declared_arrays",
    "open_data_file",
    "partition_indices",
    "signed_labels",
    "split_rows",
]

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]

DATASET_NAMES = ("digits", "gaussian_mixture", "linear", "file")
"""Names accepted by :func:`load_dataset`."""

_MAX_INFERRED_CLASSES = 256
"""A file whose labels are integers in [0, 256) is read as classification data (see :func:`load_dataset`)."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split and the model it is meant for. Arrays are float64 and read-only.

    Attributes:
        name: the dataset's name (for ``"file"``, the file name).
        X_train, y_train, X_test, y_test: features ``(samples, features)`` and labels ``(samples,)``;
            classifier labels are floats holding integer classes in ``[0, num_classes)``.
        num_classes: number of classes, 0 for regression.
        model_kind: the natural model (``"softmax"``, ``"logistic"`` or ``"linear"``).
        true_params: for synthetic data, the generating parameters in that model's layout
            (:mod:`gradcode.common.training.models`), so experiments can report $\\|\\theta - \\theta_*\\|^2 /
            \\|\\theta_*\\|^2$
            (CodedReduce eq. (11)); ``None`` otherwise.
    """

    name: str
    X_train: FloatArray
    y_train: FloatArray
    X_test: FloatArray
    y_test: FloatArray
    num_classes: int
    model_kind: str
    true_params: FloatArray | None = field(default=None)
    features_on_workers: bool = False
    """The training features stay on the workers (worker-local data): ``X_train`` is empty and ``y_train``
    holds the training labels only, which is all the master needs (their count and spread)."""

    def __post_init__(self) -> None:
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind must be one of {list(MODEL_KINDS)}, not {self.model_kind!r}.")
        for part in ("train", "test"):
            X = getattr(self, f"X_{part}")
            y = getattr(self, f"y_{part}")
            if X.dtype != np.float64 or y.dtype != np.float64:
                raise ValueError(f"X_{part} and y_{part} must be float64, got {X.dtype} and {y.dtype}.")
            local = part == "train" and self.features_on_workers  # no feature rows here, only labels
            if X.ndim != 2 or y.ndim != 1 or X.shape[0] != (0 if local else y.shape[0]):
                raise ValueError(f"X_{part} must be 2-D and y_{part} must have one label per row of X_{part}.")
            X.setflags(write=False)
            y.setflags(write=False)
        if self.X_test.shape[1] != self.X_train.shape[1]:
            raise ValueError(f"X_test has {self.X_test.shape[1]} features but X_train has {self.X_train.shape[1]}.")

    @property
    def num_features(self) -> int:
        return int(self.X_train.shape[1])

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    def without_samples(self) -> Dataset:
        """The same dataset with no samples: what a finished job keeps (its name, shape and classes). Nor does it
        keep a synthetic set's generating parameters (a model's size: 8 MB at p = 10⁶, for each finished job the
        master holds)."""
        f = self.num_features
        return dataclasses.replace(
            self, X_train=np.empty((0, f)), y_train=np.empty(0), X_test=np.empty((0, f)), y_test=np.empty(0),
            true_params=None,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"<Dataset({self.name!r}, train={self.X_train.shape}, test={self.X_test.shape}, "
            f"num_classes={self.num_classes}, model_kind={self.model_kind!r})>"
        )


# ---- public entry points ----------------------------------------------------------------------------
def load_dataset(
    name: str,
    *,
    path: str | os.PathLike[str] | None = None,
    num_samples: int | None = None,
    num_features: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    model_kind: str | None = None,
    labels_path: str | os.PathLike[str] | None = None,
    label_column: str | None = None,
) -> Dataset:
    """Load or generate the dataset ``name`` (one of :data:`DATASET_NAMES`) and split it.

    Arguments:
        name: ``"digits"``, ``"gaussian_mixture"``, ``"linear"`` or ``"file"``.
        path: the ``.npz``/``.csv``/``.npy``/``.parquet`` file, required for ``"file"`` only.
        labels_path: with a ``.npy`` of features, the ``.npy`` of labels (``"file"`` only).
        label_column: a ``.parquet`` file's label column; default the last (``"file"`` only).
        num_samples: total samples before the train/test split. Synthetic sets default to 2000
            (``gaussian_mixture``) and 1000 (``linear``); for digits and files it subsamples.
        num_features: synthetic sets default to 20 (``gaussian_mixture``) and 50 (``linear``); for
            digits and files it must be ``None`` or equal to the data's width.
        seed: seeds the synthetic draw, the subsample and the train/test shuffle.
        test_fraction: share of samples held out for testing, in ``[0, 1)``.
        model_kind: ``"file"`` only — override the inferred model. By default labels that are all
            integers in ``[0, 256)`` make classification data (2 classes → ``"logistic"``, more →
            ``"softmax"``), ``{-1, +1}`` labels make ``"logistic"`` with $-1 \\to 0$, anything else
            is ``"linear"``.

    Raises:
        ValueError: unknown name, bad sizes, or an unreadable/malformed file (the message says which).
    """
    if not isinstance(name, str) or name not in DATASET_NAMES:
        raise ValueError(f"Unknown dataset {name!r}; valid names are {list(DATASET_NAMES)}.")
    if not (isinstance(test_fraction, (int, float)) and 0.0 <= float(test_fraction) < 1.0):
        raise ValueError(f"Argument 'test_fraction' must be a number in [0, 1), not {test_fraction!r}.")
    check_int("seed", seed, 0)
    if num_samples is not None:
        check_int("num_samples", num_samples, 2)
    if num_features is not None:
        check_int("num_features", num_features, 1)
    for argument, value in (("path", path), ("labels_path", labels_path), ("label_column", label_column)):
        if value is not None and name != "file":
            raise ValueError(f"Argument {argument!r} is only used by the 'file' dataset, not by {name!r}.")
    if model_kind is not None and name != "file":
        raise ValueError(f"Argument 'model_kind' is only used by the 'file' dataset, not by {name!r}.")

    loaders: dict[str, Callable[..., Dataset]] = {
        "digits": functools.partial(_load_generated, "digits"),
        "gaussian_mixture": functools.partial(_load_generated, "gaussian_mixture"),
        "linear": functools.partial(_load_generated, "linear"),
        "file": _load_file,
    }
    kwargs: dict[str, Any] = {
        "num_samples": num_samples,
        "num_features": num_features,
        "seed": int(seed),
        "test_fraction": float(test_fraction),
    }
    if name == "file":
        kwargs.update(path=path, model_kind=model_kind, labels_path=labels_path, label_column=label_column)
    return loaders[name](**kwargs)


def partition_indices(
    num_samples: int, weights: Sequence[float] | npt.NDArray[np.floating[Any]], *, seed: int
) -> list[IndexArray]:
    """Split ``range(num_samples)`` into ``len(weights)`` disjoint index sets sized by ``weights``.

    The samples are shuffled with ``seed`` (so partitions are i.i.d. samples of the data), then cut
    into blocks whose sizes are $N w_j / \\sum w$ rounded by the largest-remainder method: every size is
    the floor of its quota, and the leftover samples go to the largest fractional parts (ties to the
    lower index). A zero weight gets no sample; every positive weight gets at least one (taken, if
    rounding left it empty, from the largest block) — an empty partition would make its worker
    idle. Each returned array is sorted (contiguous reads); together they cover every sample once.

    Raises:
        ValueError: negative/non-finite/all-zero weights, or fewer samples than positive weights.
    """
    n = check_int("num_samples", num_samples, 0)
    check_int("seed", seed, 0)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"Argument 'weights' must be a non-empty 1-D sequence, got shape {w.shape}.")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise ValueError(f"Argument 'weights' must be finite, non-negative and not all zero, not {w.tolist()!r}.")
    positive = w > 0
    num_positive = int(positive.sum())
    if n < num_positive:
        raise ValueError(
            f"Cannot split {n} samples into {num_positive} partitions with positive weight; "
            f"every such partition needs at least one sample."
        )
    sizes = _largest_remainder(n, w)
    # Guarantee one sample per positive-weight partition (only bites for extreme weight ratios).
    for j in np.flatnonzero(positive & (sizes == 0)):
        donor = int(np.argmax(sizes))
        sizes[donor] -= 1
        sizes[j] = 1
    order = np.random.default_rng(np.random.SeedSequence([int(seed), _PARTITION_STREAM])).permutation(n)
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    return [np.sort(order[bounds[j] : bounds[j + 1]]).astype(np.int64) for j in range(w.size)]


# ---- helpers ----------------------------------------------------------------------------------------
_PARTITION_STREAM = 0x9A27
_SPLIT_STREAM = 0x5B11
_GENERATE_STREAM = 0x6E7A


def _largest_remainder(n: int, weights: FloatArray) -> npt.NDArray[np.int64]:
    quotas = n * weights / weights.sum()
    sizes = np.floor(quotas).astype(np.int64)
    fractions = np.where(weights > 0, quotas - sizes, -1.0)
    leftover = n - int(sizes.sum())
    # Stable sort on -fraction: equal fractions keep index order, so ties go to the lower index.
    winners = np.argsort(-fractions, kind="stable")[:leftover]
    sizes[winners] += 1
    result: npt.NDArray[np.int64] = sizes
    return result


def split_rows(
    total: int, *, seed: int, test_fraction: float, num_samples: int | None = None, name: str = "data"
) -> tuple[IndexArray, IndexArray]:
    """The rows of a ``total``-row dataset kept for training and for testing (in that shuffled order).

    Shuffles with ``seed``, keeps ``num_samples`` (if given), holds out ``test_fraction`` for testing:
    what :func:`load_dataset` does, so a worker reading its own rows (:mod:`gradcode.common.training.datasets`)
    gets exactly the master's training set. ValueError names ``name`` when the sizes do not fit.
    """
    if num_samples is not None and num_samples > total:
        raise ValueError(f"Argument 'num_samples' must be at most {total} for dataset {name!r}, not {num_samples}.")
    keep = total if num_samples is None else num_samples
    order = np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_STREAM])).permutation(total)[:keep]
    num_test = round(test_fraction * keep)
    if keep - num_test < 1:
        raise ValueError(f"Dataset {name!r} has {keep} samples, too few to keep any for training.")
    return order[num_test:].astype(np.int64), order[:num_test].astype(np.int64)


def _split(
    name: str,
    X: FloatArray,
    y: FloatArray,
    *,
    seed: int,
    test_fraction: float,
    num_samples: int | None,
    num_classes: int,
    model_kind: str,
    true_params: FloatArray | None = None,
) -> Dataset:
    """Shuffle with ``seed``, keep ``num_samples`` (if given), hold out ``test_fraction`` for testing."""
    train, test = split_rows(X.shape[0], seed=seed, test_fraction=test_fraction, num_samples=num_samples, name=name)
    return Dataset(
        name=name,
        X_train=np.ascontiguousarray(X[train]),
        y_train=np.ascontiguousarray(y[train]),
        X_test=np.ascontiguousarray(X[test]),
        y_test=np.ascontiguousarray(y[test]),
        num_classes=num_classes,
        model_kind=model_kind,
        true_params=true_params,
    )


@dataclass(frozen=True, eq=False)
class Generated:
    """A built-in dataset before its train/test split: all its rows, and what they are for."""

    X: FloatArray
    y: FloatArray
    num_classes: int
    model_kind: str
    true_params: FloatArray | None = None
    keep: int | None = None
    """Rows the split keeps (``num_samples`` subsamples the digits; a generator draws exactly that many)."""


def generate(name: str, *, num_samples: int | None, num_features: int | None, seed: int) -> Generated:
    """Every row of the built-in dataset ``name`` (``digits``, ``gaussian_mixture`` or ``linear``), from ``seed``.

    The master splits it (:func:`load_dataset`); a worker with worker-local data generates the same rows
    and keeps its partitions' (:mod:`gradcode.common.training.datasets`).
    """
    generators: dict[str, Callable[..., Generated]] = {
        "digits": _digits,
        "gaussian_mixture": _gaussian_mixture,
        "linear": _linear,
    }
    if name not in generators:
        raise ValueError(f"Unknown built-in dataset {name!r}; valid names are {sorted(generators)}.")
    return generators[name](num_samples=num_samples, num_features=num_features, seed=seed)


def _load_generated(
    name: str, *, num_samples: int | None, num_features: int | None, seed: int, test_fraction: float
) -> Dataset:
    g = generate(name, num_samples=num_samples, num_features=num_features, seed=seed)
    return _split(
        name, g.X, g.y, seed=seed, test_fraction=test_fraction, num_samples=g.keep, num_classes=g.num_classes,
        model_kind=g.model_kind, true_params=g.true_params,
    )  # fmt: skip


def _digits(*, num_samples: int | None, num_features: int | None, seed: int) -> Generated:
    from sklearn.datasets import load_digits  # local: scikit-learn is slow to import

    bunch = load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0  # pixel intensities are 0..16
    y = np.asarray(bunch.target, dtype=np.float64)
    if num_features is not None and num_features != X.shape[1]:
        raise ValueError(f"Dataset 'digits' has {X.shape[1]} features; 'num_features' must be None or that.")
    return Generated(X, y, num_classes=10, model_kind="softmax", keep=num_samples)


def _gaussian_mixture(*, num_samples: int | None, num_features: int | None, seed: int) -> Generated:
    r"""Tandon et al. §5: $x \sim \tfrac12 N(\mu_1, I) + \tfrac12 N(\mu_2, I)$, $y \sim \mathrm{Ber}(p)$.

    The paper sets $p = 1 / (\exp(2 x^\top \beta^*) + 1)$ (i.e. $P(y = 1 \mid x) = \sigma(-2 x^\top \beta^*)$)
    with "random" $\mu_1, \mu_2, \beta^* \in \mathbb{R}^p$ but does not say from which distribution.
    Our reading: $\mu_1, \mu_2 \sim N(0, I_p)$ and $\beta^* \sim N(0, I_p / p)$, so that $2 x^\top \beta^*$
    stays of order one whatever $p$ and the labels are noisy but learnable. The paper's sizes are
    $d = 554400$, $p = 100$; the defaults here are 2000 × 20. ``true_params`` is the generating
    logistic model in :class:`~gradcode.common.training.models.LogisticRegression` layout: $[-2\beta^*, 0]$.
    """
    d = 2000 if num_samples is None else num_samples
    p = 20 if num_features is None else num_features
    rng = np.random.default_rng(np.random.SeedSequence([seed, _GENERATE_STREAM, 1]))
    means = rng.standard_normal((2, p))
    beta = rng.standard_normal(p) / math.sqrt(p)
    component = rng.integers(0, 2, size=d)
    X = means[component] + rng.standard_normal((d, p))
    prob_one = 1.0 / (np.exp(np.clip(2.0 * X @ beta, -700.0, 700.0)) + 1.0)
    y = (rng.random(d) < prob_one).astype(np.float64)
    true_params = np.concatenate((-2.0 * beta, [0.0]))
    return Generated(X, y, num_classes=2, model_kind="logistic", true_params=true_params)


def _linear(*, num_samples: int | None, num_features: int | None, seed: int) -> Generated:
    r"""CodedReduce §VI eq. (10): $y_j = x_j^\top \theta_* + z_j$, $x_j, \theta_* \sim N(0, I_p)$, $z_j \sim N(0, 1)$.

    The paper uses $(d, p) = (7644, 6500)$; the defaults here are 1000 × 50. ``true_params`` is
    $[\theta_*, 0]$ in :class:`~gradcode.common.training.models.LinearRegression` layout, for the normalized error
    rate of eq. (11).
    """
    d = 1000 if num_samples is None else num_samples
    p = 50 if num_features is None else num_features
    rng = np.random.default_rng(np.random.SeedSequence([seed, _GENERATE_STREAM, 2]))
    theta = rng.standard_normal(p)
    X = rng.standard_normal((d, p))
    y = X @ theta + rng.standard_normal(d)
    return Generated(X, y, num_classes=0, model_kind="linear", true_params=np.concatenate((theta, [0.0])))


def _load_file(
    *,
    path: str | os.PathLike[str] | None,
    model_kind: str | None,
    num_samples: int | None,
    num_features: int | None,
    seed: int,
    test_fraction: float,
    labels_path: str | os.PathLike[str] | None = None,
    label_column: str | None = None,
) -> Dataset:
    if path is None:
        raise ValueError("Dataset 'file' needs a 'path' to a .npz, .csv, .npy or .parquet file.")
    table = open_data_file(path, labels_path=labels_path, label_column=label_column)
    file = Path(path)
    X, y = table.rows(np.arange(table.num_rows))
    check_data(X, y, file, num_features=num_features)
    kind, y, num_classes = infer_task(y, model_kind, file)
    return _split(
        file.name,
        X,
        y,
        seed=seed,
        test_fraction=test_fraction,
        num_samples=num_samples,
        num_classes=num_classes,
        model_kind=kind,
    )


def check_data(X: FloatArray, y: FloatArray, file: Path, *, num_features: int | None = None) -> None:
    """ValueError unless ``X``/``y`` (rows read from ``file``) are finite and ``X`` has ``num_features`` columns."""
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError(f"Data file {str(file)!r} contains NaN or infinite values.")
    check_num_features(file, X.shape[1], num_features)


def check_num_features(file: str | Path, have: int, want: int | None) -> None:
    """ValueError unless ``want`` (a job's ``num_features``) is None or the file's ``have``."""
    if want is not None and want != have:
        raise ValueError(
            f"Data file {str(file)!r} has {have} features; 'num_features' must be None or that, not {want}."
        )


class DataTable:
    """A data file opened for reading: its shape, all its labels, or selected rows (features and labels).

    ``.npz`` and ``.csv`` files are parsed whole when opened; a ``.npy`` is memory-mapped, so
    :meth:`rows` reads only the rows asked for; a ``.parquet`` file reads its label column or the rows'
    columns. Every array returned is float64.
    """

    num_rows: int
    num_features: int
    file: Path
    model_kind: str | None = None
    """The model the rows are for; None: inferred from the labels (:func:`infer_task`)."""
    num_classes: int = 0
    """With ``model_kind``: the number of classes (0 for regression)."""
    keep: int | None = None
    """Rows the train/test split keeps (:func:`split_rows`' ``num_samples``); None: every row."""

    def labels(self) -> FloatArray:
        """Every row's label."""
        raise NotImplementedError

    def rows(self, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
        """Features ``(len(rows), num_features)`` and labels of ``rows``, in that order."""
        raise NotImplementedError

    def _check_shape(self) -> None:
        if self.num_rows < 2:
            raise ValueError(f"Data file {str(self.file)!r} has {self.num_rows} samples; at least 2 are needed.")


class _ArrayTable(DataTable):
    def __init__(self, file: Path, X: FloatArray, y: FloatArray) -> None:
        self.file, self._X, self._y = file, X, y
        self.num_rows, self.num_features = int(X.shape[0]), int(X.shape[1])
        self._check_shape()

    def labels(self) -> FloatArray:
        return self._y

    def rows(self, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
        return np.ascontiguousarray(self._X[rows]), np.ascontiguousarray(self._y[rows])


class _NpyTable(DataTable):
    """Features in one .npy (2-D), labels in another (1-D), both memory-mapped: nothing is read until asked."""

    def __init__(self, file: Path, labels_file: Path) -> None:
        self.file = file
        self._X = _mmap_npy(file, "features", ndim=2)
        self._y = _mmap_npy(labels_file, "labels", ndim=1)
        self.num_rows, self.num_features = int(self._X.shape[0]), int(self._X.shape[1])
        if self.num_features < 1:
            raise ValueError(
                f"Data file {str(file)!r}: 'X' must be 2-D (samples, features), got shape {self._X.shape}."
            )
        if self._y.shape != (self.num_rows,):
            raise ValueError(
                f"Data file {str(file)!r}: 'y' must have shape ({self.num_rows},) to match 'X', got shape "
                f"{self._y.shape}."
            )
        self._check_shape()

    def labels(self) -> FloatArray:
        return np.asarray(self._y, dtype=np.float64)

    def rows(self, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
        return np.asarray(self._X[rows], dtype=np.float64), np.asarray(self._y[rows], dtype=np.float64)


def _mmap_npy(file: Path, what: str, *, ndim: int) -> np.ndarray[Any, Any]:
    """A .npy memory-mapped read-only (never unpickled), with a real-number dtype and ``ndim`` dimensions."""
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(
            f"Data file {str(file)!r} is not a readable .npy array (object arrays are refused): {exc}"
        ) from None
    if not isinstance(array, np.ndarray) or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise ValueError(
            f"Data file {str(file)!r}: 'X' and 'y' must be numeric, got dtype {getattr(array, 'dtype', '?')}."
        )
    if array.ndim != ndim:
        key = "X" if what == "features" else "y"
        shape = "2-D (samples, features)" if ndim == 2 else "1-D (one label per sample)"
        raise ValueError(f"Data file {str(file)!r}: '{key}' must be {shape}, got shape {array.shape}.")
    return array


class _ParquetTable(DataTable):
    """A Parquet file (pyarrow, the ``parquet`` extra): the label column (default: the last) and the other,
    numeric, columns as features."""

    def __init__(self, file: Path, label_column: str | None) -> None:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("Reading .parquet files needs pyarrow: pip install 'gradcode[parquet]'.") from None
        import pyarrow as pa

        self.file = file
        self._pq = pq
        try:
            schema = pq.read_schema(file)
            self.num_rows = int(pq.ParquetFile(file).metadata.num_rows)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise ValueError(f"Data file {str(file)!r} is not a readable .parquet file: {exc}") from None
        names = list(schema.names)
        label = label_column or (names[-1] if names else "")
        if label not in names:
            raise ValueError(f"Data file {str(file)!r} has no label column {label!r}; its columns are {names[:20]}.")
        self._label = label
        self._features = [n for n in names if n != label]
        self.num_features = len(self._features)
        if self.num_features < 1:
            raise ValueError(f"Data file {str(file)!r}: each line needs at least one feature and a label.")
        bad = [
            n
            for n in names
            if not (pa.types.is_integer(schema.field(n).type) or pa.types.is_floating(schema.field(n).type))
        ]
        if bad:
            raise ValueError(f"Data file {str(file)!r}: 'X' and 'y' must be numeric; columns {bad[:5]} are not.")
        self._check_shape()

    def _read(self, columns: list[str]) -> Any:
        return self._pq.read_table(self.file, columns=columns, memory_map=True)

    def labels(self) -> FloatArray:
        column = self._read([self._label]).column(0)
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)

    def rows(self, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
        table = self._read([*self._features, self._label]).take(rows)
        X = np.empty((len(rows), self.num_features), dtype=np.float64)
        for j, name in enumerate(self._features):
            X[:, j] = table.column(name).to_numpy(zero_copy_only=False)
        y = np.asarray(table.column(self._label).to_numpy(zero_copy_only=False), dtype=np.float64)
        return X, y


def open_data_file(
    path: str | os.PathLike[str],
    *,
    labels_path: str | os.PathLike[str] | None = None,
    label_column: str | None = None,
) -> DataTable:
    """Open a ``.npz`` (arrays ``X``, ``y``), ``.csv`` (label last), ``.npy`` (features; ``labels_path`` is the
    labels' ``.npy``) or ``.parquet`` (``label_column``, default the last) data file; ValueError says what is wrong.

    Paths are used as given: callers confine them first (:func:`gradcode.common.training.datafile.data_file`).
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"Data file {str(file)!r} does not exist or is not a file.")
    suffix = file.suffix.lower()
    if labels_path is not None and suffix != ".npy":
        raise ValueError(f"A labels file is only used with a .npy features file, not with {suffix or 'no suffix'!r}.")
    if label_column is not None and suffix != ".parquet":
        raise ValueError(f"A label column is only used with a .parquet file, not with {suffix or 'no suffix'!r}.")
    if suffix == ".npz":
        return _ArrayTable(file, *_read_npz(file))
    if suffix == ".csv":
        return _ArrayTable(file, *_read_csv(file))
    if suffix == ".npy":
        if labels_path is None:
            raise ValueError(
                f"Data file {str(file)!r} is a .npy of features; name the labels' .npy too (option 'labels')."
            )
        return _NpyTable(file, Path(labels_path))
    if suffix == ".parquet":
        return _ParquetTable(file, label_column)
    raise ValueError(
        f"Data file {str(file)!r} must end in .npz, .csv, .npy or .parquet, not {suffix or '(no suffix)'!r}."
    )


MAX_FILE_ARRAY_BYTES = 1 << 30
"""Largest 'X' plus 'y' (as float64) a data file may declare; an .npz is checked from its array headers
before anything is decompressed, so a small compressed file cannot expand into gigabytes."""


@dataclass(frozen=True)
class DeclaredArray:
    """What an .npz member's .npy header says it holds: the array it decompresses into."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def npz_declared_arrays(
    source: str | os.PathLike[str] | IO[bytes], *, names: Collection[str] | None = None, max_arrays: int | None = None
) -> dict[str, DeclaredArray]:
    """The arrays an .npz declares in its members' .npy headers, by name (as ``np.load`` keys them), read without
    decompressing any array's data: how far a small compressed file would expand is known before it does.

    Only ``names`` are read when given; more than ``max_arrays`` members is a ValueError before any is read. A
    header that cannot be read raises ValueError, EOFError, OSError or zipfile.BadZipFile. Both the data files
    (:func:`open_data_file`) and the master's checkpoints (:mod:`gradcode.master.checkpoint`) are checked with it.
    """
    declared = {}
    with zipfile.ZipFile(source) as archive:
        members = archive.namelist()
        if max_arrays is not None and len(members) > max_arrays:
            raise ValueError(f"it holds {len(members)} members; at most {max_arrays} are expected")
        for member in members:
            name = member.removesuffix(".npy")
            if names is not None and name not in names:
                continue
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
            declared[name] = DeclaredArray(tuple(int(d) for d in shape), np.dtype(dtype))
    return declared


def _npz_declared_bytes(file: Path) -> int:
    """float64 bytes of the 'X' and 'y' an .npz declares in its .npy headers, without decompressing the data."""
    arrays = npz_declared_arrays(file, names=("X", "y"))
    return sum(math.prod(array.shape) * 8 for array in arrays.values())


def _read_npz(file: Path) -> tuple[FloatArray, FloatArray]:
    try:
        declared = _npz_declared_bytes(file)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"Data file {str(file)!r} is not a readable .npz archive: {exc}") from None
    if declared > MAX_FILE_ARRAY_BYTES:
        raise ValueError(
            f"Data file {str(file)!r} declares arrays of {declared / 2**20:.0f} MiB as float64; a data file may hold "
            f"at most {MAX_FILE_ARRAY_BYTES >> 20} MiB (checked before decompressing)."
        )
    try:
        archive = np.load(file, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"Data file {str(file)!r} is not a readable .npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"Data file {str(file)!r} is a single .npy array, not an .npz archive with 'X' and 'y'.")
    with archive:
        missing = [key for key in ("X", "y") if key not in archive.files]
        if missing:
            raise ValueError(
                f"Data file {str(file)!r} must contain arrays 'X' and 'y'; missing {missing}, "
                f"found {sorted(archive.files)}."
            )
        try:
            raw_X, raw_y = archive["X"], archive["y"]
        except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
            raise ValueError(
                f"Data file {str(file)!r}: cannot read 'X'/'y' (object arrays are refused): {exc}"
            ) from None
    try:
        X = np.asarray(raw_X, dtype=np.float64)
        y = np.asarray(raw_y, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"Data file {str(file)!r}: 'X' and 'y' must be numeric, got dtypes {raw_X.dtype} and {raw_y.dtype}."
        ) from None
    if X.ndim != 2 or X.shape[1] < 1:
        raise ValueError(f"Data file {str(file)!r}: 'X' must be 2-D (samples, features), got shape {X.shape}.")
    if y.shape != (X.shape[0],):
        raise ValueError(
            f"Data file {str(file)!r}: 'y' must have shape ({X.shape[0]},) to match 'X', got shape {y.shape}."
        )
    return X, y


def _read_csv(file: Path) -> tuple[FloatArray, FloatArray]:
    """Numeric CSV, one sample per line, label last; a first line that is not numeric is a header."""
    rows: list[list[float]] = []
    width: int | None = None
    with file.open(newline="") as handle:
        for line_number, fields in enumerate(csv.reader(handle), start=1):
            if not fields or all(not f.strip() for f in fields):
                continue
            try:
                values = [float(f) for f in fields]
            except ValueError:
                if line_number == 1:
                    continue  # header
                bad = next(f for f in fields if not _is_float(f))
                raise ValueError(f"Data file {str(file)!r}, line {line_number}: non-numeric value {bad!r}.") from None
            if width is None:
                width = len(values)
                if width < 2:
                    raise ValueError(
                        f"Data file {str(file)!r}: each line needs at least one feature and a label, "
                        f"line {line_number} has {width} column."
                    )
            elif len(values) != width:
                raise ValueError(
                    f"Data file {str(file)!r}, line {line_number}: {len(values)} columns, expected {width}."
                )
            rows.append(values)
    if not rows:
        raise ValueError(f"Data file {str(file)!r} holds no data rows.")
    table = np.asarray(rows, dtype=np.float64)
    return np.ascontiguousarray(table[:, :-1]), np.ascontiguousarray(table[:, -1])


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def signed_labels(y: FloatArray) -> bool:
    """Whether every label is -1 or +1: such labels train as 0/1 (:func:`infer_task`)."""
    return bool(set(np.unique(y).tolist()) <= {-1.0, 1.0})


def infer_task(y: FloatArray, model_kind: str | None, file: Path) -> tuple[str, FloatArray, int]:
    """Decide the model for a file's labels (see :func:`load_dataset`); return (kind, labels, classes)."""
    if signed_labels(y):
        y = (y > 0).astype(np.float64)  # ±1 labels → 0/1
    values = np.unique(y)
    integral = bool(np.all(np.floor(values) == values))
    is_class = integral and values.size > 0 and values[0] >= 0 and values[-1] < _MAX_INFERRED_CLASSES
    num_classes = max(2, int(values[-1]) + 1) if is_class else 0
    if model_kind is None:
        if not is_class:
            return "linear", y, 0
        return ("logistic" if num_classes == 2 else "softmax"), y, num_classes
    if model_kind not in MODEL_KINDS:
        raise ValueError(f"Argument 'model_kind' must be one of {list(MODEL_KINDS)} or None, not {model_kind!r}.")
    if model_kind == "linear":
        return "linear", y, 0
    if not is_class:
        raise ValueError(
            f"Data file {str(file)!r}: model_kind {model_kind!r} needs integer class labels in "
            f"[0, {_MAX_INFERRED_CLASSES}) (or -1/+1), found {values[:5].tolist()}..."
        )
    if model_kind == "logistic" and num_classes != 2:
        raise ValueError(
            f"Data file {str(file)!r}: model_kind 'logistic' needs two classes, the labels have {num_classes}."
        )
    return model_kind, y, num_classes
