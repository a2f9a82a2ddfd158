"""GradientCode.decoding_set: the minimal set of workers a round expects to decode from (the rest are backups).

For every registered scheme's small configurations and random preference orders: the set decodes (checked
independently of the decoder, by the rank test), no member can be left out, it lies within the shortest
prefix of the preference that decodes, and a preference that cannot decode gives None.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradcode.common.codes import GradientCode, make_code
from gradcode.common.codes.numerics import ones_in_span
from tests.codes.test_contract import CONFIGS

ORDERS = 4


def _decodes(code: GradientCode, workers: list[int]) -> bool:
    assignment = code.assign(None)
    if not code.exact:  # (ignore_stragglers) "decodable" means enough workers, not the span
        return code.decodes(workers, assignment)
    rows = assignment.rows_of(workers)
    return bool(rows) and ones_in_span(code.B[rows])


@pytest.mark.parametrize(("name", "cfg"), CONFIGS)
def test_the_decoding_set_decodes_is_minimal_and_follows_the_preference(name: str, cfg: dict[str, int]) -> None:
    code = make_code(name, **cfg)
    assignment = code.assign(None)
    rng = np.random.default_rng(7)
    for _ in range(ORDERS):
        preference = [int(w) for w in rng.permutation(code.n)]
        chosen = code.decoding_set(assignment, preference)
        assert chosen is not None, f"{code}: all workers together must decode"
        assert _decodes(code, list(chosen)), f"{code}: {chosen} does not decode"
        for w in chosen:
            rest = [v for v in chosen if v != w]
            assert not _decodes(code, rest), f"{code}: {chosen} decodes without worker {w}"
        prefix = next(i for i in range(1, code.n + 1) if _decodes(code, preference[:i]))
        assert set(chosen) <= set(preference[:prefix])
        assert list(chosen) == [w for w in preference if w in chosen], "members keep the preference order"


@pytest.mark.parametrize(
    ("name", "cfg", "expected"),
    [
        ("uncoded", {"n": 4}, (0, 1, 2, 3)),
        ("binary", {"n": 6, "s": 1}, (0, 2, 4)),  # one complete congruence class
        ("cyclic", {"n": 6, "s": 1}, (0, 1, 2, 3, 4)),  # an MDS-like code: any n - s
    ],
)
def test_decoding_sets_of_known_structure(name: str, cfg: dict[str, int], expected: tuple[int, ...]) -> None:
    code = make_code(name, **cfg)
    assert code.decoding_set(code.static_assignment(), range(code.n)) == expected


def test_fractional_repetition_takes_one_worker_of_each_group_preferring_the_earlier() -> None:
    code = make_code("fractional", n=6, s=1)
    assignment = code.static_assignment()
    chosen = code.decoding_set(assignment, [5, 4, 3, 2, 1, 0])
    assert chosen is not None and len(chosen) == 3
    groups = {code.partitions_of_worker(w) for w in chosen}
    assert len(groups) == 3, "one worker per group of replicas"
    assert set(chosen) == {5, 4, 3}


@pytest.mark.parametrize(("name", "cfg"), [("cyclic", {"n": 6, "s": 2}), ("binary", {"n": 7, "s": 2})])
def test_a_set_completing_the_messages_in_hand_decodes_with_them_and_is_minimal(name: str, cfg: dict[str, int]) -> None:
    code = make_code(name, **cfg)
    assignment = code.static_assignment()
    given = [0, 3]
    completing = code.decoding_set(assignment, [1, 2, 4, 5, 6][: code.n - 2], given=given)
    assert completing is not None and not set(completing) & set(given)
    assert code.decodes([*given, *completing], assignment)
    for w in completing:
        assert not code.decodes([*given, *(v for v in completing if v != w)], assignment)
    assert code.decoding_set(assignment, [5], given=[0, 1, 2, 3, 4]) == (), "already decodable: nothing to add"


def test_a_preference_that_cannot_decode_gives_none() -> None:
    code = make_code("cyclic", n=6, s=1)
    assert code.decoding_set(code.static_assignment(), [0, 1, 2, 3]) is None  # n - s - 1 workers
    assert code.decoding_set(code.static_assignment(), []) is None
