"""Smoke test of ``python -m gradcode.bench.primaries --quick``: every flat scheme that builds at n = 16 and 64 is
timed both ways, with the sets it found and the load; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.bench import primaries


def test_quick_run_times_every_flat_scheme_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    primaries.main(["--quick", "--out", str(tmp_path)])
    assert "decoding_set: ms as shipped" in capsys.readouterr().out
    result = json.loads((tmp_path / "primaries.json").read_text())
    assert (tmp_path / "primaries.png").stat().st_size > 0
    assert len(result["load_before"]) == 3
    rows = result["rows"]
    assert {"binary", "clustered", "fractional", "uncoded"} <= {r["scheme"] for r in rows}
    for r in rows:
        assert r["n"] in primaries.QUICK_SIZES
        for case in ("choose", "complete"):
            assert r[f"{case}_set"] is not None and 0 < r[f"{case}_set"] <= r["n"]
            assert r[f"{case}_shipped_s"] > 0 and r[f"{case}_decoding_again_s"] > 0
