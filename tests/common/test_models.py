"""Models: summed loss/gradient, finite-difference and closed-form gradients, stability, validation."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.training.models import (
    MIN_BLOCK_ROWS,
    MODEL_KINDS,
    NUM_STATISTICS,
    LinearPredictor,
    LinearRegression,
    LogisticRegression,
    Model,
    SoftmaxRegression,
    make_model,
    rows_per_block,
)

NUM_SAMPLES = 40
NUM_FEATURES = 5
NUM_CLASSES = 4


def _data(kind: str, seed: int = 0) -> tuple[Model, np.ndarray, np.ndarray, np.ndarray]:
    """A model, random data with labels valid for it, and random (non-zero) parameters."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((NUM_SAMPLES, NUM_FEATURES))
    if kind == "linear":
        model: Model = LinearRegression(NUM_FEATURES)
        y = rng.standard_normal(NUM_SAMPLES)
    elif kind == "logistic":
        model = LogisticRegression(NUM_FEATURES)
        y = rng.integers(0, 2, NUM_SAMPLES).astype(float)
    else:
        model = SoftmaxRegression(NUM_FEATURES, NUM_CLASSES)
        y = rng.integers(0, NUM_CLASSES, NUM_SAMPLES).astype(float)
    params = rng.standard_normal(model.num_params)
    return model, X, y, params


def _central_differences(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    step = 1e-6
    grad = np.empty_like(params)
    for i in range(params.size):
        up, down = params.copy(), params.copy()
        up[i] += step
        down[i] -= step
        grad[i] = (model.loss(up, X, y) - model.loss(down, X, y)) / (2 * step)
    return grad


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_matches_central_differences(kind: str, seed: int) -> None:
    model, X, y, params = _data(kind, seed)
    grad = model.gradient(params, X, y)
    assert grad.dtype == np.float64 and grad.shape == (model.num_params,)
    np.testing.assert_allclose(grad, _central_differences(model, params, X, y), rtol=1e-5, atol=1e-5)


def test_linear_gradient_matches_closed_form() -> None:
    model, X, y, params = _data("linear")
    augmented = np.hstack([X, np.ones((NUM_SAMPLES, 1))])  # the bias is the last parameter
    residual = augmented @ params - y
    np.testing.assert_allclose(model.gradient(params, X, y), augmented.T @ residual, rtol=1e-12)
    assert model.loss(params, X, y) == pytest.approx(0.5 * residual @ residual, rel=1e-12)
    # At the least-squares solution the gradient vanishes and R^2 is the best achievable.
    best, *_ = np.linalg.lstsq(augmented, y, rcond=None)
    assert np.linalg.norm(model.gradient(best, X, y)) < 1e-10


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_loss_and_gradient_add_up_over_a_split(kind: str) -> None:
    model, X, y, params = _data(kind)
    parts = np.array_split(np.arange(NUM_SAMPLES), [7, 8, 25])  # includes a 1-sample part
    loss = sum(model.loss(params, X[p], y[p]) for p in parts)
    grad = sum(model.gradient(params, X[p], y[p]) for p in parts)
    assert loss == pytest.approx(model.loss(params, X, y), rel=1e-12)
    np.testing.assert_allclose(grad, model.gradient(params, X, y), rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(MODEL_KINDS),
    cuts=st.lists(st.integers(0, NUM_SAMPLES), max_size=5),
    seed=st.integers(0, 1000),
)
def test_additivity_property(kind: str, cuts: list[int], seed: int) -> None:
    model, X, y, params = _data(kind, seed)
    parts = np.split(np.arange(NUM_SAMPLES), sorted(cuts))  # may contain empty parts
    grads = [model.gradient(params, X[p], y[p]) for p in parts]
    np.testing.assert_allclose(np.sum(grads, axis=0), model.gradient(params, X, y), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_empty_sample_set_gives_zero(kind: str) -> None:
    model, _, _, params = _data(kind)
    loss, grad = model.loss_and_gradient(params, np.zeros((0, NUM_FEATURES)), np.zeros(0))
    assert loss == 0.0
    np.testing.assert_array_equal(grad, np.zeros(model.num_params))


def test_loss_and_gradient_agree_with_separate_calls() -> None:
    model, X, y, params = _data("softmax")
    loss, grad = model.loss_and_gradient(params, X, y)
    assert loss == model.loss(params, X, y)
    np.testing.assert_array_equal(grad, model.gradient(params, X, y))


def test_init_params_are_zeros_and_give_the_uniform_loss() -> None:
    model, X, y, _ = _data("softmax")
    params = model.init_params()
    np.testing.assert_array_equal(params, np.zeros((NUM_FEATURES + 1) * NUM_CLASSES))
    assert model.loss(params, X, y) == pytest.approx(NUM_SAMPLES * np.log(NUM_CLASSES))
    logistic = LogisticRegression(NUM_FEATURES)
    assert logistic.loss(logistic.init_params(), X, (y > 1).astype(float)) == pytest.approx(NUM_SAMPLES * np.log(2))


def test_softmax_is_stable_for_huge_logits() -> None:
    model = SoftmaxRegression(2, 3)
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    theta = np.zeros((3, 3))
    theta[0, 0] = 1e300  # sample 0: class 0 has logit 1e300
    theta[1, 2] = 1e6  # sample 1: class 2 has logit 1e6, the label says class 1
    y = np.array([0.0, 1.0])
    loss, grad = model.loss_and_gradient(theta.ravel(), X, y)
    assert loss == pytest.approx(1e6)  # sample 0 costs 0, sample 1 costs its margin
    assert np.all(np.isfinite(grad))
    expected = np.zeros((3, 3))
    expected[1, 2], expected[1, 1] = 1.0, -1.0  # p - onehot for sample 1, times x = e_2
    expected[2, 2], expected[2, 1] = 1.0, -1.0  # bias row
    np.testing.assert_allclose(grad.reshape(3, 3), expected, atol=1e-12)
    # Shifting every logit by a constant changes nothing (the log-sum-exp subtracts the maximum).
    shifted = theta.copy()
    shifted[2] += 1e3
    assert model.loss(shifted.ravel(), X, y) == pytest.approx(loss)


def test_logistic_is_stable_for_huge_logits_and_accepts_plus_minus_one() -> None:
    model = LogisticRegression(1)
    X = np.array([[1.0], [-1.0]])
    params = np.array([1e5, 0.0])
    y01 = np.array([0.0, 0.0])  # sample 0 is badly wrong (margin 1e5), sample 1 right
    assert model.loss(params, X, y01) == pytest.approx(1e5)
    np.testing.assert_allclose(model.gradient(params, X, y01), [1.0, 1.0], atol=1e-12)
    ypm = np.array([-1.0, -1.0])
    assert model.loss(params, X, ypm) == model.loss(params, X, y01)
    np.testing.assert_array_equal(model.gradient(params, X, ypm), model.gradient(params, X, y01))
    assert model.accuracy(params, X, ypm) == 0.5


def test_predict_and_accuracy() -> None:
    X = np.array([[2.0], [-1.0], [3.0], [-4.0]])
    logistic = LogisticRegression(1)
    np.testing.assert_array_equal(logistic.predict([1.0, 0.0], X), [1, 0, 1, 0])
    assert logistic.accuracy([1.0, 0.0], X, [1, 0, 0, 0]) == 0.75
    softmax = SoftmaxRegression(1, 3)
    theta = np.array([[1.0, 0.0, -1.0], [0.0, 0.5, 0.0]])  # class 0 for x > 0.5, class 2 for x < -0.5
    np.testing.assert_array_equal(softmax.predict(theta.ravel(), X), [0, 2, 0, 2])
    assert softmax.accuracy(theta.ravel(), X, [0, 2, 1, 1]) == 0.5


def test_linear_accuracy_is_r_squared() -> None:
    model = LinearRegression(1)
    X = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = 2 * X[:, 0] + 1
    assert model.accuracy([2.0, 1.0], X, y) == 1.0
    assert model.accuracy([0.0, y.mean()], X, y) == pytest.approx(0.0)
    predictions = model.predict([1.0, 0.0], X)
    np.testing.assert_array_equal(predictions, X[:, 0])
    expected = 1 - np.sum((y - predictions) ** 2) / np.sum((y - y.mean()) ** 2)
    assert model.accuracy([1.0, 0.0], X, y) == pytest.approx(expected)
    constant = np.full(4, 3.0)
    assert model.accuracy([0.0, 3.0], X, constant) == 1.0
    assert model.accuracy([0.0, 2.0], X, constant) == 0.0


def test_training_by_gradient_descent_learns_a_separable_problem() -> None:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((200, 3))
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3 > 0).astype(float)
    model = make_model("logistic", num_features=3)
    params = model.init_params()
    for _ in range(200):
        params -= 1.0 * model.gradient(params, X, y) / len(y)
    assert model.accuracy(params, X, y) > 0.95


def test_make_model_builds_each_kind() -> None:
    linear = make_model("linear", num_features=4)
    assert isinstance(linear, LinearRegression) and linear.num_params == 5 and linear.kind == "linear"
    logistic = make_model("logistic", num_features=4)
    assert isinstance(logistic, LogisticRegression) and logistic.num_params == 5
    softmax = make_model("softmax", num_features=4, num_classes=10)
    assert isinstance(softmax, SoftmaxRegression) and softmax.num_params == 50 and softmax.num_features == 4
    assert repr(softmax) == "<SoftmaxRegression(num_features=4, num_classes=10)>"
    assert repr(linear) == "<LinearRegression(num_features=4)>"


def test_make_model_errors() -> None:
    with pytest.raises(
        ValueError, match=re.escape("Unknown model kind 'svm'; valid kinds are ['linear', 'logistic', 'softmax'")
    ):
        make_model("svm", num_features=3)
    with pytest.raises(ValueError, match="'num_classes' must be 2 for a logistic model, not 3"):
        make_model("logistic", num_features=3, num_classes=3)
    with pytest.raises(ValueError, match=re.escape("Argument 'num_classes' must be an integer >= 2, not 1.")):
        make_model("softmax", num_features=3, num_classes=1)
    with pytest.raises(ValueError, match=re.escape("Argument 'num_features' must be an integer >= 1, not 0.")):
        make_model("linear", num_features=0)
    with pytest.raises(ValueError, match=re.escape("'num_features' must be an integer >= 1, not 2.5")):
        LinearRegression(2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_invalid_shapes_raise_precise_errors(kind: str) -> None:
    model, X, y, params = _data(kind)
    n = model.num_params
    with pytest.raises(ValueError, match=re.escape(f"params must be a flat vector of shape ({n},)")):
        model.gradient(params[:-1], X, y)
    with pytest.raises(ValueError, match=re.escape(f"got shape ({n}, 1)")):
        model.loss(params[:, None], X, y)
    with pytest.raises(ValueError, match=re.escape(f"X must have shape (num_samples, {NUM_FEATURES})")):
        model.gradient(params, X[:, :-1], y)
    with pytest.raises(ValueError, match=re.escape(f"got shape ({NUM_SAMPLES * NUM_FEATURES},)")):
        model.predict(params, X.ravel())
    with pytest.raises(ValueError, match=re.escape(f"y must have shape ({NUM_SAMPLES},) to match X's")):
        model.gradient(params, X, y[:-1])
    with pytest.raises(ValueError, match="X must be numeric"):
        model.loss(params, [["a"] * NUM_FEATURES], [0.0])
    with pytest.raises(ValueError, match="accuracy needs at least one sample"):
        model.accuracy(params, np.zeros((0, NUM_FEATURES)), np.zeros(0))


def test_invalid_labels_raise() -> None:
    model, X, y, params = _data("logistic")
    bad = y.copy()
    bad[3] = 2.0
    with pytest.raises(ValueError, match=re.escape("y must hold labels 0 or 1 (or -1 for the negative class)")):
        model.gradient(params, X, bad)
    model, X, y, params = _data("softmax")
    for label in (4.0, -1.0, 1.5):
        bad = y.copy()
        bad[0] = label
        with pytest.raises(ValueError, match=re.escape(f"integer class labels in [0, {NUM_CLASSES})")):
            model.loss(params, X, bad)
    model, X, y, params = _data("linear")
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="y must hold finite values"):
        model.gradient(params, X, bad)


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_and_statistics_match_loss_gradient_and_accuracy(kind: str, seed: int) -> None:
    model, X, y, params = _data(kind, seed)
    stats = model.gradient_and_statistics(params, X, y)
    assert stats.shape == (model.num_params + NUM_STATISTICS,) and stats.dtype == np.float64
    np.testing.assert_array_equal(stats[: model.num_params], model.gradient(params, X, y))
    assert stats[-2] == model.loss(params, X, y)
    assert model.accuracy_from_score(stats[-1], y) == pytest.approx(model.accuracy(params, X, y), rel=1e-14)
    if kind != "linear":
        assert stats[-1] == np.sum(model.predict(params, X) == (y > 0 if kind == "logistic" else y))


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_statistics_of_disjoint_batches_add_up(kind: str) -> None:
    model, X, y, params = _data(kind, 4)
    whole = model.gradient_and_statistics(params, X, y)
    parts = model.gradient_and_statistics(params, X[:13], y[:13]) + model.gradient_and_statistics(
        params, X[13:], y[13:]
    )
    np.testing.assert_allclose(parts, whole, rtol=1e-12, atol=1e-12)


def test_statistics_of_an_empty_batch_are_zero() -> None:
    for kind in MODEL_KINDS:
        model, X, y, params = _data(kind)
        np.testing.assert_array_equal(model.gradient_and_statistics(params, X[:0], y[:0]), 0.0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_batch_larger_than_a_block_is_evaluated_in_blocks_that_add_up_to_one_piece(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built-ins evaluate row blocks of ``block_bytes`` and add them (one pass over X from memory):
    loss, gradient and score must equal the one-piece evaluation to rounding, for a last block of any size."""
    model, X, y, params = _data(kind, seed=5)
    assert type(model).block_bytes > 0  # every built-in opts in
    monkeypatch.setattr(type(model), "block_bytes", 0)
    whole = model.gradient_and_statistics(params, X, y)
    whole_statistics = model.statistics(params, X, y)
    for rows in (MIN_BLOCK_ROWS, 7, NUM_SAMPLES - 1):
        monkeypatch.setattr(type(model), "block_bytes", rows * NUM_FEATURES * 8)
        blocked = model.gradient_and_statistics(params, X, y)
        np.testing.assert_allclose(blocked, whole, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(model.statistics(params, X, y), whole_statistics, rtol=1e-13)
        loss, gradient = model.loss_and_gradient(params, X, y)
        np.testing.assert_allclose(gradient, whole[: model.num_params], rtol=1e-13, atol=1e-13)
        assert loss == pytest.approx(whole[model.num_params], rel=1e-13)
        if kind != "linear":  # the number of correct predictions is an exact count
            assert blocked[-1] == whole[-1]


def test_rows_too_wide_for_a_block_of_several_go_in_one_block() -> None:
    """Blocking pays only with several rows per block (the gradient is added once per block): a block of fewer
    than MIN_BLOCK_ROWS rows, or none asked, makes the batch one block."""
    assert rows_per_block(2 << 20, 16_000, 4000) == 131  # 2 MB of 16 KB rows: blocks of 131
    assert rows_per_block(2 << 20, (2 << 20) // MIN_BLOCK_ROWS, 100) == MIN_BLOCK_ROWS
    assert rows_per_block(2 << 20, (2 << 20) // MIN_BLOCK_ROWS + 8, 100) == 100  # one row fewer: one block
    assert rows_per_block(2 << 20, 8_000_000, 16) == 16  # p = 1e6: one block, not sixteen of one row
    assert rows_per_block(0, 8, 40) == 40
    assert rows_per_block(2 << 20, 8_000_000, 0) == 1  # an empty batch: one (empty) block
    assert rows_per_block(2 << 20, 8_000_000, 16, min_rows=1) == 1  # the rule before: a block per row


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_batch_of_wide_rows_is_evaluated_in_one_block_equal_to_blocks(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block budget below MIN_BLOCK_ROWS rows gives the one-block evaluation exactly (the same code path), and it
    equals a blocked one to rounding."""
    model, X, y, params = _data(kind, seed=9)
    monkeypatch.setattr(type(model), "block_bytes", 0)
    whole = model.gradient_and_statistics(params, X, y)
    monkeypatch.setattr(type(model), "block_bytes", (MIN_BLOCK_ROWS - 1) * NUM_FEATURES * 8)
    np.testing.assert_array_equal(model.gradient_and_statistics(params, X, y), whole)
    monkeypatch.setattr(type(model), "block_bytes", MIN_BLOCK_ROWS * NUM_FEATURES * 8)
    blocked = model.gradient_and_statistics(params, X, y)
    np.testing.assert_allclose(blocked, whole, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_batch_of_one_row_has_the_gradient_of_that_row(kind: str) -> None:
    """A one-row batch takes its own product (an outer product, not numpy's slow one-row matmul): its gradient is
    the finite differences' and the one-row halves of a two-row batch add up to it."""
    model, X, y, params = _data(kind, seed=4)
    one = model.loss_and_gradient(params, X[:1], y[:1])[1]
    np.testing.assert_allclose(one, _central_differences(model, params, X[:1], y[:1]), rtol=1e-6, atol=1e-6)
    two = model.loss_and_gradient(params, X[:2], y[:2])[1]
    np.testing.assert_allclose(one + model.loss_and_gradient(params, X[1:2], y[1:2])[1], two, rtol=1e-13, atol=1e-13)


class _PoissonRegression(LinearPredictor):
    """A model outside the built-ins on the LinearPredictor extension point: rate exp(z), loss sum(exp(z) - y z)."""

    kind = "poisson-test"

    def __init__(self, num_features: int) -> None:
        super().__init__(num_features, num_features + 1)

    def _block_terms(self, z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        rate = np.exp(z)
        return rate - y, float((rate - y * z).sum())

    def _score(self, z: np.ndarray, y: np.ndarray, loss: float) -> float:
        return float(np.count_nonzero(np.round(np.exp(z)) == y))

    def _predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.exp(self._outputs(params, X))
        return out


def test_a_linear_predictor_subclass_gives_only_its_block_terms_and_gets_the_streamed_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(11)
    model = _PoissonRegression(NUM_FEATURES)
    X = 0.3 * rng.standard_normal((NUM_SAMPLES, NUM_FEATURES))
    y = rng.poisson(1.5, NUM_SAMPLES).astype(float)
    params = 0.2 * rng.standard_normal(model.num_params)
    whole = model.gradient_and_statistics(params, X, y)
    np.testing.assert_allclose(
        whole[: model.num_params], _central_differences(model, params, X, y), rtol=1e-6, atol=1e-6
    )
    z = X @ params[:-1] + params[-1]
    assert whole[-2] == pytest.approx(float((np.exp(z) - y * z).sum()), rel=1e-13)
    assert whole[-1] == np.count_nonzero(np.round(np.exp(z)) == y)
    monkeypatch.setattr(_PoissonRegression, "block_bytes", 6 * NUM_FEATURES * 8)  # blocks of 6 rows, the last of 4
    np.testing.assert_allclose(model.gradient_and_statistics(params, X, y), whole, rtol=1e-13, atol=1e-13)
