"""Fractional repetition (Tandon et al., §3.1, Appendix B): structure, decoder, validation, properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.codes import make_code
from gradcode.common.codes.fractional import FractionalRepetitionCode, valid_fractional_stragglers
from gradcode.common.codes.numerics import contiguous_survivor_sets, decode_error, ones_in_span
from gradcode.common.exceptions import NotDecodableError

TOLERANCE = 1e-12


def test_figure_2_structure_n6_s2() -> None:
    # Eq. (5)-(6): two groups of three partitions, each group served by three workers.
    code = FractionalRepetitionCode(6, 2)
    block = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=float)
    np.testing.assert_array_equal(code.B, np.vstack([block, block, block]))
    assert code.num_groups == 2
    assert [code.group_of(w) for w in range(6)] == [0, 1, 0, 1, 0, 1]
    assert code.partitions_of_worker(4) == (0, 1, 2)
    assert code.k == 6


def test_every_partition_replicated_s_plus_one_times() -> None:
    # Theorem 1's lower bound is met with equality: every column has s + 1 non-zeros, every row too.
    code = FractionalRepetitionCode(12, 3)
    assert (np.count_nonzero(code.B, axis=0) == 4).all()
    assert (np.count_nonzero(code.B, axis=1) == 4).all()


def test_decoder_picks_first_survivor_per_group_with_unit_weights() -> None:
    code = FractionalRepetitionCode(6, 2)
    decoder = code.decoder()
    assert decoder.add(5) is False  # group 1
    assert decoder.add(3) is False  # group 1 again: still missing group 0
    assert decoder.add(2) is True  # group 0
    decoding = decoder.decoding()
    assert decoding.rows == (2, 5)
    np.testing.assert_array_equal(decoding.weights, [1.0, 1.0])
    assert decoding.exact


def test_not_decodable_raises() -> None:
    code = FractionalRepetitionCode(4, 1)
    decoder = code.decoder()
    decoder.add(0)
    decoder.add(2)  # same group as 0
    with pytest.raises(NotDecodableError, match="do not determine"):
        decoder.decoding()


@pytest.mark.parametrize(
    ("n", "s", "valid"),
    [(6, 3, "[0, 1, 2, 5]"), (7, 1, "[0, 6]"), (10, 2, "[0, 1, 4, 9]")],
)
def test_s_plus_one_must_divide_n(n: int, s: int, valid: str) -> None:
    with pytest.raises(ValueError, match=r"Argument 's'.*\(s \+ 1\) \| n") as info:
        FractionalRepetitionCode(n, s)
    assert f"with n = {n} the valid values are {valid}, not {s}." in str(info.value)
    with pytest.raises(ValueError, match="Argument 's'"):
        FractionalRepetitionCode.for_stragglers(n, s)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0, "s": 0}, "Argument 'n' must be an integer >= 1, not 0"),
        ({"n": -4, "s": 0}, "Argument 'n' must be an integer >= 1, not -4"),
        ({"n": 4, "s": 4}, r"Argument 's' must be an integer in \[0, 3\]"),
        ({"n": 4, "s": 7}, r"Argument 's' must be an integer in \[0, 3\].*not 7"),
        ({"n": 4, "s": -1}, r"Argument 's' must be an integer in \[0, 3\]"),
        ({"n": 4.0, "s": 1}, "Argument 'n' must be an integer"),
        ({"n": 4, "s": True}, "Argument 's' must be an integer"),
    ],
)
def test_invalid_parameters(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FractionalRepetitionCode(**kwargs)  # type: ignore[arg-type]


def test_unknown_message_and_worker() -> None:
    code = FractionalRepetitionCode(4, 1)
    with pytest.raises(KeyError, match="not part of this iteration"):
        code.decoder().add(4)
    with pytest.raises(KeyError, match="does not exist"):
        code.support(-1)
    with pytest.raises(ValueError, match="Argument 'worker'"):
        code.group_of(4)


def test_repr_registry_and_small_configs() -> None:
    assert repr(FractionalRepetitionCode(6, 2)) == "<FractionalRepetitionCode(n=6, s=2)>"
    assert isinstance(make_code("fractional", n=6, s=1), FractionalRepetitionCode)
    configs = list(FractionalRepetitionCode.small_configs(6))
    assert {"n": 6, "s": 2} in configs and {"n": 6, "s": 3} not in configs
    assert all(c["n"] % (c["s"] + 1) == 0 for c in configs)
    assert valid_fractional_stragglers(12) == [0, 1, 2, 3, 5, 11]


@st.composite
def _code_and_arrivals(draw: st.DrawFn) -> tuple[FractionalRepetitionCode, list[int]]:
    n = draw(st.integers(1, 64))
    s = draw(st.sampled_from(valid_fractional_stragglers(n)))
    order = draw(st.permutations(range(n)))
    size = draw(st.integers(0, n))
    return FractionalRepetitionCode(n, s), list(order[:size])


@settings(max_examples=60, deadline=None)
@given(_code_and_arrivals())
def test_decodable_exactly_when_every_group_arrived(case: tuple[FractionalRepetitionCode, list[int]]) -> None:
    code, arrivals = case
    decoder = code.decoder()
    for row in arrivals:
        decoder.add(row)
    every_group = {code.group_of(w) for w in arrivals} == set(range(code.num_groups))
    assert decoder.decodable == every_group
    if arrivals:
        assert ones_in_span(code.B[arrivals]) == every_group
    if len(arrivals) >= code.n - code.s:
        assert decoder.decodable
    if every_group:
        assert decode_error(code, arrivals, rng=np.random.default_rng(len(arrivals))) <= TOLERANCE
        assert set(decoder.decoding().weights.tolist()) == {1.0}


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.sampled_from(valid_fractional_stragglers(n)))))
def test_contiguous_survivors_decode_exactly(params: tuple[int, int]) -> None:
    n, s = params
    code = FractionalRepetitionCode(n, s)
    for survivors in contiguous_survivor_sets(n, n - s):
        assert decode_error(code, survivors) <= TOLERANCE
