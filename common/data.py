r"""Datasets for gradcode jobs and the deterministic split of samples into data partitions.

:func:`load_dataset` returns a :class:`Dataset` (train/test arrays plus the model it suits):

* ``"digits"`` — scikit-learn's bundled 8×8 handwritten digits (1797 samples, 64 features scaled to
  $[0, 1]$, 10 classes); the default demo, a small stand-in for Halbawi et al.'s MNIST softmax run.
* ``"gaussian_mixture"`` — Tandon et al.'s artificial logistic-regression data (§5).
* ``"linear"`` — CodedReduce's artificial linear-regression data (Reisizadeh et al., §VI eq. (10)).
* ``"file"`` — a user's ``.npz`` (arrays ``X`` and ``y``) or ``.csv`` (label in the last column).

:func:`partition_indices` splits the training samples into the ``k`` partitions of a gradient code in
the proportions ``code.partition_weights``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gradcode.common.models import MODEL_KINDS
from gradcode.common.validation import check_int

__all__ = ["DATASET_NAMES", "Dataset", "load_dataset", "partition_indices"]

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
            (:mod:`gradcode.common.models`), so experiments can report $\\|\\theta - \\theta_*\\|^2 / \\|\\theta_*\\|^2$
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

    def __post_init__(self) -> None:
        if self.model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind must be one of {list(MODEL_KINDS)}, not {self.model_kind!r}.")
        for part in ("train", "test"):
            X = getattr(self, f"X_{part}")
            y = getattr(self, f"y_{part}")
            if X.dtype != np.float64 or y.dtype != np.float64:
                raise ValueError(f"X_{part} and y_{part} must be float64, got {X.dtype} and {y.dtype}.")
            if X.ndim != 2 or y.shape != (X.shape[0],):
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
        return int(self.X_train.shape[0])

    def without_samples(self) -> Dataset:
        """The same dataset with no samples: what a finished job keeps (its name, shape and classes)."""
        f = self.num_features
        return dataclasses.replace(
            self, X_train=np.empty((0, f)), y_train=np.empty(0), X_test=np.empty((0, f)), y_test=np.empty(0)
        )

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
) -> Dataset:
    """Load or generate the dataset ``name`` (one of :data:`DATASET_NAMES`) and split it.

    Arguments:
        name: ``"digits"``, ``"gaussian_mixture"``, ``"linear"`` or ``"file"``.
        path: the ``.npz``/``.csv`` file, required for ``"file"`` only.
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
    if path is not None and name != "file":
        raise ValueError(f"Argument 'path' is only used by the 'file' dataset, not by {name!r}.")
    if model_kind is not None and name != "file":
        raise ValueError(f"Argument 'model_kind' is only used by the 'file' dataset, not by {name!r}.")

    loaders: dict[str, Callable[..., Dataset]] = {
        "digits": _load_digits,
        "gaussian_mixture": _gaussian_mixture,
        "linear": _linear,
        "file": _load_file,
    }
    kwargs: dict[str, Any] = {
        "num_samples": num_samples,
        "num_features": num_features,
        "seed": int(seed),
        "test_fraction": float(test_fraction),
    }
    if name == "file":
        kwargs.update(path=path, model_kind=model_kind)
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
    total = X.shape[0]
    if num_samples is not None and num_samples > total:
        raise ValueError(f"Argument 'num_samples' must be at most {total} for dataset {name!r}, not {num_samples}.")
    keep = total if num_samples is None else num_samples
    order = np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_STREAM])).permutation(total)[:keep]
    num_test = round(test_fraction * keep)
    if keep - num_test < 1:
        raise ValueError(f"Dataset {name!r} has {keep} samples, too few to keep any for training.")
    test, train = order[:num_test], order[num_test:]
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


def _load_digits(*, num_samples: int | None, num_features: int | None, seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits  # local: scikit-learn is slow to import

    bunch = load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0  # pixel intensities are 0..16
    y = np.asarray(bunch.target, dtype=np.float64)
    if num_features is not None and num_features != X.shape[1]:
        raise ValueError(f"Dataset 'digits' has {X.shape[1]} features; 'num_features' must be None or that.")
    return _split(
        "digits",
        X,
        y,
        seed=seed,
        test_fraction=test_fraction,
        num_samples=num_samples,
        num_classes=10,
        model_kind="softmax",
    )


def _gaussian_mixture(*, num_samples: int | None, num_features: int | None, seed: int, test_fraction: float) -> Dataset:
    r"""Tandon et al. §5: $x \sim \tfrac12 N(\mu_1, I) + \tfrac12 N(\mu_2, I)$, $y \sim \mathrm{Ber}(p)$.

    The paper sets $p = 1 / (\exp(2 x^\top \beta^*) + 1)$ (i.e. $P(y = 1 \mid x) = \sigma(-2 x^\top \beta^*)$)
    with "random" $\mu_1, \mu_2, \beta^* \in \mathbb{R}^p$ but does not say from which distribution.
    Our reading: $\mu_1, \mu_2 \sim N(0, I_p)$ and $\beta^* \sim N(0, I_p / p)$, so that $2 x^\top \beta^*$
    stays of order one whatever $p$ and the labels are noisy but learnable. The paper's sizes are
    $d = 554400$, $p = 100$; the defaults here are 2000 × 20. ``true_params`` is the generating
    logistic model in :class:`~gradcode.common.models.LogisticRegression` layout: $[-2\beta^*, 0]$.
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
    return _split(
        "gaussian_mixture",
        X,
        y,
        seed=seed,
        test_fraction=test_fraction,
        num_samples=None,
        num_classes=2,
        model_kind="logistic",
        true_params=true_params,
    )


def _linear(*, num_samples: int | None, num_features: int | None, seed: int, test_fraction: float) -> Dataset:
    r"""CodedReduce §VI eq. (10): $y_j = x_j^\top \theta_* + z_j$, $x_j, \theta_* \sim N(0, I_p)$, $z_j \sim N(0, 1)$.

    The paper uses $(d, p) = (7644, 6500)$; the defaults here are 1000 × 50. ``true_params`` is
    $[\theta_*, 0]$ in :class:`~gradcode.common.models.LinearRegression` layout, for the normalized error
    rate of eq. (11).
    """
    d = 1000 if num_samples is None else num_samples
    p = 50 if num_features is None else num_features
    rng = np.random.default_rng(np.random.SeedSequence([seed, _GENERATE_STREAM, 2]))
    theta = rng.standard_normal(p)
    X = rng.standard_normal((d, p))
    y = X @ theta + rng.standard_normal(d)
    return _split(
        "linear",
        X,
        y,
        seed=seed,
        test_fraction=test_fraction,
        num_samples=None,
        num_classes=0,
        model_kind="linear",
        true_params=np.concatenate((theta, [0.0])),
    )


def _load_file(
    *,
    path: str | os.PathLike[str] | None,
    model_kind: str | None,
    num_samples: int | None,
    num_features: int | None,
    seed: int,
    test_fraction: float,
) -> Dataset:
    if path is None:
        raise ValueError("Dataset 'file' needs a 'path' to a .npz or .csv file.")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"Data file {str(file)!r} does not exist or is not a file.")
    suffix = file.suffix.lower()
    if suffix == ".npz":
        X, y = _read_npz(file)
    elif suffix == ".csv":
        X, y = _read_csv(file)
    else:
        raise ValueError(f"Data file {str(file)!r} must end in .npz or .csv, not {suffix or '(no suffix)'!r}.")
    if X.shape[0] < 2:
        raise ValueError(f"Data file {str(file)!r} has {X.shape[0]} samples; at least 2 are needed.")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError(f"Data file {str(file)!r} contains NaN or infinite values.")
    if num_features is not None and num_features != X.shape[1]:
        raise ValueError(
            f"Data file {str(file)!r} has {X.shape[1]} features; 'num_features' must be None or that, "
            f"not {num_features}."
        )
    kind, y, num_classes = _infer_task(y, model_kind, file)
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


MAX_FILE_ARRAY_BYTES = 1 << 30
"""Largest 'X' plus 'y' (as float64) a data file may declare; an .npz is checked from its array headers
before anything is decompressed, so a small compressed file cannot expand into gigabytes."""


def _npz_declared_bytes(file: Path) -> int:
    """float64 bytes of the 'X' and 'y' an .npz declares in its .npy headers, without decompressing the data."""
    total = 0
    with zipfile.ZipFile(file) as archive:
        for member in ("X.npy", "y.npy"):
            if member not in archive.namelist():
                continue
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                if version == (1, 0):
                    shape, _, _ = np.lib.format.read_array_header_1_0(stream)
                else:
                    shape, _, _ = np.lib.format.read_array_header_2_0(stream)
            total += math.prod(int(d) for d in shape) * 8
    return total


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


def _infer_task(y: FloatArray, model_kind: str | None, file: Path) -> tuple[str, FloatArray, int]:
    """Decide the model for a file's labels (see :func:`load_dataset`); return (kind, labels, classes)."""
    values = np.unique(y)
    integral = bool(np.all(np.floor(values) == values))
    if integral and values.size <= 2 and set(values.tolist()) <= {-1.0, 1.0}:
        y = (y > 0).astype(np.float64)  # ±1 labels → 0/1
        values = np.unique(y)
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
