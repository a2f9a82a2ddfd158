"""Tandon et al. §1 and §2.1: the n = 3, s = 1 example (Figure 1b) reproduces exactly.

The printed matrices are the only hard-coded numbers here. Each row of the printed A is the decoding
for one straggler scenario: row i has zero weight on worker i (the straggler).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gradcode.common.codes.cyclic import ExplicitCode, cyclic_matrix
from gradcode.common.codes.numerics import decode_error, ones_in_span

PAPER_B = np.array([[0.5, 1.0, 0.0], [0.0, 1.0, -1.0], [0.5, 0.0, 1.0]])
PAPER_A = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, -1.0, 0.0]])


def _weights_over_workers(code: ExplicitCode, survivors: list[int]) -> np.ndarray:
    decoding = code.decode(survivors)
    full = np.zeros(code.n)
    full[list(decoding.rows)] = decoding.weights
    return full


def test_printed_a_times_b_is_all_ones() -> None:
    np.testing.assert_array_equal(PAPER_A @ PAPER_B, np.ones((3, 3)))


def test_b_satisfies_the_b_span_condition() -> None:
    # Condition 1: the all-ones vector is in the span of any n - s = 2 rows, and of no single row.
    for pair in itertools.combinations(range(3), 2):
        assert ones_in_span(PAPER_B[list(pair)]), pair
    for single in range(3):
        assert not ones_in_span(PAPER_B[[single]])


@pytest.mark.parametrize("straggler", [0, 1, 2])
def test_decoding_weights_are_the_rows_of_the_printed_a(straggler: int) -> None:
    code = ExplicitCode(PAPER_B, s=1)
    survivors = [w for w in range(3) if w != straggler]
    for order in (survivors, survivors[::-1]):
        np.testing.assert_allclose(_weights_over_workers(code, order), PAPER_A[straggler], atol=1e-14)
        assert decode_error(code, order) <= 1e-14


def test_introduction_combination() -> None:
    # §1: g1 + g2 + g3 = 2 (g1/2 + g2) - (g2 - g3), i.e. workers 1 and 2 survive (A's last row).
    g = np.random.default_rng(3).standard_normal((3, 5))
    messages = PAPER_B @ g
    np.testing.assert_allclose(2 * messages[0] - messages[1], g.sum(axis=0), rtol=1e-14, atol=1e-14)


def test_single_survivor_is_refused() -> None:
    code = ExplicitCode(PAPER_B, s=1)
    decoder = code.decoder()
    assert decoder.add(1) is False


def test_cyclic_algorithm_2_produces_the_example_up_to_row_scaling() -> None:
    # Algorithm 2 normalises b_i(i) = 1; H = [-2, 1, 1] (H·1 = 0) gives the paper's B with row 0 doubled.
    b = cyclic_matrix(np.array([[-2.0, 1.0, 1.0]]))
    np.testing.assert_allclose(b, np.diag([2.0, 1.0, 1.0]) @ PAPER_B, atol=0)
    code = ExplicitCode(b, s=1)
    for straggler in range(3):
        survivors = [w for w in range(3) if w != straggler]
        # Scaling row 0 by 2 scales its decoding weight by 1/2; everything else is unchanged.
        np.testing.assert_allclose(
            _weights_over_workers(code, survivors), PAPER_A[straggler] * [0.5, 1.0, 1.0], atol=1e-14
        )


def test_explicit_code_validates_its_matrix() -> None:
    with pytest.raises(ValueError, match="Argument 'b'"):
        ExplicitCode(np.ones(3), s=0)
    with pytest.raises(ValueError, match="Argument 's'"):
        ExplicitCode(PAPER_B, s=3)
    assert repr(ExplicitCode(PAPER_B, s=1)) == "<ExplicitCode(n=3, k=3, s=1)>"
