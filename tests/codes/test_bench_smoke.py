"""Smoke test of ``python -m gradcode.bench.decode --quick``: the whole benchmark path runs and saves its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.bench import decode, numerics

pytestmark = pytest.mark.slow


def test_quick_decode_benchmark_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    decode.main(["--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "Decoding coefficients" in printed
    assert "Combine" in printed
    results = json.loads((tmp_path / "decode.json").read_text())
    assert [row["n"] for row in results["coefficients"]] == list(decode.QUICK_SIZES)
    for row in results["coefficients"]:
        assert row["f"] == row["n"] - row["s"]
        assert all(row[f"{method}_s"] > 0 for method in ("rs_fast", "rs_alg3", "rs_online", "lstsq", "lu"))
    assert results["combine"] and all(row["ratio"] > 0 for row in results["combine"])
    assert (tmp_path / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_numerics_benchmark_reports_certified_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    numerics.main(["--sizes", "6", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "certified" in printed and "/proc/loadavg" in printed
    document = json.loads((tmp_path / "numerics.json").read_text())
    measured = [r for r in document["results"] if r["status"] == "ok"]
    assert {r["scheme"] for r in measured} >= {"binary", "fractional", "cyclic", "reed_solomon"}
    for r in measured:
        assert set(r["kinds"]) == {
            f"{k}/{m}" for k in ("contiguous", "random", "adversarial") for m in ("equal", "spread")
        }
        assert all(v["true"] <= v["certified"] for v in r["kinds"].values()), r
    assert (tmp_path / "numerics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
