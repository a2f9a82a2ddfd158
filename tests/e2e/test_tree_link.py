"""A tree on the master's link, with real processes (CodedReduce n = 2, s = 1, L = 2; six workers and a master): the
first layer's surplus sub-tree message is held until pulled, and the model can be relayed among the first layer.

Workers 0 and 1 are the first layer (0's children are 2 and 3, 1's are 4 and 5); the master decodes from any one of
them. Held (``JobSpec.surplus`` "auto" holds over the network, and a parent's messages always cross it), the master
expects one and asks the other as a backup that computes its sub-tree at once but sends only when pulled.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import numpy as np
import pytest

from gradcode.client.sdk import GradcodeClient
from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, metric_total, run_job, start_cluster
from tests.e2e.test_hold import _own_machine, _struck_on_iteration_2
from tests.helpers import fixed_delay, free_port

pytestmark = pytest.mark.e2e

TREE = {"n": 2, "s": 1, "L": 2}
EXACT = 1e-9
ITERATIONS = 12


def _spec(cluster: Cluster, **fields: object) -> master_pb2.JobSpec:
    return job_spec(
        "coded_reduce", TREE, iterations=ITERATIONS, verify=True, worker_ids=cluster.ids, **fields
    )  # fmt: skip


def _assert_exact(info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport]) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1))
    bad = [(r.iteration, r.verify_error) for r in reports if not (r.exact and 0 <= r.verify_error <= EXACT)]
    assert not bad


@pytest.mark.parametrize("fault", ["kill", "freeze"])
async def test_a_trees_surplus_message_is_held_and_pulled_only_for_a_first_layer_node_that_fails(
    tmp_path: Path, fault: str
) -> None:
    """Pushed, both first-layer messages cross the master's link every round; held, one does until first-layer node 0
    (expected) is killed or frozen on iteration 2's report, and from then on node 1's pulled message decodes every
    round, exactly. Every node sleeps 0.1 s a round, so the fault lands while the job runs."""
    with start_cluster(6, tmp_path) as cluster:
        delay = fixed_delay(0.1)
        push_info, pushed = await run_job(cluster.master_address, _spec(cluster, surplus="push", straggler=delay))
        with _struck_on_iteration_2(cluster, fault) as strike:
            async with asyncio.timeout(90):
                info, held = await run_job(
                    cluster.master_address, _spec(cluster, straggler=delay, iteration_deadline_seconds=10), strike
                )
    _assert_exact(push_info, pushed)
    _assert_exact(info, held)
    first, second = cluster.ids[0], cluster.ids[1]
    assert all(not r.backup_workers and len(r.used_workers) == 1 for r in pushed)
    assert held[0].backup_workers == [second] and held[0].used_workers == [first], held[0]
    unpulled = [r.iteration for r in held if set(r.used_workers) & (set(r.backup_workers) - set(r.promoted_workers))]
    assert not unpulled, f"a held message was used without being pulled in iterations {unpulled}"
    landed = next((i for i, r in enumerate(held) if r.iteration > 2 and first not in r.used_workers), None)
    assert landed is not None and landed <= len(held) - 3, f"the fault took effect too late to test anything: {held}"
    # the master's ingress: one sub-tree message (and a ready notice) in every round before the fault that pulled
    # nothing, where two messages cross pushed (the second cut short when its round decoded first: a CI run under
    # load received 8.0 KB a pushed round against 10.6 here, so the measure is one message, not the pushed rounds;
    # under load a round may also pull the held one when node 0 is slow to begin)
    message = push_info.spec.model.num_features * 10 * 8  # (softmax, 10 classes, float64)
    assert statistics.median(r.bytes_received for r in pushed) > message
    quiet = [r.bytes_received for r in held[:landed] if not r.promoted_workers]
    assert quiet, f"every round before the fault pulled the held message: {held[:landed]}"
    assert max(quiet) < 1.5 * message, (quiet, message)
    hit = held[landed]
    assert hit.used_workers == [second] and (second in hit.promoted_workers or second not in hit.backup_workers), hit
    assert all(r.used_workers == [second] for r in held[landed:])


async def test_a_trees_model_is_relayed_among_its_first_layer_and_its_gradients_stay_exact(tmp_path: Path) -> None:
    """Relayed, the master sends each iteration's model inline to one first-layer node and the other fetches it from
    that peer (checked by its digest) and forwards it to its children: the master sends about one model a round
    instead of two, and the job ends where a direct one ends."""
    ports = [free_port() for _ in range(6)]
    with start_cluster(6, tmp_path, worker_args=lambda i: _own_machine(i, ports)) as cluster:
        direct_info, direct = await run_job(cluster.master_address, _spec(cluster, model_delivery="direct"))
        before = sum(metric_total(port, "gradcode_models_relayed_total") for port in ports)
        relay_info, relayed = await run_job(cluster.master_address, _spec(cluster, model_delivery="relay"))
        fetched = sum(metric_total(port, "gradcode_models_relayed_total") for port in ports) - before
        async with GradcodeClient(cluster.master_address) as client:
            models = [await client.get_model(info.job_id) for info in (direct_info, relay_info)]
    _assert_exact(direct_info, direct)
    _assert_exact(relay_info, relayed)
    np.testing.assert_allclose(models[1], models[0], rtol=1e-12, atol=1e-15)
    assert before == 0, "a direct job relays nothing"
    # at most one fetch a round (the seed's peer); fewer when that peer was the held backup and its round decoded and
    # cancelled its request before its fetch reached the seed (a CI run under load: 10 of 12)
    assert 1 <= fetched <= ITERATIONS, fetched
    model_bytes = direct_info.spec.model.num_features * 10 * 8
    saved = statistics.median(d.bytes_sent - r.bytes_sent for d, r in zip(direct, relayed, strict=True))
    assert saved > 0.8 * model_bytes, (saved, model_bytes)
