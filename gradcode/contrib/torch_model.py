r"""A PyTorch network as a gradcode model: parameters travel as one flat vector, gradients come from autograd.

:class:`TorchModel` wraps a module factory and a per-sample loss. The flat parameter vector is the
concatenation of the module's parameters in ``named_parameters()`` order (what
``torch.nn.utils.parameters_to_vector`` produces); every evaluation slices it into views, runs the
module with them (``torch.func.functional_call``) and differentiates the *summed* loss with
``torch.autograd.grad`` with respect to the flat vector, so a partition's gradient is
$g_j = \nabla_\theta \sum_{i \in j} \ell(f_\theta(x_i), y_i)$ and $\sum_j g_j = g$ (Tandon et al. §2).

For the sum to split over partitions each sample's loss must depend on that sample alone: the
module runs in eval mode (dropout off, batch normalisation with its fixed running statistics), and
the loss must return one value per sample (``reduction="none"``; a mean would make partition
gradients scale with partition size — refused by shape).

Precision and what "exact" means. ``dtype`` is float64 or float32; the master's parameters
(float64) are rounded to it, the forward and backward passes run in it, and gradients leave as
float64 (exact conversions). In float64 a decoded gradient equals the centralized one to rounding
(relative error far below the master's ``EXACT_TOLERANCE = 1e-9``; the tests hold it to 1e-12).
In float32 the partition sums are reordered float32 sums, so the decoded gradient matches the
centralized float32 gradient only to float32 rounding: gradcode calls it exact when the relative
error is at most ``FLOAT32_TOLERANCE = 1e-5`` (about $84\,\varepsilon_{32}$, $\varepsilon_{32}
= 2^{-23}$), which is the master's verify bound for float32 jobs. Where the gradient is small
compared with the per-sample gradients it sums (near a minimum) float32 cancellation can exceed it;
certify such runs in float64.

Determinism: the initial parameters come from the module factory run under ``torch.manual_seed(seed)``
(with the global RNG state restored afterwards), and ``torch.use_deterministic_algorithms(True)`` is
switched on (process-wide) unless ``deterministic=False``. CUDA is used when available (or when
``device`` says so); on CUDA, ``CUBLAS_WORKSPACE_CONFIG`` is set for deterministic cuBLAS.
Evaluations hold a lock: the module is shared, and master and workers evaluate from threads.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.func import functional_call

from gradcode.common.training.models import MODEL_DTYPES, FloatArray, Model
from gradcode.common.validation import check_int

__all__ = ["TorchModel", "default_device"]

_TORCH_DTYPES = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(output, target) -> per-sample losses`` of shape ``(batch,)``."""


def default_device() -> torch.device:
    """CUDA when this machine has it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True)`` without its import of the compiler.

    The public function also sets ``torch._inductor.config.deterministic``, which only concerns
    ``torch.compile`` (unused here) and costs seconds of imports in every master and worker process;
    the kernel switch it wraps is ``torch._C._set_deterministic_algorithms`` (torch is pinned, and
    the tests read it back through the public ``torch.are_deterministic_algorithms_enabled``).
    """
    if torch.are_deterministic_algorithms_enabled():
        return
    switch = getattr(torch._C, "_set_deterministic_algorithms", None)
    if switch is None:  # another torch: the public function does it all
        torch.use_deterministic_algorithms(True)
    else:
        switch(True, warn_only=False)


class TorchModel(Model):
    """A classifier made of a torch module and a per-sample loss (see the module docstring).

    Args:
        module_factory: builds the network; called once, under ``torch.manual_seed(seed)``.
        loss: per-sample loss, e.g. ``torch.nn.CrossEntropyLoss(reduction="none")``.
        num_features: columns of ``X``; each row is reshaped to ``input_shape`` before the module sees it.
        num_classes: labels are the integers ``0..num_classes-1`` (floats on the wire); the module's
            output has shape ``(batch, num_classes)`` and the prediction is its argmax.
        input_shape: the shape of one sample (default ``(num_features,)``), e.g. ``(1, 8, 8)`` for images.
        dtype: float64 or float32, the precision of the forward and backward passes.
        device: a torch device; default CUDA when available, else CPU.
        seed: seeds the initial parameters.
        deterministic: switch on ``torch.use_deterministic_algorithms`` (process-wide).
        name: shown in ``repr`` (the plugin name).
    """

    kind: ClassVar[str] = "torch"

    def __init__(
        self,
        module_factory: Callable[[], torch.nn.Module],
        loss: LossFunction,
        *,
        num_features: int,
        num_classes: int,
        input_shape: Sequence[int] | None = None,
        dtype: Any = np.float64,
        device: str | torch.device | None = None,
        seed: int = 0,
        deterministic: bool = True,
        name: str = "torch",
    ) -> None:
        p = check_int("num_features", num_features, 1)
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.input_shape = tuple(int(d) for d in (input_shape if input_shape is not None else (p,)))
        if math.prod(self.input_shape) != p or any(d < 1 for d in self.input_shape):
            raise ValueError(f"input_shape {self.input_shape} must hold exactly num_features={p} values per sample.")
        dt = np.dtype(dtype)
        if dt not in MODEL_DTYPES:
            raise ValueError(f"Argument 'dtype' must be float64 or float32, not {dtype!r}.")
        self.dtype = dt
        self.name = name
        self._torch_dtype = _TORCH_DTYPES[dt]
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if deterministic:
            _use_deterministic_algorithms()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            module = module_factory()
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"module_factory returned {type(module).__name__}, not a torch.nn.Module.")
        self.module = module.to(device=self.device, dtype=self._torch_dtype).eval()
        self._loss = loss
        self._names: list[str] = []
        self._shapes: list[torch.Size] = []
        for param_name, param in self.module.named_parameters():
            self._names.append(param_name)
            self._shapes.append(param.shape)
        if not self._names:
            raise ValueError("The module has no parameters to train.")
        self._offsets = np.cumsum([0, *(s.numel() for s in self._shapes)]).tolist()
        self._init = (
            torch.nn.utils.parameters_to_vector(self.module.parameters()).detach().to("cpu", torch.float64).numpy()
        )
        self._lock = threading.Lock()
        super().__init__(p, int(self._offsets[-1]))

    # ---- the Model protocol ----------------------------------------------------------------------
    def init_params(self) -> FloatArray:
        """The module's seeded initial parameters as one flat float64 vector."""
        return self._init.copy()

    def _check_labels(self, y: FloatArray) -> FloatArray:
        bad = ~((y >= 0) & (y < self.num_classes) & (np.floor(y) == y))
        if np.any(bad):
            raise ValueError(
                f"y must hold integer class labels in [0, {self.num_classes}) for {self!r}, found {y[bad][0]!r}."
            )
        return y

    def _evaluate(
        self, params: FloatArray, X: FloatArray, y: FloatArray, *, score: bool
    ) -> tuple[float, FloatArray, float]:
        """Summed loss, its gradient by autograd, and (when ``score``) the correct predictions: one forward pass."""
        with self._lock:
            theta = self._tensor(params).requires_grad_(True)
            out = self._forward(theta, X)
            total = self._per_sample_loss(out, y).sum()
            (grad,) = torch.autograd.grad(total, theta)
            correct = 0.0
            if score:
                target = torch.tensor(y, dtype=torch.long, device=self.device)
                correct = float(torch.count_nonzero(out.detach().argmax(dim=1) == target))
            return float(total.detach()), grad.to("cpu", torch.float64).numpy(), correct

    def _predict(self, params: FloatArray, X: FloatArray) -> FloatArray:
        with self._lock, torch.no_grad():
            out = self._forward(self._tensor(params), X)
            predicted: FloatArray = out.argmax(dim=1).to("cpu", torch.float64).numpy()
            return predicted

    def export(self, params: Any, path: str | Path) -> list[Path]:
        """The ``.npy`` parameters, and beside them ``<stem>.pt``: the module's ``state_dict`` (torch.save)."""
        written = super().export(params, path)
        state = self.state_dict(params)
        target = written[0].with_suffix(".pt")
        torch.save(state, target)
        return [*written, target]

    # ---- torch helpers ---------------------------------------------------------------------------
    def state_dict(self, params: Any) -> dict[str, torch.Tensor]:
        """The module's ``state_dict`` with ``params`` as its parameters (on the CPU), for use outside gradcode."""
        p = self._check_params(params)
        with self._lock:
            state = {k: v.detach().to("cpu").clone() for k, v in self.module.state_dict().items()}
            for name, view in self._views(self._tensor(p)).items():
                state[name] = view.detach().to("cpu").clone()
        return state

    def _tensor(self, params: FloatArray) -> torch.Tensor:
        return torch.tensor(params, dtype=self._torch_dtype, device=self.device)

    def _views(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            name: theta[lo:hi].view(shape)
            for name, shape, lo, hi in zip(
                self._names, self._shapes, self._offsets[:-1], self._offsets[1:], strict=True
            )
        }

    def _forward(self, theta: torch.Tensor, X: FloatArray) -> torch.Tensor:
        inputs = torch.tensor(X, dtype=self._torch_dtype, device=self.device).reshape(X.shape[0], *self.input_shape)
        out = functional_call(self.module, self._views(theta), (inputs,))
        if not isinstance(out, torch.Tensor) or out.shape != (X.shape[0], self.num_classes):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{self!r}: the module must output (batch, {self.num_classes}) logits, got {shape}.")
        return out

    def _per_sample_loss(self, out: torch.Tensor, y: FloatArray) -> torch.Tensor:
        target = torch.tensor(y, dtype=torch.long, device=self.device)
        losses = self._loss(out, target)
        if losses.shape != (len(y),):
            raise ValueError(
                f"{self!r}: the loss must return one value per sample, shape ({len(y)},), got {tuple(losses.shape)}; "
                "use reduction='none' (gradcode sums it)."
            )
        return losses

    def __repr__(self) -> str:
        return (
            f"<TorchModel {self.name!r}(num_features={self.num_features}, num_classes={self.num_classes}, "
            f"num_params={self.num_params}, dtype={self.dtype.name}, device={self.device.type})>"
        )
