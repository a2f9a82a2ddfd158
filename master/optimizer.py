r"""First-order optimizers the master applies to the decoded gradient.

The workers' messages decode to the *summed* gradient $\sum_j g_j$ over all training samples
(:mod:`gradcode.common.training.models`); the master turns it into the gradient of the regularised mean loss

$$\nabla F(\theta) = \tfrac{1}{N} \sum_j g_j(\theta) + \lambda \theta ,$$

(:func:`mean_gradient`: divide by the number of training samples $N$, add the L2 term once) and
steps with one of:

* :class:`GradientDescent` — $\theta_{t+1} = \theta_t - \eta \nabla F(\theta_t)$.
* :class:`Nesterov` — Nesterov's accelerated gradient in the form the gradient-coding papers use
  (Tandon et al. §5 train logistic regression with it):
  $\theta_{t+1} = y_t - \eta \nabla F(y_t)$, $y_{t+1} = \theta_{t+1} + \mu_t (\theta_{t+1} - \theta_t)$,
  with a constant momentum $\mu$ or, when none is given, the schedule $\mu_t = t / (t + 3)$
  (i.e. $(t' - 1)/(t' + 2)$ with 1-based $t' = t + 1$).

Each optimizer exposes :attr:`Optimizer.point`, where the next gradient must be evaluated (what the
master sends to the workers), and :attr:`Optimizer.params`, the current estimate (what GetModel
returns). For gradient descent they coincide.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from gradcode.common.codes.numerics import all_finite

__all__ = ["OPTIMIZER_KINDS", "GradientDescent", "Nesterov", "Optimizer", "make_optimizer", "mean_gradient"]

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike

OPTIMIZER_KINDS = ("gd", "nesterov")
"""Names accepted by :func:`make_optimizer`."""


def mean_gradient(summed: FloatArray, params: FloatArray, *, num_samples: int, l2: float) -> FloatArray:
    """Gradient of the regularised mean loss from the summed gradient: ``summed / N + l2 * params``."""
    if num_samples <= 0:
        raise ValueError(f"Argument 'num_samples' must be a positive integer, not {num_samples!r}.")
    out: FloatArray = summed / num_samples
    if l2:
        out = out + l2 * params
    return out


class Optimizer(ABC):
    """A stateful first-order method over a flat float64 parameter vector."""

    kind: str

    def __init__(self, params: ArrayLike, *, learning_rate: float) -> None:
        lr = float(learning_rate)
        if not np.isfinite(lr) or lr <= 0:
            raise ValueError(f"Argument 'learning_rate' must be a finite number > 0, not {learning_rate!r}.")
        self.learning_rate = lr
        self._params: FloatArray = np.array(params, dtype=np.float64, copy=True)
        if self._params.ndim != 1:
            raise ValueError(f"Parameters must be a flat vector, got shape {self._params.shape}.")
        self.steps = 0

    @property
    def params(self) -> FloatArray:
        """The current estimate $\\theta_t$."""
        return self._params

    @property
    def point(self) -> FloatArray:
        """Where the next gradient must be evaluated."""
        return self._params

    def step(self, gradient: ArrayLike) -> FloatArray:
        """Apply one step with ``gradient`` (evaluated at :attr:`point`); return the new :attr:`params`."""
        g = np.asarray(gradient, dtype=np.float64)
        if g.shape != self._params.shape:
            raise ValueError(f"Gradient has shape {g.shape}; the parameters have shape {self._params.shape}.")
        if not all_finite(g):
            raise ValueError("Gradient contains NaN or infinite entries; refusing to step.")
        self._step(g)
        self.steps += 1
        return self._params

    @abstractmethod
    def _step(self, gradient: FloatArray) -> None:
        """Advance by one step, rebinding the state arrays to new ones and never writing into them: a
        shallow copy of an optimizer (``copy.copy``) is then a snapshot that later steps leave alone."""

    def state_arrays(self) -> dict[str, FloatArray]:
        """The arrays that, with :attr:`steps`, are this optimizer's whole state (for checkpoints)."""
        return {"params": self._params}

    def restore_state(self, arrays: dict[str, ArrayLike], *, steps: int) -> None:
        """Go back to a state from :meth:`state_arrays` after ``steps`` steps; ValueError names a bad array."""
        mine = self.state_arrays()
        if set(arrays) != set(mine):
            raise ValueError(f"Optimizer {self.kind!r} state needs arrays {sorted(mine)}, not {sorted(arrays)}.")
        restored = {k: np.array(v, dtype=np.float64, copy=True) for k, v in arrays.items()}
        for name, value in restored.items():
            if value.shape != self._params.shape or not np.all(np.isfinite(value)):
                raise ValueError(
                    f"Optimizer state {name!r} must be {self._params.shape[0]} finite numbers, got shape {value.shape}."
                )
        if steps < 0:
            raise ValueError(f"Optimizer steps must be >= 0, not {steps!r}.")
        self._set_state(restored)
        self.steps = int(steps)

    def _set_state(self, arrays: dict[str, FloatArray]) -> None:
        self._params = arrays["params"]


class GradientDescent(Optimizer):
    """Plain gradient descent with a constant step size."""

    kind = "gd"

    def _step(self, gradient: FloatArray) -> None:
        self._params = self._params - self.learning_rate * gradient


class Nesterov(Optimizer):
    """Nesterov's accelerated gradient; ``momentum = 0`` selects the schedule $t / (t + 3)$."""

    kind = "nesterov"

    def __init__(self, params: ArrayLike, *, learning_rate: float, momentum: float = 0.0) -> None:
        super().__init__(params, learning_rate=learning_rate)
        mu = float(momentum)
        if not np.isfinite(mu) or not 0.0 <= mu < 1.0:
            raise ValueError(f"Argument 'momentum' must be in [0, 1) (0 picks the schedule), not {momentum!r}.")
        self.momentum = mu
        self._lookahead: FloatArray = self._params.copy()

    @property
    def point(self) -> FloatArray:
        return self._lookahead

    def state_arrays(self) -> dict[str, FloatArray]:
        return {"params": self._params, "lookahead": self._lookahead}

    def _set_state(self, arrays: dict[str, FloatArray]) -> None:
        self._params, self._lookahead = arrays["params"], arrays["lookahead"]

    def _step(self, gradient: FloatArray) -> None:
        t = self.steps
        mu = self.momentum if self.momentum > 0 else t / (t + 3)
        new = self._lookahead - self.learning_rate * gradient
        self._lookahead = new + mu * (new - self._params)
        self._params = new


def make_optimizer(kind: str, params: ArrayLike, *, learning_rate: float, momentum: float = 0.0) -> Optimizer:
    """Build the optimizer named ``kind`` (one of :data:`OPTIMIZER_KINDS`) starting at ``params``."""
    if kind == "gd":
        if momentum:
            raise ValueError(f"Optimizer 'gd' takes no momentum (got {momentum!r}); use 'nesterov'.")
        return GradientDescent(params, learning_rate=learning_rate)
    if kind == "nesterov":
        return Nesterov(params, learning_rate=learning_rate, momentum=momentum)
    raise ValueError(f"Unknown optimizer {kind!r}; valid optimizers are {list(OPTIMIZER_KINDS)}.")
