"""Straggler delay models: determinism, order independence, analytic means, Markov statistics, errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from gradcode.common.sim.stragglers import (
    DELAY_MODEL_NAMES,
    DelayModel,
    FixedDelay,
    GilbertElliot,
    NoDelay,
    Pareto,
    ShiftedExponential,
    make_delay_model,
)

FACTORIES = {
    "none": lambda seed: NoDelay(seed=seed),
    "fixed": lambda seed: FixedDelay(0.5, workers=[1, 3]),
    "fixed_random": lambda seed: FixedDelay(0.5, every_iteration_random=True, num_workers=6, count=2, seed=seed),
    "shifted_exponential": lambda seed: ShiftedExponential(0.01, 10.0, 2.0, seed=seed),
    "pareto": lambda seed: Pareto(1.1, 0.001, seed=seed),
    "gilbert_elliot": lambda seed: GilbertElliot(0.2, 0.3, 2.0, 0.1, [0, 2], seed=seed),
    "gilbert_elliot_exp": lambda seed: GilbertElliot(0.2, 0.3, 2.0, 0.1, 3, exponential=True, shift=0.05, seed=seed),
}
GRID = [(w, t) for w in range(6) for t in range(0, 3000, 7)]


@pytest.mark.parametrize("label", FACTORIES)
def test_delays_are_deterministic_and_order_independent(label: str) -> None:
    forward = FACTORIES[label](7)
    values = {(w, t): forward.delay(w, t) for w, t in GRID}
    shuffled = FACTORIES[label](7)
    order = np.random.default_rng(0).permutation(len(GRID))
    for i in order:
        w, t = GRID[i]
        assert shuffled.delay(w, t) == values[(w, t)]
    assert all(forward.delay(w, t) == values[(w, t)] for w, t in GRID[:50])  # repeated calls too
    assert all(v >= 0.0 and math.isfinite(v) for v in values.values())


@pytest.mark.parametrize("label", ["fixed_random", "shifted_exponential", "pareto", "gilbert_elliot_exp"])
def test_seed_changes_the_draws(label: str) -> None:
    a, b = FACTORIES[label](1), FACTORIES[label](2)
    assert [a.delay(w, t) for w, t in GRID[:200]] != [b.delay(w, t) for w, t in GRID[:200]]


def test_time_scale_multiplies_every_delay() -> None:
    plain = ShiftedExponential(0.5, 2.0, 3.0, seed=4)
    scaled = ShiftedExponential(0.5, 2.0, 3.0, seed=4, time_scale=0.001)
    for w, t in GRID[:100]:
        assert scaled.delay(w, t) == pytest.approx(0.001 * plain.delay(w, t), rel=1e-15)
    assert scaled.mean() == pytest.approx(0.001 * plain.mean())


def _sample(model: DelayModel, workers: int = 8, iterations: int = 1000) -> np.ndarray:
    return np.array([model.delay(w, t) for w in range(workers) for t in range(iterations)])


def test_shifted_exponential_matches_eq_21() -> None:
    shift, rate, scale = 0.01, 10.0, 2.0  # GC-DC's alpha, mu_f, r
    model = ShiftedExponential(shift, rate, scale, seed=3)
    draws = _sample(model)
    assert draws.min() >= scale * shift
    assert model.mean() == pytest.approx(scale * (shift + 1 / rate))
    assert draws.mean() == pytest.approx(model.mean(), rel=0.05)
    # CDF of eq. (21) at its median: P[X <= r(alpha + ln2/mu)] = 1/2.
    median = scale * (shift + math.log(2) / rate)
    assert np.mean(draws <= median) == pytest.approx(0.5, abs=0.03)


def test_pareto_matches_eq_16() -> None:
    heavy = Pareto(1.1, 0.001, seed=5)  # Halbawi et al.'s experiment: xi = 1.1, t0 = 0.001
    draws = _sample(heavy)
    assert draws.min() >= 0.001
    assert np.median(draws) == pytest.approx(0.001 * 2 ** (1 / 1.1), rel=0.05)
    for t in (0.002, 0.01):  # F(t) = 1 - (t0/t)^xi
        assert np.mean(draws <= t) == pytest.approx(1 - (0.001 / t) ** 1.1, abs=0.03)
    assert heavy.mean() == pytest.approx(1.1 * 0.001 / 0.1)
    light = Pareto(4.0, 2.0, seed=6)
    assert _sample(light).mean() == pytest.approx(light.mean(), rel=0.05)
    assert light.mean() == pytest.approx(4.0 * 2.0 / 3.0)
    assert Pareto(1.0, 1.0).mean() == math.inf


def test_fixed_delay_same_workers_every_iteration() -> None:
    model = FixedDelay(0.25, workers=[2, 0])
    for t in range(20):
        assert [model.delay(w, t) for w in range(4)] == [0.25, 0.0, 0.25, 0.0]
    assert model.stragglers(5) == (0, 2)
    everyone = FixedDelay(0.1)
    assert everyone.delay(9, 3) == 0.1 and everyone.mean() == 0.1


@pytest.mark.parametrize("flag", ["every_iteration_random", "random_worker"])
def test_fixed_delay_random_worker_each_iteration(flag: str) -> None:
    n, iterations = 5, 2000
    model = make_delay_model("fixed", {"delay_seconds": 1.0, flag: True, "num_workers": n}, seed=9)
    counts = np.zeros(n)
    for t in range(iterations):
        delays = [model.delay(w, t) for w in range(n)]
        assert sorted(delays) == [0.0] * (n - 1) + [1.0]  # exactly one straggler, all workers agree
        counts[int(np.argmax(delays))] += 1
    assert np.all(np.abs(counts / iterations - 1 / n) < 0.03)  # chosen uniformly
    assert len({model.stragglers(t) for t in range(50)}) > 1  # and it changes between iterations
    assert model.mean() == pytest.approx(1 / n)


def test_fixed_delay_random_subset_of_candidates() -> None:
    model = FixedDelay(2.0, workers=[1, 4, 6], every_iteration_random=True, count=2, seed=1)
    for t in range(100):
        chosen = model.stragglers(t)
        assert len(chosen) == 2 and set(chosen) <= {1, 4, 6}
        assert [w for w in range(8) if model.delay(w, t) > 0] == list(chosen)


def test_gilbert_elliot_stationary_fraction_and_sojourn() -> None:
    p_fs, p_sf = 0.1, 0.3
    model = GilbertElliot(p_fs, p_sf, slow_delay=1.0, fast_delay=0.0, initial_slow_workers=list(range(0, 40, 2)))
    workers, iterations = 40, 3000
    states = np.array([[model.is_slow(w, t) for t in range(iterations)] for w in range(workers)])
    np.testing.assert_array_equal(states[:, 0], [w % 2 == 0 for w in range(workers)])  # initial states
    assert model.stationary_slow_fraction() == pytest.approx(0.25)
    assert states[:, 100:].mean() == pytest.approx(0.25, abs=0.02)
    # Empirical transition probabilities.
    prev, nxt = states[:, :-1], states[:, 1:]
    assert (prev & ~nxt).sum() / prev.sum() == pytest.approx(p_sf, abs=0.02)
    assert (~prev & nxt).sum() / (~prev).sum() == pytest.approx(p_fs, abs=0.01)
    # The delay is the state's delay.
    assert all(model.delay(w, t) == float(states[w, t]) for w in range(3) for t in range(0, 3000, 13))
    assert model.mean() == pytest.approx(0.25)


def test_gilbert_elliot_paper_setting() -> None:
    """GC-DC §VI-A: p = 0.05, alpha = 0.01, mu_s = 0.1, mu_f = 10, r = 2, 6 of 12 workers start slow."""
    model = GilbertElliot.from_rates(0.05, 0.1, 10.0, 0.01, 2, initial_slow_workers=6, seed=2)
    assert (model.slow_delay, model.fast_delay, model.shift) == pytest.approx((20.02, 0.22, 0.02))
    assert model.initial_slow_workers == (0, 1, 2, 3, 4, 5)
    assert model.stationary_slow_fraction() == 0.5
    slow = [model.delay(w, t) for w in range(12) for t in range(600) if model.is_slow(w, t)]
    fast = [model.delay(w, t) for w in range(12) for t in range(600) if not model.is_slow(w, t)]
    assert min(slow + fast) >= 0.02
    assert np.mean(slow) == pytest.approx(20.02, rel=0.1)  # r(alpha + 1/mu_s)
    assert np.mean(fast) == pytest.approx(0.22, rel=0.1)  # r(alpha + 1/mu_f)


def test_gilbert_elliot_caches_consistently_across_blocks() -> None:
    a = GilbertElliot(0.05, 0.05, 1.0, 0.0, [0], seed=3)
    late = a.is_slow(0, 5000)  # simulates five blocks at once
    b = GilbertElliot(0.05, 0.05, 1.0, 0.0, [0], seed=3)
    assert [b.is_slow(0, t) for t in range(5001)][-1] == late
    assert [a.is_slow(0, t) for t in range(5001)] == [b.is_slow(0, t) for t in range(5001)]


def test_make_delay_model_builds_each_name() -> None:
    assert DELAY_MODEL_NAMES == ("none", "fixed", "shifted_exponential", "pareto", "gilbert_elliot")
    assert isinstance(make_delay_model("none", {}, seed=0), NoDelay)
    fixed = make_delay_model("fixed", {"delay_seconds": 0.3, "workers": [1], "time_scale": 0.5}, seed=0)
    assert fixed.delay(1, 0) == pytest.approx(0.15) and fixed.delay(0, 0) == 0.0
    se = make_delay_model("shifted_exponential", {"shift": 0.01, "rate": 10, "scale": 2}, seed=4)
    assert isinstance(se, ShiftedExponential) and se.seed == 4
    pareto = make_delay_model("pareto", {"shape": 1.1, "scale": 0.001}, seed=0)
    assert isinstance(pareto, Pareto)
    ge = make_delay_model(
        "gilbert_elliot",
        {
            "p_fast_to_slow": 0.05,
            "p_slow_to_fast": 0.05,
            "slow_delay": 2.0,
            "fast_delay": 0.0,
            "initial_slow_workers": [3],
        },
        seed=1,
    )
    assert isinstance(ge, GilbertElliot) and ge.is_slow(3, 0) and not ge.is_slow(2, 0)
    assert repr(pareto) == "<Pareto(shape=1.1, scale=0.001, seed=0, time_scale=1.0)>"


def test_make_delay_model_errors() -> None:
    with pytest.raises(
        ValueError, match=re.escape(f"Unknown delay model 'lognormal'; valid names are {list(DELAY_MODEL_NAMES)}")
    ):
        make_delay_model("lognormal", {}, seed=0)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Unknown parameter(s) ['mu'] for delay model 'pareto'; "
            "valid parameters are ['shape', 'scale', 'time_scale']"
        ),
    ):
        make_delay_model("pareto", {"shape": 1.1, "scale": 1.0, "mu": 3}, seed=0)
    with pytest.raises(ValueError, match=r"Delay model 'pareto': .*missing .*'scale'.*valid parameters are"):
        make_delay_model("pareto", {"shape": 1.1}, seed=0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Pareto(0.0, 1.0), "Argument 'shape' must be a finite number > 0, not 0.0."),
        (lambda: Pareto(1.1, -1.0), "Argument 'scale' must be a finite number >= 0, not -1.0."),
        (lambda: ShiftedExponential(0.1, 0.0), "Argument 'rate' must be a finite number > 0, not 0.0."),
        (lambda: ShiftedExponential(float("nan"), 1.0), "Argument 'shift' must be a finite number >= 0, not nan."),
        (lambda: FixedDelay(-1.0), "Argument 'delay_seconds' must be a finite number >= 0, not -1.0."),
        (lambda: FixedDelay(1.0, every_iteration_random=True), "give 'workers' or 'num_workers'"),
        (
            lambda: FixedDelay(1.0, every_iteration_random=True, num_workers=3, count=4),
            "'count' must be an integer in [1, 3], not 4.",
        ),
        (lambda: FixedDelay(1.0, workers=[5], num_workers=3), "must name workers in [0, 3), not [5]"),
        (lambda: FixedDelay(1.0, workers="01"), "must be a sequence of worker ids or None"),
        (lambda: FixedDelay(1.0, every_iteration_random=True, random_worker=False, num_workers=2), "synonyms"),
        (lambda: GilbertElliot(1.5, 0.1, 1.0), "Argument 'p_fast_to_slow' must be a probability in [0, 1], not 1.5."),
        (lambda: GilbertElliot(0.1, -0.1, 1.0), "Argument 'p_slow_to_fast' must be a finite number >= 0, not -0.1."),
        (
            lambda: GilbertElliot(0.1, 0.1, 1.0, 0.5, exponential=True, shift=0.6),
            "'shift' must not exceed the mean delays",
        ),
        (
            lambda: GilbertElliot(0.1, 0.1, 1.0, 0.0, "ab"),
            "'initial_slow_workers' must be a list of worker ids or a count",
        ),
        (lambda: NoDelay(seed=-1), "Argument 'seed' must be an integer >= 0, not -1."),
        (lambda: NoDelay(time_scale=-2), "Argument 'time_scale' must be a finite number >= 0, not -2."),
    ],
)
def test_invalid_parameters(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build()  # type: ignore[operator]


def test_invalid_delay_arguments() -> None:
    with pytest.raises(ValueError, match=re.escape("Argument 'worker_id' must be an integer >= 0, not -1.")):
        NoDelay().delay(-1, 0)
    with pytest.raises(ValueError, match=re.escape("Argument 'iteration' must be an integer >= 0, not 1.5.")):
        Pareto(2.0, 1.0).delay(0, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("Argument 'worker_id' must be in [0, 3), not 3.")):
        FixedDelay(1.0, every_iteration_random=True, num_workers=3).delay(3, 0)
    with pytest.raises(ValueError, match="never moves"):
        GilbertElliot(0.0, 0.0, 1.0).stationary_slow_fraction()
