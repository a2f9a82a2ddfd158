"""Consistency checks from surplus messages (issue 10): wrong messages detected, located, decoded around.

Honest messages (formed by the workers' own ``encode`` from partial gradients whose magnitudes span
six orders) must never raise an alarm; one worker's well-formed wrong message must be detected as soon
as one relation involves it, and located when the relations tell it apart from every other worker.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradcode.common.codes import GradientCode, make_code
from gradcode.common.codes.consistency import check_consistency, decode_excluding, parity_checks
from gradcode.common.codes.numerics import relative_error

CODES = [
    ("cyclic", {"n": 6, "s": 2}),
    ("cyclic", {"n": 16, "s": 4, "max_certified_error": math.inf}),
    ("binary", {"n": 6, "s": 2}),
    ("binary", {"n": 12, "s": 3}),
    ("fractional", {"n": 6, "s": 2}),
    ("reed_solomon", {"n": 12, "k": 12, "w": 4}),
    ("clustered", {"n": 8, "clusters": 2, "load": 3}),
    ("coded_reduce", {"n": 6, "s": 2}),
    ("partial_stragglers", {"n": 5, "s": 2}),
]


def messages_of(code: GradientCode, g: np.ndarray, rows: list[int]) -> dict[int, np.ndarray]:
    return {r: code.encode(r, {j: g[j] for j in code.support(r)}) for r in rows}


def spread_gradients(rng: np.random.Generator, k: int, p: int = 64) -> np.ndarray:
    return rng.standard_normal((k, p)) * 10.0 ** rng.uniform(0, 6, size=(k, 1))


def corrupt(messages: dict[int, np.ndarray], rows: tuple[int, ...], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Well-formed wrong values: the right message plus 1e-6 of its norm in a random direction."""
    bad = dict(messages)
    for r in rows:
        noise = rng.standard_normal(messages[r].shape)
        bad[r] = messages[r] + 1e-6 * np.linalg.norm(messages[r]) * noise / np.linalg.norm(noise)
    return bad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CODES), seed=st.integers(0, 2**32 - 1), surplus=st.integers(0, 3))
def test_honest_messages_never_raise_an_alarm(case: tuple[str, dict[str, int]], seed: int, surplus: int) -> None:
    code = make_code(case[0], **case[1])
    rng = np.random.default_rng(seed)
    assignment = code.static_assignment()
    workers = sorted(rng.choice(code.n, size=min(code.n, code.n - code.s + surplus), replace=False).tolist())
    rows = assignment.rows_of(workers)
    report = check_consistency(code, messages_of(code, spread_gradients(rng, code.k), rows))
    assert report.consistent and report.worst_violation <= 1.0, (code, workers, report)
    assert not report.suspects and report.located is None


@pytest.mark.parametrize(("name", "params"), CODES)
def test_one_wrong_message_among_surplus_is_detected_and_located(name: str, params: dict[str, int]) -> None:
    code = make_code(name, **params)
    assignment = code.static_assignment()
    rng = np.random.default_rng(7)
    every_row = [r for rows in assignment.rows for r in rows]
    g = spread_gradients(rng, code.k)
    honest = messages_of(code, g, every_row)
    located = 0
    for culprit in range(code.n):
        report = check_consistency(code, corrupt(honest, assignment.rows[culprit], rng))
        if not parity_checks(code.B[every_row])[:, [every_row.index(r) for r in assignment.rows[culprit]]].any():
            continue  # no relation involves this worker's rows (e.g. a naive part): nothing can see it
        assert not report.consistent and report.worst_violation > 10, (code, culprit, report)
        if report.located is not None:
            assert report.located == culprit and report.suspects == (culprit,)
            located += 1
            # Decode without it: the exact gradient again (when the others suffice: s >= 1).
            decoding = decode_excluding(code, every_row, [culprit], assignment)
            if decoding is None:
                assert code.s == 0  # e.g. partial stragglers: only this worker holds its naive part
                continue
            combined, certificate = decoding.combine_certified(honest)
            assert relative_error(combined, g.sum(axis=0)) <= certificate.bound <= 1e-9
    assert located > 0, f"{code}: no culprit located with all n workers' messages in hand"


def test_one_surplus_message_detects_but_cannot_locate() -> None:
    code = make_code("cyclic", n=6, s=2)
    rng = np.random.default_rng(1)
    rows = [0, 1, 2, 3, 4]  # n - s + 1: one relation
    honest = messages_of(code, spread_gradients(rng, code.k), rows)
    report = check_consistency(code, corrupt(honest, (2,), rng))
    assert report.checks == 1 and not report.consistent
    assert report.located is None and report.suspects == (0, 1, 2, 3, 4)  # each alone could be the one


def test_minimal_set_has_nothing_to_check() -> None:
    code = make_code("cyclic", n=6, s=2)
    rng = np.random.default_rng(2)
    honest = messages_of(code, spread_gradients(rng, code.k), [0, 1, 2, 3])
    report = check_consistency(code, corrupt(honest, (1,), rng))
    assert report.checks == 0 and report.consistent


def test_decode_excluding_says_when_the_rest_is_not_decodable() -> None:
    code = make_code("cyclic", n=6, s=2)
    assert decode_excluding(code, [0, 1, 2, 3], [0]) is None
    decoding = decode_excluding(code, [0, 1, 2, 3, 4], [0])
    assert decoding is not None and 0 not in decoding.rows


def test_unknown_rows_and_ragged_messages_are_refused() -> None:
    code = make_code("binary", n=4, s=1)
    with pytest.raises(KeyError, match="not part of the assignment"):
        check_consistency(code, {99: np.zeros(3)})
    with pytest.raises(ValueError, match="one shape"):
        check_consistency(code, {0: np.zeros(3), 1: np.zeros(4)})
