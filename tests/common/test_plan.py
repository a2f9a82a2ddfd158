"""The planner: censored fits of each worker from a history, and configurations ranked by simulation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradcode.client.__main__ import main
from gradcode.common.codes import make_code
from gradcode.common.sim.plan import (
    Excess,
    FittedDelays,
    candidate_codes,
    candidate_configurations,
    delivery_from_spec,
    fit_workers,
    plan,
    read_history,
    straggler_from_spec,
    surplus_from_spec,
)
from gradcode.common.sim.simulate import Costs
from gradcode.common.sim.stragglers import FixedDelay

N = 8
SHIFT = 0.01


def history(excess: list[float], iterations: int, *, late: int, seed: int = 0) -> list[dict[str, Any]]:
    """Reports as the master writes them: each worker takes SHIFT + Exp(mean excess[w]); the round decodes at the
    (N - late)-th time and the ``late`` slowest are cancelled (no timing, listed late), with pool ids 10..17."""
    rng = np.random.default_rng(seed)
    reports = []
    for t in range(iterations):
        times = SHIFT + rng.exponential(excess)
        order = np.argsort(times)
        kept, cut = order[: N - late], order[N - late :]
        reports.append(
            {
                "iteration": t + 1,
                "timings": [{"worker_id": 10 + int(w), "seconds": float(times[w])} for w in kept],
                "late_workers": sorted(10 + int(w) for w in cut),
                "used_workers": sorted(10 + int(w) for w in kept),
            }
        )
    return reports


def test_censored_fit_recovers_a_straggler_that_dropping_late_rounds_would_call_fast() -> None:
    excess = [0.01] * (N - 1) + [0.2]
    reports = history(excess, 300, late=2)
    fits = fit_workers(reports)
    assert [f.worker_id for f in fits] == list(range(10, 18))
    slow = fits[-1]
    assert slow.censored > 200  # mostly late
    assert 1.0 / slow.rate == pytest.approx(0.2, rel=0.3)
    observed = [t["seconds"] for r in reports for t in r["timings"] if t["worker_id"] == 17]
    assert np.mean(observed) - SHIFT < 0.2 / 2  # what a fit that dropped the late rounds would believe
    for f in fits[:-1]:
        assert 1.0 / f.rate == pytest.approx(0.01, rel=0.3) and f.shift == pytest.approx(SHIFT, abs=1e-3)


def test_plan_recommends_tolerating_the_two_slow_hosts_with_an_interval_and_runners_up() -> None:
    codes = [make_code("uncoded", n=N), make_code("fractional", n=N, s=1), make_code("binary", n=N, s=2)]
    fractional = codes[1]
    partner = next(w for w in range(1, N) if fractional.partitions_of_worker(w) == fractional.partitions_of_worker(0))
    excess = [0.5 if w in (0, partner) else 0.001 for w in range(N)]  # both hosts of one fractional group slow
    reports = history(excess, 80, late=0, seed=1)
    rows, _ = plan(reports, make_code("uncoded", n=N), iterations=60, bootstrap=8, top=2, candidates=codes)
    assert [r.scheme for r in rows] == ["binary", "fractional", "uncoded"]
    best = rows[0]
    assert best.low_seconds <= best.mean_seconds <= best.high_seconds and best.low_seconds < best.high_seconds
    assert best.mean_seconds < 0.1 < rows[-1].mean_seconds  # uncoded waits for the 0.5 s stragglers
    assert rows[-1].low_seconds == rows[-1].high_seconds == rows[-1].mean_seconds  # outside the top: no bootstrap


def test_candidates_are_exact_and_include_the_trees_that_fit() -> None:
    codes = candidate_codes(6)
    names = {type(c).name for c in codes}
    assert "ignore_stragglers" not in names and {"binary", "fractional", "uncoded"} <= names
    trees = [c for c in codes if c.topology() is not None]
    assert trees and all(c.topology().num_workers == 6 for c in trees)  # type: ignore[union-attr]


def test_configurations_may_leave_the_slowest_hosts_idle_and_always_include_the_smaller_trees() -> None:
    sizes = {c.worker_processes() for c in candidate_configurations(8) if c.topology() is None}
    assert sizes == {8}
    widened = candidate_configurations(8, leave_out=2)
    assert {c.worker_processes() for c in widened if c.topology() is None} == {6, 7, 8}
    trees = [c for c in candidate_configurations(8) if c.topology() is not None]
    assert {c.worker_processes() for c in trees} == {6}, "no regular tree has 7 or 8 nodes; one of 6 does"
    for bad, message in ((8, "at 8 hosts at most 7 can be left out"), (-1, "leave_out")):
        with pytest.raises(ValueError, match=message):
            candidate_configurations(8, leave_out=bad)


SLOW_HOSTS = (12, 15)
"""Pool ids of the two hosts :func:`_two_slow_hosts` makes slow."""


def _two_slow_hosts(iterations: int = 60) -> list[dict[str, Any]]:
    """An uncoded history of N hosts in which two are slow whatever their share: 40 ms more every iteration."""
    reports = history([0.001] * N, iterations, late=0, seed=3)
    for report in reports:
        for timing in report["timings"]:
            if timing["worker_id"] in SLOW_HOSTS:
                timing["seconds"] += 0.04
    return reports


def test_a_plan_leaving_hosts_out_runs_on_the_fastest_and_beats_every_code_that_waits_for_the_slow() -> None:
    reports = _two_slow_hosts()
    everyone, _ = plan(reports, make_code("uncoded", n=N), iterations=40, bootstrap=0)
    assert all(r.workers == N for r in everyone if r.scheme != "coded_reduce")
    rows, fits = plan(reports, make_code("uncoded", n=N), iterations=40, bootstrap=0, leave_out=2)
    best = rows[0]
    fast = tuple(f.worker_id for f in fits if f.worker_id not in SLOW_HOSTS)
    assert best.workers == 6 and best.worker_ids == fast, best
    assert best.mean_seconds < min(r.mean_seconds for r in rows if r.workers == N)
    assert best.mean_seconds <= everyone[0].mean_seconds  # without it, only a 6-node tree can leave hosts out
    assert all(r.worker_ids == fast for r in everyone if r.workers == 6)
    on_all = [r for r in rows if r.workers == N]
    assert on_all and all(r.worker_ids == tuple(f.worker_id for f in fits) for r in on_all)


def test_behind_a_slow_master_link_a_tree_of_fewer_nodes_than_hosts_can_win_on_the_fastest() -> None:
    """24 hosts, 8 MB messages, a 200 Mbit/s master link (the emulated cluster of issue 28): a 6-node tree sends
    the master one message, the flat codes three or more; the tree runs on the 6 fastest hosts."""
    hosts = 24
    reports = [
        {
            "iteration": t + 1,
            "timings": [{"worker_id": 100 + w, "seconds": 0.05 + 0.001 * w} for w in range(hosts)],
            "late_workers": [],
            "used_workers": list(range(100, 100 + hosts)),
        }
        for t in range(20)
    ]
    codes = [make_code("fractional", n=hosts, s=1), make_code("fractional", n=hosts, s=7), make_code(
        "coded_reduce", n=2, s=1, L=2
    )]  # fmt: skip
    base = Costs(message_bytes=8e6, master_bandwidth=25e6, worker_bandwidth=125e6)
    rows, _ = plan(reports, make_code("uncoded", n=hosts), base=base, iterations=10, bootstrap=0, candidates=codes)
    assert rows[0].scheme == "coded_reduce" and rows[0].worker_ids == tuple(range(100, 106)), rows[0]
    assert rows[0].mean_seconds < 0.7 * min(r.mean_seconds for r in rows[1:])
    with pytest.raises(ValueError, match="needs 25 workers; the history has 24"):
        plan(reports, make_code("uncoded", n=hosts), candidates=[make_code("uncoded", n=25)])


def test_gradcode_plan_reads_the_masters_history_and_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in history([0.001] * (N - 1) + [0.3], 40, late=0)))
    (tmp_path / "job.spec.json").write_text(json.dumps({"code": {"name": "uncoded", "params": {"n": N}}}))
    out = tmp_path / "plan.json"
    argv = ["plan", str(path), "--iterations", "20", "--bootstrap", "3", "--top", "2", "--show", "4"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "worker 17:" in printed and "rank" in printed
    saved = json.loads(out.read_text())
    assert saved["rows"][0]["rank"] == 1 and saved["rows"][0]["scheme"] != "uncoded"
    reports, spec = read_history(path)
    assert len(reports) == 40 and spec is not None
    assert main([*argv, "--surplus", "push"]) == 0  # a job on one machine, whose workers share memory
    with pytest.raises(SystemExit):
        main([*argv, "--surplus", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_gradcode_plan_refuses_a_file_without_reports_or_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"job_id": "x"}) + "\n")
    assert main(["plan", str(empty)]) == 1
    assert "no iteration reports" in capsys.readouterr().err
    lone = tmp_path / "lone.jsonl"
    lone.write_text(json.dumps(history([0.01] * N, 3, late=0)[0]) + "\n")
    assert main(["plan", str(lone)]) == 1
    assert "--spec" in capsys.readouterr().err


def test_run_plan_replaces_the_scheme_with_the_recommendation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradcode.client.__main__ import _apply_plan, _spec_from_args, build_parser
    from gradcode.common.transport.wire import dict_from_struct

    path = tmp_path / "job.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in history([0.001] * (N - 1) + [0.3], 30, late=0)))
    (tmp_path / "job.spec.json").write_text(json.dumps({"code": {"name": "uncoded", "params": {"n": N}}}))
    args = build_parser().parse_args(["run", "--scheme", "uncoded", "--n", str(N), "--plan", str(path)])
    _apply_plan(args)
    assert args.scheme != "uncoded" and "plan from" in capsys.readouterr().out
    spec = _spec_from_args(args)
    assert spec.code.name == args.scheme
    make_code(spec.code.name, **dict_from_struct(spec.code.params))  # the spec builds the recommended code


def test_run_plan_leaving_hosts_out_names_the_workers_it_runs_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradcode.client.__main__ import _apply_plan, build_parser

    path = tmp_path / "job.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _two_slow_hosts(30)))
    (tmp_path / "job.spec.json").write_text(json.dumps({"code": {"name": "uncoded", "params": {"n": N}}}))
    run = ["run", "--scheme", "uncoded", "--n", str(N)]
    args = build_parser().parse_args([*run, "--plan", str(path), "--leave-out", "2"])
    _apply_plan(args)
    fast = [w for w in range(10, 10 + N) if w not in SLOW_HOSTS]
    assert args.worker_ids == fast and f"on workers {fast} of the {N} fitted" in capsys.readouterr().out
    for argv, message in (
        ([*run, "--plan", str(path), "--leave-out", "-1"], "--leave-out must be >= 0"),
        ([*run, "--leave-out", "2"], "give it with --plan HISTORY or --probe ITERATIONS"),
        ([*run, "--plan", str(path), "--leave-out", str(N)], f"at {N} hosts at most {N - 1} can be left out"),
    ):
        with pytest.raises(ValueError, match=message):
            _apply_plan(build_parser().parse_args(argv))


def _reports(times: np.ndarray) -> list[dict[str, Any]]:
    """Reports of a history where every worker answered: ``times[t, i]`` for the worker of code index i (pool id
    20 + i), iteration t + 1."""
    return [
        {"iteration": t + 1, "timings": [{"worker_id": 20 + i, "seconds": float(s)} for i, s in enumerate(row)]}
        for t, row in enumerate(times)
    ]


def test_a_workers_whole_time_scales_with_its_share_as_in_gc_dc_eq_21() -> None:
    # Measured at share 1/2 (fractional n = 4, s = 1): each worker takes 2 (SHIFT + Exp(mean SHIFT)). At share 1/4
    # (uncoded) it takes SHIFT + Exp(mean SHIFT), so an uncoded round (the slowest of 4) lasts SHIFT (1 + H_4).
    # Scaling the shift alone would keep the doubled spread: SHIFT + 2 SHIFT H_4, 1.7 times as long.
    rng = np.random.default_rng(3)
    reports = _reports(2 * (SHIFT + rng.exponential(SHIFT, size=(600, 4))))
    uncoded = make_code("uncoded", n=4)
    rows, fits = plan(reports, make_code("fractional", n=4, s=1), iterations=3000, bootstrap=0, candidates=[uncoded])
    harmonic = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert rows[0].mean_seconds == pytest.approx(SHIFT * (1 + harmonic), rel=0.08)
    assert all(f.shift == pytest.approx(2 * SHIFT, rel=0.05) for f in fits)


def test_the_jobs_emulated_straggler_law_is_taken_out_of_the_fit_and_simulated_unscaled() -> None:
    # Uncoded n = 4 history; the job's spec made code indices 1 and 3 (a fractional group: both must be waited for
    # under fractional s = 1 ... unless one of them answers) sleep 0.2 s every iteration on top of their own time.
    fractional = make_code("fractional", n=4, s=1)
    partner = next(w for w in (0, 2, 3) if fractional.partitions_of_worker(w) == fractional.partitions_of_worker(1))
    spec = {"straggler": {"model": "fixed", "params": {"delay_seconds": 0.2, "workers": [1, partner]}, "seed": "0"}}
    injected = straggler_from_spec(spec)
    assert injected is not None and injected.delay(1, 5) == 0.2 and straggler_from_spec({"straggler": {}}) is None
    rng = np.random.default_rng(4)
    times = SHIFT + rng.exponential(0.002, size=(300, 4))
    times[:, [1, partner]] += 0.2
    reports = _reports(times)
    rows, fits = plan(reports, make_code("uncoded", n=4), iterations=500, bootstrap=0, candidates=[fractional],
                      injected=injected)  # fmt: skip
    assert all(f.shift == pytest.approx(SHIFT, abs=1e-3) for f in fits)  # the 0.2 s is the law's, not the host's
    # Twice the share doubles the hosts' own time, not the law's sleep: 0.2 + 2 SHIFT + a little, not 2 (0.2 + SHIFT).
    assert 0.2 + 2 * SHIFT <= rows[0].mean_seconds < 0.2 + 3 * SHIFT
    unaware, _ = plan(reports, make_code("uncoded", n=4), iterations=500, bootstrap=0, candidates=[fractional])
    assert unaware[0].mean_seconds > 0.4  # without the spec's law the sleep counts as the hosts' and doubles


def test_a_spec_with_an_unknown_straggler_model_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"straggler model 'molasses' is unknown; valid models are \("):
        straggler_from_spec({"straggler": {"model": "molasses"}})


def test_the_excess_is_the_kaplan_meier_estimate_with_the_late_rounds_as_censored() -> None:
    # Observed 1, 2, 4 and one round late at 3: at 1 four are at risk (S = 3/4), at 2 three (S = 1/2), at 4 one
    # (the late round is known only to exceed 3: S = 0). Everything observed: no tail.
    excess = Excess.estimate([1.0, 2.0, 4.0], [3.0], rate=0.5)
    assert excess.values == (1.0, 2.0, 4.0) and excess.cumulative == pytest.approx((0.25, 0.5, 1.0))
    assert excess.mean() == pytest.approx(0.25 * 1 + 0.25 * 2 + 0.5 * 4)
    # The largest time late: the mass beyond the last observed value continues as the exponential tail.
    tailed = Excess.estimate([1.0, 2.0], [3.0, 5.0], rate=0.5)
    assert tailed.cumulative == pytest.approx((0.25, 0.5)) and tailed.mean() == pytest.approx(0.75 + 0.5 * (2 + 2))
    rng = np.random.default_rng(0)
    draws = np.array([tailed.draw(rng) for _ in range(20000)])
    assert np.mean(draws == 1.0) == pytest.approx(0.25, abs=0.02) and np.mean(draws > 2.0) == pytest.approx(
        0.5, abs=0.02
    )
    assert draws.mean() == pytest.approx(tailed.mean(), rel=0.05)


def test_a_host_answering_in_a_narrow_band_keeps_its_band_instead_of_an_exponential_from_its_fastest_time() -> None:
    # Two CPU-quota hosts at share 1 (fractional n = 2, s = 1): 0.05 s every iteration but one in 20, 0.01 s (a
    # burst of quota), never both at once. Uncoded halves the share: the round, the slower of the two, lasts about
    # 0.05 / 2. A shifted exponential from the fastest time (0.01 + Exp(mean 0.038)) would predict 0.034.
    times = np.full((400, 2), 0.05)
    times[::20, 0] = 0.01
    times[10::20, 1] = 0.01
    rows, _ = plan(_reports(times), make_code("fractional", n=2, s=1), iterations=2000, bootstrap=0,
                   candidates=[make_code("uncoded", n=2)])  # fmt: skip
    assert rows[0].mean_seconds == pytest.approx(0.5 * (0.05 * (1 - 0.05**2) + 0.01 * 0.05**2), rel=0.03)


def test_the_planner_simulates_backups_as_the_master_runs_them() -> None:
    """The spec's surplus decides (auto holds, as the master does on hosts of their own). Held, a backup waits for
    the master's pull, so fractional s = 1 is predicted slower than pushed on hosts with random excess; uncoded has
    no backup and the same prediction either way."""
    assert [surplus_from_spec(s) for s in ({}, {"surplus": "auto"}, {"surplus": "hold"}, {"surplus": "push"})] == [
        "hold", "hold", "hold", "push",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="surplus must be one of push, hold, auto, not 'sometimes'"):
        surplus_from_spec({"surplus": "sometimes"})
    rng = np.random.default_rng(5)
    reports = _reports(SHIFT + rng.exponential(0.02, size=(200, 4)))
    codes = [make_code("fractional", n=4, s=1), make_code("uncoded", n=4)]
    uncoded = make_code("uncoded", n=4)
    held, _ = plan(reports, uncoded, iterations=300, bootstrap=0, candidates=codes, surplus="hold")
    pushed, _ = plan(reports, uncoded, iterations=300, bootstrap=0, candidates=codes, surplus="push")
    by_scheme = {r.scheme: (r.mean_seconds, p.mean_seconds) for r in held for p in pushed if p.scheme == r.scheme}
    assert by_scheme["fractional"][0] > 1.1 * by_scheme["fractional"][1]
    assert by_scheme["uncoded"][0] == by_scheme["uncoded"][1]
    with pytest.raises(ValueError, match="'surplus' must be one of push, hold, not 'auto'"):
        plan(reports, uncoded, bootstrap=0, candidates=codes, surplus="auto")


def test_a_fitted_hosts_excess_is_spent_computing_and_the_jobs_law_before_it_begins() -> None:
    injected = FixedDelay(0.2, workers=[1])
    delays = FittedDelays([Excess((0.05,), (), 20.0)] * 2, injected=injected)
    for w in (0, 1):
        before, whole = delays.parts(w, 3)
        assert before == (0.2 if w == 1 else 0.0) and whole == delays.delay(w, 3) and whole >= before + 0.05


def test_the_planner_relays_the_model_where_the_master_would() -> None:
    """``model_delivery`` from the spec, relayed per candidate by the master's own rule (``relays``): with the
    master's link the limit, a relayed flat code is predicted faster than direct; ``auto`` never relays a tree."""
    assert [delivery_from_spec(s) for s in ({}, {"model_delivery": "relay"}, {"model_delivery": "auto"})] == [
        "direct", "relay", "auto",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="model_delivery must be one of direct, relay, auto, not 'pigeon'"):
        delivery_from_spec({"model_delivery": "pigeon"})
    rng = np.random.default_rng(6)
    reports = _reports(SHIFT + rng.exponential(0.002, size=(100, 6)))
    base = Costs(message_bytes=1e6, master_bandwidth=1e7, worker_bandwidth=1e8)  # 0.1 s a model on the master's link
    flat, tree = make_code("uncoded", n=6), make_code("coded_reduce", n=2, s=1, L=2)
    predicted = {
        way: {r.scheme: r.mean_seconds for r in plan(reports, flat, base=base, iterations=20, bootstrap=0,
                                                   candidates=[flat, tree], delivery=way)[0]}
        for way in ("direct", "relay", "auto")
    }  # fmt: skip
    assert predicted["relay"]["uncoded"] < 0.6 * predicted["direct"]["uncoded"]
    assert predicted["auto"]["uncoded"] == predicted["relay"]["uncoded"]  # six workers over the network: relayed
    assert predicted["auto"]["coded_reduce"] == predicted["direct"]["coded_reduce"]  # a tree only when asked
