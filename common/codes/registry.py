"""Registry of gradient-code schemes by name, used by configuration, the CLI and the master."""

from __future__ import annotations

import importlib
import inspect
import numbers
import typing
from typing import Any, TypeVar

from gradcode.common.codes.base import GradientCode

__all__ = ["available_codes", "code_class", "code_parameters", "make_code", "register"]

_REGISTRY: dict[str, type[GradientCode]] = {}

C = TypeVar("C", bound=type[GradientCode])


def register(cls: C) -> C:
    """Class decorator: make ``cls`` constructible by its ``name`` through :func:`make_code`."""
    name = cls.name
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"Scheme name {name!r} is already registered by {_REGISTRY[name].__name__}.")
    _REGISTRY[name] = cls
    return cls


def available_codes() -> list[str]:
    """Names of every registered scheme, sorted."""
    _load_builtin_schemes()
    return sorted(_REGISTRY)


def code_class(name: str) -> type[GradientCode]:
    """The class registered as ``name``; ``KeyError`` listing the valid names otherwise."""
    _load_builtin_schemes()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"Unknown gradient code {name!r}; available: {', '.join(sorted(_REGISTRY))}.") from None


def code_parameters(name: str) -> list[str]:
    """The keyword parameters the scheme ``name`` accepts."""
    sig = inspect.signature(code_class(name).__init__)
    return [p for p in sig.parameters if p != "self"]


def make_code(name: str, **params: Any) -> GradientCode:
    """Construct scheme ``name`` from keyword parameters, rejecting unknown parameters clearly."""
    cls = code_class(name)
    accepted = code_parameters(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"Gradient code {name!r} does not take parameter(s) {unknown}; it accepts {accepted}.")
    _check_numbers(name, cls, params)
    try:
        inspect.signature(cls.__init__).bind(None, **params)
    except TypeError as exc:
        raise ValueError(f"Gradient code {name!r}: {exc}; it accepts {accepted}.") from None
    return cls(**params)


def _check_numbers(name: str, cls: type[GradientCode], params: dict[str, Any]) -> None:
    """Refuse a text value for a numeric parameter first, so ``n=abc`` is named rather than a missing ``s``."""
    hints = typing.get_type_hints(cls.__init__)
    for key, value in params.items():
        kind = hints.get(key)
        if kind in (int, float) and not isinstance(value, numbers.Real):  # the class's own checks do the rest
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"Gradient code {name!r}: parameter {key!r} must be {what}, not {value!r}.")


BUILTIN_SCHEME_MODULES = (
    "gradcode.common.codes.baseline",
    "gradcode.common.codes.fractional",
    "gradcode.common.codes.cyclic",
    "gradcode.common.codes.partial",
    "gradcode.common.codes.reed_solomon",
    "gradcode.common.codes.binary",
    "gradcode.common.codes.clustered",
    "gradcode.common.codes.coded_reduce",
)
"""Modules whose import registers the built-in schemes (each decorates its classes)."""


def _load_builtin_schemes() -> None:
    for module in BUILTIN_SCHEME_MODULES:
        importlib.import_module(module)
