"""Smoke test of ``python -m gradcode.bench.soak --quick``: a real master and workers run a few jobs back to
back and the master's memory is read from its /metrics after each. No memory figure is asserted beyond
being there and positive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.bench import soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_quick_soak_reads_the_masters_memory_after_every_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert soak.main(["--quick", "--workers", "3", "--out", str(tmp_path)]) == 0
    assert "growth per 100 jobs" in capsys.readouterr().out
    result = json.loads((tmp_path / "soak.json").read_text())
    samples = result["samples"]
    assert [s["job"] for s in samples] == list(range(len(samples))) and len(samples) >= 3
    assert all(s["rss_bytes"] > 0 for s in samples)
    assert [s["jobs_held"] for s in samples[:3]] == [0, 1, 2]  # each finished job is held (up to the bound)
    assert len(result["loadavg_before"]) == 3
    assert (tmp_path / "soak.png").stat().st_size > 0
