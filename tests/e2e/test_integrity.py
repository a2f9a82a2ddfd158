"""A worker sending well-formed wrong gradients, caught by the code's own redundancy (issue 10), without verify mode.

A real master and five real worker processes, plus one hostile worker (in this process, on loopback)
that answers every Compute with checksum-valid chunks of 1e3 everywhere (cyclic, n = 6). Under ``detect``
(s = 2) the affected iterations are labelled (not exact) and the worker named; under ``locate`` (s = 3:
three relations, so no two other workers colluding could have framed it) the job ends exactly like an
honest (centralized) run and the worker is quarantined.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from gradcode.client.history import format_summary
from gradcode.common.gather.integrity import QUARANTINE_AFTER
from gradcode.common.transport.serving import ServingHandle, start_server
from gradcode.common.transport.wire import array_from_tensor
from gradcode.v1 import master_pb2, worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job, start_cluster
from tests.e2e.test_training import centralized_gd
from tests.helpers import HostileWorker, fixed_delay

pytestmark = pytest.mark.e2e

HOSTILE_INDEX = 2
"""The hostile worker's place among the job's six workers."""


@pytest.fixture(scope="module")
def cluster5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(5, tmp_path_factory.mktemp("cluster5")) as cluster:
        yield cluster


async def _with_hostile(
    cluster: Cluster, mangle: Callable[[worker_pb2.GradientChunk], None] = lambda chunk: None
) -> tuple[HostileWorker, ServingHandle, list[int]]:
    """Start and register the hostile worker; the job's six pool ids with it at HOSTILE_INDEX."""
    hostile = HostileWorker(mangle, value=1e3)  # well-formed, checksum-valid messages of 1e3s
    handle = await start_server(
        "127.0.0.1",
        0,
        registrars=[lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(hostile, server)],
        service_names=["gradcode.v1.Worker"],
    )
    async with master_stub(cluster.master_address) as stub:
        request = master_pb2.RegisterWorkerRequest(
            address=handle.address, name="hostile", process_secret=hostile.process_secret
        )
        reply = await stub.RegisterWorker(request)
    ids = list(cluster.ids)
    ids.insert(HOSTILE_INDEX, reply.worker_id)
    return hostile, handle, ids


async def _run_and_read(
    cluster: Cluster, spec: master_pb2.JobSpec, handle: ServingHandle
) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], np.ndarray, dict[int, master_pb2.WorkerInfo]]:
    """Run ``spec`` to its end; its info, reports, final parameters and the pool's workers after it. The hostile
    worker's server is stopped whatever happens."""
    try:
        async with asyncio.timeout(180), master_stub(cluster.master_address) as stub:
            info, reports = await run_job(cluster.master_address, spec)
            model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
            workers = {w.worker_id: w for w in (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers}
    finally:
        await handle.stop(0)
    return info, reports, array_from_tensor(model.parameters), workers


async def test_detect_labels_the_affected_iterations_and_names_the_worker(cluster5: Cluster) -> None:
    cluster5.ensure_all_up()
    hostile, handle, ids = await _with_hostile(cluster5)
    bad = ids[HOSTILE_INDEX]
    try:
        honest_late = fixed_delay(0.05, workers=[i for i in range(6) if i != HOSTILE_INDEX])  # as in the locate test
        spec = job_spec("cyclic", {"n": 6, "s": 2}, iterations=4, worker_ids=ids, integrity="detect",
                        straggler=honest_late)  # fmt: skip
        async with asyncio.timeout(180):
            info, reports = await run_job(cluster5.master_address, spec)
    finally:
        await handle.stop(0)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert hostile.computes >= 1 and not spec.verify
    affected = [r for r in reports if bad in r.used_workers or bad in r.suspect_workers]
    assert affected, "the hostile worker's messages never reached a decode"
    for r in affected:
        assert not r.exact, (r.iteration, r.integrity)
        assert bad in r.suspect_workers and r.consistency_checks >= 1 and "violation" in r.integrity
    for r in reports:
        assert r.error_bound >= 0  # every decode certified
        assert r.exact == (bad not in r.used_workers and bad not in r.suspect_workers)
    history = [json.loads(line) for line in (cluster5.local.run_dir / f"{info.job_id}.jsonl").read_text().splitlines()]
    first = next(h for h in history if h["iteration"] == affected[0].iteration)
    # (the hostile worker reports no magnitude for its rows of several partitions: uncertified, "inf" in the history)
    assert first["exact"] is False and bad in first["suspect_workers"] and float(first["error_bound"]) >= 0


async def test_locate_finishes_like_an_honest_run_and_quarantines_the_worker(cluster5: Cluster) -> None:
    cluster5.ensure_all_up()
    hostile, handle, ids = await _with_hostile(cluster5)
    bad = ids[HOSTILE_INDEX]
    iterations, lr = 8, 0.5
    # The honest workers' requests go out on their links at once, the hostile one's (it serves no link) on its gRPC
    # session a moment later: a little delay keeps its message inside the rounds it must be checked in.
    honest_late = fixed_delay(0.05, workers=[i for i in range(6) if i != HOSTILE_INDEX])
    spec = job_spec("cyclic", {"n": 6, "s": 3}, iterations=iterations, learning_rate=lr, worker_ids=ids,
                    integrity="locate", straggler=honest_late)  # fmt: skip
    info, reports, params_got, workers = await _run_and_read(cluster5, spec, handle)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, iterations + 1))
    assert all(r.exact and 0 <= r.error_bound <= 1e-9 for r in reports), [(r.exact, r.integrity) for r in reports]
    assert all(bad not in r.used_workers for r in reports)
    singled_out = [r.iteration for r in reports if list(r.suspect_workers) == [bad]]
    assert len(singled_out) == QUARANTINE_AFTER, [(r.iteration, r.integrity) for r in reports]
    quarantined_at = singled_out[-1]
    assert "quarantined" in reports[quarantined_at - 1].integrity
    assert all(bad in r.failed_workers for r in reports if r.iteration > quarantined_at)
    assert hostile.computes == quarantined_at  # asked every iteration until quarantined, never after
    assert "quarantined" in workers[bad].last_error and info.job_id in workers[bad].last_error
    params, _ = centralized_gd(iterations, lr)
    np.testing.assert_allclose(params_got, params, rtol=1e-9, atol=1e-12)


async def test_two_slow_honest_workers_leave_the_liar_unchecked_and_every_iteration_labelled(cluster5: Cluster) -> None:
    """Issue 24: with two honest workers persistently slower than the iteration deadline, detect decoded from the
    minimal set at the deadline, checked nothing and reported every iteration exact while the liar's values were
    used. Now every iteration is labelled (unchecked), and the job's final message and the CLI count them."""
    cluster5.ensure_all_up()
    hostile, handle, ids = await _with_hostile(cluster5)
    iterations = 3
    try:
        spec = job_spec(
            "cyclic", {"n": 6, "s": 2}, iterations=iterations, worker_ids=ids, integrity="detect",
            iteration_deadline_seconds=1.0, straggler=fixed_delay(5.0, workers=[4, 5]),
        )  # fmt: skip
        async with asyncio.timeout(180):
            info, reports = await run_job(cluster5.master_address, spec)
    finally:
        await handle.stop(0)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert hostile.computes >= 1 and [r.iteration for r in reports] == list(range(1, iterations + 1))
    slow = {ids[4], ids[5]}
    for r in reports:
        assert not r.exact and not slow & set(r.used_workers), (r.iteration, r.integrity)
        assert r.unchecked_workers and "unchecked" in r.integrity, (r.iteration, r.integrity)
    assert f"{iterations} of {iterations} iterations not exact, {iterations} of them unchecked" in info.message
    line = format_summary("cyclic", reports)
    assert f"{iterations} of {iterations} iterations not exact" in line


def _claims_others(chunk: worker_pb2.GradientChunk) -> None:
    """A flat job's worker that says, in its trailer, that it quarantined job worker 0, that worker 1 lost the job
    and that it singled out worker 3, as only a tree parent's trailer may say of its own children."""
    if chunk.HasField("trailer"):
        chunk.trailer.children_quarantined.append(0)
        chunk.trailer.children_lost.append(1)
        chunk.trailer.children_singled_out.append(3)


async def test_a_worker_cannot_have_others_quarantined_reloaded_or_named_through_its_trailer(cluster5: Cluster) -> None:
    """Before, the master believed any message's subtree claims: a flat job's worker that named worker 0 as
    quarantined had it marked DOWN (for every job), worker 1 reloaded and worker 3 named a suspect, even with
    integrity off. Now the round refuses a message that names a node outside its sender's subtree."""
    cluster5.ensure_all_up()
    hostile, handle, ids = await _with_hostile(cluster5, _claims_others)
    bad, iterations, lr = ids[HOSTILE_INDEX], 4, 0.5
    honest_late = fixed_delay(0.2, workers=[i for i in range(6) if i != HOSTILE_INDEX])  # its message comes first
    spec = job_spec("cyclic", {"n": 6, "s": 1}, iterations=iterations, learning_rate=lr, worker_ids=ids,
                    straggler=honest_late)  # fmt: skip
    info, reports, params_got, workers = await _run_and_read(cluster5, spec, handle)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert hostile.computes >= 1
    assert all(r.exact for r in reports), [(r.iteration, r.integrity) for r in reports]
    assert all(bad not in r.used_workers for r in reports)
    assert bad in reports[0].failed_workers
    for victim in (ids[0], ids[1], ids[3]):
        assert all(victim not in r.suspect_workers and victim not in r.failed_workers for r in reports)
        assert workers[victim].state == master_pb2.WORKER_STATE_UP, workers[victim]
        assert "quarantined" not in workers[victim].last_error, workers[victim]
    assert cluster5.local.master is not None
    master_log = cluster5.local.master.log_path.read_text(errors="replace")
    assert "names workers [0, 1, 3] in its trailer" in master_log  # the refusal, with its reason
    params, _ = centralized_gd(iterations, lr)
    np.testing.assert_allclose(params_got, params, rtol=1e-9, atol=1e-12)
