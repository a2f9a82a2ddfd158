"""Tests of the binary gradient codes (Charalambides, Mahdavifar, Hero): construction, decoder, allocation."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Decoding
from gradcode.common.codes.binary import (
    BinaryCode,
    BinaryCodeBase,
    BinaryDecoding,
    HeterogeneousBinaryCode,
    binary_run_lengths,
    equal_time_loads,
)
from gradcode.common.codes.numerics import contiguous_survivor_sets, decode_error, ones_in_span
from gradcode.common.exceptions import NotDecodableError
from tests.codes.conftest import EXACT_BINARY_TOLERANCE

SETTINGS = settings(max_examples=60, deadline=None)


def _decoding(code: BinaryCodeBase, rows: list[int]) -> BinaryDecoding:
    decoding = code.decode(rows)
    assert isinstance(decoding, BinaryDecoding)
    return decoding


def _check_decoding(code: BinaryCodeBase, decoding: Decoding) -> None:
    """Weights are integers ±1, they reproduce the all-ones vector exactly and decode within 1e-12."""
    assert isinstance(decoding, BinaryDecoding)
    assert set(decoding.weights.tolist()) <= {1.0, -1.0}
    np.testing.assert_array_equal(decoding.weights @ code.B[list(decoding.rows)], np.ones(code.k))
    if decoding.congruence_class is not None:
        assert decoding.zero_one
        assert decoding.rows == code.classes[decoding.congruence_class]
    assert decode_error(code, list(decoding.rows)) <= EXACT_BINARY_TOLERANCE


# ---- construction: the slides' worked example (slide 13/14) ----------------------------------------
def test_slide_13_example_n11_s3() -> None:
    code = BinaryCode(11, 3)
    assert (code.ell, code.r) == (2, 3)
    # C1 = classes [0], [1], [2] with ell + 1 = 3 workers; C2 = [3] with ell = 2 workers.
    assert code.classes == ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7))
    b1 = code.B[[w for c in range(3) for w in code.classes[c]]]
    b2 = code.B[list(code.classes[3])]
    assert b1.shape == (9, 11) and int(b1.sum()) == 33
    assert b2.shape == (2, 11) and int(b2.sum()) == 11  # the slide's text shows 10 ones: one is lost
    # Runs of C1 classes: s + 1 = 4, 4, s = 3 (ell + r > s); of C2: s + t + 2 = 6, s + t + 1 = 5 (t = q = 1).
    assert [code.runs[w] for w in code.classes[1]] == [(0, 4), (4, 8), (8, 11)]
    assert [code.runs[w] for w in code.classes[3]] == [(0, 6), (6, 11)]
    # Slide 14: a_{2,6,10} (1-indexed) = sum of class [1].
    decoding = _decoding(code, [1, 5, 9])
    assert decoding.congruence_class == 1 and decoding.rows == (1, 5, 9)
    np.testing.assert_array_equal(decoding.weights, np.ones(3))
    assert int(np.count_nonzero(code.B)) == code.k * (code.s + 1)  # slide 15: nnz(B) = k (s + 1)


def test_algorithm_3_prefers_the_smaller_c2_class() -> None:
    code = BinaryCode(11, 3)
    decoding = _decoding(code, list(range(11)))
    assert decoding.congruence_class == 3 and decoding.rows == (3, 7)


# ---- construction: every (n, s) ---------------------------------------------------------------------
@pytest.mark.parametrize("n", range(1, 41))
def test_run_lengths_follow_algorithms_1_and_2(n: int) -> None:
    for s in range(n):
        ell, r = divmod(n, s + 1)
        runs = binary_run_lengths(n, s)
        assert len(runs) == s + 1
        for c, lengths in enumerate(runs):
            size = ell + 1 if c < r else ell
            # Both cases of Algorithm 1 and Algorithm 2 are "as even as possible, larger runs first".
            even = [n // size + 1] * (n % size) + [n // size] * (size - n % size)
            assert lengths == even, (n, s, c)


@pytest.mark.parametrize("n", range(1, 41))
def test_every_class_tiles_the_partitions(n: int) -> None:
    for s in range(n):
        code = BinaryCode(n, s)
        assert code.k == n
        np.testing.assert_array_equal(code.partition_weights, np.full(n, 1 / n))
        assert sorted(w for members in code.classes for w in members) == list(range(n))
        for c, members in enumerate(code.classes):
            assert all(w % (s + 1) == c for w in members)
            assert len(members) == (code.ell + 1 if c < code.r else code.ell)
            np.testing.assert_array_equal(code.B[list(members)].sum(axis=0), np.ones(n))
            starts = [code.runs[w][0] for w in members]
            assert starts == sorted(starts) and starts[0] == 0  # contiguous, in block order
        assert set(np.unique(code.B).tolist()) <= {0.0, 1.0}
        loads = code.B.sum(axis=1)
        for members in code.classes:
            assert loads[list(members)].max() - loads[list(members)].min() <= 1


def test_extreme_stragglers() -> None:
    np.testing.assert_array_equal(BinaryCode(5, 0).B, np.eye(5))  # s = 0: uncoded
    np.testing.assert_array_equal(BinaryCode(5, 4).B, np.ones((5, 5)))  # s = n - 1: full replication
    assert _decoding(BinaryCode(5, 4), [3]).rows == (3,)


# ---- decoder ----------------------------------------------------------------------------------------
def test_decodable_without_a_complete_class() -> None:
    code = BinaryCode(11, 3)
    # Worker 0 (class [0]) holds 0..3, worker 5 (class [1]) 4..7, worker 10 (class [2]) 8..10.
    decoder = code.decoder()
    for w in (0, 5):
        assert not decoder.add(w)
    assert decoder.add(10)
    assert decoder.complete_classes == ()  # type: ignore[attr-defined]
    decoding = decoder.decoding()
    assert isinstance(decoding, BinaryDecoding)
    assert decoding.congruence_class is None and decoding.zero_one and decoding.rows == (0, 5, 10)
    _check_decoding(code, decoding)


class _HandMadeCode(BinaryCodeBase):
    """Three classes tiling 5 partitions, where workers {0, 3, 6} decode only with a -1 weight."""

    name = "_hand_made_binary_test_code"  # not registered

    def __init__(self) -> None:
        super().__init__(7, 5, 2)
        runs = [(0, 3), (3, 5), (0, 2), (2, 3), (3, 5), (0, 2), (2, 5)]
        self._build([(0, 1), (2, 3, 4), (5, 6)], [Fraction(j, 5) for j in range(6)], runs)


def test_minus_one_weights_when_only_a_signed_path_exists() -> None:
    code = _HandMadeCode()
    decoder = code.decoder()
    for w in (0, 3):
        assert not decoder.add(w)
    assert decoder.add(6)  # [0,3) - [2,3) + [2,5) = 1
    decoding = decoder.decoding()
    assert isinstance(decoding, BinaryDecoding)
    assert decoding.congruence_class is None and not decoding.zero_one
    assert dict(zip(decoding.rows, decoding.weights.tolist(), strict=True)) == {0: 1.0, 3: -1.0, 6: 1.0}
    _check_decoding(code, decoding)
    assert ones_in_span(code.B[[0, 3, 6]]) and not ones_in_span(code.B[[0, 3]])


def test_refusal_raises_and_duplicates_are_ignored() -> None:
    code = BinaryCode(7, 2)
    decoder = code.decoder()
    decoder.add(0)
    decoder.add(0)
    assert decoder.received == (0,) and not decoder.decodable
    with pytest.raises(NotDecodableError):
        decoder.decoding()
    with pytest.raises(KeyError, match="not part of this iteration"):
        decoder.add(7)


def _assert_prefixes_exact(code: BinaryCodeBase, order: list[int]) -> int:
    """Feed ``order``; at every prefix the answer equals the rank test. Return the first decodable count."""
    decoder = code.decoder()
    first = 0
    for count, w in enumerate(order, start=1):
        decodable = decoder.add(w)
        assert decodable == ones_in_span(code.B[order[:count]]), (code, order[:count])
        if decodable and not first:
            first = count
            _check_decoding(code, decoder.decoding())
    return first


@st.composite
def _binary_and_order(draw: st.DrawFn) -> tuple[BinaryCode, list[int]]:
    n = draw(st.integers(1, 64))
    s = draw(st.integers(0, n - 1))
    order = draw(st.permutations(range(n)))
    return BinaryCode(n, s), list(order)


@SETTINGS
@given(_binary_and_order())
def test_random_arrival_orders(case: tuple[BinaryCode, list[int]]) -> None:
    code, order = case
    first = _assert_prefixes_exact(code, order)
    assert 1 <= first <= code.n - code.s


@SETTINGS
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_contiguous_survivors(ns: tuple[int, int]) -> None:
    n, s = ns
    code = BinaryCode(n, s)
    for survivors in contiguous_survivor_sets(n, n - s):
        decoding = _decoding(code, survivors)
        _check_decoding(code, decoding)


def _latest_completion_order(code: BinaryCodeBase, rng: np.random.Generator) -> list[int]:
    """All but one worker of every class first (no class complete), then the held-back workers."""
    held_back = [members[int(rng.integers(len(members)))] for members in code.classes]
    rest = [w for w in range(code.n) if w not in held_back]
    return [int(w) for w in rng.permutation(rest)] + [int(w) for w in rng.permutation(held_back)]


@SETTINGS
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))), st.integers(0, 2**32))
def test_classes_completing_as_late_as_possible(ns: tuple[int, int], seed: int) -> None:
    n, s = ns
    code = BinaryCode(n, s)
    order = _latest_completion_order(code, np.random.default_rng(seed))
    decoder = code.decoder()
    for count, w in enumerate(order, start=1):
        decoder.add(w)
        # No class can be complete before n - s arrivals (s + 1 workers held back), and one is at n - s.
        assert bool(decoder.complete_classes) == (count >= n - s)  # type: ignore[attr-defined]
    first = _assert_prefixes_exact(code, order)
    assert 1 <= first <= n - s


def test_class_free_decodability_is_common_and_exact() -> None:
    """Exhaustively for n <= 8: sets decodable without a complete class exist and decode with 0/1 weights."""
    class_free = 0
    for n in range(1, 9):
        for s in range(n):
            code = BinaryCode(n, s)
            for size in range(n + 1):
                for workers in itertools.combinations(range(n), size):
                    decoder = code.decoder()
                    for w in workers:
                        decoder.add(w)
                    assert decoder.decodable == ones_in_span(code.B[list(workers)])
                    if decoder.decodable:
                        decoding = decoder.decoding()
                        assert isinstance(decoding, BinaryDecoding)
                        if decoding.congruence_class is None:
                            class_free += 1
                            assert decoding.zero_one  # measured: never a -1 for the homogeneous code
    assert class_free > 0


# ---- data layout ------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_samples", [0, 1, 7, 100, 1001])
def test_partition_sizes_follow_weights(num_samples: int) -> None:
    for code in (BinaryCode(11, 3), HeterogeneousBinaryCode(3, 5, 2, 3.0, 1.0)):
        sizes = code.partition_sizes(num_samples)
        assert sum(sizes) == num_samples and len(sizes) == code.k
        assert np.all(np.abs(np.array(sizes) - num_samples * code.partition_weights) <= 1)


# ---- heterogeneous allocation ----------------------------------------------------------------------
def test_equal_time_loads_solve_the_linear_system() -> None:
    x1, x2 = equal_time_loads(4, 6, 1, 3.0, 1.5)
    assert x1 / 3 == x2 / Fraction(3, 2) and 4 * x1 + 6 * x2 == 2


@pytest.mark.parametrize(
    ("n1", "n2", "s", "speed1", "speed2"), [(4, 6, 1, 3.0, 1.5), (3, 6, 2, 2.5, 1.0), (2, 2, 1, 1.0, 7.0)]
)
def test_divisible_groups_reproduce_the_slides_equal_times(
    n1: int, n2: int, s: int, speed1: float, speed2: float
) -> None:
    code = HeterogeneousBinaryCode(n1, n2, s, speed1, speed2)
    x1, x2 = equal_time_loads(n1, n2, s, speed1, speed2)
    np.testing.assert_allclose(code.worker_loads, [float(x1)] * n1 + [float(x2)] * n2, rtol=1e-15)
    lower_bound = (s + 1) / (n1 * speed1 + n2 * speed2)
    np.testing.assert_allclose(code.expected_times, lower_bound, rtol=1e-14)


def _brute_force_best_min_speed(n1: int, n2: int, m: int, v1: Fraction, v2: Fraction) -> Fraction:
    """max over all class compositions of the slowest class's speed (independent enumeration)."""

    def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
        return [c for c in itertools.product(range(total + 1), repeat=parts) if sum(c) == total]

    best = Fraction(0)
    for a in compositions(n1, m):
        for b in compositions(n2, m):
            best = max(best, min(a[c] * v1 + b[c] * v2 for c in range(m)))
    return best


SPEED_PAIRS = [(2.0, 1.0), (3.0, 2.0), (1.0, 5.0), (1.5, 1.25), (1.0, 1.0)]


@pytest.mark.slow
@pytest.mark.parametrize(("speed1", "speed2"), SPEED_PAIRS)
def test_allocation_minimises_the_largest_expected_time(speed1: float, speed2: float) -> None:
    for n1, n2 in itertools.product(range(6), repeat=2):
        for s in range(min(n1 + n2, 4)):
            code = HeterogeneousBinaryCode(n1, n2, s, speed1, speed2)
            best = _brute_force_best_min_speed(n1, n2, s + 1, Fraction(speed1), Fraction(speed2))
            assert code.expected_times.max() == pytest.approx(1 / float(best), rel=1e-13), code
            assert code.expected_times.max() >= (s + 1) / (n1 * speed1 + n2 * speed2) * (1 - 1e-13)


def test_balanced_classes_are_not_always_optimal() -> None:
    # Two classes, speeds 3 and 2, two fast and three slow: {F, F} and {S, S, S} both reach 6,
    # while giving each class one fast worker tops out at 5.
    code = HeterogeneousBinaryCode(2, 3, 1, 3.0, 2.0)
    np.testing.assert_allclose(sorted(code.class_speeds), [6.0, 6.0])
    np.testing.assert_allclose(code.expected_times, 1 / 6)


@st.composite
def _heterogeneous_and_order(draw: st.DrawFn) -> tuple[HeterogeneousBinaryCode, list[int]]:
    n1 = draw(st.integers(0, 32))
    n2 = draw(st.integers(1 if n1 == 0 else 0, 32))
    s = draw(st.integers(0, n1 + n2 - 1))
    speeds = st.floats(0.1, 10.0, allow_nan=False, allow_infinity=False)
    code = HeterogeneousBinaryCode(n1, n2, s, draw(speeds), draw(speeds))
    return code, list(draw(st.permutations(range(n1 + n2))))


@settings(max_examples=40, deadline=None)
@given(_heterogeneous_and_order())
def test_heterogeneous_structure_and_decoding(case: tuple[HeterogeneousBinaryCode, list[int]]) -> None:
    code, order = case
    assert code.k <= code.n and len(code.classes) == code.s + 1
    assert sum(code.partition_cuts[j + 1] - code.partition_cuts[j] for j in range(code.k)) == 1
    assert np.all(code.partition_weights > 0) and code.partition_weights.sum() == pytest.approx(1.0, abs=1e-15)
    for c, members in enumerate(code.classes):
        np.testing.assert_array_equal(code.B[list(members)].sum(axis=0), np.ones(code.k))
        # Within a class, every worker finishes at the same expected time 1 / speed(class).
        np.testing.assert_allclose(code.expected_times[list(members)], 1 / code.class_speeds[c], rtol=1e-12)
    # Faster workers never get less data than slower ones of the same class.
    for members in code.classes:
        by_speed = sorted(members, key=lambda w: code.speeds[w])
        assert np.all(np.diff(code.worker_loads[by_speed]) >= -1e-15)
    first = _assert_prefixes_exact(code, order)
    assert 1 <= first <= code.n - code.s
    held_back_order = _latest_completion_order(code, np.random.default_rng(0))
    assert 1 <= _assert_prefixes_exact(code, held_back_order) <= code.n - code.s


def test_equal_speeds_give_exactly_balanced_classes() -> None:
    code = HeterogeneousBinaryCode(11, 0, 3, 1.0, 1.0)  # same n, s as slide 13 but unequal partitions
    for members in code.classes:
        np.testing.assert_allclose(code.worker_loads[list(members)], 1 / len(members), rtol=1e-15)
    assert code.k < 11 and len(set(code.partition_weights.round(12).tolist())) > 1


def test_data_share_of_every_code_agrees_with_binarys_own_loads_over_unequal_partitions() -> None:
    code = HeterogeneousBinaryCode(11, 0, 3, 1.0, 1.0)
    np.testing.assert_allclose([code.data_share(w) for w in range(code.n)], code.worker_loads, rtol=1e-14)


# ---- parameters, registry, repr ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0, "s": 0}, r"Argument 'n' must be an integer >= 1, not 0"),
        ({"n": 4, "s": 4}, r"Argument 's' must be an integer in \[0, 3\].*not 4"),
        ({"n": 4, "s": -1}, r"Argument 's' must be an integer in \[0, 3\].*not -1"),
        ({"n": 4.0, "s": 1}, r"Argument 'n' must be an integer >= [0-9]+, not 4.0"),
        ({"n": True, "s": 0}, r"Argument 'n' must be an integer >= [0-9]+, not True"),
    ],
)
def test_binary_invalid_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BinaryCode(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n1": -1, "n2": 2, "s": 0}, r"Argument 'n1' must be an integer >= 0, not -1"),
        ({"n1": 2, "n2": "3", "s": 0}, r"Argument 'n2' must be an integer >= [0-9]+, not '3'"),
        ({"n1": 0, "n2": 0, "s": 0}, r"at least one worker \(n1 \+ n2 >= 1\), not 0 \+ 0"),
        ({"n1": 2, "n2": 1, "s": 3}, r"Argument 's' must be an integer in \[0, 2\].*not 3"),
        ({"n1": 2, "n2": 1, "s": 0, "speed1": 0.0}, r"Argument 'speed1' must be a positive finite number, not 0.0"),
        ({"n1": 2, "n2": 1, "s": 0, "speed2": float("inf")}, r"'speed2' must be a positive finite number, not inf"),
        ({"n1": 2, "n2": 1, "s": 0, "speed2": float("nan")}, r"'speed2' must be a positive finite number, not nan"),
        ({"n1": 2, "n2": 1, "s": 0, "speed1": "fast"}, r"'speed1' must be a positive finite number, not 'fast'"),
        ({"n1": 2, "n2": 1, "s": 0, "speed1": True}, r"'speed1' must be a positive finite number, not True"),
    ],
)
def test_heterogeneous_invalid_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HeterogeneousBinaryCode(**kwargs)  # type: ignore[arg-type]


def test_registry_and_canonical_instances() -> None:
    assert isinstance(make_code("binary", n=6, s=2), BinaryCode)
    assert isinstance(make_code("binary_heterogeneous", n1=3, n2=3, s=2), HeterogeneousBinaryCode)
    canonical = HeterogeneousBinaryCode.for_stragglers(5, 2)
    assert isinstance(canonical, HeterogeneousBinaryCode) and (canonical.n1, canonical.n2, canonical.s) == (3, 2, 2)
    assert BinaryCode.for_stragglers(9, 4).s == 4
    with pytest.raises(ValueError, match="Argument 's'"):
        BinaryCode.for_stragglers(3, 3)
    with pytest.raises(ValueError, match="Argument 'n'"):
        HeterogeneousBinaryCode.for_stragglers(0, 0)


def test_repr() -> None:
    assert repr(BinaryCode(11, 3)) == "<BinaryCode(n=11, s=3)>"
    assert (
        repr(HeterogeneousBinaryCode(3, 2, 1, 3.0, 1.0))
        == "<HeterogeneousBinaryCode(n1=3, n2=2, s=1, speed1=3.0, speed2=1.0)>"
    )


def test_small_configs_are_valid_and_cover_every_binary_pair() -> None:
    configs = list(BinaryCode.small_configs(6))
    assert configs == [{"n": n, "s": s} for n in range(1, 7) for s in range(n)]
    for cfg in HeterogeneousBinaryCode.small_configs(6):
        HeterogeneousBinaryCode(**cfg)
