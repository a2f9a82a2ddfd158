"""Saving, summarising and plotting a job's per-iteration history.

Every format keeps the per-worker timings: JSON has each report whole (``timings`` as
``[{"worker_id": 3, "seconds": 0.41, "model_seconds": 0.002, "compute_seconds": 0.12, ...}, ...]``, numbers as
numbers), CSV adds ``worker_<id>_seconds``, ``worker_<id>_model_seconds`` and ``worker_<id>_compute_seconds`` columns
per worker (empty when that worker did not answer that iteration), :func:`format_worker_table` puts each worker's
median response beside its own account of it, and :func:`plot_workers` draws who was late, how often and by how much.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gradcode.common.ops.metrics import first_decodable_seconds
from gradcode.common.sim.plan import read_history
from gradcode.common.transport.wire import message_to_dict
from gradcode.v1 import master_pb2

__all__ = [
    "WorkerRecord",
    "continuous_elapsed",
    "format_summary",
    "format_worker_table",
    "plot_history",
    "plot_workers",
    "read_reports",
    "report_rows",
    "save_history",
    "save_spec",
    "worker_records",
]


def report_rows(reports: Sequence[master_pb2.IterationReport]) -> list[dict[str, Any]]:
    """Reports as plain dicts (every field, defaults included, ints as ints)."""
    return [message_to_dict(r) for r in reports]


def _worker_ids(reports: Sequence[master_pb2.IterationReport]) -> list[int]:
    ids: set[int] = set()
    for r in reports:
        ids.update(r.used_workers, r.late_workers, r.failed_workers, r.backup_workers, (t.worker_id for t in r.timings))
        ids.update(r.late_children, (t.worker_id for t in r.child_timings))
    return sorted(ids)


_TIMING_COLUMNS = ("seconds", "model_seconds", "compute_seconds")
"""The WorkerTiming fields a CSV history has a column of per worker."""


def save_history(reports: Sequence[master_pb2.IterationReport], path: Path) -> Path:
    """Write the history as JSON (``.json``) or CSV (``.csv``: list fields joined with spaces, and per worker
    its ``worker_<id>_seconds``, ``worker_<id>_model_seconds`` and ``worker_<id>_compute_seconds`` columns)."""
    rows = report_rows(reports)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif path.suffix == ".csv":
        workers = _worker_ids(reports)
        fields = [k for k in rows[0] if k != "timings"] if rows else []
        fields += [f"worker_{w}_{name}" for w in workers for name in _TIMING_COLUMNS]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for report, row in zip(reports, rows, strict=True):
                flat = {k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()}
                answered = (*report.timings, *report.child_timings)
                flat.update(
                    {f"worker_{t.worker_id}_{name}": getattr(t, name) for t in answered for name in _TIMING_COLUMNS}
                )
                writer.writerow(flat)
    else:
        raise ValueError(f"History file must end in .json or .csv, not {path.name!r}.")
    return path


def save_spec(spec: master_pb2.JobSpec, path: Path) -> Path:
    """Write a job's spec as JSON with its own types (``"n": 8``, not ``8.0``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(message_to_dict(spec), indent=2))
    return path


@dataclass
class WorkerRecord:
    """One worker over a job: how often it was used, late, failed or a spare, and how fast it answered.

    A tree node below the first layer (``below_first_layer``) counts as used when it delivered to its parent, as
    late when its parent decoded without it, and its response times are as its parent saw them."""

    worker_id: int
    iterations: int
    """Iterations the worker took part in (used, late, failed or spare)."""
    used: int
    late: int
    failed: int
    spare: int
    """Iterations that asked it as a backup and decoded without it (neither late nor failed)."""
    response_seconds: list[float]
    """Its response time in each iteration it answered."""
    model_seconds: list[float]
    compute_seconds: list[float]
    """Its own account of each of those responses: getting its model checked, and computing (WorkerTiming)."""
    late_by_at_least: list[float]
    """For each iteration it was late: how long the decodable set waited (the worker had not
    answered by then; a late call is cancelled, so the true lateness is only bounded below)."""

    below_first_layer: bool = False

    def answered(self, timing: master_pb2.WorkerTiming) -> None:
        self.response_seconds.append(timing.seconds)
        self.model_seconds.append(timing.model_seconds)
        self.compute_seconds.append(timing.compute_seconds)

    @property
    def median_response(self) -> float | None:
        return _median(self.response_seconds)

    @property
    def median_model(self) -> float | None:
        return _median(self.model_seconds)

    @property
    def median_compute(self) -> float | None:
        return _median(self.compute_seconds)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def worker_records(reports: Sequence[master_pb2.IterationReport]) -> list[WorkerRecord]:
    """Per-worker straggler attribution over ``reports``, by worker id."""
    records = {w: WorkerRecord(w, 0, 0, 0, 0, 0, [], [], [], []) for w in _worker_ids(reports)}
    for r in reports:
        first = first_decodable_seconds(r)
        for w in {*r.used_workers, *r.late_workers, *r.failed_workers, *r.backup_workers}:
            records[w].iterations += 1
        for w in set(r.backup_workers).difference(r.used_workers, r.late_workers, r.failed_workers):
            records[w].spare += 1
        for w in r.used_workers:
            records[w].used += 1
        for w in r.late_workers:
            records[w].late += 1
            if first is not None:
                records[w].late_by_at_least.append(first)
        for w in r.failed_workers:
            records[w].failed += 1
        for t in r.timings:
            records[t.worker_id].answered(t)
        for t in r.child_timings:
            child = records[t.worker_id]
            child.below_first_layer = True
            child.iterations += 1
            child.used += 1
            child.answered(t)
        for w in r.late_children:
            records[w].below_first_layer = True
            records[w].iterations += 1
            records[w].late += 1
    return list(records.values())


def read_reports(path: Path) -> list[master_pb2.IterationReport]:
    """The reports of a history file: the master's ``<job>.jsonl`` or the ``history.json`` a client saves
    (:func:`~gradcode.common.sim.plan.read_history`); ValueError for a file that holds none."""
    rows, _ = read_history(path)
    reports = []
    for row in rows:
        try:
            reports.append(json_format.ParseDict(row, master_pb2.IterationReport(), ignore_unknown_fields=True))
        except json_format.ParseError as exc:
            raise ValueError(
                f"{path}: iteration {row.get('iteration', '?')} is not a report gradcode wrote: {exc}"
            ) from None
    return reports


def format_summary(label: str, reports: Sequence[master_pb2.IterationReport]) -> str:
    """One line on a job's reports: iterations, median time, final loss and accuracy, exactness (verified and
    certified errors, integrity findings), the master's bytes, held backups' slack."""
    if not reports:
        return f"{label}: no iteration finished"
    times = [r.wall_seconds for r in reports]
    last = reports[-1]
    inexact = [r for r in reports if not r.exact]
    unchecked = sum(1 for r in inexact if r.unchecked_workers)
    verified = [r.verify_error for r in reports if r.verify_error >= 0]
    check = f", worst verified error {max(verified):.1e}" if verified else ""
    bounds = [r.error_bound for r in reports if r.error_bound >= 0]
    certified = f", worst certified error {max(bounds):.1e}" if bounds else ""
    suspects = sorted({w for r in reports for w in r.suspect_workers})
    flagged = f", consistency checks flagged workers {suspects}" if suspects else ""
    counted = (
        f" ({len(inexact)} of {len(reports)} iterations not exact"
        + (f", {unchecked} of them unchecked by the integrity checks" if unchecked else "")
        + ")"
        if inexact
        else ""
    )
    evaluated = [r.test_accuracy for r in reports if not math.isnan(r.test_accuracy)]
    accuracy = f"test accuracy {evaluated[-1]:.3f}" if evaluated else "no test accuracy"
    slacks = [r.start_slack_seconds for r in reports if r.start_slack_seconds > 0]
    held = (
        f"; held backups waited {statistics.median(slacks) * 1e3:.1f} ms past the expected workers' beginnings "
        f"(median of {len(slacks)} rounds)"
        if slacks
        else ""
    )
    return (
        f"{label}: {len(reports)} iterations, median {statistics.median(times) * 1e3:.1f} ms/iteration, "
        f"final loss {last.loss:.4f}, {accuracy}, "
        f"{'APPROXIMATE' if inexact else 'exact'} gradients{counted}{check}{certified}{flagged}"
        f"; master received/sent {_megabytes(r.bytes_received for r in reports)}/"
        f"{_megabytes(r.bytes_sent for r in reports)} MB per iteration (median){held}"
    )


def _megabytes(values: Iterable[int]) -> str:
    return f"{statistics.median(values) / 1e6:.3g}"


def format_worker_table(reports: Sequence[master_pb2.IterationReport]) -> str:
    """A table of who straggled: per worker, used, late, failed and spare counts, and its median response time
    beside its own account of it (median seconds getting its model and computing)."""
    lines = ["worker  used  late        failed  spare  median response     model   compute"]
    records = worker_records(reports)
    for rec in records:
        share = f"({rec.late / rec.iterations:.0%})" if rec.iterations else ""
        response, model, compute = (
            "-" if median is None else f"{median * 1e3:.1f} ms"
            for median in (rec.median_response, rec.median_model, rec.median_compute)
        )
        name = f"{rec.worker_id}*" if rec.below_first_layer else f"{rec.worker_id}"
        lines.append(
            f"{name:>6}  {rec.used:>4}  {rec.late:>4} {share:<6} {rec.failed:>6}  {rec.spare:>5}  {response:>15}"
            f"  {model:>8}  {compute:>8}"
        )
    if any(rec.below_first_layer for rec in records):
        lines.append("* a tree node below the first layer: used = delivered to its parent, late = its parent decoded "
                     "without it, response as its parent saw it")  # fmt: skip
    lines.append("model: the worker's seconds getting its model checked (a relayed one: the fetch); compute: its "
                 "computing (a tree parent's: until its children's decode)")  # fmt: skip
    return "\n".join(lines)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def continuous_elapsed(reports: Sequence[master_pb2.IterationReport]) -> tuple[list[float], list[float]]:
    """Each report's time since the job first started, and the times at which it was resumed.

    A resumed job's ``elapsed_seconds`` starts again from 0 (they count from the start of the current run),
    so plotted as they are a resumed job runs backwards. Here a report whose elapsed time is below its
    predecessor's begins a new run, which continues from where the previous run's last report ended.
    """
    times: list[float] = []
    resumes: list[float] = []
    offset = previous = 0.0
    for r in reports:
        if times and r.elapsed_seconds < previous:
            offset = times[-1]
            resumes.append(offset)
        previous = r.elapsed_seconds
        times.append(offset + r.elapsed_seconds)
    return times, resumes


def plot_history(runs: dict[str, Sequence[master_pb2.IterationReport]], path: Path) -> Path:
    """Loss and test accuracy against wall-clock time, one colour per run, saved as PNG.

    The test accuracy is evaluated every few iterations (NaN in between), so only those points are drawn,
    joined and marked; a resumed run's time continues across its resumes, each marked by a dotted line.
    One legend, on the loss panel (the accuracy panel uses the same colours).
    """
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, reports in runs.items():
        t, resumes = continuous_elapsed(reports)
        (line,) = ax_loss.plot(t, [r.loss for r in reports], label=label)
        evaluated = [(ti, r.test_accuracy) for ti, r in zip(t, reports, strict=True) if not math.isnan(r.test_accuracy)]
        if evaluated:
            ax_acc.plot(*zip(*evaluated, strict=True), marker="o", markersize=4, color=line.get_color())
        for i, at in enumerate(resumes):
            for ax in (ax_loss, ax_acc):
                ax.axvline(
                    at,
                    color=line.get_color(),
                    linestyle=":",
                    label=f"{label} resumed" if ax is ax_loss and not i else None,
                )
    ax_loss.set(xlabel="wall-clock time (s)", ylabel="training loss", yscale="log", title="Loss")
    ax_acc.set(xlabel="wall-clock time (s)", ylabel="test accuracy", title="Test accuracy (where evaluated)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    ax_loss.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_workers(reports: Sequence[master_pb2.IterationReport], path: Path) -> Path:
    """Who was late, how often, and by how much, saved as PNG.

    Left: per worker, the share of iterations it was used, late, failed or a spare in. Right: per worker,
    its response time in every iteration it answered (dots), and for every iteration it was late a
    triangle at the time the decodable set was complete — it had not answered by then. A tree's nodes below
    its first layer are marked ``*``: their times are from their parent's request, as it saw them.
    """
    plt = _pyplot()
    records = worker_records(reports)
    labels = [f"{r.worker_id}*" if r.below_first_layer else str(r.worker_id) for r in records]
    x = list(range(len(records)))
    fig, (ax_share, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    bottom = [0.0] * len(records)
    for name, color, counts in (
        ("used", "tab:green", [r.used for r in records]),
        ("late", "tab:orange", [r.late for r in records]),
        ("failed", "tab:red", [r.failed for r in records]),
        ("spare (backup not needed)", "tab:gray", [r.spare for r in records]),
    ):
        shares = [c / r.iterations if r.iterations else 0.0 for c, r in zip(counts, records, strict=True)]
        ax_share.bar(x, shares, bottom=bottom, color=color, label=name)
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    ax_share.set(xlabel="worker", ylabel="share of iterations", title="How often each worker was late", ylim=(0, 1))
    ax_share.set_xticks(x, labels)
    ax_share.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # beside the bars, not on them
    answered = [(i, t) for i, rec in enumerate(records) for t in rec.response_seconds]
    late = [(i, t) for i, rec in enumerate(records) for t in rec.late_by_at_least]
    if answered:
        ax_time.scatter(*zip(*answered, strict=True), s=10, color="tab:blue", alpha=0.5, label="answered")
    if late:
        ax_time.scatter(*zip(*late, strict=True), s=22, marker="^", color="tab:orange",
                        label="late: not answered by this time")  # fmt: skip
    tree = any(r.below_first_layer for r in records)
    ax_time.set(xlabel="worker (*: below a tree's first layer, timed by its parent)" if tree else "worker",
                ylabel="seconds from request", title="Response time per worker")  # fmt: skip
    ax_time.set_xticks(x, labels)
    handles, names = ax_time.get_legend_handles_labels()
    if handles:
        ax_time.legend(handles, names, loc="best")
    for ax in (ax_share, ax_time):
        ax.grid(alpha=0.3, axis="y")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
