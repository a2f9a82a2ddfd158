"""What every benchmark shares: where results go, the machine's load, and saving JSON beside a PNG."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "load_average", "save"]

RESULTS = Path(__file__).resolve().parent / "results"
"""Default output directory: the committed results of this project's development machine."""


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (``/proc/loadavg``), recorded beside every figure."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def save(results: Any, out: Path, name: str, plot: Callable[[Path], None]) -> tuple[Path, Path]:
    """Write ``out/name.json`` and draw ``out/name.png`` with ``plot``; print and return both paths."""
    out.mkdir(parents=True, exist_ok=True)
    data, figure = out / f"{name}.json", out / f"{name}.png"
    data.write_text(json.dumps(results, indent=1) + "\n")
    plot(figure)
    print(f"Saved {data} and {figure}")
    return data, figure
