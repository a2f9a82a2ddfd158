"""What a code tells the master (so the master never names a scheme): its implied size, the rows a
worker can be asked for, and its topology."""

from __future__ import annotations

from typing import Any

import pytest

from gradcode.common.codes.base import Observation
from gradcode.common.codes.registry import available_codes, code_class, make_code

CONFIGS = [(name, params) for name in available_codes() for params in code_class(name).small_configs(4)]


@pytest.mark.parametrize(("name", "params"), CONFIGS, ids=[f"{n}-{p}" for n, p in CONFIGS])
def test_the_implied_size_is_the_size_of_the_built_code(name: str, params: dict[str, Any]) -> None:
    code = make_code(name, **params)
    size = code_class(name).implied_size(params)
    topology = code.topology()
    assert size.workers == (code.n if topology is None else topology.num_workers)
    assert size.partitions is None or size.partitions == code.k


@pytest.mark.parametrize(("name", "params"), CONFIGS, ids=[f"{n}-{p}" for n, p in CONFIGS])
def test_every_row_a_worker_is_assigned_is_a_row_it_can_be_asked_for(name: str, params: dict[str, Any]) -> None:
    code = make_code(name, **params)
    observations: list[Observation | None] = [None]
    observations += [Observation(straggling=tuple(w == slow for w in range(code.n))) for slow in range(code.n)]
    for observation in observations:
        assignment = code.assign(observation) if code.dynamic else code.static_assignment()
        for w in range(code.n):
            assert set(assignment.rows[w]) <= set(code.rows_for_worker(w))
            held = set(code.partitions_of_worker(w))
            assert all(set(code.support(r)) <= held for r in code.rows_for_worker(w))


@pytest.mark.parametrize(("n", "s", "L"), [(2, 1, 2), (3, 1, 2), (2, 1, 3)])
def test_a_tree_topology_is_consistent(n: int, s: int, L: int) -> None:
    code = make_code("coded_reduce", n=n, s=s, L=L)
    topology = code.topology()
    assert topology is not None and make_code("coded_reduce", n=n, s=s, L=1).topology() is None
    parent_of = topology.parent_of()
    assert len(parent_of) == topology.num_workers == sum(n**layer for layer in range(1, L + 1))
    for w in range(topology.num_workers):
        assert all(parent_of[c] == w for c in topology.children(w))
        row = topology.row(w)
        assert list(row.partitions) == sorted(set(row.partitions)) and len(row.coefficients) == len(row.partitions)
    child = make_code(topology.child_code.name, **topology.child_code.params)
    assert child.n == n and child.s == s
