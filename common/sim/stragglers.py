r"""Straggler emulation: extra seconds a worker sleeps in an iteration (experiments only; off by default).

A :class:`DelayModel` answers ``delay(worker_id, iteration)``. The answer is a pure function of
``(seed, worker_id, iteration)`` and the model's parameters: each value is drawn from its own numpy
generator seeded by ``SeedSequence([seed, stream, worker_id, iteration])``, so the same call returns
the same value whatever order calls come in and whichever process makes them (every worker can own
a copy). The Markov model simulates its chain from iteration 0 with per-block seeded draws and caches
it. ``time_scale`` multiplies every delay, to shrink the papers' time units to a test's budget.

Models (parameters named as in the papers):

* :class:`NoDelay` — the default.
* :class:`FixedDelay` — Tandon et al. §5: a fixed extra delay for chosen workers, or for ``count``
  workers drawn uniformly at random each iteration ("we artificially add delays to s random workers
  in each iteration").
* :class:`ShiftedExponential` — Buyukates et al. (GC-DC) eq. (21):
  $P[X \le t] = 1 - e^{-\mu (t / r - \alpha)}$ for $t \ge r\alpha$.
* :class:`Pareto` — Halbawi et al. eq. (16): $P[T \le t] = 1 - (t_0 / t)^{\xi}$ for $t \ge t_0$.
* :class:`GilbertElliot` — GC-DC §VI-A: every worker is a two-state (fast/slow) Markov chain.

:func:`make_delay_model` builds one from a name and a parameter mapping (configuration, CLI).
"""

from __future__ import annotations

import inspect
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from gradcode.common.validation import check_int, check_number

__all__ = [
    "DELAY_MODEL_NAMES",
    "DelayModel",
    "FixedDelay",
    "GilbertElliot",
    "NoDelay",
    "Pareto",
    "ShiftedExponential",
    "make_delay_model",
]

# Stream tags keep the draws of different purposes independent. Every SeedSequence key has the same
# length (4 words) so that no two keys can collide through zero padding.
_STREAM_DELAY = 1
_STREAM_CHOICE = 2
_STREAM_MARKOV = 3
_MARKOV_BLOCK = 1024


def _check_probability(name: str, value: object) -> float:
    v = check_number(name, value)
    if v > 1.0:
        raise ValueError(f"Argument {name!r} must be a probability in [0, 1], not {value!r}.")
    return v


class DelayModel(ABC):
    """Extra seconds worker ``worker_id`` waits before answering in ``iteration``; seeded, reproducible."""

    name: ClassVar[str]

    def __init__(self, *, seed: int = 0, time_scale: float = 1.0) -> None:
        self.seed = check_int("seed", seed, 0)
        self.time_scale = check_number("time_scale", time_scale)

    def delay(self, worker_id: int, iteration: int) -> float:
        """Extra seconds for ``worker_id`` in ``iteration`` (both >= 0), already multiplied by ``time_scale``."""
        w = check_int("worker_id", worker_id, 0)
        t = check_int("iteration", iteration, 0)
        return self.time_scale * self._delay(w, t)

    def parts(self, worker_id: int, iteration: int) -> tuple[float, float]:
        """(the part of :meth:`delay` that passes before the worker begins computing and says so, the whole delay):
        all of it for an emulated law, which the worker sleeps first; a model of slow hosts keeps its part inside
        the computation (the master's held-backup rules tell a worker not begun from one computing slowly)."""
        whole = self.delay(worker_id, iteration)
        return whole, whole

    def _rng(self, stream: int, a: int, b: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.seed, stream, a, b]))

    @abstractmethod
    def _delay(self, worker_id: int, iteration: int) -> float:
        """The unscaled delay, for validated arguments."""

    def mean(self) -> float:
        """Expected delay of one worker in one iteration (scaled); ``inf`` when it does not exist."""
        return self.time_scale * self._mean()

    @abstractmethod
    def _mean(self) -> float: ...

    def _params(self) -> dict[str, object]:
        return {}

    def __repr__(self) -> str:
        params = {**self._params(), "seed": self.seed, "time_scale": self.time_scale}
        return f"<{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in params.items())})>"


class NoDelay(DelayModel):
    """No emulated straggling: every delay is 0."""

    name = "none"

    def _delay(self, worker_id: int, iteration: int) -> float:
        return 0.0

    def _mean(self) -> float:
        return 0.0


class FixedDelay(DelayModel):
    """A fixed extra delay for some workers (Tandon et al. §5, Figures 4 and 5).

    Two modes:

    * fixed workers (default): every worker in ``workers`` (all workers when ``None``) is delayed by
      ``delay_seconds`` in every iteration — Figure 5's "the straggling worker was fixed to be the
      same machine across iterations";
    * ``every_iteration_random=True`` (alias ``random_worker=True``): in each iteration ``count``
      workers, drawn uniformly without replacement from ``workers`` (or from ``range(num_workers)``),
      are delayed — Figure 4's "we artificially add delays to s random workers in each iteration".
      The draw depends on ``(seed, iteration)`` only, so every worker agrees on who straggles.

    ``count`` (default 1) belongs to the random mode; fixed mode refuses it rather than ignore it, since
    there the delayed workers are ``workers`` (a count without a draw would not say which ones).
    """

    name = "fixed"

    def __init__(
        self,
        delay_seconds: float,
        workers: Sequence[int] | None = None,
        every_iteration_random: bool = False,
        *,
        random_worker: bool | None = None,
        num_workers: int | None = None,
        count: int | None = None,
        seed: int = 0,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__(seed=seed, time_scale=time_scale)
        self.delay_seconds = check_number("delay_seconds", delay_seconds)
        if random_worker is not None and bool(random_worker) != bool(every_iteration_random):
            if every_iteration_random:
                raise ValueError(
                    "Arguments 'random_worker' and 'every_iteration_random' are synonyms; "
                    f"they disagree ({random_worker!r} vs {every_iteration_random!r})."
                )
            every_iteration_random = bool(random_worker)
        self.every_iteration_random = bool(every_iteration_random)
        self.num_workers = None if num_workers is None else check_int("num_workers", num_workers, 0)
        if self.num_workers == 0:
            raise ValueError("Argument 'num_workers' must be a positive integer, not 0.")
        if workers is None:
            self.workers: tuple[int, ...] | None = None
        else:
            if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
                raise ValueError(f"Argument 'workers' must be a sequence of worker ids or None, not {workers!r}.")
            self.workers = tuple(sorted({check_int("workers[i]", w, 0) for w in workers}))
            if self.num_workers is not None and any(w >= self.num_workers for w in self.workers):
                raise ValueError(
                    f"Argument 'workers' must name workers in [0, {self.num_workers}), not {list(self.workers)}."
                )
        self._workers_set = frozenset(self.workers or ())
        if count is not None and not self.every_iteration_random:
            raise ValueError(
                f"Argument 'count' ({count!r}) applies only with every_iteration_random=true (alias random_worker): "
                "in fixed mode the delayed workers are 'workers' (all when omitted). Give random_worker=true and "
                "num_workers to delay 'count' random workers in each iteration, or drop 'count'."
            )
        self.count = 1 if count is None else check_int("count", count, 0)
        self._last_choice: tuple[int, tuple[int, ...]] | None = None
        if self.every_iteration_random:
            if self.workers is None and self.num_workers is None:
                raise ValueError("A randomly chosen straggler needs the candidates: give 'workers' or 'num_workers'.")
            pool = len(self.workers) if self.workers is not None else self.num_workers
            assert pool is not None
            if not 1 <= self.count <= pool:
                raise ValueError(f"Argument 'count' must be an integer in [1, {pool}], not {count!r}.")

    def stragglers(self, iteration: int) -> tuple[int, ...]:
        """The workers delayed in ``iteration`` (all of ``workers`` in fixed mode; ``()`` means all)."""
        t = check_int("iteration", iteration, 0)
        if not self.every_iteration_random:
            return self.workers if self.workers is not None else ()
        cached = self._last_choice
        if cached is not None and cached[0] == t:
            return cached[1]
        candidates = self.workers if self.workers is not None else tuple(range(self.num_workers or 0))
        picks = self._rng(_STREAM_CHOICE, 0, t).choice(len(candidates), size=self.count, replace=False)
        chosen = tuple(sorted(candidates[int(i)] for i in picks))
        self._last_choice = (t, chosen)  # every worker asks about the same iteration in turn
        return chosen

    def _delay(self, worker_id: int, iteration: int) -> float:
        if self.num_workers is not None and worker_id >= self.num_workers:
            raise ValueError(f"Argument 'worker_id' must be in [0, {self.num_workers}), not {worker_id}.")
        if self.every_iteration_random:
            return self.delay_seconds if worker_id in self.stragglers(iteration) else 0.0
        if self.workers is None or worker_id in self._workers_set:
            return self.delay_seconds
        return 0.0

    def _mean(self) -> float:
        """Mean over workers of one iteration's delay (needs ``num_workers`` unless all are delayed)."""
        if self.workers is None and not self.every_iteration_random:
            return self.delay_seconds
        if self.num_workers is None:
            raise ValueError("The mean delay per worker needs 'num_workers'.")
        delayed = self.count if self.every_iteration_random else len(self.workers or ())
        return self.delay_seconds * delayed / self.num_workers

    def _params(self) -> dict[str, object]:
        return {
            "delay_seconds": self.delay_seconds,
            "workers": None if self.workers is None else list(self.workers),
            "every_iteration_random": self.every_iteration_random,
            "num_workers": self.num_workers,
            **({"count": self.count} if self.every_iteration_random else {}),
        }


class ShiftedExponential(DelayModel):
    r"""GC-DC eq. (21): $P[X \le t] = 1 - e^{-\mu(t/r - \alpha)}$ for $t \ge r\alpha$.

    That is $X = r(\alpha + E)$ with $E \sim \mathrm{Exp}(\mu)$: ``shift`` is $\alpha$ (the minimum
    time per partial gradient), ``rate`` is $\mu$ and ``scale`` is $r$ (the number of partial gradients
    the worker computes). Mean $r(\alpha + 1/\mu)$. GC-DC §VI uses $\alpha = 0.01$, $\mu \in \{0.1, 10\}$,
    $r \in \{2, 3\}$.
    """

    name = "shifted_exponential"

    def __init__(
        self, shift: float, rate: float, scale: float = 1.0, *, seed: int = 0, time_scale: float = 1.0
    ) -> None:
        super().__init__(seed=seed, time_scale=time_scale)
        self.shift = check_number("shift", shift)
        self.rate = check_number("rate", rate, strict=True)
        self.scale = check_number("scale", scale)

    def _delay(self, worker_id: int, iteration: int) -> float:
        exponential = self._rng(_STREAM_DELAY, worker_id, iteration).exponential(1.0 / self.rate)
        return self.scale * (self.shift + float(exponential))

    def _mean(self) -> float:
        return self.scale * (self.shift + 1.0 / self.rate)

    def _params(self) -> dict[str, object]:
        return {"shift": self.shift, "rate": self.rate, "scale": self.scale}


class Pareto(DelayModel):
    r"""Halbawi et al. eq. (16): $F(t) = 1 - (t_0 / t)^{\xi}$ for $t \ge t_0$ (heavy-tailed delay).

    ``shape`` is $\xi$ and ``scale`` is $t_0$, "the fundamental delay of the machine". Sampled by
    inversion, $t_0 U^{-1/\xi}$ with $U$ uniform on $(0, 1]$, capped at :attr:`MAX_DRAW_SECONDS` (which
    :meth:`mean` ignores). Mean $\xi t_0 / (\xi - 1)$ for $\xi > 1$ (infinite otherwise), median
    $t_0 2^{1/\xi}$. The paper's experiment uses $\xi = 1.1$, $t_0 = 0.001$.
    """

    name = "pareto"

    def __init__(self, shape: float, scale: float, *, seed: int = 0, time_scale: float = 1.0) -> None:
        super().__init__(seed=seed, time_scale=time_scale)
        self.shape = check_number("shape", shape, strict=True)
        self.scale = check_number("scale", scale)

    MAX_DRAW_SECONDS: ClassVar[float] = 3600.0
    """Cap on one unscaled draw: a tiny ``shape`` makes ``U^(-1/shape)`` overflow a float."""

    def _delay(self, worker_id: int, iteration: int) -> float:
        uniform = 1.0 - float(self._rng(_STREAM_DELAY, worker_id, iteration).random())  # in (0, 1]
        if self.scale == 0.0:
            return 0.0
        # Compare in log space, so the cap applies before math.pow could overflow.
        if math.log(self.scale) - math.log(uniform) / self.shape >= math.log(self.MAX_DRAW_SECONDS):
            return self.MAX_DRAW_SECONDS
        return self.scale * math.pow(uniform, -1.0 / self.shape)

    def _mean(self) -> float:
        return self.shape * self.scale / (self.shape - 1.0) if self.shape > 1.0 else math.inf

    def _params(self) -> dict[str, object]:
        return {"shape": self.shape, "scale": self.scale}


class GilbertElliot(DelayModel):
    r"""GC-DC §VI-A: each worker is an independent two-state Markov chain, fast or slow.

    The state changes only at the start of an iteration (from iteration 1 on): fast → slow with
    probability ``p_fast_to_slow``, slow → fast with ``p_slow_to_fast`` (the paper's symmetric case is
    both equal to $p = 0.05$). Workers in ``initial_slow_workers`` (a list of ids, or an int $c$
    meaning workers $0..c-1$) start slow, the rest fast. The stationary fraction of slow states is
    $p_{fs} / (p_{fs} + p_{sf})$.

    In a state the delay is ``slow_delay`` or ``fast_delay`` seconds. With ``exponential=True`` it is
    instead eq. (21)'s shifted exponential with that *mean*: ``shift`` plus an exponential of mean
    ``state_delay - shift``. The paper's setting $r = 2$, $\alpha = 0.01$, $\mu_s = 0.1$, $\mu_f = 10$
    is ``shift = rα = 0.02``, ``slow_delay = r(α + 1/μ_s) = 20.02``, ``fast_delay = r(α + 1/μ_f) = 0.22``
    (see :meth:`from_rates`).
    """

    name = "gilbert_elliot"

    def __init__(
        self,
        p_fast_to_slow: float,
        p_slow_to_fast: float,
        slow_delay: float,
        fast_delay: float = 0.0,
        initial_slow_workers: Sequence[int] | int = (),
        *,
        exponential: bool = False,
        shift: float = 0.0,
        seed: int = 0,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__(seed=seed, time_scale=time_scale)
        self.p_fast_to_slow = _check_probability("p_fast_to_slow", p_fast_to_slow)
        self.p_slow_to_fast = _check_probability("p_slow_to_fast", p_slow_to_fast)
        self.slow_delay = check_number("slow_delay", slow_delay)
        self.fast_delay = check_number("fast_delay", fast_delay)
        self.exponential = bool(exponential)
        self.shift = check_number("shift", shift)
        if self.exponential and self.shift > min(self.slow_delay, self.fast_delay):
            raise ValueError(
                f"Argument 'shift' must not exceed the mean delays (fast {self.fast_delay:g}, slow "
                f"{self.slow_delay:g}) with exponential=True, not {shift!r}."
            )
        if isinstance(initial_slow_workers, (int, np.integer)) and not isinstance(initial_slow_workers, bool):
            self.initial_slow_workers = tuple(range(check_int("initial_slow_workers", initial_slow_workers, 0)))
        elif isinstance(initial_slow_workers, Sequence) and not isinstance(initial_slow_workers, (str, bytes)):
            self.initial_slow_workers = tuple(
                sorted({check_int("initial_slow_workers[i]", w, 0) for w in initial_slow_workers})
            )
        else:
            raise ValueError(
                "Argument 'initial_slow_workers' must be a list of worker ids or a count, "
                f"not {initial_slow_workers!r}."
            )
        self._initial_slow = frozenset(self.initial_slow_workers)
        self._chains: dict[int, list[bool]] = {}
        self._lock = threading.Lock()  # a worker may ask from several threads; the cache must stay a chain

    @classmethod
    def from_rates(
        cls,
        p: float,
        mu_slow: float,
        mu_fast: float,
        alpha: float,
        r: float,
        initial_slow_workers: Sequence[int] | int = (),
        *,
        seed: int = 0,
        time_scale: float = 1.0,
    ) -> GilbertElliot:
        r"""The paper's parametrisation: switching probability $p$, rates $\mu_s, \mu_f$, shift $\alpha$, load $r$."""
        mu_slow = check_number("mu_slow", mu_slow, strict=True)
        mu_fast = check_number("mu_fast", mu_fast, strict=True)
        alpha = check_number("alpha", alpha)
        r = check_number("r", r)
        return cls(
            p,
            p,
            r * (alpha + 1.0 / mu_slow),
            r * (alpha + 1.0 / mu_fast),
            initial_slow_workers,
            exponential=True,
            shift=r * alpha,
            seed=seed,
            time_scale=time_scale,
        )

    def is_slow(self, worker_id: int, iteration: int) -> bool:
        """Whether ``worker_id`` is in the slow state in ``iteration``."""
        w = check_int("worker_id", worker_id, 0)
        t = check_int("iteration", iteration, 0)
        with self._lock:
            chain = self._chains.setdefault(w, [w in self._initial_slow])
            while len(chain) <= t:
                self._extend(w, chain)
            return chain[t]

    def _extend(self, worker_id: int, chain: list[bool]) -> None:
        """Append one block of states; block ``b`` uses transitions seeded by ``(seed, worker, b)``."""
        start = len(chain)  # transitions into iterations start .. start + BLOCK - 1
        block = (start - 1) // _MARKOV_BLOCK
        offset = (start - 1) % _MARKOV_BLOCK
        uniforms = self._rng(_STREAM_MARKOV, worker_id, block).random(_MARKOV_BLOCK)[offset:].tolist()
        state = chain[-1]
        for u in uniforms:
            state = (u >= self.p_slow_to_fast) if state else (u < self.p_fast_to_slow)
            chain.append(state)

    def stationary_slow_fraction(self) -> float:
        """Long-run fraction of iterations a worker spends slow: $p_{fs} / (p_{fs} + p_{sf})$."""
        total = self.p_fast_to_slow + self.p_slow_to_fast
        if total == 0.0:
            raise ValueError("With both transition probabilities 0 the chain never moves; no stationary fraction.")
        return self.p_fast_to_slow / total

    def _delay(self, worker_id: int, iteration: int) -> float:
        mean = self.slow_delay if self.is_slow(worker_id, iteration) else self.fast_delay
        if not self.exponential or mean == self.shift:
            return mean
        extra = self._rng(_STREAM_DELAY, worker_id, iteration).exponential(mean - self.shift)
        return self.shift + float(extra)

    def _mean(self) -> float:
        """Stationary mean delay per iteration."""
        slow = self.stationary_slow_fraction()
        return slow * self.slow_delay + (1.0 - slow) * self.fast_delay

    def _params(self) -> dict[str, object]:
        return {
            "p_fast_to_slow": self.p_fast_to_slow,
            "p_slow_to_fast": self.p_slow_to_fast,
            "slow_delay": self.slow_delay,
            "fast_delay": self.fast_delay,
            "initial_slow_workers": list(self.initial_slow_workers),
            "exponential": self.exponential,
            "shift": self.shift,
        }


_MODELS: dict[str, type[DelayModel]] = {
    model.name: model for model in (NoDelay, FixedDelay, ShiftedExponential, Pareto, GilbertElliot)
}
DELAY_MODEL_NAMES = tuple(_MODELS)
"""Names accepted by :func:`make_delay_model`."""


def _parameter_names(model: type[DelayModel]) -> list[str]:
    names = [p for p in inspect.signature(model.__init__).parameters if p not in ("self", "seed")]
    return names


def make_delay_model(name: str, params: Mapping[str, float | int | list[Any] | bool | None], seed: int) -> DelayModel:
    """Build the delay model ``name`` (one of :data:`DELAY_MODEL_NAMES`) from keyword ``params``.

    ``params`` are the class's constructor arguments (``time_scale`` included; ``seed`` is its own
    argument). An unknown name or parameter raises ``ValueError`` listing the valid ones; a missing
    or invalid value raises the class's own ``ValueError``.
    """
    if name not in _MODELS:
        raise ValueError(f"Unknown delay model {name!r}; valid names are {list(DELAY_MODEL_NAMES)}.")
    model = _MODELS[name]
    valid = _parameter_names(model)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"Unknown parameter(s) {unknown} for delay model {name!r}; valid parameters are {valid}.")
    try:
        return model(**params, seed=seed)  # type: ignore[arg-type]
    except TypeError as exc:  # a required parameter is missing
        raise ValueError(f"Delay model {name!r}: {exc}; valid parameters are {valid}.") from None
