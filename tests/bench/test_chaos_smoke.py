"""Smoke test of ``python -m gradcode.bench.chaos --quick``: a real master and eight workers run one verified job
of every scheme (a tree too) while workers are frozen and killed. Every job must succeed with every iteration
exact (the benchmark's exit status says so), and the failures must really have been inflicted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.bench import chaos

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_quick_chaos_keeps_every_gradient_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = chaos.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "chaos.json").read_text())
    assert status == 0, out
    assert result["jobs"] == len(chaos.SCHEMES) and result["failed_jobs"] == [] and result["inexact"] == 0
    assert result["iterations"] == len(chaos.SCHEMES) * chaos.JOB_ITERATIONS
    assert 0 <= result["worst_error"] <= 1e-9
    assert result["freezes"] + result["kills"] >= 1, out
    assert len(result["loadavg_before"]) == 3
    assert (tmp_path / "chaos.png").stat().st_size > 0
