"""Tree jobs (coded_reduce with L > 1): node layout, what LoadJob carries, and that it decodes exactly.

The bottom-up check below uses only what the master sends (every JobSetup) plus the library: each
node's own message from its loaded rows and data, each parent's decode with the child code it is
told to build, and the master's decoder. It must equal the centralized gradient and
:func:`~gradcode.common.codes.coded_reduce.simulate_coded_reduce`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradcode.common.codes.coded_reduce import CompAllocCode, simulate_coded_reduce
from gradcode.common.codes.registry import make_code
from gradcode.common.transport.wire import code_spec, dict_from_struct
from gradcode.master.job import JobRunner
from gradcode.master.pool import PoolWorker, WorkerPool
from gradcode.master.spec import JobPlan, JobSpecError, plan_job
from gradcode.v1 import master_pb2, worker_pb2
from tests.master.test_job_spec import spec

TREES = [(2, 1, 2), (3, 1, 2), (2, 0, 2), (3, 2, 2), (2, 1, 3)]


def runner_for(plan: JobPlan) -> JobRunner:
    """A runner whose worker index ``w`` is pool worker ``w`` at a made-up loopback address."""
    runner = JobRunner(plan, WorkerPool())
    runner.loader.workers = [PoolWorker(worker_id=w, address=f"127.0.0.1:{20000 + w}") for w in range(plan.num_workers)]
    return runner


async def setups_and_data(plan: JobPlan) -> list[tuple[worker_pb2.JobSetup, dict[int, tuple[np.ndarray, np.ndarray]]]]:
    """Every worker's JobSetup and the partition data its LoadJob stream carries."""
    runner = runner_for(plan)
    out = []
    for w in range(plan.num_workers):
        chunks = [chunk async for chunk in runner.loader.load_stream(w)]
        data: dict[int, tuple[bytearray, bytearray]] = {}
        for chunk in chunks[1:]:
            d = chunk.data
            features, labels = data.setdefault(d.partition, (bytearray(), bytearray()))
            features += d.features
            labels += d.labels
        arrays = {
            j: (np.frombuffer(bytes(f), "<f8").reshape(-1, plan.dataset.num_features), np.frombuffer(bytes(y), "<f8"))
            for j, (f, y) in data.items()
        }
        out.append((chunks[0].setup, arrays))
    return out


@pytest.mark.parametrize(("n", "s", "L"), TREES)
def test_a_tree_job_takes_every_node_as_a_worker_in_breadth_first_order(n: int, s: int, L: int) -> None:
    plan = plan_job(spec("coded_reduce", {"n": n, "s": s, "L": L}))
    assert plan.topology is not None
    assert plan.num_workers == sum(n**level for level in range(1, L + 1))
    parent_of = plan.topology.parent_of()
    assert parent_of[:n] == [-1] * n
    for w in range(n, plan.num_workers):
        assert parent_of[w] == (w - n) // n  # breadth first: children of w are n + n*w .. n + n*w + n - 1
        assert w in plan.topology.children(parent_of[w])
    for w in range(n):
        assert plan.topology.node(w).slot == w == plan.code.static_assignment().rows[w][0]


@pytest.mark.parametrize(("n", "s", "L"), [*TREES, (4, 1, 2)])
@pytest.mark.parametrize("seed", [None, 7])
def test_the_child_code_spec_builds_the_trees_per_parent_code(n: int, s: int, L: int, seed: int | None) -> None:
    params: dict[str, Any] = {"n": n, "s": s, "L": L} | ({} if seed is None else {"seed": seed})
    plan = plan_job(spec("coded_reduce", params))
    assert plan.topology is not None
    child_spec = code_spec(plan.topology.child_code.name, plan.topology.child_code.params)  # what LoadJob carries
    child = make_code(child_spec.name, **dict_from_struct(child_spec.params))  # what worker/parent.py does
    reference = CompAllocCode(n, s) if seed is None else CompAllocCode(n, s, seed=seed)
    np.testing.assert_array_equal(child.B, reference.B)
    np.testing.assert_array_equal(child.B, plan.topology.tree.code.B)
    assert child.static_assignment().rows == tuple((i,) for i in range(n))


@pytest.mark.parametrize(("n", "s", "L"), TREES)
async def test_each_node_is_loaded_with_exactly_its_partitions_one_row_and_its_children(n: int, s: int, L: int) -> None:
    plan = plan_job(spec("coded_reduce", {"n": n, "s": s, "L": L}, iteration_deadline_seconds=6.0))
    assert plan.topology is not None
    for w, (setup, arrays) in enumerate(await setups_and_data(plan)):
        node = plan.topology.node(w)
        assert setup.worker_id == w
        assert len(setup.rows) == 1
        row = setup.rows[0]
        assert row.row == node.slot
        assert list(row.partitions) == sorted(node.partitions)
        expected = dict(zip(node.partitions, node.coefficients, strict=True))
        assert list(row.coefficients_real) == [expected[j] for j in row.partitions]
        assert sorted(arrays) == sorted(node.partitions) and setup.num_partitions_sent == len(node.partitions)
        for j, (X, y) in arrays.items():
            np.testing.assert_array_equal(X, plan.dataset.X_train[plan.partitions[j]])
            np.testing.assert_array_equal(y, plan.dataset.y_train[plan.partitions[j]])
        children = plan.topology.children(w)
        assert setup.HasField("parent") == bool(children)
        if children:
            role = setup.parent
            assert [c.worker_id for c in role.children] == children
            assert [c.address for c in role.children] == [f"127.0.0.1:{20000 + c}" for c in children]
            assert [plan.topology.node(c).slot for c in children] == list(range(n))
            assert role.child_code == code_spec(plan.topology.child_code.name, plan.topology.child_code.params)
            assert role.wait_seconds == pytest.approx(6.0 * (L + 1 - node.layer) / (L + 1))
            assert 0 < role.wait_seconds < 6.0


@pytest.mark.parametrize(("n", "s", "L"), TREES)
async def test_what_the_master_loads_decodes_bottom_up_to_the_centralized_gradient(n: int, s: int, L: int) -> None:
    plan = plan_job(spec("coded_reduce", {"n": n, "s": s, "L": L}))
    tree = plan.topology
    assert tree is not None
    rng = np.random.default_rng(n * 100 + s * 10 + L)
    params = rng.standard_normal(plan.model.num_params)
    loaded = await setups_and_data(plan)
    child_spec = code_spec(tree.child_code.name, tree.child_code.params)
    child_code = make_code(child_spec.name, **dict_from_struct(child_spec.params))
    # Every parent hears from a random n - s of its children, in random order (the rest straggle).
    arrivals = {w: [int(c) for c in rng.permutation(tree.children(w))[: n - s]] for w in range(plan.num_workers)}

    def message(w: int) -> np.ndarray:
        setup, arrays = loaded[w]
        row = setup.rows[0]
        own = sum(
            (
                c * plan.model.gradient(params, *arrays[j])
                for j, c in zip(row.partitions, row.coefficients_real, strict=True)
            ),
            np.zeros(plan.model.num_params),
        )
        if not setup.HasField("parent"):
            return own
        children = [c.worker_id for c in setup.parent.children]
        decoder = child_code.decoder()
        for c in arrivals[w]:  # like common.gather.round: stop at the first decodable moment
            if decoder.add(child_code.static_assignment().rows[children.index(c)][0]):
                break
        decoding = decoder.decoding()
        return own + decoding.combine({r: message(children[r]) for r in decoding.rows})

    root = plan.code.decoder()
    survivors = [int(w) for w in rng.permutation(n)[: n - s]]
    for w in survivors:
        if root.add(w):
            break
    decoding = root.decoding()
    decoded = decoding.combine({r: message(r) for r in decoding.rows})
    central = plan.model.gradient(params, plan.dataset.X_train, plan.dataset.y_train)
    assert np.linalg.norm(decoded - central) <= 1e-9 * np.linalg.norm(central)

    partials = np.array(
        [plan.model.gradient(params, plan.dataset.X_train[idx], plan.dataset.y_train[idx]) for idx in plan.partitions]
    )
    order = {0: [w + 1 for w in survivors]}  # the library numbers tree nodes, worker w is node w + 1
    order |= {v + 1: [c + 1 for c in arrivals[v]] for v in range(plan.num_workers) if tree.children(v)}
    simulated = simulate_coded_reduce(tree.tree, partials, order)
    assert np.linalg.norm(decoded - simulated) <= 1e-9 * np.linalg.norm(simulated)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            spec("coded_reduce", {"n": 2, "s": 1, "L": 2}, worker_ids=[0, 1]),
            r"worker_ids must list 6 distinct worker ids \(every node of the n=2, L=2 tree\)",
        ),
        (
            spec("coded_reduce", {"n": 2, "s": 1, "L": 2}, tree=master_pb2.TreeSpec(parent_of=[-1, -1, 0, 1, 0, 1])),
            r"JobSpec.tree.parent_of \[-1, -1, 0, 1, 0, 1\] does not match .*give \[-1, -1, 0, 0, 1, 1\]",
        ),
        (
            spec("cyclic", {"n": 6, "s": 2}, tree=master_pb2.TreeSpec(parent_of=[-1, -1, 0, 0, 1, 1])),
            r"JobSpec.tree is only for coded_reduce with L > 1",
        ),
        (
            spec("coded_reduce", {"n": 2, "s": 1}, tree=master_pb2.TreeSpec(parent_of=[-1, -1])),
            r"JobSpec.tree is only for coded_reduce with L > 1",
        ),
    ],
)
def test_tree_refusals_name_the_problem(bad: master_pb2.JobSpec, match: str) -> None:
    with pytest.raises(JobSpecError, match=match):
        plan_job(bad, known_worker_ids=list(range(8)))


def test_an_explicit_tree_that_matches_the_implied_one_is_accepted() -> None:
    plan = plan_job(
        spec("coded_reduce", {"n": 2, "s": 1, "L": 2}, tree=master_pb2.TreeSpec(parent_of=[-1, -1, 0, 0, 1, 1]))
    )
    assert plan.topology is not None and plan.num_workers == 6


def test_a_one_layer_coded_reduce_stays_a_flat_job() -> None:
    plan = plan_job(spec("coded_reduce", {"n": 3, "s": 1}))
    assert plan.topology is None and plan.num_workers == 3
