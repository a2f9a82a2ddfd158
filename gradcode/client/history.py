"""Saving and plotting a job's per-iteration history."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from gradcode.v1 import master_pb2

__all__ = ["plot_history", "report_rows", "save_history"]


def report_rows(reports: Sequence[master_pb2.IterationReport]) -> list[dict[str, Any]]:
    """Reports as plain dicts (every field, defaults included)."""
    return [
        MessageToDict(r, always_print_fields_with_no_presence=True, preserving_proto_field_name=True) for r in reports
    ]


def save_history(reports: Sequence[master_pb2.IterationReport], path: Path) -> Path:
    """Write the history as JSON (``.json``) or CSV (``.csv``, list fields joined with spaces)."""
    rows = report_rows(reports)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif path.suffix == ".csv":
        fields = [k for k in rows[0] if k != "timings"] if rows else []
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()})
    else:
        raise ValueError(f"History file must end in .json or .csv, not {path.name!r}.")
    return path


def plot_history(runs: dict[str, Sequence[master_pb2.IterationReport]], path: Path) -> Path:
    """Loss and test accuracy against wall-clock time, one line per run, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, reports in runs.items():
        t = [r.elapsed_seconds for r in reports]
        ax_loss.plot(t, [r.loss for r in reports], label=label)
        ax_acc.plot(t, [r.test_accuracy for r in reports], label=label)
    ax_loss.set(xlabel="wall-clock time (s)", ylabel="training loss", yscale="log", title="Loss")
    ax_acc.set(xlabel="wall-clock time (s)", ylabel="test accuracy", title="Accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
