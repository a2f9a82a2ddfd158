"""CodedReduce trees with real processes: n = 2, L = 2, s = 1 (six worker processes and a master).

Worker index ``w`` of a tree job is tree node ``w + 1`` (breadth first): workers 0 and 1 are the
first layer, 2 and 3 the children of 0, 4 and 5 the children of 1. With ``worker_ids=cluster.ids``
worker index ``w`` is worker process ``w``. Every parent (the master included) needs any
``n - s = 1`` of its two children (``s = n - 1``: the per-parent code is all ones), so one leaf
under each first-layer parent may die, and after that first-layer node 0 too: the master decodes
from node 1, which decodes from its surviving leaf, and the gradient stays exact.

``python -m pytest -q -s tests/e2e/test_tree.py`` also prints the median iteration time of the
tree next to flat jobs on the same machine.
"""

from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pytest

from gradcode.common.transport.wire import array_from_tensor
from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job
from tests.e2e.test_training import EXACT, centralized_gd
from tests.helpers import fixed_delay

pytestmark = pytest.mark.e2e

TREE = {"n": 2, "s": 1, "L": 2}
FIRST_LAYER = (0, 1)
CHILDREN = {0: (2, 3), 1: (4, 5)}


def assert_exact(reports: list[master_pb2.IterationReport], iterations: int) -> None:
    assert [r.iteration for r in reports] == list(range(1, iterations + 1))
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)


async def test_a_healthy_tree_trains_exactly_like_centralized_gradient_descent(cluster6: Cluster) -> None:
    cluster6.ensure_all_up()
    iterations, lr = 8, 0.5
    spec = job_spec("coded_reduce", TREE, iterations=iterations, learning_rate=lr, worker_ids=cluster6.ids, verify=True)
    async with asyncio.timeout(180), master_stub(cluster6.master_address) as stub:
        info, reports = await run_job(cluster6.master_address, spec)
        model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
        flat = {}
        for name, code, code_params, ids in [
            ("flat cyclic n=6 s=1", "cyclic", {"n": 6, "s": 1}, cluster6.ids),
            ("flat coded_reduce n=2 s=1 L=1", "coded_reduce", {"n": 2, "s": 1}, cluster6.ids[:2]),
        ]:
            flat_spec = job_spec(code, code_params, iterations=iterations, worker_ids=ids)
            flat_info, flat_reports = await run_job(cluster6.master_address, flat_spec)
            assert flat_info.state == master_pb2.JOB_STATE_SUCCEEDED, flat_info.message
            flat[name] = statistics.median(r.wall_seconds for r in flat_reports)

    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert_exact(reports, iterations)
    first_layer = {cluster6.ids[w] for w in FIRST_LAYER}
    for r in reports:
        assert set(r.used_workers) <= first_layer and r.used_workers
        assert not r.failed_workers
        assert {t.worker_id for t in r.timings} <= first_layer
    params, accuracy = centralized_gd(iterations, lr)
    np.testing.assert_allclose(array_from_tensor(model.parameters), params, rtol=1e-7, atol=1e-9)
    assert abs(reports[-1].test_accuracy - accuracy) <= 0.01
    tree_median = statistics.median(r.wall_seconds for r in reports)
    print(f"\nmedian iteration: tree n=2 s=1 L=2 {tree_median * 1e3:.1f} ms; " + "; ".join(
        f"{name} {seconds * 1e3:.1f} ms" for name, seconds in flat.items()
    ))  # fmt: skip


async def test_killed_leaves_and_a_killed_first_layer_node_leave_the_gradient_exact(cluster6: Cluster) -> None:
    cluster6.ensure_all_up()
    # Every worker sleeps 50 ms per iteration, so the job is still running well after the kills the
    # watcher triggers (the master never waits for watchers); what is asserted is the order of events:
    # once first-layer node 0 has failed, every later iteration decodes from node 1 alone, exactly.
    iterations, lr = 30, 0.5
    leaves = (CHILDREN[0][1], CHILDREN[1][0])  # one leaf under each first-layer parent
    killed: dict[int, tuple[int, ...]] = {}

    def kill(report: master_pb2.IterationReport) -> None:
        victims = {3: leaves, 7: (0,)}.get(report.iteration, ())
        for i in victims:
            cluster6.kill(i)
        if victims:
            killed[report.iteration] = victims

    spec = job_spec(
        "coded_reduce",
        TREE,
        iterations=iterations,
        learning_rate=lr,
        worker_ids=cluster6.ids,
        verify=True,
        iteration_deadline_seconds=10.0,
        straggler=fixed_delay(0.05),
    )
    async with asyncio.timeout(180), master_stub(cluster6.master_address) as stub:
        info, reports = await run_job(cluster6.master_address, spec, kill)
        model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))

    assert killed == {3: leaves, 7: (0,)}
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert_exact(reports, iterations)
    survivor, victim = cluster6.ids[1], cluster6.ids[0]
    lost = [r.iteration for r in reports if r.iteration > 7 and victim in r.failed_workers]
    assert lost, "first-layer node 0 was killed but never reported failed"
    after = [r for r in reports if r.iteration >= lost[0]]
    assert all(r.used_workers == [survivor] and victim in r.failed_workers for r in after), [
        (r.iteration, list(r.used_workers), list(r.failed_workers)) for r in after
    ]
    params, _ = centralized_gd(iterations, lr)
    np.testing.assert_allclose(array_from_tensor(model.parameters), params, rtol=1e-7, atol=1e-9)


async def test_a_parent_without_decodable_children_fails_the_job_naming_them_and_stays_up(cluster6: Cluster) -> None:
    # Continues from the previous test's state if it ran: worker 0 and leaves 3 and 4 are dead already.
    for i in (0, 3, 4, 5):
        cluster6.kill(i)
    spec = job_spec("coded_reduce", TREE, iterations=3, worker_ids=cluster6.ids, iteration_deadline_seconds=1.5)
    async with asyncio.timeout(120):
        info, reports = await run_job(cluster6.master_address, spec)

    assert info.state == master_pb2.JOB_STATE_FAILED
    assert "Iteration 1: not decodable within the iteration deadline of 1.5 s" in info.message, info.message
    assert f"missing workers {sorted(cluster6.ids[w] for w in FIRST_LAYER)}" in info.message
    assert "Tree parent of job" in info.message and "children [4, 5] did not deliver" in info.message
    for i in CHILDREN[1]:
        assert cluster6.addresses[i] in info.message
    assert "tolerates 1 straggler(s) among the children of every parent" in info.message
    assert reports and set(reports[-1].failed_workers) == {cluster6.ids[w] for w in FIRST_LAYER}
    states = {w.worker_id: w.state for w in cluster6.list_workers()}
    assert states[cluster6.ids[1]] == master_pb2.WORKER_STATE_UP  # alive: its children failed, not it


async def test_a_deeper_node_killed_and_restarted_is_reloaded_and_used_again(cluster6: Cluster) -> None:
    """Leaf 2 (under first-layer node 0) is killed and restarted at its address; then its sibling, leaf 3,
    dies for good. From then on node 0 can only answer if leaf 2 was loaded with the job again and is
    used: first-layer node 1 is a fixed 1 s straggler, so every iteration node 0 answers in is decoded
    from node 0 (and, without a reload, node 0 fails every iteration and node 1 is used instead)."""
    cluster6.ensure_all_up()
    restarted, sibling = CHILDREN[0]
    events: dict[str, int] = {}

    def chaos(report: master_pb2.IterationReport) -> None:
        if "killed" not in events and report.iteration >= 3:
            cluster6.kill(restarted)
            events["killed"] = int(report.iteration)
        elif "killed" in events and "restarted" not in events and report.iteration >= events["killed"] + 3:
            cluster6.restart(restarted)
            cluster6.wait_all_up()  # at its old address: the same pool worker, UP again
            events["restarted"] = int(report.iteration)
        elif "restarted" in events and "sibling killed" not in events:
            cluster6.kill(sibling)
            events["sibling killed"] = int(report.iteration)

    iterations = 400
    spec = job_spec(
        "coded_reduce", TREE, iterations=iterations, worker_ids=list(cluster6.ids), verify=True,
        iteration_deadline_seconds=20.0, straggler=fixed_delay(1.0, workers=[FIRST_LAYER[1]]),
    )  # fmt: skip
    restarted_address = cluster6.addresses[restarted]
    async with asyncio.timeout(600):
        info, reports = await run_job(cluster6.master_address, spec, chaos)
    assert set(events) == {"killed", "restarted", "sibling killed"}, events
    assert cluster6.addresses[restarted] == restarted_address, "the leaf must come back at its old address"
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert_exact(reports, iterations)
    node0, node1 = cluster6.ids[FIRST_LAYER[0]], cluster6.ids[FIRST_LAYER[1]]
    after = [r for r in reports if r.iteration > events["sibling killed"]]
    assert after, events
    tail = after[len(after) // 2 :]  # the reload has long happened by then
    assert all(r.used_workers == [node0] and node0 not in r.failed_workers for r in tail), [
        (r.iteration, list(r.used_workers), list(r.failed_workers)) for r in tail if r.used_workers != [node0]
    ]
    assert node1 not in tail[-1].used_workers


async def test_every_nodes_timing_carries_its_own_account_of_its_model_delay_and_computing(cluster6: Cluster) -> None:
    """Each report's timings (the first layer, as the master saw them) and child timings (the leaves, as their parents
    saw them) split each node's seconds into its own account: its model read and checked, the emulated delay it
    slept, its computing (a parent's: its start to its children's decode, which covers its delay). A leaf's account
    fits inside the seconds its parent saw."""
    cluster6.ensure_all_up()
    iterations, delay = 4, 0.05
    spec = job_spec(
        "coded_reduce", TREE, iterations=iterations, worker_ids=cluster6.ids, straggler=fixed_delay(delay)
    )  # every node sleeps 50 ms
    async with asyncio.timeout(180):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    first_layer = {cluster6.ids[w] for w in FIRST_LAYER}
    leaves = {cluster6.ids[w] for children in CHILDREN.values() for w in children}
    for r in reports:
        assert r.timings and {t.worker_id for t in r.timings} <= first_layer
        assert r.child_timings and {t.worker_id for t in r.child_timings} <= leaves
        for t in r.timings:  # parents
            assert t.straggle_seconds == pytest.approx(delay), t
            assert t.model_seconds > 0 and t.compute_seconds >= delay, t
            assert t.model_seconds + t.compute_seconds <= t.seconds, t
        for t in r.child_timings:  # leaves
            assert t.straggle_seconds == pytest.approx(delay), t
            assert t.model_seconds > 0 and 0 < t.compute_seconds < t.seconds, t
            assert t.model_seconds + t.straggle_seconds + t.compute_seconds <= t.seconds, t


async def test_reports_name_the_leaves_each_parent_used_and_decoded_without(cluster6: Cluster) -> None:
    """Issue 30: a tree job's reports and its worker table show the nodes below the first layer, not only it: each
    first-layer message the master received says which of its parent's children delivered and which were late (the
    subtree of a parent whose message the master did not wait for is unknown to it)."""
    from gradcode.client.history import format_worker_table

    cluster6.ensure_all_up()
    iterations, slow_leaf = 6, CHILDREN[0][1]
    spec = job_spec(
        "coded_reduce", TREE, iterations=iterations, worker_ids=cluster6.ids, verify=True,
        straggler=fixed_delay(1.0, workers=[slow_leaf, FIRST_LAYER[1]]),  # the master waits for the leaf's parent
    )  # fmt: skip
    async with asyncio.timeout(180):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert_exact(reports, iterations)
    leaves = {cluster6.ids[w] for children in CHILDREN.values() for w in children}
    slow = cluster6.ids[slow_leaf]
    for r in reports:
        delivered = {t.worker_id for t in r.child_timings}
        assert delivered and delivered <= leaves and slow not in delivered, (r.iteration, delivered)
        assert set(r.late_children) <= leaves - delivered
        assert all(t.seconds >= 0 for t in r.child_timings)
    heard_from_its_parent = [r for r in reports if cluster6.ids[0] in {t.worker_id for t in r.timings}]
    assert heard_from_its_parent, "the slow leaf's parent never answered the master"
    assert all(slow in r.late_children for r in heard_from_its_parent), [
        (r.iteration, list(r.late_children)) for r in reports
    ]
    table = format_worker_table(reports)
    named = {t.worker_id for r in reports for t in r.child_timings} | {w for r in reports for w in r.late_children}
    assert slow in named and all(f"{leaf}*" in table for leaf in named), table
    assert "below the first layer" in table
