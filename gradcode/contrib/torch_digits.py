"""Example model plugins: small PyTorch networks for scikit-learn's 8x8 handwritten digits.

Registered in gradcode's own ``pyproject.toml`` under the ``gradcode.models`` entry-point group, so
with ``pip install "gradcode[torch]"`` a job can name them::

    gradcode run --model digits_mlp --dataset digits --scheme cyclic --n 6 --s 2 ...

* ``digits_mlp`` — 64 -> 64 (tanh) -> 10: reaches >= 97% test accuracy in about 50 full-batch
  Nesterov steps (learning rate 0.5), cheap enough for a laptop or CI.
* ``digits_cnn`` — conv 3x3 (8 channels) -> ReLU -> 2x2 max-pool -> linear: the same images as
  1x8x8 pictures.

Both are built with the seed :data:`SEED`, so every master and worker starts from the same
parameters; the per-sample loss is the cross-entropy.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcode.contrib.torch_model import TorchModel

__all__ = ["SEED", "digits_cnn", "digits_mlp"]

SEED = 0
"""Seeds the initial parameters (the master and every worker build the same network)."""
_SIDE = 8
_HIDDEN = 64
_CHANNELS = 8


def _check_digits(name: str, num_features: int, num_classes: int) -> None:
    if num_features != _SIDE * _SIDE or num_classes < 2:
        raise ValueError(
            f"{name} takes 8x8 images ({_SIDE * _SIDE} features) and at least 2 classes, e.g. dataset 'digits'; "
            f"got {num_features} features and {num_classes} classes."
        )


def digits_mlp(*, num_features: int, num_classes: int, dtype: Any) -> TorchModel:
    """A multi-layer perceptron, 64 -> 64 (tanh) -> ``num_classes``."""
    _check_digits("digits_mlp", num_features, num_classes)

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(num_features, _HIDDEN), torch.nn.Tanh(), torch.nn.Linear(_HIDDEN, num_classes)
        )

    return TorchModel(
        build,
        torch.nn.CrossEntropyLoss(reduction="none"),
        num_features=num_features,
        num_classes=num_classes,
        dtype=dtype,
        seed=SEED,
        name="digits_mlp",
    )


def digits_cnn(*, num_features: int, num_classes: int, dtype: Any) -> TorchModel:
    """A small convolutional network over 1x8x8 images: conv 3x3 x8, ReLU, 2x2 max-pool, linear."""
    _check_digits("digits_cnn", num_features, num_classes)

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, _CHANNELS, kernel_size=3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(_CHANNELS * (_SIDE // 2) ** 2, num_classes),
        )

    return TorchModel(
        build,
        torch.nn.CrossEntropyLoss(reduction="none"),
        num_features=num_features,
        num_classes=num_classes,
        input_shape=(1, _SIDE, _SIDE),
        dtype=dtype,
        seed=SEED,
        name="digits_cnn",
    )
