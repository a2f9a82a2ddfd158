"""Argument checks shared by every gradcode module: one wording for every refusal.

Each raises ``ValueError("Argument 'x' must be <what is valid>, not <value>.")``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_int", "check_number"]


def check_int(name: str, value: object, low: int, high: int | None = None, *, why: str = "") -> int:
    """Return ``value`` as an int if it is an integer with ``low <= value <= high``; else ValueError."""
    valid = f"in [{low}, {high}]" if high is not None else f">= {low}"
    suffix = f" ({why})" if why else ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"Argument {name!r} must be an integer {valid}{suffix}, not {value!r}.")
    v = int(value)
    if v < low or (high is not None and v > high):
        raise ValueError(f"Argument {name!r} must be an integer {valid}{suffix}, not {v}.")
    return v


def check_number(name: str, value: object, *, low: float = 0.0, strict: bool = False) -> float:
    """Return ``value`` as a float if it is a finite number ``>= low`` (``> low`` if strict); else ValueError."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    v = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not ok or not math.isfinite(v) or v < low or (strict and v == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"Argument {name!r} must be a finite number {bound}, not {value!r}.")
    return v
