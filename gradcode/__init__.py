"""gradcode: straggler-tolerant distributed gradient descent with exact gradient coding over gRPC.

The one import name gradcode installs. Its subpackages are the repository's top-level folders:
``gradcode.common`` (codes, models, data, wire helpers), ``gradcode.master``, ``gradcode.worker``,
``gradcode.v1`` (the generated wire contract, from ``protos/gradcode/v1``), ``gradcode.client`` (SDK,
CLI, local launcher) and ``gradcode.bench``.

The names below are loaded on first use, so ``import gradcode.common.codes`` stays free of gRPC.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradcode.client.sdk import GradcodeClient, JobFailedError, build_job_spec
    from gradcode.common.codes import GradientCode, make_code
    from gradcode.common.models import Model, available_models, make_model
    from gradcode.common.plugins import ModelFactory

__all__ = [
    "GradcodeClient",
    "GradientCode",
    "JobFailedError",
    "Model",
    "ModelFactory",
    "available_models",
    "build_job_spec",
    "make_code",
    "make_model",
]

_LAZY = {
    "GradcodeClient": "gradcode.client.sdk",
    "JobFailedError": "gradcode.client.sdk",
    "build_job_spec": "gradcode.client.sdk",
    "GradientCode": "gradcode.common.codes",
    "make_code": "gradcode.common.codes",
    "Model": "gradcode.common.models",
    "available_models": "gradcode.common.models",
    "make_model": "gradcode.common.models",
    "ModelFactory": "gradcode.common.plugins",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gradcode' has no attribute {name!r}")
