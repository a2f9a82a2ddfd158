"""Smoke test of ``python -m gradcode.bench.training --quick``: a real gradcode cluster, real torch.distributed
(gloo) ranks and, where Open MPI and mpi4py are installed, real MPI ranks on loopback run every configuration on
two straggler seeds and the outputs are saved. No timing is asserted: only that every figure is there beside its
ideal, every system followed the same (exact) trajectory, and the files were written. The ideal itself is
checked on draws whose answer is known."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest

from gradcode.bench import training
from gradcode.common.codes.registry import code_class, make_code
from gradcode.common.sim.stragglers import make_delay_model


@pytest.mark.slow
def test_quick_training_benchmark_runs_every_system_on_every_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    training.main(["--quick", "--backups", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "Per-iteration time" in printed and "Pareto delays" in printed and "Targets:" in printed
    results = json.loads((tmp_path / "training.json").read_text())
    if sys.platform == "linux":  # the dev extra installs mpi4py and Open MPI's wheel there: the baseline must run
        assert training.mpi_unavailable() is None, training.mpi_unavailable()
    baselines = [training.GLOO] + ([] if training.mpi_unavailable() else [training.MPI])
    if training.mpi_unavailable():
        assert "The MPI baseline is skipped" in printed
    systems = [*training.SCHEMES, *baselines]
    assert results["systems"] == systems and results["quick"] is True
    seeds = results["seeds"]
    assert len(seeds) == training.QUICK_SEEDS and len(set(seeds)) == len(seeds)

    raw = results["raw"]
    assert len(raw["sweep"]) == len(training.QUICK_CONFIGS) * len(systems) * len(seeds)
    assert sorted({r["seed"] for r in raw["pareto"]}) == seeds  # a new draw each round, every system on it
    for row in raw["sweep"] + raw["pareto"]:
        assert row["exact"] and len(row["load_before"]) == 3 and len(row["load_after"]) == 3
        assert math.isfinite(row["period_s"]) and row["period_s"] > 0
    assert all(0 <= error < 1e-9 for error in raw["verify_max_error"].values())
    assert len(raw["verify_max_error"]) == len(training.SCHEMES) * (len(training.QUICK_CONFIGS) + 1)

    summary = results["summary"]
    for entry in summary["sweep"]:
        assert entry["best_coded"] in training.SCHEMES[1:]
        for system in [*systems, training.ALLREDUCE]:
            cell = entry[system]
            assert len(cell["period_s"]["values"]) == len(seeds)
            assert cell["period_s"]["q1"] <= cell["period_s"]["median"] <= cell["period_s"]["q3"]
            assert all(ideal > 0 for ideal in cell["ideal_s"]["values"])
            ratios = [p / i for p, i in zip(cell["period_s"]["values"], cell["ideal_s"]["values"], strict=True)]
            assert cell["over_ideal"]["median"] == pytest.approx(statistics.median(ratios))
        # allreduce is, per round, the faster baseline.
        for k in range(len(seeds)):
            fastest = min(entry[b]["period_s"]["values"][k] for b in baselines)
            assert entry[training.ALLREDUCE]["period_s"]["values"][k] == fastest

    # Every system is exact and steps with the same rule from the same start: the same loss curve.
    for seed in seeds:
        final = {row["system"]: row["loss"][-1] for row in raw["pareto"] if row["seed"] == seed}
        assert set(final) == set(systems)
        reference = final["uncoded"]
        assert all(abs(loss - reference) <= 1e-9 * reference for loss in final.values()), final
    pareto = summary["pareto"]
    for system in [*systems, training.ALLREDUCE]:
        q = pareto["systems"][system]
        assert all(t > 0 for t in q["time_to_target_s"]["values"])
        assert all(i > 0 for i in q["ideal_s"]["values"])
    assert [t["what"] for t in summary["targets"]]  # every target is reported with its value

    # Backups at low priority against every worker asked alike: the same configurations, interleaved, both exact.
    backups = raw["backups"]
    assert {(r["system"], r["backup_priority"]) for r in backups} == {
        (scheme, priority) for scheme in training.SCHEMES[1:] for priority in ("low", "normal")
    }
    assert "Backups at low priority" in printed
    assert (tmp_path / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_to_target_is_the_first_crossing() -> None:
    assert training.time_to_target([1.0, 2.0, 3.0], [5.0, 3.0, 1.0], 3.0) == 2.0
    assert math.isnan(training.time_to_target([1.0, 2.0], [5.0, 4.0], 3.0))


def test_gradcode_evaluates_no_more_than_the_allreduces_do() -> None:
    """The held-out accuracy once, after the last step (the baselines evaluate nothing): not every 10th iteration
    beside the rounds the benchmark times."""
    for iterations in (4, 12, 100):
        spec = training._spec(training.QUICK, "fractional", 1, training.Delays("none"), iterations)
        assert spec.evaluate_every == spec.iterations == iterations


def test_the_ideal_of_an_allreduce_waits_for_every_rank_and_a_code_for_a_decodable_set() -> None:
    n, solo, busy, cores = 6, 0.010, 0.012, 2
    draws = make_delay_model("fixed", {"delay_seconds": 0.25, "random_worker": True, "num_workers": n, "count": 1}, 3)
    uncoded = make_code("uncoded", n=n)
    ideal, partitions = training.ideal_iterations(
        uncoded, draws, 5, gradient_solo_s=solo, gradient_busy_s=busy, cores=cores
    )
    assert ideal == pytest.approx([0.25 + solo] * 5)  # the delayed rank, then its own partition
    assert partitions == pytest.approx([n] * 5)

    # Fractional repetition, s = 1: the delayed worker's group partner covers it; the step needs every partition
    # once (6 partitions over 2 cores) and each worker's two partitions alone take 2 * solo: the larger counts.
    fractional = make_code("fractional", n=n, s=1)
    ideal, partitions = training.ideal_iterations(
        fractional, draws, 5, gradient_solo_s=solo, gradient_busy_s=busy, cores=cores
    )
    assert partitions == pytest.approx([n] * 5)
    assert ideal == pytest.approx([max(2 * solo, n * busy / cores)] * 5)

    # With no delay at all, the ideal is the compute floor of what each scheme needs, never below one worker alone.
    none = make_delay_model("none", {}, 0)
    cyclic = make_code("cyclic", n=n, s=1)
    ideal, partitions = training.ideal_iterations(cyclic, none, 3, gradient_solo_s=solo, gradient_busy_s=busy, cores=1)
    assert partitions == pytest.approx([(n - 1) * 2] * 3)  # n - s workers of two partitions each
    assert ideal == pytest.approx([(n - 1) * 2 * busy] * 3)


def test_under_pareto_draws_a_code_is_never_ideally_slower_than_waiting_for_everyone() -> None:
    n = 6
    draws = make_delay_model("pareto", dict(training.PARETO), 5)
    kwargs = {"gradient_solo_s": 0.01, "gradient_busy_s": 0.01, "cores": 2}
    everyone, _ = training.ideal_iterations(make_code("uncoded", n=n), draws, 50, **kwargs)
    for scheme in ("fractional", "binary", "reed_solomon"):
        coded, _ = training.ideal_iterations(code_class(scheme).for_stragglers(n, 1), draws, 50, **kwargs)
        # Each worker computes two partitions, so a round without a straggler may ideally take longer (one worker's
        # 2 x solo against 1 x solo), but never more than that.
        assert all(c <= e + 0.01 + 1e-12 for c, e in zip(coded, everyone, strict=True)), scheme
        assert sum(coded) < sum(everyone)


def test_the_mpirun_started_is_the_one_beside_this_python_then_the_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mpi extra's Open MPI wheel puts mpirun beside the environment's python, which need not be on PATH (a
    virtual environment used without activating it): that one first, then PATH's, else the baseline is unavailable
    and says why."""

    def executable(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    python = executable(tmp_path / "venv" / "bin" / "python")
    on_path = executable(tmp_path / "elsewhere" / "mpirun")
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert training.mpirun() == str(on_path)
    beside = executable(python.with_name("mpirun"))
    assert training.mpirun() == str(beside)
    beside.chmod(0o644)  # not executable: not an mpirun
    assert training.mpirun() == str(on_path)
    monkeypatch.setenv("PATH", os.devnull)
    assert training.mpirun() is None
    reason = training.mpi_unavailable()
    assert reason is not None and ("no mpirun beside this Python or on PATH" in reason or "mpi4py" in reason)
