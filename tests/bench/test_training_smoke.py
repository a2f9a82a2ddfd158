"""Smoke test of ``python -m gradcode.bench.training --quick``: a real gradcode cluster and real torch.distributed
(gloo) ranks on loopback run every configuration and the outputs are saved. No timing is asserted: only that
every figure is there, every system followed the same (exact) trajectory, and the files were written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradcode.bench import training


@pytest.mark.slow
def test_quick_training_benchmark_runs_both_systems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    training.main(["--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "Per-iteration time" in printed and "Pareto delays" in printed
    results = json.loads((tmp_path / "training.json").read_text())
    systems = [*training.SCHEMES, training.ALLREDUCE]
    assert results["systems"] == systems and results["quick"] is True

    raw = results["raw"]
    expected = len(training.QUICK_DELAYS) * len(training.QUICK_STRAGGLERS) * len(systems) * training.QUICK_ROUNDS
    assert len(raw["sweep"]) == expected
    for row in raw["sweep"] + raw["pareto"]:
        assert row["exact"] and len(row["load_before"]) == 3 and len(row["load_after"]) == 3
        assert math.isfinite(row["period_s"]) and row["period_s"] > 0
    assert all(0 <= error < 1e-9 for error in raw["verify_max_error"].values())

    # The compute floor: the gradients each step needed (in partitions of 1/n of the data) and their CPU.
    n = results["workload"]["n"]
    assert "compute floor" in printed
    for row in raw["sweep"] + raw["pareto"]:
        if row["system"] in ("uncoded", training.ALLREDUCE):
            assert row["partitions_needed"] == pytest.approx(n)  # every partition, once
        else:  # a decodable set covers every partition, at most s + 1 times
            assert n - 1e-9 <= row["partitions_needed"] <= n * (row["s"] + 1) + 1e-9, row
        if row["system"] == training.ALLREDUCE:
            assert 0 < row["gradient_cpu_s"] < row["period_s"] * n
    for entry in results["summary"]["sweep"]:
        assert entry["gradient_cpu_s"] > 0
        for system in systems:
            cell = entry[system]
            assert cell["floor_s"] == pytest.approx(
                cell["partitions_needed"] * entry["gradient_cpu_s"] / results["summary"]["cores"]
            )
            assert cell["over_floor"] == pytest.approx(cell["period_s"] / cell["floor_s"])

    # Every system is exact and steps with the same rule from the same start: the same loss curve.
    final = {row["system"]: row["loss"][-1] for row in raw["pareto"]}
    assert set(final) == set(systems)
    reference = final["uncoded"]
    assert all(abs(loss - reference) <= 1e-9 * reference for loss in final.values()), final
    assert len({len(row["loss"]) for row in raw["pareto"]}) == 1

    # Backups at low priority against every worker asked alike: the same configurations, interleaved, both exact.
    backups = raw["backups"]
    coded = training.SCHEMES[1:]
    assert sorted((r["system"], r["backup_priority"]) for r in backups) == sorted(
        (scheme, priority) for scheme in coded for priority in ("low", "normal")
    )
    assert all(r["exact"] and r["delay_s"] == 0.0 for r in backups)
    final_sweep = {r["system"]: r["loss"][-1] for r in raw["sweep"]}  # same draws, same step: the same losses
    assert all(abs(r["loss"][-1] - final_sweep[r["system"]]) <= 1e-9 * final_sweep[r["system"]] for r in backups)
    assert "Backups at low priority" in printed
    for entry in results["summary"]["backups"]:
        assert entry["low_over_normal"] == pytest.approx(entry["low"]["period_s"] / entry["normal"]["period_s"])

    pareto = results["summary"]["pareto"]
    assert pareto["target_loss"] == pytest.approx(reference * (1 + training.LOSS_TOLERANCE))
    for system in systems:  # every system reaches the target: the final loss is below it
        assert pareto["systems"][system]["time_to_target_s"] > 0
    assert (tmp_path / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_to_target_is_the_first_crossing() -> None:
    assert training.time_to_target([1.0, 2.0, 3.0], [5.0, 3.0, 1.0], 3.0) == 2.0
    assert math.isnan(training.time_to_target([1.0, 2.0], [5.0, 4.0], 3.0))
