"""Optimizers on a strongly convex quadratic with a known optimum, and the mean-gradient rule."""

from __future__ import annotations

import numpy as np
import pytest

from gradcode.master.optimizer import GradientDescent, Nesterov, make_optimizer, mean_gradient

RNG_SEED = 20240611


def quadratic(dim: int = 8, condition: float = 50.0) -> tuple[np.ndarray, np.ndarray, float]:
    """A symmetric positive definite A with eigenvalues in [1, condition], an optimum, and L = max eig."""
    rng = np.random.default_rng(RNG_SEED)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    eig = np.linspace(1.0, condition, dim)
    return (q * eig) @ q.T, rng.normal(size=dim), float(eig.max())


def run(opt_kind: str, steps: int, **kwargs: float) -> tuple[np.ndarray, np.ndarray]:
    A, optimum, L = quadratic()
    opt = make_optimizer(opt_kind, np.zeros_like(optimum), learning_rate=1.0 / L, **kwargs)
    for _ in range(steps):
        opt.step(A @ (opt.point - optimum))
    return opt.params, optimum


@pytest.mark.parametrize("kind", ["gd", "nesterov"])
def test_converges_to_the_known_optimum(kind: str) -> None:
    params, optimum = run(kind, 2000)
    np.testing.assert_allclose(params, optimum, rtol=0, atol=1e-8)


def test_nesterov_is_faster_than_gradient_descent_on_an_ill_conditioned_quadratic() -> None:
    gd, optimum = run("gd", 100)
    nag, _ = run("nesterov", 100)
    assert np.linalg.norm(nag - optimum) < 0.1 * np.linalg.norm(gd - optimum)


def test_constant_momentum_also_converges() -> None:
    params, optimum = run("nesterov", 2000, momentum=0.7)
    np.testing.assert_allclose(params, optimum, rtol=0, atol=1e-8)


def test_nesterov_steps_follow_the_formula() -> None:
    # theta_{t+1} = y_t - lr g(y_t); y_{t+1} = theta_{t+1} + t/(t+3) (theta_{t+1} - theta_t)
    opt = Nesterov(np.array([1.0, 2.0]), learning_rate=0.1)
    g0 = np.array([1.0, -1.0])
    theta1 = np.array([1.0, 2.0]) - 0.1 * g0
    np.testing.assert_array_equal(opt.step(g0), theta1)
    np.testing.assert_array_equal(opt.point, theta1)  # mu_0 = 0: the first step is plain GD
    g1 = np.array([0.5, 0.5])
    theta2 = theta1 - 0.1 * g1
    np.testing.assert_allclose(opt.step(g1), theta2)
    np.testing.assert_allclose(opt.point, theta2 + 0.25 * (theta2 - theta1))


def test_gradient_descent_point_is_its_params() -> None:
    opt = GradientDescent(np.zeros(3), learning_rate=0.5)
    opt.step(np.ones(3))
    np.testing.assert_array_equal(opt.params, -0.5 * np.ones(3))
    assert opt.point is opt.params
    assert opt.steps == 1


def test_mean_gradient_divides_by_the_sample_count_and_adds_l2_once() -> None:
    params = np.array([1.0, -2.0])
    summed = np.array([10.0, 20.0])
    np.testing.assert_allclose(mean_gradient(summed, params, num_samples=10, l2=0.5), [1.5, 1.0])
    np.testing.assert_allclose(mean_gradient(summed, params, num_samples=5, l2=0.0), [2.0, 4.0])
    with pytest.raises(ValueError, match="num_samples"):
        mean_gradient(summed, params, num_samples=0, l2=0.0)


@pytest.mark.parametrize(
    ("kind", "kwargs", "match"),
    [
        ("adam", {"learning_rate": 0.1}, r"Unknown optimizer 'adam'; valid optimizers are \['gd', 'nesterov'\]"),
        ("gd", {"learning_rate": 0.0}, "learning_rate' must be a finite number > 0"),
        ("gd", {"learning_rate": float("nan")}, "learning_rate"),
        ("gd", {"learning_rate": 0.1, "momentum": 0.9}, "takes no momentum"),
        ("nesterov", {"learning_rate": 0.1, "momentum": 1.0}, r"momentum' must be in \[0, 1\)"),
    ],
)
def test_invalid_optimizers_are_refused(kind: str, kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_optimizer(kind, np.zeros(2), **kwargs)


def test_step_refuses_wrong_shapes_and_non_finite_gradients() -> None:
    opt = GradientDescent(np.zeros(2), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"shape \(3,\); the parameters have shape \(2,\)"):
        opt.step(np.zeros(3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        opt.step(np.array([np.nan, 0.0]))
    assert opt.steps == 0
