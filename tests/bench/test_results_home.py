"""Benchmark outputs live in the repository's docs/results, not inside the import package; their figures are
written and closed by one helper."""

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from gradcode.bench.output import RESULTS, figure

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_writes_results_to_docs_results() -> None:
    assert RESULTS == ROOT / "docs" / "results"
    assert (RESULTS / "wide.json").is_file(), "the committed results moved with the default"


def test_the_package_holds_no_results() -> None:
    outputs = [path for path in (ROOT / "gradcode").rglob("*") if path.suffix in {".json", ".png"}]
    assert outputs == []


def test_a_figure_is_written_when_its_block_ends_and_closed_even_when_the_drawing_fails(tmp_path: Path) -> None:
    open_before = len(plt.get_fignums())
    with figure(tmp_path / "two.png", 1, 2, figsize=(4, 2), dpi=50) as (left, right):
        left.plot([0, 1], [1, 0])
        right.bar([0, 1], [1, 2])
    assert (tmp_path / "two.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ZeroDivisionError), figure(tmp_path / "bad.png", figsize=(2, 2), dpi=50) as ax:
        ax.plot([0], [1 / 0])
    assert not (tmp_path / "bad.png").exists() and len(plt.get_fignums()) == open_before
