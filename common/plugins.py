"""Model plugins: models from installed packages, found through the ``gradcode.models`` entry-point group.

A plugin is a distribution that declares, in its ``pyproject.toml``::

    [project.entry-points."gradcode.models"]
    my_net = "my_package.models:build_my_net"

where ``build_my_net`` is a :class:`ModelFactory`: called as
``build_my_net(num_features=..., num_classes=..., dtype=...)`` it returns a
:class:`gradcode.common.models.Model` (for a PyTorch network, a
:class:`gradcode.contrib.torch_model.TorchModel`). A job names the plugin (``ModelSpec.kind = "my_net"``);
the master and every worker build it with :func:`gradcode.common.models.make_model`, which looks only
at the names installed on that machine. Nothing is ever imported from a module name or path that
arrives over the network: an unknown name is refused with the list of what is installed.

Plugins may not reuse a built-in name (:data:`gradcode.common.models.MODEL_KINDS`); two installed
distributions declaring the same name are refused by name (ambiguous) rather than picked at random.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from gradcode.common.models import Model

__all__ = [
    "MODEL_ENTRY_POINT_GROUP",
    "ModelFactory",
    "PluginError",
    "load_model_factory",
    "model_dtype",
    "model_plugins",
    "unknown_model",
]

MODEL_ENTRY_POINT_GROUP = "gradcode.models"
"""The entry-point group installed packages register model factories under."""

_PLUGIN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class PluginError(ValueError):
    """A model plugin is unknown, ambiguous, fails to load, or builds something that is not a Model."""


class ModelFactory(Protocol):
    """What a ``gradcode.models`` entry point must point at.

    ``num_features`` is the number of columns of ``X`` (the dataset's), ``num_classes`` the number
    of classes (0 for a regression dataset), ``dtype`` the floating type to compute in
    (``float64``, or ``float32`` when the job's messages are float32).
    """

    def __call__(self, *, num_features: int, num_classes: int, dtype: np.dtype[Any]) -> Model: ...


def model_dtype(message_dtype: int) -> np.dtype[Any]:
    """The floating type a job's model computes in, from the job's wire message dtype.

    float32 when the messages are ``DTYPE_FLOAT32`` (a float32 model's gradients travel at their own
    precision, half the bytes), float64 otherwise (complex codes' messages carry float64 gradients).
    The master and every worker derive it the same way, so they build the same model.
    """
    from gradcode.v1 import common_pb2

    return np.dtype(np.float32) if message_dtype == common_pb2.DTYPE_FLOAT32 else np.dtype(np.float64)


def _discover() -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=MODEL_ENTRY_POINT_GROUP):
        found.setdefault(ep.name, []).append(ep)
    return found


def model_plugins() -> dict[str, str]:
    """Installed model plugins: name -> ``module:attribute`` (what its distribution registered), sorted."""
    from gradcode.common.models import MODEL_KINDS

    return {
        name: " | ".join(ep.value for ep in eps)
        for name, eps in sorted(_discover().items())
        if name not in MODEL_KINDS and _PLUGIN_NAME.match(name)
    }


def unknown_model(name: str) -> PluginError:
    """The error for a model name that is neither built in nor an installed plugin: it lists the valid ones."""
    from gradcode.common.models import available_models

    return PluginError(
        f"Unknown model kind {name!r}; valid kinds are {available_models()} (the built-in models, then the plugins "
        f"installed here under the entry-point group {MODEL_ENTRY_POINT_GROUP!r})."
    )


def load_model_factory(name: str) -> ModelFactory:
    """The factory the installed plugin ``name`` registered; :class:`PluginError` says why not."""
    from gradcode.common.models import MODEL_KINDS

    if name in MODEL_KINDS:
        raise PluginError(f"{name!r} is a built-in model, not a plugin.")
    return _load(name)


@functools.cache
def _load(name: str) -> ModelFactory:
    eps = _discover().get(name, []) if _PLUGIN_NAME.match(name) else []
    if not eps:
        raise unknown_model(name)
    if len(eps) > 1:
        raise PluginError(
            f"Model plugin {name!r} is registered more than once ({[ep.value for ep in eps]}); uninstall all but "
            "one of the packages that provide it."
        )
    try:
        factory = eps[0].load()
    except Exception as exc:  # whatever the plugin's import raises, say which plugin and why
        raise PluginError(
            f"Model plugin {name!r} ({eps[0].value}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise PluginError(f"Model plugin {name!r} ({eps[0].value}) is not callable; it must be a model factory.")
    return factory  # type: ignore[no-any-return]
