"""Benchmark outputs live in the repository's docs/results, not inside the import package."""

from pathlib import Path

from gradcode.bench.output import RESULTS

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_writes_results_to_docs_results() -> None:
    assert RESULTS == ROOT / "docs" / "results"
    assert (RESULTS / "wide.json").is_file(), "the committed results moved with the default"


def test_the_package_holds_no_results() -> None:
    outputs = [path for path in (ROOT / "gradcode").rglob("*") if path.suffix in {".json", ".png"}]
    assert outputs == []
