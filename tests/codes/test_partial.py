"""Two-stage scheme for α-partial stragglers (Tandon et al., §4, Figure 3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.numerics import decode_error, ones_in_span
from gradcode.common.codes.partial import PartialStragglerCode, naive_partitions_per_worker
from gradcode.common.exceptions import NotDecodableError

TOLERANCE = 1e-9


def test_figure_3_numbers() -> None:
    # n = 3, s = 1, α = 2: 3 + 3·2 = 9 partitions, each worker processes 4/9 of the data (not 2/3).
    code = PartialStragglerCode(3, 1, alpha=2)
    assert (code.k, code.naive_per_worker, code.num_messages) == (9, 2, 6)
    assert code.load_fraction == pytest.approx(4 / 9)
    assert code.load_fraction == pytest.approx((1 + 1) / 3 * 2 / (1 + 2))  # (s+1)/n · α/(s+α)
    assert code.partitions_of_worker(0) == (0, 1, 6, 7)
    assert code.static_assignment().rows == ((0, 3), (1, 4), (2, 5))


def test_alpha_1_2_replicates_about_ten_percent() -> None:
    # Figure 4 caption: "partial straggler schemes for α = 1.2 need to only replicate approximately 10%".
    code = PartialStragglerCode(12, 1, alpha=1.2)
    assert code.naive_per_worker == 10  # (s+1)/(α-1) = 10 despite 1.2 - 1 != 0.2 in float64
    assert code.coded_fraction == pytest.approx(1 / 11)


@pytest.mark.parametrize(("s", "alpha"), [(1, 4.0), (2, 1.7), (3, 3.0), (0, 1.01), (5, 100.0)])
def test_rounding_up_keeps_the_timing_guarantee(s: int, alpha: float) -> None:
    m = naive_partitions_per_worker(s, alpha)
    # A straggler's naive part (α m) takes no longer than a fast worker's naive + coded part (m + s + 1)...
    assert alpha * m >= m + s + 1 - 1e-9
    # ... and m is the smallest such integer.
    assert m == 1 or alpha * (m - 1) < (m - 1) + s + 1


def test_matrix_layout() -> None:
    code = PartialStragglerCode(4, 1, alpha=3.0, inner="fractional")
    n, m = 4, code.naive_per_worker
    assert m == 1
    b = code.B
    np.testing.assert_array_equal(b[:n, : n * m], np.eye(n))
    np.testing.assert_array_equal(b[:n, n * m :], 0)
    np.testing.assert_array_equal(b[n:, : n * m], 0)
    np.testing.assert_array_equal(b[n:, n * m :], code.inner_code.B)
    assert code.naive_row(2) == 2 and code.coded_row(2) == 6


def test_full_stragglers_and_partial_stragglers_are_reported_apart() -> None:
    code = PartialStragglerCode(5, 2)
    assert code.s == 0 and code.partial_stragglers == 2
    assert repr(code) == "<PartialStragglerCode(n=5, s=2, alpha=2.0, inner='cyclic', seed=0)>"
    assert repr(PartialStragglerCode(4, 1, inner="fractional")) == (
        "<PartialStragglerCode(n=4, s=1, alpha=2.0, inner='fractional')>"
    )
    assert isinstance(make_code("partial_stragglers", n=3, s=1, alpha=1.5), PartialStragglerCode)


def test_decoding_is_naive_sum_plus_inner_decoding() -> None:
    code = PartialStragglerCode(4, 1, inner="fractional")
    decoder = code.decoder()
    for row in (0, 1, 2, 4, 5):  # all but worker 3's naive message, coded from workers 0 and 1
        assert decoder.add(row) is False
    with pytest.raises(NotDecodableError):
        decoder.decoding()
    assert decoder.add(3) is True
    decoding = decoder.decoding()
    assert decoding.rows == (0, 1, 2, 3, 4, 5)
    np.testing.assert_array_equal(decoding.weights, np.ones(6))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0, "s": 0}, "Argument 'n' must be an integer >= 1, not 0"),
        ({"n": -1, "s": 0}, "Argument 'n'"),
        ({"n": 3, "s": 3}, r"Argument 's' must be an integer in \[0, 2\]"),
        ({"n": 3, "s": 1, "alpha": 1.0}, "Argument 'alpha' must be a finite real number > 1"),
        ({"n": 3, "s": 1, "alpha": 0.5}, "Argument 'alpha'"),
        ({"n": 3, "s": 1, "alpha": float("inf")}, "Argument 'alpha'"),
        ({"n": 3, "s": 1, "alpha": float("nan")}, "Argument 'alpha'"),
        ({"n": 3, "s": 1, "alpha": True}, "Argument 'alpha'"),
        ({"n": 3, "s": 1, "inner": "mds"}, r"Argument 'inner' must be one of \['cyclic', 'fractional'\]"),
        ({"n": 5, "s": 1, "inner": "fractional"}, r"Argument 's' must satisfy \(s \+ 1\) \| n"),
        ({"n": 3, "s": 1, "seed": -2}, "Argument 'seed'"),
    ],
)
def test_invalid_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PartialStragglerCode(**kwargs)  # type: ignore[arg-type]


def test_unknown_message_is_refused() -> None:
    code = PartialStragglerCode(3, 1)
    with pytest.raises(KeyError, match="not part of this iteration"):
        code.decoder().add(6)
    with pytest.raises(ValueError, match="Argument 'worker'"):
        code.coded_row(3)


ARRIVAL_CASES = [
    pytest.param({"n": n, "s": s, "alpha": alpha, "inner": inner}, id=f"{inner}-n{n}-s{s}-a{alpha}")
    for n in range(1, 6)
    for s in range(n)
    for inner in ("cyclic", "fractional")
    for alpha in (2.0, 4.0)
    if inner == "cyclic" or n % (s + 1) == 0
]


@pytest.mark.parametrize("params", ARRIVAL_CASES)
def test_every_arrival_state(params: dict[str, object]) -> None:
    """Each worker has delivered 0, 1 (naive) or 2 (naive, then coded) messages: all 3^n states."""
    code = PartialStragglerCode(**params)  # type: ignore[arg-type]
    n = code.n
    rng = np.random.default_rng(7)
    for states in itertools.product((0, 1, 2), repeat=n):
        # Interleave the workers randomly but keep each worker's own order: naive before coded.
        queue = [w for w in range(n) for _ in range(states[w])]
        rng.shuffle(queue)
        sent = [0] * n
        decoder = code.decoder()
        rows = []
        for worker in queue:
            row = code.naive_row(worker) if sent[worker] == 0 else code.coded_row(worker)
            sent[worker] += 1
            rows.append(row)
            decoder.add(row)
        complete = [w for w in range(n) if states[w] == 2]
        inner_decodable = bool(complete) and ones_in_span(code.inner_code.B[complete])
        expected = all(state >= 1 for state in states) and inner_decodable
        assert decoder.decodable == expected, states
        if all(state >= 1 for state in states) and len(complete) >= n - code.partial_stragglers:
            assert expected, states  # the §4 guarantee: s partial stragglers still deliver their naive part
        assert ones_in_span(code.B[rows]) == expected if rows else not expected
        if expected:
            assert decode_error(code, rows, rng=rng) <= TOLERANCE, states
            if len(complete) >= n - code.partial_stragglers:
                assert decoder.decoding().exact
