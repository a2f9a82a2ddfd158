"""Every exception class gradcode defines is in one tree (:class:`~gradcode.common.exceptions.GradcodeError`), so a
caller can catch all of gradcode's own refusals with one ``except`` and the transport edge maps them in one place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from gradcode.common.exceptions import GradcodeError

SKIPPED_PACKAGES = ("gradcode.v1", "gradcode.contrib")
"""Generated protobuf modules, and optional integrations whose imports need extras (torch)."""


PACKAGES = ("gradcode", "gradcode.common", "gradcode.master", "gradcode.worker")
"""The import package and the top-level folders it maps (``common/``, ``master/``, ``worker/``)."""


def gradcode_modules() -> list[str]:
    names = set()
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            if not info.name.startswith(SKIPPED_PACKAGES) and not info.name.endswith("__main__"):
                names.add(info.name)
    return sorted(names)


def test_every_exception_gradcode_defines_is_a_gradcode_error() -> None:
    defined = {}
    for name in gradcode_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                defined[f"{name}.{cls.__qualname__}"] = cls
    assert len(defined) >= 30, sorted(defined)  # the walk found the package's own errors
    outside = sorted(name for name, cls in defined.items() if not issubclass(cls, GradcodeError))
    assert not outside, f"exceptions outside the GradcodeError tree: {outside}"
