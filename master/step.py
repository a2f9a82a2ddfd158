"""From a decoded gradient to the next model: verify it (optional), then step a copy of the optimizer.

Both take the decoded *summed* gradient (the gradient part of the decoded message, without the
training statistics the workers append; see :func:`gradcode.common.training.models.training_metrics`).

Verify mode compares the decoded gradient with the centralized one and refuses to step when an
exact decode is off by more than the plan's tolerance. The step runs on a copy of the optimizer, so a
failed step leaves the model untouched; the caller commits the copy together with the iteration
number (no await in between).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import numpy as np

from gradcode.common.codes.numerics import relative_error
from gradcode.common.exceptions import JobFailedError
from gradcode.common.gather.round import Decoded
from gradcode.master.optimizer import Optimizer, mean_gradient
from gradcode.master.spec import JobPlan

__all__ = ["stepped", "verify_error"]


async def verify_error(
    plan: JobPlan,
    t: int,
    point: np.ndarray[Any, Any],
    decoded: Decoded,
    gradient_sum: np.ndarray[Any, Any],
    pool_ids: list[int],
) -> float:
    """The decoded gradient's relative error against the centralized one (-1 when not verifying).

    Raises JobFailedError when an exact decode is off by more than the plan's tolerance.
    """
    if not plan.spec.verify:
        return -1.0
    central = await asyncio.to_thread(plan.model.gradient, point, plan.dataset.X_train, plan.dataset.y_train)
    vector = np.asarray(gradient_sum, dtype=np.float64)
    error = relative_error(vector, central)
    if decoded.exact and not error <= plan.tolerance:
        raise JobFailedError(
            f"Iteration {t}: the decoded gradient differs from the centralized one by relative error "
            f"{error:.3e} > {plan.tolerance:g} (rows {list(decoded.rows)} from workers "
            f"{[pool_ids[w] for w in decoded.used_workers]}); refusing to step with a wrong gradient."
        )
    return error


def stepped(
    optimizer: Optimizer, plan: JobPlan, t: int, point: np.ndarray[Any, Any], gradient_sum: np.ndarray[Any, Any]
) -> tuple[Optimizer, np.ndarray[Any, Any]]:
    """A copy of ``optimizer`` stepped with the decoded gradient (mean plus L2 term), and its new parameters."""
    vector = np.asarray(gradient_sum, dtype=np.float64)
    gradient = mean_gradient(vector, point, num_samples=plan.dataset.num_train, l2=plan.spec.model.l2)
    new = copy.copy(optimizer)  # steps rebind the state arrays (Optimizer._step): no array is copied
    try:
        params = new.step(gradient)
    except ValueError as exc:
        raise JobFailedError(f"Iteration {t}: {exc}") from None
    return new, params
