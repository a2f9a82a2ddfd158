"""Smoke test of ``python -m gradcode.bench.integrity --quick``: a real master and six workers run one job per
(straggler model, consistency policy). No timing is asserted; only that every figure is there, with its load,
and that the policies did what they say (no checks under off, at least one per iteration otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.bench import integrity


@pytest.mark.e2e
def test_quick_run_measures_every_policy_under_every_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert integrity.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "vs off" in capsys.readouterr().out
    result = json.loads((tmp_path / "integrity.json").read_text())
    summary = result["summary"]
    assert {(e["straggler"], e["policy"]) for e in summary} == {
        (m, p) for m in integrity.STRAGGLERS for p in integrity.POLICIES
    }
    for e in summary:
        assert e["median_wall_s"] > 0 and e["loadavg_1min"] >= 0 and e["all_exact"]
        assert (e["checks_per_iteration"] == 0) == (e["policy"] == "off")
    assert all(len(row["loadavg"]) == 3 for row in result["raw"])
    assert (tmp_path / "integrity.png").stat().st_size > 0
