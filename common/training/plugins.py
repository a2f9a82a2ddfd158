"""Plugins: models and datasets from installed packages, found through the ``gradcode.models`` and
``gradcode.datasets`` entry-point groups.

A plugin is a distribution that declares, in its ``pyproject.toml``::

    [project.entry-points."gradcode.models"]
    my_net = "my_package.models:build_my_net"

where ``build_my_net`` is a :class:`ModelFactory`: called as
``build_my_net(num_features=..., num_classes=..., dtype=...)`` it returns a
:class:`gradcode.common.training.models.Model` (for a PyTorch network, a
:class:`gradcode.contrib.torch_model.TorchModel`). A job names the plugin (``ModelSpec.kind = "my_net"``);
the master and every worker build it with :func:`gradcode.common.training.models.make_model`, which looks only
at the names installed on that machine. Nothing is ever imported from a module name or path that
arrives over the network: an unknown name is refused with the list of what is installed.

Plugins may not reuse a built-in name (:data:`gradcode.common.training.models.MODEL_KINDS`); two installed
distributions declaring the same name are refused by name (ambiguous) rather than picked at random.

Dataset plugins (:data:`DATASET_ENTRY_POINT_GROUP`) are found the same way: an entry point names an
object with the :class:`gradcode.common.training.datasets.DatasetPlugin` methods, which a worker uses to load
its own partitions (worker-local data) and the master to learn the dataset's shape, labels and
held-out rows; :func:`load_dataset_plugin` resolves a name against what is installed here only.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gradcode.common.exceptions import GradcodeError

if TYPE_CHECKING:
    from gradcode.common.training.models import Model

__all__ = [
    "DATASET_ENTRY_POINT_GROUP",
    "MODEL_ENTRY_POINT_GROUP",
    "ModelFactory",
    "PluginError",
    "dataset_plugins",
    "load_dataset_plugin",
    "load_model_factory",
    "model_dtype",
    "model_plugins",
    "unknown_model",
]

MODEL_ENTRY_POINT_GROUP = "gradcode.models"
"""The entry-point group installed packages register model factories under."""
DATASET_ENTRY_POINT_GROUP = "gradcode.datasets"
"""The entry-point group installed packages register dataset plugins under."""

_PLUGIN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


class PluginError(GradcodeError, ValueError):
    """A plugin is unknown, ambiguous, fails to load, or is not what its group needs."""


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


def _discover(group: str = MODEL_ENTRY_POINT_GROUP) -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group):
        found.setdefault(ep.name, []).append(ep)
    return found


def model_plugins() -> dict[str, str]:
    """Installed model plugins: name -> ``module:attribute`` (what its distribution registered), sorted."""
    from gradcode.common.training.models import MODEL_KINDS

    return {
        name: " | ".join(ep.value for ep in eps)
        for name, eps in sorted(_discover().items())
        if name not in MODEL_KINDS and _PLUGIN_NAME.match(name)
    }


def unknown_model(name: str) -> PluginError:
    """The error for a model name that is neither built in nor an installed plugin: it lists the valid ones."""
    from gradcode.common.training.models import available_models

    return PluginError(
        f"Unknown model kind {name!r}; valid kinds are {available_models()} (the built-in models, then the plugins "
        f"installed here under the entry-point group {MODEL_ENTRY_POINT_GROUP!r})."
    )


def load_model_factory(name: str) -> ModelFactory:
    """The factory the installed plugin ``name`` registered; :class:`PluginError` says why not."""
    from gradcode.common.training.models import MODEL_KINDS

    if name in MODEL_KINDS:
        raise PluginError(f"{name!r} is a built-in model, not a plugin.")
    return _load(name)


@functools.cache
def _load(name: str) -> ModelFactory:
    factory = _load_entry_point(MODEL_ENTRY_POINT_GROUP, name, "Model", unknown_model)
    if not callable(factory):
        raise PluginError(f"Model plugin {name!r} is not callable; it must be a model factory.")
    return factory  # type: ignore[no-any-return]


def _load_entry_point(group: str, name: str, what: str, unknown: Any) -> Any:
    """The object the one installed entry point ``name`` of ``group`` names; ``unknown(name)`` when there is none."""
    eps = _discover(group).get(name, []) if _PLUGIN_NAME.match(name) else []
    if not eps:
        raise unknown(name)
    if len(eps) > 1:
        raise PluginError(
            f"{what} plugin {name!r} is registered more than once ({[ep.value for ep in eps]}); uninstall all but "
            "one of the packages that provide it."
        )
    try:
        return eps[0].load()
    except Exception as exc:  # whatever the plugin's import raises, say which plugin and why
        raise PluginError(
            f"{what} plugin {name!r} ({eps[0].value}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc


def dataset_plugins(builtin: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed dataset plugins: name -> ``module:attribute``, sorted; names in ``builtin`` are left out."""
    return {
        name: " | ".join(ep.value for ep in eps)
        for name, eps in sorted(_discover(DATASET_ENTRY_POINT_GROUP).items())
        if name not in builtin and _PLUGIN_NAME.match(name)
    }


def load_dataset_plugin(name: str, *, builtin: tuple[str, ...] = ()) -> Any:
    """The object the installed dataset plugin ``name`` registered; PluginError lists the valid names when
    there is none (``builtin`` first, then the installed plugins)."""

    def unknown(name: str) -> PluginError:
        valid = [*builtin, *dataset_plugins(builtin)]
        return PluginError(
            f"Unknown dataset {name!r}; valid datasets here are {valid} (the built-in ones, then the plugins "
            f"installed under the entry-point group {DATASET_ENTRY_POINT_GROUP!r})."
        )

    if name in builtin:
        raise PluginError(f"{name!r} is a built-in dataset, not a plugin.")
    return _load_entry_point(DATASET_ENTRY_POINT_GROUP, name, "Dataset", unknown)
