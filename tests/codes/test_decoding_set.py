"""GradientCode.decoding_set: the minimal set of workers a round expects to decode from (the rest are backups).

For every registered scheme's small configurations and random preference orders: the set decodes (checked
independently of the decoder, by the rank test), no member can be left out, it lies within the shortest
prefix of the preference that decodes, and a preference that cannot decode gives None.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradcode.common.codes import GradientCode, base, make_code
from gradcode.common.codes.numerics import ones_in_span, span_minimal_members
from gradcode.common.codes.registry import code_class
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


@pytest.mark.parametrize(("name", "cfg"), [c for c in CONFIGS if code_class(c.values[0]).exact])
def test_the_span_minimisation_leaves_out_exactly_whom_decoding_again_would(
    name: str, cfg: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The solves of ``span_minimal_members`` and a decode without each member, the latest first, keep the same
    members, for random preferences and messages in hand (the solves forced even where decoding again is cheaper)."""
    monkeypatch.setattr(base, "MINIMISE_BY_DECODING_UP_TO", 0)
    code = make_code(name, **cfg)  # (exact codes: an approximate one's decodable sets are no span)
    assignment = code.assign(None)
    rng = np.random.default_rng(11)
    for trial in range(2 * ORDERS):
        order = [int(w) for w in rng.permutation(code.n)]
        given, preference = (order[: trial % (code.n // 2 + 1)], order[trial % (code.n // 2 + 1) :])
        greedy = code._greedy_prefix(assignment, preference, given)
        if not greedy:  # (the given workers decode alone, or nobody does)
            continue
        kept = span_minimal_members(code.B, [assignment.rows[w] for w in greedy], assignment.rows_of(given))
        assert kept is not None
        assert [greedy[i] for i in kept] == code._minimal_by_decoding(assignment, greedy, given), (given, greedy)
        assert code.decoding_set(assignment, preference, given=given) == tuple(greedy[i] for i in kept)


@pytest.mark.parametrize(("name", "n"), [("clustered", 200), ("binary", 200), ("fractional", 200), ("uncoded", 150)])
def test_a_large_decoding_set_decodes_and_no_member_can_go(name: str, n: int) -> None:
    """Above the sizes the contract covers, where the span's solves run in blocks of rows (one per cluster or
    replica group) or in one large block (binary's overlapping runs), checked by the independent rank test."""
    code = code_class(name).for_stragglers(n, 0 if name == "uncoded" else 1)
    assignment = code.static_assignment()
    preference = [int(w) for w in np.random.default_rng(5).permutation(code.n)]
    chosen = code.decoding_set(assignment, preference)
    assert chosen is not None and _decodes(code, list(chosen))
    for w in chosen[:: max(1, len(chosen) // 12)]:
        assert not _decodes(code, [v for v in chosen if v != w]), f"{code}: decodes without worker {w}"
    assert list(chosen) == [w for w in preference if w in chosen]


def test_the_span_minimisation_refuses_rows_that_do_not_span_the_ones() -> None:
    b = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    assert span_minimal_members(b, [[0], [1]]) is None, "partition 2 is covered by no row"
    assert span_minimal_members(np.array([[1.0, 1.0], [1.0, 1.0]]), [[0], [1]]) == [1], "the earlier copy goes"
    assert span_minimal_members(np.array([[1.0, 2.0], [2.0, 4.0]]), [[0], [1]]) is None, "they span (1, 2) only"
