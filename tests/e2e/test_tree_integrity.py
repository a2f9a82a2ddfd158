"""Issue 24, end to end: a lying leaf in a CodedReduce tree (L = 2) is named by its parent, and quarantined by
it when the evidence singles it out under the fault model.

A real master, real worker processes and one hostile leaf (in this process, on loopback) that answers every
Compute with well-formed, checksum-valid messages of 1e3 everywhere. Worker index ``w`` is tree node ``w + 1``
(breadth first): ``0 .. n-1`` the first layer, ``n .. 2n-1`` the children of node 0 (the hostile leaf is the
second of them). Under ``locate`` the parent checks its children, singles the leaf out, decodes without it
and names it in its trailer; the master names the leaf, never the parent, which stays UP, and the job ends at
an honest run's parameters.

* n = 3, s = 2: three children give two relations, and two colluding siblings would explain the violation as
  well as the leaf does (README, "Exact, or labelled"), so the leaf is named each time but never quarantined.
* n = 5, s = 3: three relations among five children, no pair explains it: after
  :data:`~gradcode.common.gather.integrity.QUARANTINE_AFTER` iterations the parent quarantines the leaf (asks
  it no more; the master records it for this job, on the parent's word, and does not mark it DOWN in the pool),
  and the parent decodes from its four honest children.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from gradcode.common.gather.integrity import QUARANTINE_AFTER
from gradcode.common.transport.serving import start_server
from gradcode.common.transport.wire import array_from_tensor, struct_from_dict
from gradcode.v1 import common_pb2, master_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job, start_cluster
from tests.e2e.test_training import centralized_gd
from tests.helpers import HostileWorker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARENT = 0


def delays(n: int) -> common_pb2.StragglerSpec:
    """Every honest node 0.2 s late, first-layer nodes 1 .. n-1 0.6 s: the hostile leaf (no delay) is always in
    its parent's hand, and the parent's message always first in the master's."""
    params = {"p_fast_to_slow": 0.0, "p_slow_to_fast": 0.0, "slow_delay": 0.6, "fast_delay": 0.2,
              "initial_slow_workers": list(range(1, n))}  # fmt: skip
    return common_pb2.StragglerSpec(model="gilbert_elliot", params=struct_from_dict(params))


@pytest.fixture(scope="module")
def cluster11(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(11, tmp_path_factory.mktemp("cluster11")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster29(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(29, tmp_path_factory.mktemp("cluster29")) as cluster:
        yield cluster


async def run_with_lying_leaf(
    cluster: Cluster, tree: dict[str, int], iterations: int
) -> tuple[
    list[int], master_pb2.JobInfo, list[master_pb2.IterationReport], np.ndarray, dict[int, master_pb2.WorkerInfo], int
]:
    """Run a ``locate`` tree job with the hostile leaf as node 0's second child; return the job's worker ids,
    its info, its reports, its final parameters, the pool's workers after it and how often the leaf was asked."""
    cluster.ensure_all_up()
    hostile = HostileWorker(value=1e3)
    handle = await start_server(
        "127.0.0.1", 0,
        registrars=[lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(hostile, server)],
        service_names=["gradcode.v1.Worker"],
    )  # fmt: skip
    n = tree["n"]
    try:
        async with master_stub(cluster.master_address) as stub:
            reply = await stub.RegisterWorker(
                master_pb2.RegisterWorkerRequest(
                    address=handle.address, name="liar", process_secret=hostile.process_secret
                )
            )
            ids = list(cluster.ids)
            ids.insert(n + 1, reply.worker_id)
            spec = job_spec("coded_reduce", tree, iterations=iterations, learning_rate=0.5, worker_ids=ids,
                            integrity="locate", iteration_deadline_seconds=30.0,
                            straggler=delays(n))  # fmt: skip
            async with asyncio.timeout(300):
                info, reports = await run_job(cluster.master_address, spec)
                model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
                workers = {w.worker_id: w for w in (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers}
    finally:
        await handle.stop(0)
    assert hostile.computes >= 1
    return ids, info, reports, array_from_tensor(model.parameters), workers, hostile.computes


def assert_honest_outcome(
    info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport], params: np.ndarray, iterations: int
) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, iterations + 1))
    assert all(r.exact and 0 <= r.error_bound <= 1e-9 for r in reports), [(r.exact, r.integrity) for r in reports]
    honest, _ = centralized_gd(iterations, 0.5)
    np.testing.assert_allclose(params, honest, rtol=1e-9, atol=1e-12)


async def test_locate_names_a_lying_leaf_by_its_parent_never_the_parent(cluster11: Cluster) -> None:
    iterations = 6
    tree = {"n": 3, "s": 2, "L": 2}
    ids, info, reports, params, workers, asked = await run_with_lying_leaf(cluster11, tree, iterations)
    liar, parent = ids[3 + 1], ids[PARENT]
    assert_honest_outcome(info, reports, params, iterations)
    for r in reports:  # the parent's message is the first in hand (its siblings are delayed): the master reads it
        assert liar in r.suspect_workers and "singled out its child" in r.integrity, (r.iteration, r.integrity)
        assert "quarantined" not in r.integrity, (r.iteration, r.integrity)  # two siblings could collude
    assert all(parent not in r.suspect_workers and parent not in r.failed_workers for r in reports)
    assert workers[parent].state == master_pb2.WORKER_STATE_UP
    assert asked == iterations and "quarantined" not in workers[liar].last_error


async def test_locate_quarantines_a_lying_leaf_its_parent_singles_out(cluster29: Cluster) -> None:
    iterations = QUARANTINE_AFTER + 2
    tree = {"n": 5, "s": 3, "L": 2}
    ids, info, reports, params, workers, asked = await run_with_lying_leaf(cluster29, tree, iterations)
    liar, parent = ids[5 + 1], ids[PARENT]
    assert_honest_outcome(info, reports, params, iterations)
    named = [r.iteration for r in reports if liar in r.suspect_workers]
    history = [(r.iteration, r.integrity) for r in reports]
    assert named[:QUARANTINE_AFTER] == list(range(1, QUARANTINE_AFTER + 1)), history
    quarantined_at = QUARANTINE_AFTER
    assert "quarantined by its parent" in reports[quarantined_at - 1].integrity, reports[quarantined_at - 1].integrity
    for r in reports[quarantined_at:]:  # asked no more: the parent decodes from its four honest children
        assert liar not in r.suspect_workers, (r.iteration, r.integrity)
    assert all(parent not in r.suspect_workers and parent not in r.failed_workers for r in reports)
    assert workers[parent].state == master_pb2.WORKER_STATE_UP
    assert asked == QUARANTINE_AFTER  # asked by its parent until quarantined, never after
    # in this job only: the master has just the parent's word for it, and a lying parent must not get an honest
    # child marked DOWN for every job
    assert workers[liar].state == master_pb2.WORKER_STATE_UP and "quarantined" not in workers[liar].last_error
