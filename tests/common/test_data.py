"""Datasets (digits, Tandon's Gaussian mixture, CodedReduce's linear model, files) and partitioning."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.training.data import DATASET_NAMES, Dataset, load_dataset, partition_indices
from gradcode.common.training.models import make_model


def _same(a: Dataset, b: Dataset) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("X_train", "y_train", "X_test", "y_test"))


# ---- digits --------------------------------------------------------------------------------------------
def test_digits_is_scaled_split_and_deterministic() -> None:
    data = load_dataset("digits", seed=3)
    assert (data.name, data.num_classes, data.model_kind, data.num_features) == ("digits", 10, "softmax", 64)
    assert data.X_train.shape[0] + data.X_test.shape[0] == 1797
    assert data.X_test.shape[0] == round(0.2 * 1797)
    for X in (data.X_train, data.X_test):
        assert X.dtype == np.float64 and X.min() == 0.0 and X.max() == 1.0
    labels = np.concatenate([data.y_train, data.y_test])
    assert set(np.unique(labels).tolist()) == set(map(float, range(10)))
    assert data.true_params is None
    assert _same(data, load_dataset("digits", seed=3))
    assert not _same(data, load_dataset("digits", seed=4))
    with pytest.raises(ValueError, match="read-only"):
        data.X_train[0, 0] = 1.0


def test_digits_subsample_and_errors() -> None:
    small = load_dataset("digits", num_samples=100, test_fraction=0.25)
    assert small.X_train.shape == (75, 64) and small.X_test.shape == (25, 64)
    with pytest.raises(ValueError, match=re.escape("'num_samples' must be at most 1797 for dataset 'digits'")):
        load_dataset("digits", num_samples=5000)
    with pytest.raises(ValueError, match="has 64 features"):
        load_dataset("digits", num_features=10)


# ---- synthetic sets --------------------------------------------------------------------------------------
def test_gaussian_mixture_follows_tandon_model() -> None:
    data = load_dataset("gaussian_mixture", num_samples=4000, num_features=8, seed=1, test_fraction=0.5)
    assert (data.model_kind, data.num_classes, data.num_features) == ("logistic", 2, 8)
    assert data.X_train.shape == (2000, 8) and data.X_test.shape == (2000, 8)
    y = np.concatenate([data.y_train, data.y_test])
    X = np.concatenate([data.X_train, data.X_test])
    assert set(np.unique(y).tolist()) == {0.0, 1.0}
    # An even mixture of N(mu1, I) and N(mu2, I) has covariance I + (mu1 - mu2)(mu1 - mu2)^T / 4:
    # all eigenvalues 1 except one, which is larger.
    eigenvalues = np.linalg.eigvalsh(np.cov(X.T))
    assert np.all(np.abs(eigenvalues[:-1] - 1.0) < 0.15) and eigenvalues[-1] > 1.5
    assert data.true_params is not None and data.true_params.shape == (9,) and data.true_params[-1] == 0.0
    # Labels are Bernoulli with P(y=1|x) = 1/(exp(2 x^T beta*) + 1) = sigmoid(x^T true_w): check calibration.
    prob = 1 / (1 + np.exp(-(X @ data.true_params[:-1])))
    for low, high in ((0.0, 0.3), (0.3, 0.7), (0.7, 1.0)):
        sel = (prob >= low) & (prob < high)
        assert abs(y[sel].mean() - prob[sel].mean()) < 0.05
    model = make_model("logistic", num_features=8)
    assert model.accuracy(data.true_params, X, y) > 0.6
    assert _same(data, load_dataset("gaussian_mixture", num_samples=4000, num_features=8, seed=1, test_fraction=0.5))


def test_gaussian_mixture_defaults_are_small() -> None:
    data = load_dataset("gaussian_mixture")
    assert data.X_train.shape == (1600, 20) and data.X_test.shape == (400, 20)


def test_linear_follows_coded_reduce_model() -> None:
    data = load_dataset("linear", num_samples=3000, num_features=10, seed=2, test_fraction=0.0)
    assert (data.model_kind, data.num_classes) == ("linear", 0)
    assert data.X_train.shape == (3000, 10) and data.X_test.shape == (0, 10)
    assert data.true_params is not None
    theta = data.true_params[:-1]
    noise = data.y_train - data.X_train @ theta
    assert abs(noise.mean()) < 0.1 and abs(noise.std() - 1.0) < 0.05  # z_j standard Gaussian
    assert abs(data.X_train.std() - 1.0) < 0.05  # x_j ~ N(0, I)
    default = load_dataset("linear")
    assert default.X_train.shape == (800, 50)


# ---- files ------------------------------------------------------------------------------------------------
def test_npz_file_classification(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 3))
    y = rng.integers(0, 3, 50)
    file = tmp_path / "mine.npz"
    np.savez(file, X=X, y=y)
    data = load_dataset("file", path=file, seed=0, test_fraction=0.2)
    assert (data.name, data.model_kind, data.num_classes) == ("mine.npz", "softmax", 3)
    assert data.X_train.shape == (40, 3) and data.X_test.shape == (10, 3)
    # Every original row is present once, with its label.
    rows = {(*r.tolist(), float(t)) for r, t in zip(X, y, strict=True)}
    got = {
        (*r.tolist(), float(t))
        for r, t in zip(np.vstack([data.X_train, data.X_test]), np.r_[data.y_train, data.y_test], strict=True)
    }
    assert got == rows
    assert load_dataset("file", path=file, model_kind="linear").model_kind == "linear"


def test_csv_with_header_and_plus_minus_one_labels(tmp_path: Path) -> None:
    file = tmp_path / "d.csv"
    file.write_text("a,b,label\n1,2,-1\n3,4,1\n5,6,1\n\n7,8,-1\n")
    data = load_dataset("file", path=str(file), test_fraction=0.0)
    assert (data.model_kind, data.num_classes) == ("logistic", 2)
    order = np.argsort(data.X_train[:, 0])
    np.testing.assert_array_equal(data.X_train[order], [[1, 2], [3, 4], [5, 6], [7, 8]])
    np.testing.assert_array_equal(data.y_train[order], [0, 1, 1, 0])


def test_csv_without_header_regression(tmp_path: Path) -> None:
    file = tmp_path / "r.CSV"
    file.write_text("0.5,1.25\n1.5,2.5\n2.5,3.75\n")
    data = load_dataset("file", path=file, test_fraction=0.0)
    assert (data.model_kind, data.num_classes) == ("linear", 0)
    np.testing.assert_array_equal(np.sort(data.y_train), [1.25, 2.5, 3.75])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("x,y\n1,2\n3,oops\n", "line 3: non-numeric value 'oops'"),
        ("1,2,3\n4,5\n", "line 2: 2 columns, expected 3"),
        ("1\n2\n", "needs at least one feature and a label"),
        ("x,y\n", "holds no data rows"),
        ("1,2\n", "has 1 samples; at least 2 are needed"),
        ("1,2\nnan,3\n", "contains NaN or infinite values"),
    ],
)
def test_bad_csv_files(tmp_path: Path, content: str, message: str) -> None:
    file = tmp_path / "bad.csv"
    file.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_dataset("file", path=file)


def test_bad_npz_and_path_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.npz"
    with pytest.raises(ValueError, match=re.escape(f"Data file {str(missing)!r} does not exist")):
        load_dataset("file", path=missing)
    with pytest.raises(ValueError, match="needs a 'path'"):
        load_dataset("file")
    txt = tmp_path / "data.txt"
    txt.write_text("1,2\n")
    with pytest.raises(ValueError, match=re.escape("must end in .npz, .csv, .npy or .parquet, not '.txt'")):
        load_dataset("file", path=txt)
    no_y = tmp_path / "no_y.npz"
    np.savez(no_y, X=np.zeros((4, 2)))
    with pytest.raises(ValueError, match=re.escape("must contain arrays 'X' and 'y'; missing ['y'], found ['X']")):
        load_dataset("file", path=no_y)
    bad_y = tmp_path / "bad_y.npz"
    np.savez(bad_y, X=np.zeros((4, 2)), y=np.zeros(3))
    with pytest.raises(ValueError, match=re.escape("'y' must have shape (4,) to match 'X', got shape (3,)")):
        load_dataset("file", path=bad_y)
    flat_x = tmp_path / "flat.npz"
    np.savez(flat_x, X=np.zeros(4), y=np.zeros(4))
    with pytest.raises(ValueError, match=re.escape("'X' must be 2-D (samples, features), got shape (4,)")):
        load_dataset("file", path=flat_x)
    text_x = tmp_path / "text.npz"
    np.savez(text_x, X=np.array([["a", "b"], ["c", "d"]]), y=np.zeros(2))
    with pytest.raises(ValueError, match="'X' and 'y' must be numeric"):
        load_dataset("file", path=text_x)
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a readable \.npz archive"):
        load_dataset("file", path=corrupt)
    reg = tmp_path / "reg.npz"
    np.savez(reg, X=np.zeros((4, 2)), y=np.array([0.5, 1.5, 2.0, 3.0]))
    with pytest.raises(ValueError, match="model_kind 'softmax' needs integer class labels"):
        load_dataset("file", path=reg, model_kind="softmax")
    with pytest.raises(ValueError, match=re.escape("has 2 features; 'num_features' must be None or that, not 3")):
        load_dataset("file", path=reg, num_features=3)


def test_load_dataset_argument_errors() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("Unknown dataset 'mnist'; valid names are ['digits', 'gaussian_mixture', 'linear', 'file']"),
    ):
        load_dataset("mnist")
    assert DATASET_NAMES == ("digits", "gaussian_mixture", "linear", "file")
    with pytest.raises(ValueError, match=re.escape("'test_fraction' must be a number in [0, 1), not 1.0")):
        load_dataset("linear", test_fraction=1.0)
    with pytest.raises(ValueError, match=re.escape("'seed' must be an integer >= 0, not -1")):
        load_dataset("linear", seed=-1)
    with pytest.raises(ValueError, match=re.escape("'num_samples' must be an integer >= 2, not 1")):
        load_dataset("linear", num_samples=1)
    with pytest.raises(ValueError, match="'path' is only used by the 'file' dataset"):
        load_dataset("linear", path="x.csv")


# ---- partitions -------------------------------------------------------------------------------------------
def test_partition_is_deterministic_disjoint_cover() -> None:
    parts = partition_indices(103, [1.0] * 7, seed=11)
    assert [len(p) for p in parts] == [15, 15, 15, 15, 15, 14, 14]  # 103/7 = 14.71: five largest remainders
    joined = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(joined), np.arange(103))
    again = partition_indices(103, [1.0] * 7, seed=11)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_indices(103, [1.0] * 7, seed=12)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


def test_partition_proportions_largest_remainder() -> None:
    assert [len(p) for p in partition_indices(10, [0.5, 0.3, 0.2], seed=0)] == [5, 3, 2]
    assert [len(p) for p in partition_indices(10, [1, 1, 1], seed=0)] == [4, 3, 3]  # tie → lower index
    assert [len(p) for p in partition_indices(7, [3, 0, 1], seed=0)] == [5, 0, 2]  # 5.25, 0, 1.75
    assert [len(p) for p in partition_indices(100, [1, 2, 3, 4], seed=0)] == [10, 20, 30, 40]
    # Rounding would leave the tiny partition empty; it still gets one sample.
    assert [len(p) for p in partition_indices(5, [1000, 1], seed=0)] == [4, 1]


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(0, 500),
    weights=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=12),
    seed=st.integers(0, 2**32),
)
def test_partition_property(num_samples: int, weights: list[float], seed: int) -> None:
    w = np.array(weights)
    positive = int((w > 0).sum())
    if positive == 0 or num_samples < positive:
        with pytest.raises(ValueError):
            partition_indices(num_samples, weights, seed=seed)
        return
    parts = partition_indices(num_samples, weights, seed=seed)
    sizes = np.array([len(p) for p in parts])
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(num_samples))
    assert np.all(sizes[w == 0] == 0) and np.all(sizes[w > 0] >= 1)
    quotas = num_samples * w / w.sum()
    if np.all(quotas[w > 0] >= 1):  # no minimum-one adjustment: pure largest remainder
        assert np.all(np.abs(sizes - quotas) < 1 + 1e-9)


def test_partition_errors() -> None:
    with pytest.raises(ValueError, match=re.escape("Cannot split 2 samples into 3 partitions with positive weight")):
        partition_indices(2, [1, 1, 0, 1], seed=0)
    with pytest.raises(ValueError, match="finite, non-negative and not all zero"):
        partition_indices(10, [1, -1], seed=0)
    with pytest.raises(ValueError, match="finite, non-negative and not all zero"):
        partition_indices(10, [0, 0], seed=0)
    with pytest.raises(ValueError, match="finite, non-negative and not all zero"):
        partition_indices(10, [1, float("nan")], seed=0)
    with pytest.raises(ValueError, match="non-empty 1-D sequence"):
        partition_indices(10, [], seed=0)
    with pytest.raises(ValueError, match=re.escape("'num_samples' must be an integer >= 0, not -1")):
        partition_indices(-1, [1], seed=0)
    with pytest.raises(ValueError, match=re.escape("'seed' must be an integer >= 0, not -3")):
        partition_indices(5, [1], seed=-3)


def test_a_dataset_without_samples_keeps_its_shape_and_nothing_the_size_of_its_data_or_model() -> None:
    """What a finished job keeps: name, shape, classes and kind; not the samples, nor a synthetic set's generating
    parameters (at p = 10^6 a finished job held 8 MB of them, unused)."""
    data = load_dataset("linear", num_samples=200, num_features=30, seed=1, test_fraction=0.25)
    kept = data.without_samples()
    assert (kept.name, kept.num_features, kept.num_classes, kept.model_kind) == (
        data.name, 30, data.num_classes, data.model_kind,
    )  # fmt: skip
    assert kept.X_train.shape == (0, 30) and kept.X_test.shape == (0, 30) and kept.y_train.size == kept.y_test.size == 0
    assert data.true_params is not None and kept.true_params is None
