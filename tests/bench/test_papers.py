"""The papers' timing results from gradcode's own codes (gradcode.bench.papers), on sizes that run in seconds."""

from __future__ import annotations

import pytest

from gradcode.bench.papers import (
    buyukates_improvement,
    halbawi_optimal_load,
    main,
    reisizadeh_latency,
    tandon_figure4,
)


def test_tandon_figure4_naive_grows_with_the_delay_coded_schemes_stay_flat() -> None:
    rows, curves = tandon_figure4(delays=(0.0, 1.0, 3.0), iterations=6)
    assert [r.holds for r in rows] == [True, True, True]
    for curve in curves.values():
        naive = curve["naive (uncoded)"]
        assert naive[2] - naive[0] == pytest.approx(3.0)  # every iteration waits for the delayed worker
        for label, times in curve.items():
            if label != "naive (uncoded)":
                assert times[0] > naive[0] and times[-1] < naive[-1]  # more load, but beats naive as delay grows


def test_halbawi_simulated_optimum_brackets_eq22() -> None:
    row, means = halbawi_optimal_load(iterations=40, max_w=5)  # 10 draws of 40
    best = min(means, key=means.__getitem__)
    assert row.holds and best == pytest.approx(3 / 24) and 3 / 24 < 0.1477 < 4 / 24
    assert sorted(means) == pytest.approx([2 / 24, 3 / 24, 4 / 24, 5 / 24])  # w = 1 tolerates no straggler


def test_buyukates_dynamic_clustering_beats_static_and_perfect_information_beats_imperfect() -> None:
    rows, mean = buyukates_improvement(seeds=1, iterations=120)
    assert mean["GC-DC perfect"] < mean["GC-DC imperfect"] < mean["GC-SC"]
    assert len(rows) == 2


def test_reisizadeh_theorem2_upper_side_is_exact_for_fixed_compute_and_the_finite_n_exceptions() -> None:
    rows, numbers = reisizadeh_latency(sizes=(4, 12), iterations=200)
    assert all(r.holds for r in rows if "compute a d_i only" in r.setting)
    assert all(
        simulated == pytest.approx(det, rel=1e-9) or simulated > det for simulated, _, _, det in numbers.values()
    )
    at_4, at_12 = numbers[4], numbers[12]
    assert at_4[0] > at_4[2]  # n = 4: above the upper side (8): the maxima have not concentrated yet
    assert at_12[0] < at_12[1]  # n = 12: below the lower side (7): receptions overlap the exponential tails


def test_the_report_exits_nonzero_when_a_claim_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import gradcode.bench.papers as papers

    row = papers.PaperRow("p", "s", "q", "1", "2", holds=False)
    monkeypatch.setattr(papers, "run", lambda *, quick: [row])
    assert main(["--quick"]) == 1
    monkeypatch.setattr(papers, "run", lambda *, quick: [papers.PaperRow("p", "s", "q", "1", "1", holds=True)])
    assert main(["--quick"]) == 0
