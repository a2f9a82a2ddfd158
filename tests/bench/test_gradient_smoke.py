"""Smoke test of ``gradcode bench gradient --quick``: both block rules time every batch, give the same gradient and
save their outputs. No timing is asserted, only that every figure is there and positive."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradcode.bench import gradient


def test_quick_gradient_benchmark_times_both_rules_on_every_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gradient.main(["--quick", "--out", str(tmp_path)])
    assert "row blocks ms" in capsys.readouterr().out
    results = json.loads((tmp_path / "gradient.json").read_text())
    assert (tmp_path / "gradient.png").stat().st_size > 0
    assert results["quick"] is True and len(results["load_before"]) == 3
    assert {(r["kind"], r["rows"], r["features"]) for r in results["rows"]} == {
        (kind, rows, features) for rows, features in gradient.QUICK_BATCHES for kind in gradient.KINDS
    }
    for row in results["rows"]:
        assert row["same_gradient"] is True
        for key in ("shipped_s", "row_blocks_s", "ratio_median", "ratio_min", "ratio_max"):
            assert math.isfinite(row[key]) and row[key] > 0


def test_the_row_block_rule_is_the_one_before_and_the_shipped_one_is_not() -> None:
    """At 70,000 features a 2 MB block holds 3 rows: the rule before blocks them, the shipped one does not."""
    shipped, row_blocks = gradient._models("linear", 70_000)
    assert (shipped.min_block_rows, row_blocks.min_block_rows) == (4, 1)
    assert type(row_blocks).block_bytes == type(shipped).block_bytes
