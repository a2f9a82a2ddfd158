"""Every node of a CodedReduce tree stays in the job (real gRPC servers in one process).

The tree is n = 2, s = 1, L = 2: worker indices 0 and 1 are the first layer, 2 and 3 the children of
0, 4 and 5 the children of 1 (see ``tests/e2e/test_tree.py``). The workers are listed to the master
(``--workers``) and never register, so the master learns that a deeper node restarted only from its
parent, which names the children that answered NOT_FOUND. With call tokens the workers register with
a join secret instead: a restarted node registers again and is issued a new call token, which its
parent must be given.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from gradcode.common.ops import metrics
from gradcode.common.transport.security import Security
from gradcode.common.transport.wire import struct_from_dict
from gradcode.master.node import MasterNode
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc
from gradcode.worker.node import WorkerNode
from tests.helpers import fixed_delay
from tests.master.test_master_node import SAMPLES, TIMEOUT

TREE = {"n": 2, "s": 1, "L": 2}
JOIN = "tree-join-secret-0123456789abcdef"


def _tree_spec(ids: list[int], iterations: int, straggler: common_pb2.StragglerSpec) -> master_pb2.JobSpec:
    return master_pb2.JobSpec(
        code=common_pb2.CodeSpec(name="coded_reduce", params=struct_from_dict(TREE)),
        dataset=master_pb2.DatasetSpec(name="digits", num_samples=SAMPLES),
        optimizer=master_pb2.OptimizerSpec(kind="gd", learning_rate=0.5),
        iterations=iterations, worker_ids=ids, verify=True, iteration_deadline_seconds=30.0, straggler=straggler,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def _tree(
    secure: bool = False, links: bool = True
) -> AsyncIterator[tuple[list[WorkerNode], master_pb2_grpc.MasterStub, list[int], Callable[[int], WorkerNode]]]:
    """Six workers, a master, the workers' pool ids in worker order, and a factory of a worker at a port.

    Plain: the workers never register and the master lists them. ``secure``: master and workers share a
    join secret and the workers register, so each answers only the call token the master issued it.
    ``links``: the master's ``--link``.
    """
    security = Security(join_secret=JOIN) if secure else Security()
    master = MasterNode(grace=0.2, security=security, links=links) if secure else None

    def worker(port: int = 0) -> WorkerNode:
        where = master.address if master is not None else None
        return WorkerNode(port=port, grace=0.2, master_address=where, security=security, reregister_seconds=0.5)

    workers: list[WorkerNode] = []
    try:
        if master is not None:
            await master.start()
        workers.extend(worker() for _ in range(6))
        for w in workers:
            await w.start()
        addresses = [w.address for w in workers]
        async with contextlib.AsyncExitStack() as stack:
            if master is None:
                master = await stack.enter_async_context(MasterNode(workers=addresses, grace=0.2, links=links))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
            stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
            while True:
                listed = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
                by_address = {w.address: w for w in listed}
                if all(a in by_address and by_address[a].state == master_pb2.WORKER_STATE_UP for a in addresses):
                    break
                await asyncio.sleep(0.02)
            yield workers, stub, [by_address[a].worker_id for a in addresses], worker
    finally:
        for w in workers:
            await w.shutdown()
        if master is not None:
            await master.shutdown()


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "call-tokens"])
async def test_a_restarted_deeper_node_is_reloaded_through_its_parent_and_used_again(secure: bool) -> None:
    """Leaf 2 restarts (same port, empty); then its sibling leaf 3 stops for good. First-layer node 1
    is a 0.3 s straggler, so node 0 answers first whenever it can, and from then on it can only with
    leaf 2 back in the job: the master must have reloaded leaf 2 on its parent's word (plain), or, with
    call tokens, reloaded node 0 with the new call token the restarted leaf was issued when it registered
    again (the leaf refuses the old one)."""
    async with asyncio.timeout(TIMEOUT * 3), _tree(secure) as (workers, stub, ids, worker):
        iterations = 40
        spec = _tree_spec(ids, iterations, fixed_delay(0.3, workers=[1]))
        info = await stub.CreateJob(spec)
        events: dict[str, int] = {}
        reports = []
        async for report in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id)):
            reports.append(report)
            if "restarted" not in events and report.iteration >= 3:
                port = int(workers[2].address.rpartition(":")[2])
                await workers[2].shutdown()
                workers[2] = worker(port)
                await workers[2].start()
                events["restarted"] = int(report.iteration)
            elif "sibling stopped" not in events and report.iteration > events.get("restarted", iterations):
                await workers[3].shutdown()
                events["sibling stopped"] = int(report.iteration)
        final = await stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id))
    assert final.state == master_pb2.JOB_STATE_SUCCEEDED, final.message
    assert all(r.exact and 0 <= r.verify_error <= 1e-9 for r in reports)
    # The iteration under way when the shutdown returned (one or two after the last one reported) may still
    # have used the sibling's message; only those begun after it cannot.
    after = [r for r in reports if r.iteration > events["sibling stopped"] + 2]
    assert len(after) >= 20, events
    # Leaf 2's parent may first learn that it lost the job in the iteration the sibling is gone (while
    # the sibling answered, the parent needed only one child): node 0 fails then, until the reload is
    # done (how many iterations that takes depends on scheduling). Once node 0 is used again it never
    # fails again: leaf 2 is back in the job for good.
    back = next(r.iteration for r in after if list(r.used_workers) == [ids[0]])
    assert not [r.iteration for r in after if r.iteration > back and ids[0] in r.failed_workers]
    tail = after[len(after) // 2 :]
    assert back <= tail[0].iteration and all(list(r.used_workers) == [ids[0]] for r in tail), [
        (r.iteration, list(r.used_workers), list(r.failed_workers)) for r in after if list(r.used_workers) != [ids[0]]
    ]


async def test_a_parents_own_delay_does_not_hold_up_its_children() -> None:
    """First-layer node 0 sleeps 600 s per iteration; its children are still asked at once and compute
    while it sleeps (until the master, decoding from node 1, cancels node 0 and with it their calls).
    A parent that slept before asking would never have asked them."""
    async with asyncio.timeout(TIMEOUT * 3), _tree() as (workers, stub, ids, _):
        computed: dict[int, set[int]] = {2: set(), 3: set()}

        def observer(leaf: int) -> Any:
            return lambda job_id, iteration, partition: computed[leaf].add(iteration)

        for leaf in computed:
            workers[leaf].servicer.on_partition = observer(leaf)
        iterations = 5
        info = await stub.CreateJob(_tree_spec(ids, iterations, fixed_delay(600.0, workers=[0])))
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        final = await stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id))
    assert final.state == master_pb2.JOB_STATE_SUCCEEDED, final.message
    assert all(list(r.used_workers) == [ids[1]] for r in reports)
    assert set().union(*computed.values()) <= set(range(1, iterations + 1))
    assert any(computed.values()), "node 0's children never computed while it slept"


def _links_opened() -> float:
    return metrics.WORKER_REGISTRY.get_sample_value("gradcode_links_opened_total") or 0.0


@pytest.mark.parametrize("links", [True, False], ids=["links-on", "links-off"])
async def test_the_masters_link_setting_reaches_the_tree_parents(links: bool) -> None:
    """With ``--link off`` on the master no node of the tree opens a link (a network that blocks link
    ports costs nothing); with links on, the parents move their children's Computes onto links too."""
    async with asyncio.timeout(TIMEOUT * 3), _tree(links=links) as (workers, stub, ids, _):
        opened = _links_opened()
        info = await stub.CreateJob(_tree_spec(ids, 400, common_pb2.StragglerSpec()))
        linked: list[bool | None] = []
        async for report in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id)):
            parents = [workers[p].servicer.jobs[info.job_id].parent for p in (0, 1)]
            callers = [c.caller for p in parents if p is not None and p.connected for c in p._channels or []]
            linked = [c.serves_links for c in callers]
            if report.iteration >= 5 and len(linked) == 4 and None not in linked:
                await stub.CancelJob(master_pb2.CancelJobRequest(job_id=info.job_id))
                break
        assert report.exact
    assert linked == [links] * 4
    assert (_links_opened() > opened) is links
