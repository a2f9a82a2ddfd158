"""Training with real processes: workers killed mid-training, emulated stragglers, too many failures, a comeback.

One master and six worker processes are shared by the module (``cluster6``); tests that need every
worker alive restart the dead ones first.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gradcode.common.codes.registry import make_code
from gradcode.common.sim.stragglers import make_delay_model
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import make_model
from gradcode.common.transport.wire import array_from_tensor, dict_from_struct
from gradcode.v1 import common_pb2, master_pb2
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job
from tests.helpers import fixed_delay

pytestmark = pytest.mark.e2e

EXACT = 1e-9
KILL_MARGIN = 5
"""Iterations the master may run ahead of the client's kill (see the kill test)."""


def centralized_gd(iterations: int, learning_rate: float) -> tuple[np.ndarray, float]:
    """Plain numpy gradient descent on the whole digits training set: the reference run."""
    data = load_dataset("digits", seed=0, test_fraction=0.2)
    model = make_model("softmax", num_features=data.num_features, num_classes=data.num_classes)
    params = model.init_params()
    for _ in range(iterations):
        params = params - learning_rate * model.gradient(params, data.X_train, data.y_train) / data.num_train
    return params, model.accuracy(params, data.X_test, data.y_test)


async def test_two_workers_killed_mid_training_exact_gradients_and_centralized_accuracy(cluster6: Cluster) -> None:
    cluster6.ensure_all_up()
    iterations, lr, victims = 25, 0.5, (1, 4)
    killed_at: list[int] = []

    def kill_two(report: master_pb2.IterationReport) -> None:
        if report.iteration == 3:
            for i in victims:
                cluster6.kill(i)
            killed_at.append(report.iteration)

    spec = job_spec(
        "cyclic",
        {"n": 6, "s": 2},
        iterations=iterations,
        learning_rate=lr,
        worker_ids=cluster6.ids,
        verify=True,
        straggler=fixed_delay(0.03),  # every worker: keeps the kill well inside the run
    )
    async with asyncio.timeout(240), master_stub(cluster6.master_address) as stub:
        info, reports = await run_job(cluster6.master_address, spec, kill_two)
        model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))

    assert killed_at == [3]
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, iterations + 1))
    dead = {cluster6.ids[i] for i in victims}
    # The kill happens when report 3 reaches this client; by then the master may be a few iterations
    # ahead (reports are streamed, and each one is published after its metrics). From iteration
    # 3 + KILL_MARGIN on the victims must be failed in every report; before that, once a victim has
    # failed it must never be used again.
    after = [r for r in reports if r.iteration > 3 + KILL_MARGIN]
    assert len(after) == iterations - 3 - KILL_MARGIN
    assert all(dead <= set(r.failed_workers) for r in after)
    assert all(not dead & set(r.used_workers) for r in after)
    for victim in dead:
        gone = [r.iteration for r in reports if victim in r.failed_workers]
        assert gone and gone[0] > 3 and gone == list(range(gone[0], iterations + 1)), (victim, gone)
        assert all(victim not in r.used_workers for r in reports if r.iteration >= gone[0])
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)
    history = (cluster6.local.run_dir / f"{info.job_id}.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in history] == list(range(1, iterations + 1))
    params, accuracy = centralized_gd(iterations, lr)
    np.testing.assert_allclose(array_from_tensor(model.parameters), params, rtol=1e-7, atol=1e-9)
    assert abs(reports[-1].test_accuracy - accuracy) <= 0.01


async def test_a_frozen_worker_is_left_behind_exactly_and_serves_again_once_thawed(cluster6: Cluster) -> None:
    """SIGSTOP one worker mid-job (its Session stalls, nothing fails on the wire), SIGCONT it later: the
    iterations go on without it and stay exact, and once thawed it is asked, and used, again."""
    cluster6.ensure_all_up()
    iterations, frozen, victim = 80, (3, 15), 2
    process = cluster6.processes[victim].process
    seen: list[int] = []

    def freeze_then_thaw(report: master_pb2.IterationReport) -> None:
        if report.iteration == frozen[0]:
            process.send_signal(signal.SIGSTOP)
            seen.append(report.iteration)
        elif report.iteration == frozen[1]:
            process.send_signal(signal.SIGCONT)
            seen.append(report.iteration)

    spec = job_spec(
        "cyclic", {"n": 6, "s": 1}, iterations=iterations, learning_rate=0.5, worker_ids=cluster6.ids,
        verify=True, straggler=fixed_delay(0.03),
    )  # fmt: skip
    try:
        async with asyncio.timeout(240):
            info, reports = await run_job(cluster6.master_address, spec, freeze_then_thaw)
    finally:
        process.send_signal(signal.SIGCONT)
    assert seen == list(frozen)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(r.exact and 0 <= r.verify_error <= EXACT for r in reports), [
        (r.iteration, r.verify_error) for r in reports if not r.exact
    ]
    worker = cluster6.ids[victim]
    while_frozen = [r for r in reports if frozen[0] + KILL_MARGIN < r.iteration <= frozen[1]]
    assert while_frozen and all(worker not in r.used_workers for r in while_frozen)
    assert any(worker in r.used_workers for r in reports if r.iteration > frozen[1] + KILL_MARGIN), "never back"


async def _reports(
    cluster: Cluster, code: str, params: dict[str, int], straggler: common_pb2.StragglerSpec
) -> list[master_pb2.IterationReport]:
    spec = job_spec(code, params, iterations=4, worker_ids=cluster.ids, straggler=straggler)
    async with asyncio.timeout(180):
        info, reports = await run_job(cluster.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    return reports


async def test_coded_iterations_do_not_wait_for_a_fixed_or_random_straggler(cluster6: Cluster) -> None:
    """The coded job stops at the first decodable moment; "wait for all" waits for the straggler.

    Asserted on events, not on speed: every coded iteration decodes from exactly n - s = 5 workers and
    whoever it did not use was late (cancelled), never waited for; the delayed worker of an iteration
    (computed from the same seeded model the workers evaluate) is left out whenever the others answer
    first, which on any machine is most iterations (asserted: at least one per mode). The only timing
    figure is a lower bound the uncoded job cannot beat: it waits out the delay.
    """
    cluster6.ensure_all_up()
    delay = 2.0
    modes = {
        "same worker every iteration": fixed_delay(delay, workers=[0]),
        "random worker each iteration": fixed_delay(delay, every_iteration_random=True, num_workers=6, count=1),
    }
    async with asyncio.timeout(300):
        for mode, straggler in modes.items():
            model = make_delay_model(straggler.model, dict_from_struct(straggler.params), straggler.seed)
            coded = await _reports(cluster6, "cyclic", {"n": 6, "s": 1}, straggler)
            skipped = 0
            for r in coded:
                unused = set(cluster6.ids) - set(r.used_workers)
                assert len(r.used_workers) == 5 and unused <= set(r.late_workers) | set(r.failed_workers), (mode, r)
                delayed = {cluster6.ids[w] for w in range(6) if model.delay(w, r.iteration) > 0}
                assert len(delayed) == 1
                skipped += not delayed & set(r.used_workers)
            assert skipped >= 1, (mode, [list(r.used_workers) for r in coded])
            uncoded = await _reports(cluster6, "uncoded", {"n": 6}, straggler)
            assert all(len(r.used_workers) == 6 and r.wall_seconds >= delay for r in uncoded), (mode, uncoded)


async def test_more_failures_than_the_code_tolerates_fail_the_job_naming_the_missing_workers(
    cluster6: Cluster,
) -> None:
    cluster6.ensure_all_up()
    victims = (2, 5)
    for i in victims:
        cluster6.kill(i)
    spec = job_spec("cyclic", {"n": 6, "s": 1}, iterations=5, worker_ids=cluster6.ids, iteration_deadline_seconds=1.5)
    async with asyncio.timeout(120), master_stub(cluster6.master_address) as stub:
        started = asyncio.get_running_loop().time()
        info, reports = await run_job(cluster6.master_address, spec)
        elapsed = asyncio.get_running_loop().time() - started
        model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))

    missing = sorted(cluster6.ids[i] for i in victims)
    assert info.state == master_pb2.JOB_STATE_FAILED
    assert f"missing workers {missing}" in info.message, info.message
    for i in victims:
        assert cluster6.addresses[i] in info.message
    assert "tolerates 1 straggler" in info.message
    assert elapsed < 15
    assert info.iterations_done == 0 and len(reports) == 1
    assert reports[0].state == master_pb2.JOB_STATE_FAILED and set(missing) <= set(reports[0].failed_workers)
    assert not array_from_tensor(model.parameters).any()  # no step was taken with a partial gradient


async def test_restarted_workers_are_reloaded_and_used_again(cluster6: Cluster) -> None:
    for i in (2, 5):
        cluster6.kill(i)
    cluster6.ensure_all_up()  # restarts them at their old addresses; they register again
    spec = job_spec("uncoded", {"n": 6}, iterations=3, worker_ids=cluster6.ids, verify=True)
    async with asyncio.timeout(120):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(sorted(r.used_workers) == sorted(cluster6.ids) for r in reports)
    assert all(r.verify_error <= EXACT for r in reports)


async def test_dynamic_clustering_moves_observed_stragglers_into_different_clusters(cluster6: Cluster) -> None:
    """GC-DC live: two stragglers start in one cluster (static placement); Algorithm 1 separates them."""
    cluster6.ensure_all_up()
    params = {"n": 6, "clusters": 2, "load": 2, "clusters_per_worker": 2}
    static_cluster = make_code("dynamic_clustered", **params).place(None).clusters[0]  # type: ignore[attr-defined]
    slow = list(static_cluster[:2])  # load 2 tolerates one straggler per cluster, not two
    delay = 2.0
    spec = job_spec(
        "dynamic_clustered", params, iterations=6, worker_ids=cluster6.ids, verify=True,
        straggler=fixed_delay(delay, workers=slow),
    )  # fmt: skip
    async with asyncio.timeout(180):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(r.exact and r.verify_error <= EXACT for r in reports)
    slow_ids = {cluster6.ids[w] for w in slow}
    # The static placement has to wait for one of them; once re-clustered, neither is waited for.
    assert reports[0].wall_seconds >= delay and slow_ids & set(reports[0].used_workers), reports[0]
    # (a re-clustered straggler is late, or gets no row to compute at all: either way it is not waited for)
    assert all(not slow_ids & set(r.used_workers) for r in reports[2:]), [
        (list(r.used_workers), list(r.late_workers)) for r in reports
    ]


async def test_partial_stragglers_code_uses_both_messages_of_every_worker(cluster6: Cluster) -> None:
    """Each worker streams a naive and a coded message; the exact decode needs every naive one."""
    cluster6.ensure_all_up()
    spec = job_spec("partial_stragglers", {"n": 6, "s": 2, "alpha": 2.0}, iterations=4, worker_ids=cluster6.ids,
                    verify=True)  # fmt: skip
    async with asyncio.timeout(180):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    for r in reports:
        assert r.exact and r.verify_error <= EXACT
        assert sorted(r.used_workers) == sorted(cluster6.ids)  # every worker's naive message is needed


async def test_cancel_stops_a_running_job_and_ends_its_watch_stream(cluster6: Cluster) -> None:
    cluster6.ensure_all_up()
    spec = job_spec("cyclic", {"n": 6, "s": 2}, iterations=50, worker_ids=cluster6.ids, straggler=fixed_delay(0.2))
    async with asyncio.timeout(120), master_stub(cluster6.master_address) as stub:
        info = await stub.CreateJob(spec)
        seen = [r async for r in _until_first(stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id)))]
        cancelled = await stub.CancelJob(master_pb2.CancelJobRequest(job_id=info.job_id))
        rest = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
    assert cancelled.state == master_pb2.JOB_STATE_CANCELLED, cancelled.message
    assert 1 <= cancelled.iterations_done < 50 and len(seen) == 1
    assert len(rest) == cancelled.iterations_done  # the history, then the stream ends


async def _until_first(stream: AsyncIterator[master_pb2.IterationReport]) -> AsyncIterator[master_pb2.IterationReport]:
    async for report in stream:
        yield report
        stream.cancel()  # type: ignore[attr-defined]
        return
