"""GC-SC and GC-DC (Buyukates et al.): the paper's worked example, exceptions, reprs and properties.

Workers, clusters and partitions are 0-based in the code and 1-based in the paper; the helpers below
convert, so the expected values read exactly as printed in the paper.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.codes import Observation, make_code
from gradcode.common.codes.clustered import ClusteredCode, DynamicClusteredCode, observation_from_speeds
from gradcode.common.codes.cyclic import draw_cyclic_repetition
from gradcode.common.codes.numerics import (
    DEFAULT_MAX_DECODE_ERROR,
    decode_error,
    equilibrated_decoding_weights,
    ones_in_span,
)

TOLERANCE = 1e-9

# ---- the paper's running example: K = 12, P = 4, r = 2, n = 2 ------------------------------------
PAPER_SHIFTS = ((0, 1), (3, 2), (0, 3))
"""The shifts read off eq. (13): group {w1..w4} shifted by 0 and 1, {w5..w8} by 3 and 2, {w9..w12} by
0 and 3 (the text states the first two groups; the third follows from rows 3 and 6)."""
EQ_13 = [
    [1, 2, 3, 4],
    [6, 7, 8, 5],
    [9, 10, 11, 12],
    [4, 1, 2, 3],
    [7, 8, 5, 6],
    [10, 11, 12, 9],
]
EQ_18 = [  # eq. (13) with each column sorted (eq. (16))
    [1, 1, 2, 3],
    [4, 2, 3, 4],
    [6, 7, 5, 5],
    [7, 8, 8, 6],
    [9, 10, 11, 9],
    [10, 11, 12, 12],
]
S_EQ_18 = [1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]
"""Straggler realisation of the Fig. 2 walk-through (1 = non-straggler): stragglers w3, w5, w6, w7, w8,
the red entries of eq. (18), |K_s| = 5, |K_f| = 7."""
S_SECTION_IV_C = [1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0, 1]
"""Straggler realisation of §IV-C (stragglers w3, w8, w9, w11), where GC-SC fails in cluster 3."""


def paper_code(**overrides: object) -> DynamicClusteredCode:
    params: dict[str, object] = {"n": 12, "clusters": 4, "load": 2, "clusters_per_worker": 2, "shifts": PAPER_SHIFTS}
    params.update(overrides)
    return DynamicClusteredCode(**params)  # type: ignore[arg-type]


def observe(s: list[int]) -> Observation:
    return Observation(straggling=tuple(v == 0 for v in s))


def one_based(clusters: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    return [[w + 1 for w in members] for members in clusters]


def non_stragglers_decode(code: DynamicClusteredCode, assignment: object, straggling: tuple[bool, ...]) -> bool:
    decoder = code.decoder(assignment)  # type: ignore[arg-type]
    for w in range(code.n):
        if not straggling[w]:
            for row in assignment.rows[w]:  # type: ignore[attr-defined]
                decoder.add(row)
    return decoder.decodable


def test_cluster_matrix_is_eq_13_and_sorts_to_eq_18() -> None:
    code = paper_code()
    assert (code.cluster_matrix + 1).tolist() == EQ_13
    assert np.sort(code.cluster_matrix + 1, axis=0).tolist() == EQ_18
    # "worker w1 is assigned to the first and second clusters, worker w2 to the second and third"
    assert code.clusters_of_worker(0) == (0, 1)
    assert code.clusters_of_worker(1) == (1, 2)


def test_static_assignment_is_gc_sc_of_eqs_5_to_7() -> None:
    code = paper_code()
    static = code.static_assignment()
    # eq. (7): A_code = [c11 c21 c31 c41 c42 c12 c22 c32 c13 c23 c33 c43], codeword c_{p,i} is row (p-1)ℓ + i-1
    a_code = [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (1, 2), (2, 2), (3, 2), (1, 3), (2, 3), (3, 3), (4, 3)]
    assert [static.rows[w] for w in range(12)] == [((p - 1) * 3 + i - 1,) for p, i in a_code]
    # eq. (5): clusters {1,6,9}, {2,7,10}, {3,8,11}, {4,5,12}
    clusters = [sorted(w + 1 for w in range(12) if code.cluster_of_row(static.rows[w][0]) == p) for p in range(4)]
    assert clusters == [[1, 6, 9], [2, 7, 10], [3, 8, 11], [4, 5, 12]]
    # eq. (6): the partitions behind each worker's codeword (g1..g12)
    a_data = [(1, 2), (4, 5), (7, 8), (10, 11), (11, 12), (2, 3), (5, 6), (8, 9), (1, 3), (4, 6), (7, 9), (10, 12)]
    assert [tuple(j + 1 for j in code.support(static.rows[w][0])) for w in range(12)] == a_data


def test_memory_is_n_times_ell() -> None:
    code = paper_code()
    # "I_1 = {D_1, ..., D_6} so that worker 1 can compute partial gradients g1, ..., g6"
    assert code.partitions_of_worker(0) == (0, 1, 2, 3, 4, 5)
    assert all(len(code.partitions_of_worker(w)) == 2 * 3 for w in range(12))
    assert code.candidate_rows(0) == (0, 1, 2, 3, 4, 5)


def test_fig_2_worked_example() -> None:
    """§V, eq. (18) and Fig. 2, step by step (reconstructed from the text; the figure is an image).

    Availabilities |K_f^p| = 4, 4, 3, 3 give O_f = [3, 4, 1, 2] and |K_s^p| = 2, 2, 3, 3 give
    O_s = [1, 2, 3, 4]. Read as "the sequence of clusters taking turns" or as "O_f(p) = rank of
    cluster p", both vectors are the same here ([3, 4, 1, 2] is its own inverse), so that ambiguity
    does not matter for this example. Cluster 3 takes w2 first, cluster 4 takes w4; Phase I leaves
    cluster 1 = {w1, w6} one short and w12 unplaced; w12 fits only clusters 3 and 4; cluster 3 has no
    worker that can join cluster 1, cluster 4 has w4; swapping w4 and w12 ends with one straggler in
    every cluster but cluster 2, which has two.
    """
    code = paper_code()
    obs = observe(S_EQ_18)
    columns = [set(code.cluster_matrix[:, p].tolist()) for p in range(4)]
    fast = {w for w in range(12) if not obs.straggling[w]}
    assert [len(c & fast) for c in columns] == [4, 4, 3, 3]
    assert [len(c - fast) for c in columns] == [2, 2, 3, 3]

    placement = code.place(obs)
    assert [p + 1 for p in placement.non_straggler_order] == [3, 4, 1, 2]
    assert [p + 1 for p in placement.straggler_order] == [1, 2, 3, 4]
    phase_one = one_based(placement.phase_one)
    assert phase_one[2][0] == 2 and phase_one[3][0] == 4  # "w2 is assigned to [cluster 3] ... fourth gets w4"
    assert phase_one == [[1, 6], [10, 7, 8], [2, 11, 3], [4, 9, 5]]
    assert [w + 1 for w in placement.conflicts] == [12]
    # swap (k, p, k_bar, p_bar): w4 leaves cluster 4 for cluster 1, w12 takes its place in cluster 4
    assert [(k + 1, p + 1, kb + 1, pb + 1) for k, p, kb, pb in placement.swaps] == [(12, 1, 4, 4)]
    final = one_based(placement.clusters)
    assert [sorted(c) for c in final] == [[1, 4, 6], [7, 8, 10], [2, 3, 11], [5, 9, 12]]
    assert [sum(S_EQ_18[w - 1] == 0 for w in c) for c in final] == [1, 2, 1, 1]
    # w4, w7, w9, w10 are the workers outside cluster 1 that could join it at the end of Phase I
    outside = sorted(w + 1 for w in columns[0] if w + 1 not in phase_one[0])
    assert outside == [4, 7, 9, 10]


def test_literal_turn_rule_does_not_reproduce_fig_2() -> None:
    """Lines 16–23 run literally (clusters keep taking non-stragglers until full) give another Phase I.

    Cluster 3 takes w12 on its third turn, the stragglers then leave w5 unplaced, and the swap with w4
    ends with 0 stragglers in cluster 3 and 2 in cluster 4 — not the text of Fig. 2. The reading that
    stops the first group at the first turn finding no available worker reproduces it (test above).
    """
    placement = paper_code()._place(observe(S_EQ_18), stop_at_miss=False)
    assert one_based(placement.phase_one) == [[1, 6], [10, 7, 8], [2, 11, 12], [4, 9, 3]]
    assert [w + 1 for w in placement.conflicts] == [5]
    stragglers = [sum(S_EQ_18[w] == 0 for w in c) for c in placement.clusters]
    assert stragglers == [1, 2, 0, 2]


def test_gc_dc_decodes_where_gc_sc_cannot() -> None:
    """§IV-C: with stragglers w3, w8, w9, w11, GC-SC's cluster 3 = {w3, w8, w11} is all stragglers."""
    code = paper_code()
    obs = observe(S_SECTION_IV_C)
    static = code.static_assignment()
    assert not non_stragglers_decode(code, static, obs.straggling)

    # The paper's hand-made fix: w5 computes c_{3,1} (w3's codeword), w2 computes c_{3,2} (w8's); the
    # stragglers w3 and w8 take over the codewords w5 and w2 left (c_{4,2} and c_{2,1}).
    rows = [r for (r,) in static.rows]
    rows[4], rows[2] = rows[2], rows[4]  # w5 <-> w3
    rows[1], rows[7] = rows[7], rows[1]  # w2 <-> w8
    by_hand = type(static)(tuple((r,) for r in rows))
    assert all(by_hand.rows[w][0] in code.candidate_rows(w) for w in range(12))
    assert non_stragglers_decode(code, by_hand, obs.straggling)

    # Algorithm 1 finds a working placement on its own, without conflicts.
    placement = code.place(obs)
    assert placement.conflicts == ()
    assert all(sum(obs.straggling[w] for w in c) <= 1 for c in placement.clusters)
    assignment = code.assign(obs)
    assert non_stragglers_decode(code, assignment, obs.straggling)
    fast_rows = assignment.rows_of([w for w in range(12) if not obs.straggling[w]])
    assert decode_error(code, fast_rows, assignment=assignment) <= TOLERANCE


def test_lemma_1_is_enforced() -> None:
    # n > P(K - 1) / (2K): 12/4 needs n >= 2; 20/5 needs n >= 3 (n > 95/40)
    with pytest.raises(ValueError, match=r"Lemma 1.*clusters_per_worker.*not 1"):
        DynamicClusteredCode(12, 4, 2, 1)
    with pytest.raises(ValueError, match="Lemma 1"):
        DynamicClusteredCode(20, 5, 3, 2)
    assert DynamicClusteredCode(20, 5, 3, 3).clusters_per_worker == 3


def test_heterogeneous_workers_are_taken_fastest_first() -> None:
    """§VI-B: clusters pick the fastest available worker instead of the lowest index."""
    code = paper_code()
    by_index = code.place(None)
    assert by_index.phase_one[0][0] == 0  # cluster 1 first takes w1
    speeds = tuple(float(w) for w in range(12))  # higher index is faster
    by_speed = code.place(Observation(straggling=(False,) * 12, speed=speeds))
    assert by_speed.phase_one[0][0] == 9  # cluster 1's fastest candidate is w10
    obs = observation_from_speeds([0.2, 3.0, 0.1, 4.0, 1.0, 0.6, 2.0, 0.3, 5.0, 0.7, 1.5, 2.5], threshold=0.5)
    assert [i + 1 for i, s in enumerate(obs.straggling) if s] == [1, 3, 8]
    assignment = code.assign(obs)
    assert sorted(r for rows in assignment.rows for r in rows) == list(range(12))


def test_assign_without_observation_treats_everyone_as_fast() -> None:
    code = paper_code()
    assert code.assign(None) == code.assign(Observation(straggling=(False,) * 12))
    assert sorted(r for (r,) in code.assign(None).rows) == list(range(12))


def test_degenerate_loads_are_exactly_binary() -> None:
    assert np.array_equal(ClusteredCode(6, 2, 1).B, np.eye(6))
    full = ClusteredCode(6, 2, 3).B
    assert np.array_equal(full, np.kron(np.eye(2), np.ones((3, 3))))


@pytest.mark.parametrize("dynamic", [False, True])
def test_every_cluster_runs_the_shared_checked_cyclic_draw(dynamic: bool) -> None:
    # One implementation of Algorithm 2 (gradcode.common.codes.cyclic): the same checked draw in every diagonal block.
    code = DynamicClusteredCode(12, 3, 3, 2, seed=5) if dynamic else ClusteredCode(12, 3, 3, seed=5)
    accepted = draw_cyclic_repetition(4, 2, seed=5)
    assert accepted.measured_decode_error <= DEFAULT_MAX_DECODE_ERROR
    np.testing.assert_array_equal(code.B, np.kron(np.eye(3), accepted.B))
    # Each cluster is decoded with the solve the guard measured.
    rows = [0, 1, 6, 7, 9, 10]
    decoding = code.decode(rows)
    for p, used in enumerate(([0, 1], [6, 7], [9, 10])):
        local = accepted.B[[r - 4 * p for r in used]]
        expected = equilibrated_decoding_weights(local, independent=True)
        np.testing.assert_array_equal(decoding.weights[2 * p : 2 * p + 2], expected)


def test_cyclic_support_inside_each_cluster() -> None:
    code = ClusteredCode(12, 3, 3)
    for row in range(12):
        p, i = divmod(row, 4)
        assert code.cluster_of_row(row) == p
        assert set(code.support(row)) == {p * 4 + (i + t) % 4 for t in range(3)}
    assert code.partitions_of_cluster(2) == (8, 9, 10, 11)


def test_for_stragglers() -> None:
    assert ClusteredCode.for_stragglers(12, 1)._params() == {"n": 12, "clusters": 6, "load": 2, "seed": 0}
    assert ClusteredCode.for_stragglers(12, 2)._params()["clusters"] == 4
    assert ClusteredCode.for_stragglers(12, 11)._params()["clusters"] == 1
    dc = DynamicClusteredCode.for_stragglers(12, 1)
    assert isinstance(dc, DynamicClusteredCode)
    assert (dc.clusters, dc.load, dc.clusters_per_worker) == (6, 2, 3)
    with pytest.raises(ValueError, match="'s'"):
        ClusteredCode.for_stragglers(4, 4)


@pytest.mark.parametrize(
    ("cls", "params", "match"),
    [
        pytest.param(ClusteredCode, {"n": 0, "clusters": 1, "load": 1}, r"'n' must be an integer >= 1.*not 0", id="n"),
        pytest.param(ClusteredCode, {"n": 12, "clusters": 5, "load": 1}, r"'clusters' must divide n = 12", id="div"),
        pytest.param(ClusteredCode, {"n": 12, "clusters": 13, "load": 1}, r"'clusters'.*\[1, 12\]", id="many"),
        pytest.param(ClusteredCode, {"n": 12, "clusters": 4, "load": 4}, r"'load'.*\[1, 3\].*not 4", id="load"),
        pytest.param(ClusteredCode, {"n": 12, "clusters": 4, "load": 0}, r"'load'.*not 0", id="load0"),
        pytest.param(ClusteredCode, {"n": 12, "clusters": 4, "load": 2, "seed": -1}, r"'seed'", id="seed"),
        pytest.param(
            DynamicClusteredCode,
            {"n": 12, "clusters": 4, "load": 2, "clusters_per_worker": 5},
            r"'clusters_per_worker'.*\[1, 4\].*not 5",
            id="per_worker",
        ),
        pytest.param(
            DynamicClusteredCode,
            {"n": 12, "clusters": 4, "load": 2, "clusters_per_worker": 2, "shifts": ((0, 0), (1, 2), (0, 3))},
            r"'shifts' must hold ℓ = 3 groups of 2 distinct integers in \[0, 3\]",
            id="shifts_repeat",
        ),
        pytest.param(
            DynamicClusteredCode,
            {"n": 12, "clusters": 4, "load": 2, "clusters_per_worker": 2, "shifts": ((0, 1), (1, 2))},
            r"'shifts'",
            id="shifts_groups",
        ),
        pytest.param(
            DynamicClusteredCode,
            {"n": 12, "clusters": 4, "load": 2, "clusters_per_worker": 2, "shifts": ((0, 4), (1, 2), (0, 3))},
            r"'shifts'",
            id="shifts_range",
        ),
    ],
)
def test_exceptions(cls: type, params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cls(**params)


def test_observation_is_checked() -> None:
    code = paper_code()
    with pytest.raises(ValueError, match=r"straggling must have one entry per worker \(n = 12\), not 3"):
        code.assign(Observation(straggling=(False, True, False)))
    with pytest.raises(ValueError, match="speed must be empty or hold 12 finite rates"):
        code.assign(Observation(straggling=(False,) * 12, speed=(1.0,) * 11))
    with pytest.raises(ValueError, match="'threshold'"):
        observation_from_speeds([1.0], float("nan"))


def test_repr_and_registry() -> None:
    assert repr(ClusteredCode(12, 4, 2)) == "<ClusteredCode(n=12, clusters=4, load=2, seed=0)>"
    assert repr(paper_code()) == (
        "<DynamicClusteredCode(n=12, clusters=4, load=2, seed=0, clusters_per_worker=2, "
        "shifts=((0, 1), (3, 2), (0, 3)))>"
    )
    assert isinstance(make_code("clustered", n=6, clusters=2, load=2), ClusteredCode)
    dc = make_code("dynamic_clustered", n=6, clusters=3, load=2, clusters_per_worker=2)
    assert isinstance(dc, DynamicClusteredCode) and dc.dynamic


def test_seeded_draws_are_deterministic() -> None:
    a, b = DynamicClusteredCode(20, 5, 3, 3, seed=7), DynamicClusteredCode(20, 5, 3, 3, seed=7)
    assert a.shifts == b.shifts and np.array_equal(a.B, b.B)
    c = DynamicClusteredCode(20, 5, 3, 3, seed=8)
    assert c.shifts != a.shifts and not np.array_equal(c.B, a.B)


# ---- properties ----------------------------------------------------------------------------------
DC_CONFIGS = [
    (12, 4, 2, 2),
    (12, 4, 3, 3),
    (12, 3, 2, 2),
    (12, 6, 2, 3),
    (16, 4, 2, 2),
    (20, 5, 3, 3),
    (20, 5, 2, 4),
    (20, 4, 3, 2),
    (8, 2, 3, 1),
]


@st.composite
def dc_cases(draw: st.DrawFn) -> tuple[DynamicClusteredCode, Observation]:
    n, clusters, load, per_worker = draw(st.sampled_from(DC_CONFIGS))
    code = DynamicClusteredCode(n, clusters, load, per_worker, seed=draw(st.integers(0, 3)))
    straggling = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    speeds = draw(st.none() | st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n))
    return code, Observation(straggling=straggling, speed=tuple(speeds) if speeds else ())


@settings(max_examples=150, deadline=None)
@given(dc_cases())
def test_assignment_is_valid_and_decodes(case: tuple[DynamicClusteredCode, Observation]) -> None:
    code, obs = case
    placement = code.place(obs)
    assignment = code.assign(obs)
    size = code.cluster_size
    # one codeword per worker, every codeword once, only candidate codewords
    assert all(len(rows) == 1 for rows in assignment.rows)
    assert sorted(r for (r,) in assignment.rows) == list(range(code.n))
    for w, (row,) in enumerate(assignment.rows):
        assert row in code.candidate_rows(w)
    # the placement behind it: ℓ workers per cluster, each in a cluster it belongs to
    assert all(len(members) == size for members in placement.clusters)
    for p, members in enumerate(placement.clusters):
        for i, w in enumerate(members):
            assert p in code.clusters_of_worker(w)
            assert assignment.rows[w] == (p * size + i,)
    # every message: exact decode
    assert decode_error(code, [r for (r,) in assignment.rows], assignment=assignment) <= TOLERANCE
    # the non-stragglers alone: the decoder's answer is the exact span test, and when Algorithm 1 left
    # every cluster at least ℓ - r + 1 non-stragglers they decode
    fast_rows = assignment.rows_of([w for w in range(code.n) if not obs.straggling[w]])
    decoder = code.decoder(assignment)
    for row in fast_rows:
        decoder.add(row)
    assert decoder.decodable == ones_in_span(code.B[fast_rows])
    enough = all(sum(not obs.straggling[w] for w in members) >= size - code.load + 1 for members in placement.clusters)
    if enough:
        assert decoder.decodable
        assert decode_error(code, fast_rows, assignment=assignment) <= TOLERANCE


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([(12, 4, 2), (12, 3, 3), (20, 4, 3), (20, 5, 4)]),
    st.integers(0, 3),
    st.data(),
)
def test_gc_sc_decodes_exactly_when_every_cluster_has_enough(
    params: tuple[int, int, int], seed: int, data: st.DataObject
) -> None:
    n, clusters, load = params
    code = ClusteredCode(n, clusters, load, seed=seed)
    alive = data.draw(st.lists(st.integers(0, n - 1), unique=True), label="alive")
    decoder = code.decoder()
    for w in alive:
        decoder.add(w)
    size = n // clusters
    enough = all(sum(w // size == p for w in alive) >= size - load + 1 for p in range(clusters))
    if not alive:
        assert not decoder.decodable
        return
    assert decoder.decodable == enough
    assert ones_in_span(code.B[sorted(alive)]) == enough
    if enough:
        assert decode_error(code, alive) <= TOLERANCE
