"""Issue 24, end to end: a lying leaf in a CodedReduce tree (n = 3, s = 2, L = 2) is named by its parent.

A real master, eleven real worker processes and one hostile leaf (in this process, on loopback) that answers
every Compute with well-formed, CRC-valid messages of 1e3 everywhere. Worker index ``w`` is tree node
``w + 1`` (breadth first): 0..2 the first layer, 3..5 the children of 0 (the hostile leaf is 4). Under
``locate`` the parent checks its three children (two relations), singles the leaf out, decodes without
it and names it in its trailer; the master names the leaf, never the parent, which stays UP, and the
job ends at an honest run's parameters. Three children are too few to quarantine (two colluding siblings
would explain the violation as well: README, "Exact, or labelled"), so the leaf stays in the job, named
each time it is in hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from gradcode.common.transport.serving import start_server
from gradcode.common.transport.wire import array_from_tensor, struct_from_dict
from gradcode.v1 import common_pb2, master_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job, start_cluster
from tests.e2e.test_training import centralized_gd
from tests.helpers import HostileWorker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TREE = {"n": 3, "s": 2, "L": 2}
PARENT, HOSTILE_LEAF = 0, 4
_DELAY_PARAMS = {"p_fast_to_slow": 0.0, "p_slow_to_fast": 0.0, "slow_delay": 0.6, "fast_delay": 0.2}
DELAYS = common_pb2.StragglerSpec(
    model="gilbert_elliot", params=struct_from_dict({**_DELAY_PARAMS, "initial_slow_workers": [1, 2]})
)
"""Every honest node 0.2 s late, first-layer nodes 1 and 2 0.6 s: the hostile leaf (no delay) is always in its
parent's hand, and the parent's message always in the master's."""


@pytest.fixture(scope="module")
def cluster11(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(11, tmp_path_factory.mktemp("cluster11")) as cluster:
        yield cluster


async def test_locate_names_a_lying_leaf_by_its_parent_never_the_parent(cluster11: Cluster) -> None:
    cluster11.ensure_all_up()
    hostile = HostileWorker(value=1e3)
    handle = await start_server(
        "127.0.0.1", 0,
        registrars=[lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(hostile, server)],
        service_names=["gradcode.v1.Worker"],
    )  # fmt: skip
    iterations, lr = 6, 0.5
    try:
        async with master_stub(cluster11.master_address) as stub:
            reply = await stub.RegisterWorker(
                master_pb2.RegisterWorkerRequest(
                    address=handle.address, name="liar", process_secret=hostile.process_secret
                )
            )
            ids = list(cluster11.ids)
            ids.insert(HOSTILE_LEAF, reply.worker_id)
            spec = job_spec("coded_reduce", TREE, iterations=iterations, learning_rate=lr, worker_ids=ids,
                            integrity="locate", iteration_deadline_seconds=30.0,
                            straggler=DELAYS)  # fmt: skip
            async with asyncio.timeout(300):
                info, reports = await run_job(cluster11.master_address, spec)
                model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
                workers = {w.worker_id: w for w in (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers}
    finally:
        await handle.stop(0)
    liar, parent = ids[HOSTILE_LEAF], ids[PARENT]
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert hostile.computes >= 1
    assert [r.iteration for r in reports] == list(range(1, iterations + 1))
    assert all(r.exact and 0 <= r.error_bound <= 1e-9 for r in reports), [(r.exact, r.integrity) for r in reports]
    for r in reports:  # the parent's message is the first in hand (its siblings are delayed): the master reads it
        assert liar in r.suspect_workers and "singled out its child" in r.integrity, (r.iteration, r.integrity)
    assert all(parent not in r.suspect_workers and parent not in r.failed_workers for r in reports)
    assert workers[parent].state == master_pb2.WORKER_STATE_UP
    params, _ = centralized_gd(iterations, lr)
    np.testing.assert_allclose(array_from_tensor(model.parameters), params, rtol=1e-9, atol=1e-12)
