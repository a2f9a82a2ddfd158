"""``python -m gradcode.bench.versus``: this checkout against a commit, each side on a real cluster of its own code.

No timing is asserted: that both sides ran, each on the code it was meant to (the base from a throw-away worktree,
this side from this checkout: an editable install must not shadow either), interleaved, with the ratios computed
from the runs, and that a bad commit or job is refused with what would be valid."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gradcode.bench import versus


@pytest.mark.e2e
def test_both_sides_run_their_own_code_interleaved_and_the_worktree_is_removed(tmp_path: Path) -> None:
    result = versus.run("HEAD", job_name="uncoded", n=2, pairs=2, iterations=8, out=tmp_path)
    runs = result["runs"]
    assert [(r["pair"], r["side"]) for r in runs] == [(0, "base"), (0, "this"), (1, "this"), (1, "base")]
    assert {r["checkout"] for r in runs if r["side"] == "this"} == {str(versus.CHECKOUT)}
    base_checkouts = {r["checkout"] for r in runs if r["side"] == "base"}
    assert len(base_checkouts) == 1 and str(versus.CHECKOUT) not in base_checkouts
    (base_checkout,) = base_checkouts
    assert not Path(base_checkout).exists()  # the worktree is gone ...
    worktrees = subprocess.run(
        ["git", "-C", str(versus.CHECKOUT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert base_checkout not in worktrees  # ... and git forgot it
    for r in runs:
        assert r["period_s"] > 0 and r["cpu_master_s"] >= 0 and r["load"] >= 0
    this0, base0 = runs[1], runs[0]
    assert result["ratios"]["period_s"]["pairs"][0] == pytest.approx(this0["period_s"] / base0["period_s"])
    saved = json.loads((tmp_path / "versus.json").read_text())
    assert saved["base"] == result["base"] and len(saved["runs"]) == 4
    assert (tmp_path / "versus.png").stat().st_size > 0


def test_a_commit_that_does_not_exist_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="'no-such-commit-7f3' names no commit"):
        versus.run("no-such-commit-7f3", job_name="uncoded", n=2, pairs=1, iterations=8, out=tmp_path)
    with pytest.raises(SystemExit) as exited:
        versus.main(["no-such-commit-7f3", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "names no commit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("job", "n", "pairs", "iterations", "message"),
    [
        ("1 worker", 16, 1, 8, r"No job '1 worker' at n = 16; the jobs are \['cyclic', 'tree', 'uncoded'\]"),
        ("tree", 16, 1, 8, r"No tree at n = 16; bench cluster's trees are at n = \[6, 12, 24\]"),
        ("uncoded", 2, 0, 8, "pairs must be >= 1"),
        ("uncoded", 2, 1, 4, "iterations >= 5"),
    ],
)
def test_a_job_it_cannot_run_is_refused_with_what_would_do(
    tmp_path: Path, job: str, n: int, pairs: int, iterations: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        versus.run("HEAD", job_name=job, n=n, pairs=pairs, iterations=iterations, out=tmp_path)
    assert not (tmp_path / "versus.json").exists()


def test_the_tree_job_is_bench_clusters_tree_and_runs_as_one_on_this_checkout(tmp_path: Path) -> None:
    """``--job tree``: bench cluster's CodedReduce tree at n (6: two children per parent, two layers, 6 workers), the
    model relayed, the master allowing p = 1e6; measured here on a small p, on real processes, as a side runs it."""
    job = versus._job("tree", None, 8)
    assert job["code_params"] == {"n": 4, "s": 1, "L": 2} and job["n"] == 20
    assert job["num_features"] == 999_999 and job["master_args"] == ["--max-features", "1000000"]
    job = {**versus._job("tree", 6, 8), "num_features": 99}
    assert job["code_params"] == {"n": 2, "s": 1, "L": 2} and job["n"] == 6 and job["model_delivery"] == "relay"
    measured = versus._measure(versus.CHECKOUT, job, tmp_path / "run")
    assert measured["period_s"] > 0 and measured["checkout"] == str(versus.CHECKOUT)
    assert 0 < measured["cpu_busiest_worker_s"] <= measured["cpu_workers_s"]
