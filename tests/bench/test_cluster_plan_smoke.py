"""``gradcode bench cluster-plan`` (issue 29's third target): heterogeneous hosts, a probe, the plan, and its ranked
configurations measured in interleaved rounds. The parts without hosts are checked everywhere; the run itself needs
root and ``ip netns`` (skipped, saying why, otherwise)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradcode.bench import cluster_plan
from gradcode.bench import testbed as testbed_module
from gradcode.bench.cluster_plan import Layout, judge
from gradcode.common.sim.plan import PlanRow
from gradcode.common.sim.stragglers import make_delay_model
from tests.bench.test_cluster_smoke import needs_testbed


def test_layouts_the_machine_cannot_give_are_refused_saying_why() -> None:
    with pytest.raises(ValueError, match=r"quotas add up to 1860 % of a core, more than this machine's \d+ cores"):
        Layout(n=8, slow_hosts=2, fast_cpu=300, slow_cpu=10, master_cpu=40)
    with pytest.raises(ValueError, match=r"slow_hosts must be in \[0, 4\) \(some host must be fast\), not 4"):
        Layout(n=4, slow_hosts=4)
    with pytest.raises(ValueError, match=r"delayed must be in \[0, 2\] \(the fast hosts\), not 3"):
        Layout(n=4, slow_hosts=2, delayed=3)
    with pytest.raises(ValueError, match="n must be at least 2 worker hosts, not 1"):
        Layout(n=1, slow_hosts=0, delayed=0)


def test_the_slow_hosts_are_the_last_and_the_straggler_law_follows_the_delayed_hosts_to_their_code_index() -> None:
    layout = Layout(n=4, slow_hosts=1, fast_cpu=30, slow_cpu=10, delayed=1, delay_mean=0.04)
    assert [(h.role, h.cpu_percent) for h in layout.specs()] == [
        ("m", 40.0), ("w0", 30.0), ("w1", 30.0), ("w2", 30.0), ("w3", 10.0)
    ]  # fmt: skip
    order = ["w2", "w3", "w0", "w1"]  # code index 2 runs on host w0, the delayed one
    delays = layout.delays(order, seed=5)
    model = make_delay_model(delays.model, delays.params, delays.seed)
    draws = [[model.delay(i, t) for t in range(1, 400)] for i in range(4)]
    assert all(d == 0.0 for i in (0, 1, 3) for d in draws[i])
    assert sum(draws[2]) / len(draws[2]) == pytest.approx(0.04, rel=0.2) and min(draws[2]) > 0
    assert Layout(n=4, slow_hosts=1, delayed=0).delays(order, 0).model == "none"


def _entry(name: str, predicted: float, rounds: list[float], recommended: bool = False) -> dict[str, object]:
    rounds_sorted = sorted(rounds)
    return {
        "system": name, "predicted_s": predicted, "rounds_s": rounds,
        "measured_s": rounds_sorted[len(rounds) // 2], "recommended": recommended,
    }  # fmt: skip


def test_the_verdict_reports_the_ratio_and_both_readings_of_no_slower() -> None:
    held = judge([_entry("a", 0.10, [0.105, 0.11, 0.108], True), _entry("b", 0.12, [0.13, 0.12, 0.125])])
    assert held["ratio"] == pytest.approx(1.08) and held["within_tolerance"]
    assert held["no_slower_strict"] and held["no_slower_within_spread"] and held["best_alternative"] == "b"
    # Slower than b's median but not than b's slowest round: only the reading within the spread holds.
    close = judge([_entry("a", 0.10, [0.123, 0.124, 0.122], True), _entry("b", 0.12, [0.12, 0.121, 0.125])])
    assert not close["no_slower_strict"] and close["no_slower_within_spread"]
    missed = judge([_entry("a", 0.10, [0.2, 0.2, 0.2], True), _entry("b", 0.12, [0.1, 0.1, 0.1])])
    assert not missed["within_tolerance"] and not missed["no_slower_within_spread"]
    assert missed["versus_best"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="exactly one entry must be the recommendation, not 0"):
        judge([_entry("b", 0.12, [0.1])])


def test_a_plan_row_becomes_the_system_the_cluster_runs() -> None:
    row = PlanRow(1, "fractional", "n=8 s=1", {"n": 8, "s": 1}, 8, tuple(range(8)), 0.06, 0.05, 0.07, 6.0)
    system = cluster_plan._system(row, 8)
    assert (system.name, system.scheme, system.workers, system.code_params) == (
        "fractional n=8 s=1", "fractional", 8, {"n": 8, "s": 1}
    )  # fmt: skip
    assert cluster_plan._system(None, 8).code_params == {"n": 8}


def test_a_plan_row_leaving_hosts_out_runs_on_its_workers_in_code_index_order() -> None:
    ids = [3, 5, 8, 9]
    host_of = {3: "w0", 5: "w1", 8: "w2", 9: "w3"}
    row = PlanRow(1, "uncoded", "n=3", {"n": 3}, 3, (3, 8, 9), 0.06, 0.05, 0.07, 6.0)
    assert cluster_plan._placement(row, ids, host_of) == ([3, 8, 9], ["w0", "w2", "w3"])
    assert cluster_plan._placement(None, ids, host_of) == (ids, ["w0", "w1", "w2", "w3"])


def test_the_command_refuses_without_root_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(testbed_module.os, "geteuid", lambda: 1000)
    assert cluster_plan.main(["--quick"]) == 2
    assert "gradcode bench cluster-plan: the emulated cluster needs root" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.slow
@needs_testbed
def test_a_quick_run_probes_plans_and_measures_every_ranked_configuration_exactly(tmp_path: Path) -> None:
    assert cluster_plan.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "cluster-plan.json").read_text())
    assert (tmp_path / "cluster-plan.png").stat().st_size > 0
    summary = result["summary"]
    assert sum(e["recommended"] for e in summary) == 1 and summary[0]["recommended"]
    assert summary[0]["system"] == f"{result['plan'][0]['scheme']} {result['plan'][0]['parameters']}"
    assert any(e["scheme"] == "uncoded" for e in summary)  # the probe's own configuration is measured too
    assert all(e["exact"] for e in summary) and all(j["exact"] for j in result["jobs"])
    assert sorted(e["measured_rank"] for e in summary) == list(range(1, len(summary) + 1))
    assert math.isfinite(result["verdict"]["ratio"]) and result["verdict"]["ratio"] > 0
    assert len(result["order"]) == 4 and sorted(result["order"]) == ["w0", "w1", "w2", "w3"]
