"""gradcode: straggler-tolerant distributed gradient descent with exact gradient coding over gRPC.

The one import name gradcode installs. Its subpackages are the repository's top-level folders:
``gradcode.common`` (codes, models, data, wire helpers), ``gradcode.master``, ``gradcode.worker``,
``gradcode.v1`` (the generated wire contract, from ``protos/gradcode/v1``), ``gradcode.client`` (SDK,
CLI, local launcher) and ``gradcode.bench``.

The names below are loaded on first use, so ``import gradcode.common.codes`` stays free of gRPC.

An install (a wheel, or ``pip install -e``) gets those subpackages from pyproject.toml's ``package-dir``. Imported
straight from a checkout instead (the repository's root on ``sys.path``: ``python -m`` or pytest run there,
``PYTHONPATH=.``), this folder holds only the SDK, CLI and benchmarks, so :class:`_CheckoutFolders` maps the
same names to the same folders, read from the same table.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradcode.client.sdk import GradcodeClient, JobFailedError, build_job_spec
    from gradcode.common.codes import GradientCode, make_code
    from gradcode.common.training.models import Model, available_models, make_model
    from gradcode.common.training.plugins import ModelFactory

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
    "Model": "gradcode.common.training.models",
    "available_models": "gradcode.common.training.models",
    "make_model": "gradcode.common.training.models",
    "ModelFactory": "gradcode.common.training.plugins",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gradcode' has no attribute {name!r}")


class _CheckoutFolders(MetaPathFinder):
    """Finds ``gradcode.common`` and its siblings in a checkout's top-level folders (pyproject's package-dir);
    their own subpackages are then found through their ``__path__`` as usual."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return spec_from_file_location(fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


def _checkout_folders() -> dict[str, Path]:
    """The mapped packages and their folders when this package is imported from a checkout, else nothing."""
    here = Path(__file__).parent
    root = here.resolve().parent
    if (here / "common").is_dir() or not (root / "pyproject.toml").is_file():
        return {}  # installed: the wheel or the editable tree holds the subpackages
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())
    mapping: dict[str, str] = project.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {name: root / folder for name, folder in mapping.items() if name != __name__}


if _folders := _checkout_folders():
    sys.meta_path.insert(0, _CheckoutFolders(_folders))
