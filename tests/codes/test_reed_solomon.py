"""Reed–Solomon gradient code (Halbawi et al.): paper example, closed-form decoders, guard, properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcode.common.codes.reed_solomon as rs
from gradcode.common.codes import code_parameters, make_code
from gradcode.common.codes.numerics import (
    DEFAULT_MAX_DECODE_ERROR,
    contiguous_survivor_sets,
    decode_error,
    ones_in_span,
    worst_decode_error,
)
from gradcode.common.codes.reed_solomon import (
    ReedSolomonCode,
    decoding_weights,
    decoding_weights_algorithm3,
    encoding_matrix,
)
from gradcode.common.exceptions import NumericallyUnsafeError

TOLERANCE = 1e-9


def _alpha_powers(n: int, exponents: object) -> np.ndarray:
    return np.exp(2j * np.pi * np.asarray(exponents) / n)


# ---- the paper's example (n, k, w) = (8, 4, 3) --------------------------------------------------


def test_paper_example_parameters() -> None:
    code = ReedSolomonCode(8, 4, 3)
    assert (code.n, code.k, code.w, code.s, code.f) == (8, 4, 3, 5, 3)
    np.testing.assert_array_equal(code.B != 0, code.mask == 1)


def test_paper_example_polynomials_eq7_to_eq10() -> None:
    # t_1..t_4 vanish at {α^6, α^7}, {α^4, α^5}, {α^2, α^3}, {1, α} and have constant term 1 (κ_j).
    code = ReedSolomonCode(8, 4, 3)
    zeros = [(6, 7), (4, 5), (2, 3), (0, 1)]
    points = _alpha_powers(8, range(8))
    for j, roots in enumerate(zeros):
        coefficients = np.poly(_alpha_powers(8, roots))  # highest degree first
        coefficients = coefficients / coefficients[-1]  # κ_j: constant term 1
        np.testing.assert_allclose(code.B[:, j], np.polyval(coefficients, points), atol=1e-12)
        assert np.all(code.B[list(roots), j] == 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.data())
def test_encoding_matrix_is_vandermonde_times_coefficients(n: int, data: st.DataObject) -> None:
    # B = G T (eq. (11)) with G the n x f Vandermonde matrix and T's first row all ones (t_j(0) = 1).
    k = data.draw(st.integers(1, n))
    w = data.draw(st.integers(-(-2 * k // n), k))
    b = encoding_matrix(n, k, w)
    f = n - rs.straggler_tolerance(n, k, w)
    g = np.vander(_alpha_powers(n, range(n)), f, increasing=True)
    t = g.conj().T @ b / n  # the columns of G are orthogonal with norm² n
    np.testing.assert_allclose(g @ t, b, atol=1e-9 * np.abs(b).max())
    np.testing.assert_allclose(t[0], np.ones(k), rtol=1e-9)


# ---- closed-form decoding weights ---------------------------------------------------------------


@st.composite
def survivor_sets(draw: st.DrawFn, max_n: int = 64) -> tuple[int, list[int]]:
    n = draw(st.integers(2, max_n))
    size = draw(st.integers(1, n))
    rows = draw(st.permutations(range(n)))[:size]
    return n, list(rows)


@settings(max_examples=80, deadline=None)
@given(survivor_sets())
def test_fast_weights_equal_algorithm_3(case: tuple[int, list[int]]) -> None:
    n, rows = case
    np.testing.assert_allclose(decoding_weights(n, rows), decoding_weights_algorithm3(n, rows), rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(survivor_sets(max_n=16))
def test_fast_weights_solve_the_vandermonde_system(case: tuple[int, list[int]]) -> None:
    # Eq. (12): a^T G_F = e_1 for the square Vandermonde G_F of the survivors, checked against lstsq.
    n, rows = case
    vandermonde = np.vander(_alpha_powers(n, rows), len(rows), increasing=True)
    unit = np.zeros(len(rows), dtype=complex)
    unit[0] = 1.0
    reference, *_ = np.linalg.lstsq(vandermonde.T, unit, rcond=None)
    np.testing.assert_allclose(decoding_weights(n, rows), reference, atol=1e-9 * np.abs(reference).max())


@pytest.mark.parametrize("limit", [0, 10**9])
def test_python_and_numpy_paths_agree(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    rng = np.random.default_rng(3)
    for n in (3, 7, 12, 30):
        rows = [int(r) for r in rng.permutation(n)[: n - n // 3]]
        expected = decoding_weights_algorithm3(n, rows)
        monkeypatch.setattr(rs, "_PYTHON_PATH_LIMIT", limit)
        np.testing.assert_allclose(decoding_weights(n, rows), expected, rtol=1e-12)
        monkeypatch.undo()


@pytest.mark.parametrize("limit", [0, 10**9])
@pytest.mark.parametrize("rows", [[0, 0, 1], [0, 5], [-1, 2], []])
def test_weights_refuse_bad_rows(monkeypatch: pytest.MonkeyPatch, limit: int, rows: list[int]) -> None:
    monkeypatch.setattr(rs, "_PYTHON_PATH_LIMIT", limit)
    with pytest.raises(ValueError, match="Argument 'rows'"):
        decoding_weights(5, rows)
    with pytest.raises(ValueError, match="Argument 'rows'"):
        decoding_weights_algorithm3(5, rows)


def test_weights_of_every_f_set_give_all_ones() -> None:
    code = ReedSolomonCode.for_stragglers(12, 3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = [int(r) for r in rng.permutation(12)[: code.f]]
        np.testing.assert_allclose(decoding_weights(12, rows) @ code.B[rows], np.ones(code.k), atol=1e-12)


# ---- parameters, registry, presentation ---------------------------------------------------------


def test_registry_and_for_stragglers() -> None:
    code = make_code("reed_solomon", n=8, k=4, w=3)
    assert isinstance(code, ReedSolomonCode)
    assert code_parameters("reed_solomon") == ["n", "k", "w", "max_decode_error"]
    for n, s in [(2, 1), (10, 2), (12, 5), (20, 4), (9, 8)]:
        natural = ReedSolomonCode.for_stragglers(n, s)
        assert isinstance(natural, ReedSolomonCode)
        assert (natural.n, natural.k, natural.w, natural.s) == (n, n, s + 1, s)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"n": 1, "k": 1, "w": 1}, "Argument 'n' must be an integer >= 2"),
        ({"n": 4, "k": 0, "w": 1}, "Argument 'k' must be an integer >= 1"),
        ({"n": 4, "k": 4, "w": 5}, "Argument 'w' must be an integer in \\[1, 4\\]"),
        ({"n": 4, "k": 4, "w": 1}, "Argument 'w' must be at least ceil\\(2k/n\\) = 2 .* not 1"),
        ({"n": 10, "k": 7, "w": 1}, "Argument 'w' must be at least ceil\\(2k/n\\) = 2 .* not 1"),
        ({"n": 4, "k": 4, "w": 2, "max_decode_error": 0.0}, "Argument 'max_decode_error' must be a positive"),
        ({"n": 4, "k": 4, "w": 2, "max_decode_error": math.nan}, "Argument 'max_decode_error' must be a positive"),
        ({"n": 4, "k": 4, "w": 2, "max_decode_error": True}, "Argument 'max_decode_error' must be a positive"),
        ({"n": 4.0, "k": 4, "w": 2}, r"Argument 'n' must be an integer >= [0-9]+, not 4.0"),
    ],
)
def test_exceptions(params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReedSolomonCode(**params)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "s"), [(5, 0), (5, 5), (1, 0)])
def test_for_stragglers_refuses(n: int, s: int) -> None:
    with pytest.raises(ValueError, match=r"Argument '[ns]'"):
        ReedSolomonCode.for_stragglers(n, s)


def test_repr_and_str() -> None:
    assert repr(ReedSolomonCode(8, 4, 3)) == "<ReedSolomonCode(n=8, k=4, w=3)>"
    assert repr(ReedSolomonCode(8, 7, 3, max_decode_error=1e-6)) == (
        "<ReedSolomonCode(n=8, k=7, w=3, max_decode_error=1e-06)>"
    )
    text = str(ReedSolomonCode(8, 7, 3, max_decode_error=math.inf))
    assert text == (
        "ReedSolomonCode:\n"
        "  (n, k, w): (8, 7, 3)\n"
        "  stragglers s: 2 (any f = 6 workers decode)\n"
        "  column weights: 4 x 3, 3 x 4\n"
        "  worst decode error: not measured (max inf)"
    )


# ---- numerical guard ----------------------------------------------------------------------------


def test_guard_refuses_ill_conditioned_codes() -> None:
    with pytest.raises(NumericallyUnsafeError, match=r"decode error [0-9.e+-]+ .*max_decode_error=1e-09.*'binary'"):
        ReedSolomonCode.for_stragglers(45, 9)
    assert issubclass(NumericallyUnsafeError, ValueError)
    with pytest.raises(NumericallyUnsafeError, match=r"certifies relative error [0-9.e+-]+ > max_decode_error=1e-06"):
        ReedSolomonCode(45, 45, 10, max_decode_error=1e-6)  # measured within 1e-6, certified above it (issue 24)
    relaxed = ReedSolomonCode(45, 45, 10, max_decode_error=1e-3)
    assert relaxed.measured_decode_error is not None and relaxed.certified_decode_error is not None
    assert DEFAULT_MAX_DECODE_ERROR < relaxed.measured_decode_error <= relaxed.certified_decode_error <= 1e-3
    assert ReedSolomonCode(45, 45, 10, max_decode_error=math.inf).measured_decode_error is None


def test_guard_limits_documented_in_module() -> None:
    # s = n/5 (k = n, w = s + 1): accepted up to n = 29, refused at n = 30 (module docstring, issue 24's guard).
    accepted = ReedSolomonCode.for_stragglers(29, 5)
    assert isinstance(accepted, ReedSolomonCode)
    assert accepted.certified_decode_error is not None and accepted.measured_decode_error is not None
    assert accepted.measured_decode_error <= accepted.certified_decode_error <= DEFAULT_MAX_DECODE_ERROR
    with pytest.raises(NumericallyUnsafeError):
        ReedSolomonCode.for_stragglers(30, 6)


def test_guard_agrees_with_independent_measurement() -> None:
    # The guard's fast measurement and numerics.worst_decode_error (through the decoder) agree in size.
    for n, s in [(30, 6), (45, 9), (60, 12)]:
        code = ReedSolomonCode(n, n, s + 1, max_decode_error=math.inf)
        fast = ReedSolomonCode(n, n, s + 1, max_decode_error=1e300).measured_decode_error
        assert fast is not None
        slow = worst_decode_error(code, contiguous_survivor_sets(n, code.f))
        assert 0.01 < slow / fast < 100, (n, s, fast, slow)


# ---- exact decodability -------------------------------------------------------------------------


def test_rank_deficient_code_decodes_below_f() -> None:
    # (8, 8, 2): columns j and j + 4 share a mask arc, so one worker per pair {0,1}, {2,3}, ... decodes.
    code = ReedSolomonCode(8, 8, 2)
    assert code.f == 7
    assert not code.has_full_rank
    decoder = code.decoder()
    for worker in (0, 2, 4):
        assert not decoder.add(worker)
    assert decoder.add(7)
    assert decode_error(code, [0, 2, 4, 7]) <= TOLERANCE
    assert ReedSolomonCode(10, 10, 3).has_full_rank


def test_rows_after_a_span_decode_are_not_mixed_in() -> None:
    code = ReedSolomonCode(8, 8, 2)
    decoder = code.decoder()
    for worker in (0, 2, 4, 6, 1):
        decoder.add(worker)
    assert decoder.decoding().rows == (0, 2, 4, 6)
    assert decode_error(code, [0, 2, 4, 6, 1]) <= TOLERANCE


def test_ill_conditioned_span_is_refused_not_decoded_wrong() -> None:
    # k = 13 < f = 16, so rank B < f; Gram–Schmidt alone calls the contiguous workers 0..14 spanning,
    # but least squares cannot reproduce the all-ones vector from them: wait for the 16th worker.
    code = ReedSolomonCode(32, 13, 7, max_decode_error=1e-6)  # certified 1.2e-7: the 1e-9 guard refuses it
    decoder = code.decoder()
    for worker in range(15):
        assert not decoder.add(worker)
    assert not ones_in_span(code.B[:15])
    assert decoder.add(15)
    assert decode_error(code, list(range(16))) <= TOLERANCE


def test_more_than_f_rows_use_every_row() -> None:
    code = ReedSolomonCode.for_stragglers(12, 3)
    decoding = code.decode(list(range(12)))
    assert decoding.rows == tuple(range(12))
    assert decode_error(code, list(range(12))) <= TOLERANCE


@st.composite
def codes_and_arrivals(draw: st.DrawFn) -> tuple[dict[str, int], list[int]]:
    n = draw(st.integers(2, 64))
    k = draw(st.integers(1, 2 * n))
    w = draw(st.integers(-(-2 * k // n), k))
    f = n - rs.straggler_tolerance(n, k, w)
    if draw(st.booleans()):
        order = list(draw(st.permutations(range(n))))
    else:  # adversarial: the s stragglers are cyclically contiguous and arrive last
        start = draw(st.integers(0, n - 1))
        survivors = draw(st.permutations(contiguous_survivor_sets(n, f)[start]))
        order = list(survivors) + [w_ for w_ in range(n) if w_ not in survivors]
    return {"n": n, "k": k, "w": w}, order


@settings(max_examples=60, deadline=None)
@given(codes_and_arrivals())
def test_online_decoding_properties(case: tuple[dict[str, int], list[int]]) -> None:
    params, order = case
    try:
        code = ReedSolomonCode(**params)
    except NumericallyUnsafeError as refusal:  # measured or certified (issue 24) above the bound: it says which
        assert refusal.measured_error is not None and refusal.measured_error > DEFAULT_MAX_DECODE_ERROR
        return
    decoder = code.decoder()
    used = 0
    for worker in order:
        used += 1
        if decoder.add(worker):
            break
    assert decoder.decodable
    assert used <= code.f
    received = list(decoder.received)
    assert decode_error(code, received) <= TOLERANCE
    if used < code.f:
        assert not code.has_full_rank
        assert ones_in_span(code.B[received])
    elif used > 1 and code.n <= 24:
        assert not ones_in_span(code.B[received[:-1]])
