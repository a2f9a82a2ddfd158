"""Per-worker attribution of a job's reports (used, late, failed, spare), and the plots drawn from them."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from gradcode.client.__main__ import main
from gradcode.client.history import (
    continuous_elapsed,
    format_worker_table,
    plot_history,
    plot_workers,
    save_history,
    worker_records,
)
from gradcode.common.transport.wire import message_to_dict
from gradcode.v1 import master_pb2


def _report(**fields: list[int]) -> master_pb2.IterationReport:
    timings = [master_pb2.WorkerTiming(worker_id=w, seconds=0.01 * (w + 1)) for w in fields.get("used_workers", [])]
    return master_pb2.IterationReport(iteration=1, timings=timings, **fields)  # type: ignore[arg-type]


def test_a_backup_the_round_did_not_need_is_spare_one_it_used_is_used_and_neither_is_late() -> None:
    reports = [
        _report(used_workers=[0, 2], backup_workers=[1, 3]),  # both backups spare
        _report(used_workers=[2, 3], late_workers=[0], backup_workers=[1, 3], promoted_workers=[3]),  # 3 covered 0
        _report(used_workers=[0, 2], failed_workers=[1], backup_workers=[1, 3]),  # 1 failed: not spare
    ]
    records = {r.worker_id: r for r in worker_records(reports)}
    counts = {w: (r.iterations, r.used, r.late, r.failed, r.spare) for w, r in records.items()}
    assert counts == {0: (3, 2, 1, 0, 0), 1: (3, 0, 0, 1, 2), 2: (3, 3, 0, 0, 0), 3: (3, 1, 0, 0, 2)}
    table = format_worker_table(reports).splitlines()
    assert table[0].split() == ["worker", "used", "late", "failed", "spare", "median", "response", "model", "compute"]
    assert table[2].split()[:5] == ["1", "0", "0", "(0%)", "1"] and table[2].split()[5] == "2"


def test_the_worker_table_puts_each_workers_own_account_beside_its_response() -> None:
    """Median response, model and compute seconds per worker, a tree's nodes below the first layer included."""
    reports = [
        master_pb2.IterationReport(
            iteration=i, used_workers=[0],
            timings=[
                master_pb2.WorkerTiming(worker_id=0, seconds=0.1 * i, model_seconds=0.01 * i, compute_seconds=0.02 * i)
            ],
            child_timings=[master_pb2.WorkerTiming(worker_id=5, seconds=0.3, model_seconds=0.004, compute_seconds=0.2)],
        )
        for i in (1, 2, 3)
    ]  # fmt: skip
    records = {r.worker_id: r for r in worker_records(reports)}
    assert (records[0].median_model, records[0].median_compute) == (0.02, 0.04)
    rows = {line.split()[0]: line.split() for line in format_worker_table(reports).splitlines()[1:3]}
    assert rows["0"][-6:] == ["200.0", "ms", "20.0", "ms", "40.0", "ms"]
    assert rows["5*"][-6:] == ["300.0", "ms", "4.0", "ms", "200.0", "ms"]


def test_a_csv_history_has_each_workers_seconds_and_its_own_account(tmp_path: Path) -> None:
    report = master_pb2.IterationReport(
        iteration=1, used_workers=[0],
        timings=[master_pb2.WorkerTiming(worker_id=0, seconds=0.5, model_seconds=0.125, compute_seconds=0.25)],
        child_timings=[master_pb2.WorkerTiming(worker_id=3, seconds=0.25, compute_seconds=0.0625)],
    )  # fmt: skip
    with save_history([report], tmp_path / "h.csv").open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert {k: float(v) for k, v in row.items() if k.startswith("worker_")} == {
        "worker_0_seconds": 0.5, "worker_0_model_seconds": 0.125, "worker_0_compute_seconds": 0.25,
        "worker_3_seconds": 0.25, "worker_3_model_seconds": 0.0, "worker_3_compute_seconds": 0.0625,
    }  # fmt: skip


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plotting functions save, drawn (so extents are known) before they are closed."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    save = Figure.savefig

    def keep(fig: Any, *args: Any, **kwargs: Any) -> None:
        save(fig, *args, **kwargs)
        figures.append(fig)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _run(iterations: range, start: float = 0.0) -> list[master_pb2.IterationReport]:
    """Reports with the test accuracy evaluated every 10 iterations (NaN between), 0.1 s apart from ``start``."""
    timings = [master_pb2.WorkerTiming(worker_id=w, seconds=0.01) for w in (0, 1)]
    reports = []
    for k, i in enumerate(iterations):
        accuracy = 0.5 + i / 100 if i % 10 == 0 else math.nan
        reports.append(
            master_pb2.IterationReport(
                iteration=i,
                loss=1.0 / i,
                elapsed_seconds=start + 0.1 * (k + 1),
                test_accuracy=accuracy,
                used_workers=[0, 1],
                late_workers=[2] if i % 3 else [],
                timings=timings,
            )
        )
    return reports


def test_the_accuracy_panel_draws_the_evaluated_points_with_markers(tmp_path: Path, drawn: list[Any]) -> None:
    plot_history({"binary": _run(range(1, 31))}, tmp_path / "h.png")
    accuracy = drawn[0].axes[1]
    points = [
        (x, y) for line in accuracy.get_lines() if line.get_marker() not in ("None", "", None)
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True) if not math.isnan(y)
    ]  # fmt: skip
    assert [round(y, 2) for _, y in points] == [0.6, 0.7, 0.8]  # iterations 10, 20, 30, each visible


def test_a_resumed_job_runs_forward_with_one_legend(tmp_path: Path, drawn: list[Any]) -> None:
    """After a resume elapsed_seconds starts again at 0 (iteration 61 at 6.72 s, 62 at 0.25 s)."""
    reports = _run(range(1, 26)) + _run(range(26, 41))  # the second part's elapsed time restarts
    times, resumes = continuous_elapsed(reports)
    assert times == sorted(times) and resumes == [pytest.approx(2.5)]
    assert times[25] == pytest.approx(2.6)
    plot_history({"job": reports}, tmp_path / "h.png")
    loss = drawn[0].axes[0].get_lines()[0].get_xdata()
    assert list(loss) == sorted(loss)
    assert sum(ax.get_legend() is not None for ax in drawn[0].axes) == 1


def test_the_workers_legend_covers_no_bar(tmp_path: Path, drawn: list[Any]) -> None:
    plot_workers(_run(range(1, 31)), tmp_path / "w.png")
    share = drawn[0].axes[0]
    legend = share.get_legend().get_window_extent()
    bars = [p.get_window_extent() for p in share.patches if p.get_height() > 0]
    assert bars and not any(legend.overlaps(bar) for bar in bars)


def _account_reports() -> list[master_pb2.IterationReport]:
    return [
        master_pb2.IterationReport(
            job_id="j", iteration=i, loss=1.0 / i, exact=True, wall_seconds=0.5, used_workers=[3],
            timings=[master_pb2.WorkerTiming(worker_id=3, seconds=0.5, model_seconds=0.125, compute_seconds=0.25)],
        )
        for i in (1, 2, 3)
    ]  # fmt: skip


def test_gradcode_history_summarises_a_masters_or_a_clients_history_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = _account_reports()
    masters = tmp_path / "job.jsonl"  # as the master writes it: one report per line
    masters.write_text("".join(json.dumps(message_to_dict(r)) + "\n" for r in reports))
    clients = save_history(reports, tmp_path / "history.json")
    for path, skip, iterations in ((masters, 0, 3), (clients, 1, 2)):
        assert main(["history", str(path), "--skip", str(skip)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"{path.name}: {iterations} iterations, median 500.0 ms/iteration"), out
        assert out[2].split()[-6:] == ["500.0", "ms", "125.0", "ms", "250.0", "ms"], out  # worker 3's row


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no iteration reports"),
        ('{"iteration": "three", "timings": []}\n', "iteration three is not a report gradcode wrote"),
        ("not json\n", "job.jsonl is not a history gradcode wrote (JSON reports"),
    ],
)
def test_gradcode_history_refuses_a_file_it_cannot_read_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "job.jsonl"
    path.write_text(content)
    assert main(["history", str(path)]) == 1
    assert message in capsys.readouterr().err


def test_gradcode_history_refuses_a_missing_file_and_a_negative_skip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["history", str(tmp_path / "missing.jsonl")])
    assert exited.value.code == 2 and "missing.jsonl: no such file" in capsys.readouterr().err
    path = save_history(_account_reports(), tmp_path / "history.json")
    assert main(["history", str(path), "--skip", "-1"]) == 1
    assert "--skip must be 0 or more iterations, not -1" in capsys.readouterr().err
