"""Pool hygiene: a registered worker is UP only where it proves it answers; bounded labels and pool; removal;
lateness probes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest

from gradcode.common.transport.security import Security, new_process_secret
from gradcode.master.liveness import BackgroundLoads, LatenessWatch
from gradcode.master.node import MasterNode
from gradcode.master.pool import (
    AddressTakenError,
    PoolFullError,
    RemovedWorkerError,
    UnreachableWorkerError,
    WorkerPool,
)
from gradcode.v1 import master_pb2, master_pb2_grpc
from gradcode.worker.node import WorkerNode, default_machine_id
from tests.helpers import free_port

TIMEOUT = 60.0
SECRET = new_process_secret()


async def test_an_unreachable_address_is_refused_with_advice_about_advertise() -> None:
    pool = WorkerPool()
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(UnreachableWorkerError, match="--advertise HOST:PORT"):
        await pool.register(address, "ghost", "abc", secret=SECRET)
    assert pool.workers == []
    await pool.close()


async def test_the_master_itself_is_not_a_worker() -> None:
    """A worker that advertised an address where the master (not a worker) answers is refused."""
    async with asyncio.timeout(TIMEOUT), MasterNode(grace=0.1) as master:
        with pytest.raises(UnreachableWorkerError, match="Something other than a gradcode worker answers"):
            await master.pool.register(master.address, "confused", "abc", secret=SECRET)
        assert master.pool.workers == []


async def test_an_address_held_by_a_live_worker_is_not_taken_over_and_a_restart_is() -> None:
    """Knowing what Hello tells (the instance id, proofs of chosen nonces) does not let another process
    register at a live worker's address; a new process that proves it answers there does."""
    security = Security(join_secret="admission-join-secret-0123456789")
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1, security=security) as worker:
        pool = WorkerPool(security=security)
        try:
            first = await pool.register(
                worker.address, "real", worker.instance_id, secret=worker.servicer.process_secret
            )
            token = first.call_token
            for instance_id in (worker.instance_id, "another-instance"):  # the id Hello tells anyone, or another
                with pytest.raises(AddressTakenError, match="did not prove it holds"):
                    await pool.register(worker.address, "impostor", instance_id, secret=new_process_secret())
            assert [(w.name, w.is_up, w.call_token) for w in pool.workers] == [("real", True, token)]
            # the same process again (a periodic re-registration): nothing changes
            again = await pool.register(
                worker.address, "real", worker.instance_id, secret=worker.servicer.process_secret
            )
            assert again is first and again.is_up and again.call_token == token
            # a new process at the same address (a restart) proves its own secret there, so it is admitted
            worker.servicer.process_secret = restarted = new_process_secret()
            again = await pool.register(worker.address, "real", "restarted", secret=restarted)
            assert again is first and again.is_up and again.instance_id == "restarted"
            assert again.call_token not in (None, token)
        finally:
            await pool.close()


async def test_a_registration_without_a_process_secret_is_refused_before_anything_else() -> None:
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1) as worker:
        pool = WorkerPool()
        try:
            for secret in (b"", b"s" * 15, b"s" * 65):
                with pytest.raises(ValueError, match="upgrade it"):
                    await pool.register(worker.address, "old", worker.instance_id, secret=secret)
            assert pool.workers == []
        finally:
            await pool.close()


async def test_labels_and_pool_size_are_bounded_and_workers_can_be_removed() -> None:
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1) as a, WorkerNode(grace=0.1) as b:
        pool = WorkerPool(max_workers=1)
        try:
            with pytest.raises(ValueError, match="at most 128 printable characters"):
                await pool.register(a.address, "n" * 40_000_000, a.instance_id, secret=SECRET)
            with pytest.raises(ValueError, match="longer than 255 characters"):
                await pool.register("h" * 1000 + ":1", "x", a.instance_id, secret=SECRET)
            with pytest.raises(ValueError, match=r"machine id .* at most 64 printable characters"):
                await pool.register(a.address, "a", a.instance_id, "m" * 65, secret=SECRET)
            worker = await pool.register(a.address, "a", a.instance_id, secret=a.servicer.process_secret)
            with pytest.raises(PoolFullError, match="gradcode workers remove"):
                await pool.register(b.address, "b", b.instance_id, secret=b.servicer.process_secret)
            removed = await pool.remove(worker.worker_id)
            with pytest.raises(RemovedWorkerError, match="restart it to join again"):
                await pool.register(a.address, "a", a.instance_id, secret=a.servicer.process_secret)  # stays out
            assert not removed.is_up and removed.last_error == "removed from the pool" and pool.workers == []
            with pytest.raises(KeyError, match="Unknown worker id"):
                await pool.remove(worker.worker_id)
            newer = await pool.register(b.address, "b", b.instance_id, secret=b.servicer.process_secret)
            assert newer.worker_id == worker.worker_id + 1  # ids are never reused
        finally:
            await pool.close()


async def test_register_and_remove_over_grpc() -> None:
    """RegisterWorker maps refusals to statuses; RemoveWorker removes; the master keeps serving."""
    async with (
        asyncio.timeout(TIMEOUT),
        MasterNode(grace=0.1) as master,
        grpc.aio.insecure_channel(master.address) as channel,
    ):
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RegisterWorker(
                master_pb2.RegisterWorkerRequest(address=f"127.0.0.1:{free_port()}", process_secret=SECRET)
            )
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--advertise" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:  # a worker of an older gradcode sends no secret
            await stub.RegisterWorker(master_pb2.RegisterWorkerRequest(address=f"127.0.0.1:{free_port()}"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "upgrade" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RegisterWorker(master_pb2.RegisterWorkerRequest(address="a:1", name="n" * 10_000))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(info.value.details() or "") < 300  # echoes at most a short prefix
        async with WorkerNode(master_address=master.address, grace=0.1) as worker:
            await asyncio.wait_for(worker.registered.wait(), TIMEOUT)
            assert worker.worker_id is not None
            listed = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
            assert [w.machine_id for w in listed if w.worker_id == worker.worker_id] == [default_machine_id()]
            info_reply = await stub.RemoveWorker(master_pb2.RemoveWorkerRequest(worker_id=worker.worker_id))
            assert info_reply.state == master_pb2.WORKER_STATE_DOWN
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RemoveWorker(master_pb2.RemoveWorkerRequest(worker_id=999))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        workers = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
        assert all(w.state == master_pb2.WORKER_STATE_UP for w in workers)  # nothing unreachable is listed UP


async def test_a_worker_late_k_times_in_a_row_is_probed_and_marked_down_when_the_probe_fails() -> None:
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1) as alive, WorkerNode(grace=0.1) as doomed:
        pool = WorkerPool([alive.address, doomed.address])
        watch = LatenessWatch(pool, consecutive=3, probe_timeout=1.0)
        try:
            slow, cut = pool.workers
            await doomed.shutdown()  # its link is "cut": nothing answers at its address any more
            for iteration in range(2):
                assert watch.observe(on_time=[], late=[slow, cut]) == [], iteration
            started = watch.observe(on_time=[], late=[slow, cut])
            assert started == [slow, cut]
            await watch.wait_probes()
            assert slow.is_up and not cut.is_up and "health check" in cut.last_error
            # a worker that delivers in between starts its count again
            watch.observe(on_time=[], late=[slow])
            watch.observe(on_time=[slow], late=[])
            assert watch.observe(on_time=[], late=[slow]) == [] and watch.late_streak[slow.worker_id] == 1
        finally:
            watch.close()
            await pool.close()


async def test_a_hung_reload_runs_beside_the_iterations_and_wakes_the_runner_when_it_ends() -> None:
    pool = WorkerPool()
    loads = BackgroundLoads(pool)
    release = asyncio.Event()
    calls: list[int] = []

    async def hung_load() -> bool:
        calls.append(1)
        await release.wait()
        return True

    async with asyncio.timeout(TIMEOUT):
        assert loads.start(4, hung_load) and loads.loading(4)
        assert not loads.start(4, hung_load)  # one load per worker at a time, however many iterations ask
        await asyncio.sleep(0)
        assert calls == [1] and loads.loading(4)  # start() returned at once: the gather of the others goes on
        waiter = asyncio.create_task(pool.wait_changed(TIMEOUT))
        await asyncio.sleep(0)
        release.set()
        await waiter  # woken by the load's end, long before TIMEOUT
        assert not loads.loading(4)
        release.clear()
        loads.start(5, hung_load)
        await loads.close()  # the job ended: loads under way are cancelled
        assert not loads.loading(5)
    await pool.close()


async def test_a_worker_that_refuses_the_masters_credential_is_told_about_the_join_secret() -> None:
    worker_side = Security(join_secret="worker-side-secret-0123456789")
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1, security=worker_side) as worker:
        pool = WorkerPool(security=Security(join_secret="master-side-secret-0123456789"))
        try:
            with pytest.raises(UnreachableWorkerError, match="the same join secret"):
                await pool.register(worker.address, "w", worker.instance_id, secret=worker.servicer.process_secret)
            assert pool.workers == []
        finally:
            await pool.close()


async def test_a_probe_revives_only_the_process_that_registered_and_a_new_one_gets_a_new_token() -> None:
    """A DOWN worker answering the probe is UP again only if Hello proves the registered process's secret; a
    new process at the address stays DOWN until it registers, and is then issued a new call token."""
    security = Security(join_secret="probe-join-secret-0123456789")
    pool = WorkerPool(security=security)
    try:
        async with asyncio.timeout(TIMEOUT):
            async with WorkerNode(grace=0.1, security=security) as first:
                address = first.address
                mine = first.servicer.process_secret
                worker = await pool.register(address, "w", first.instance_id, secret=mine)
                token = worker.call_token
                assert token is not None and worker.is_up
                assert (await pool.register(address, "w", first.instance_id, secret=mine)).call_token == token
                pool.mark_down(worker, "Compute failed")
                assert await pool.probe(worker) and worker.is_up and worker.call_token == token  # the same process
                pool.mark_down(worker, "Compute failed")
            port = int(address.rpartition(":")[2])
            async with WorkerNode(port=port, grace=0.1, security=security) as second:
                assert second.address == address
                for _ in range(2):  # the monitor probes again and again: never revived
                    assert not await pool.probe(worker)
                    assert not worker.is_up and "another worker process answers" in worker.last_error
                await pool.probe_down()
                assert not worker.is_up
                # the old process's id and secret are no good there any more (and its token stays dropped)
                with pytest.raises(AddressTakenError):
                    await pool.register(address, "w", first.instance_id, secret=mine)
                again = await pool.register(address, "w", second.instance_id, secret=second.servicer.process_secret)
                assert again is worker and worker.is_up and worker.instance_id == second.instance_id
                assert worker.call_token not in (None, token)
                # and an UP worker whose address now answers with another process is marked DOWN by a probe
                second.servicer.process_secret = new_process_secret()
                assert not await pool.probe(worker) and not worker.is_up
    finally:
        await pool.close()


async def test_without_a_join_secret_no_call_token_is_issued() -> None:
    async with asyncio.timeout(TIMEOUT), WorkerNode(grace=0.1) as node:
        pool = WorkerPool()
        try:
            worker = await pool.register(node.address, "w", node.instance_id, secret=node.servicer.process_secret)
            assert worker.call_token is None and worker.bearer is None
        finally:
            await pool.close()


async def _restart_registration(worker: WorkerNode, master_address: str) -> None:
    """Restart the worker's registration loop (same process, same secret) and wait for its first outcome."""
    assert worker._registration is not None
    worker._registration.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await worker._registration
    worker.registered.clear()
    failures = worker.registration_failures
    worker._registration = asyncio.create_task(worker._register_forever(master_address))
    while not worker.registered.is_set() and worker.registration_failures == failures:
        await asyncio.sleep(0.02)


async def test_the_same_process_keeps_its_token_and_one_displaced_from_its_address_drops_it() -> None:
    """Re-registrations of one process (periodic, or a restarted registration loop) keep its call token. A
    process whose advertised address now reaches another worker is refused (ALREADY_EXISTS) and drops its
    token, and the worker answering there keeps its own."""
    security = Security(join_secret="keep-join-secret-0123456789")
    async with (
        asyncio.timeout(TIMEOUT),
        MasterNode(grace=0.1, security=security) as master,
        WorkerNode(master_address=master.address, grace=0.1, security=security, reregister_seconds=0.1) as a,
        WorkerNode(master_address=master.address, grace=0.1, security=security, reregister_seconds=0.1) as b,
    ):
        await asyncio.gather(a.registered.wait(), b.registered.wait())
        assert a.call_token is not None and b.call_token is not None
        token_a, token_b = a.call_token.value, b.call_token.value
        await asyncio.sleep(0.5)  # a few periodic re-registrations
        await _restart_registration(a, master.address)
        assert a.registered.is_set() and a.registration_failures == 0
        tokens = {w.address: w.call_token for w in master.pool.workers}
        assert a.call_token.value == token_a == tokens[a.address] and token_b == tokens[b.address]
        # a's advertised name now leads to b (a DNS name moved to another pod): a is no longer the worker there
        a.advertise_address = b.address
        await _restart_registration(a, master.address)
        assert "ALREADY_EXISTS" in a.last_registration_error and a.call_token.value is None
        assert b.call_token.value == token_b == {w.address: w.call_token for w in master.pool.workers}[b.address]


async def test_more_idle_workers_than_a_periods_probes_take_turns_and_a_dead_one_is_found_in_its_turn() -> None:
    """A pool that probes 2 workers a period, with 5 idle: each period the next 2 in worker id order, wrapping
    around; one shut down is DOWN at its turn, and the turns then go on among the others."""
    nodes = [WorkerNode(grace=0.1) for _ in range(5)]
    pool = WorkerPool(probes_per_period=2)
    try:
        async with asyncio.timeout(TIMEOUT):
            for node in nodes:
                await node.start()
            workers = [
                await pool.register(n.address, f"w{i}", n.instance_id, secret=n.servicer.process_secret)
                for i, n in enumerate(nodes)
            ]
            ids = [w.worker_id for w in workers]

            async def one_period() -> list[int]:
                before = {w.worker_id: w.last_seen for w in workers}
                await pool.probe_idle()
                return sorted(w.worker_id for w in workers if w.last_seen != before[w.worker_id])

            assert [await one_period() for _ in range(3)] == [ids[0:2], ids[2:4], sorted([ids[4], ids[0]])]
            await nodes[1].shutdown()  # next in turn: 1 and 2
            await one_period()
            assert [w.is_up for w in workers] == [True, False, True, True, True]
            assert await one_period() == ids[3:5], "the turn goes on among the workers still UP"
            with pytest.raises(ValueError, match="probes_per_period"):
                WorkerPool(probes_per_period=0)
    finally:
        await pool.close()
        for node in nodes:
            await node.shutdown()


async def test_more_down_workers_than_a_periods_probes_take_turns_coming_back() -> None:
    """Five ``--workers`` addresses (no registration: a probe that finds one serving brings it UP), all DOWN, then
    all serving: 2 a period come back, in worker id order."""
    ports = [free_port() for _ in range(5)]
    pool = WorkerPool([f"127.0.0.1:{port}" for port in ports], probes_per_period=2)
    nodes = [WorkerNode(port=port, grace=0.1) for port in ports]
    try:
        async with asyncio.timeout(TIMEOUT):
            for worker in pool.workers:
                pool.mark_down(worker, "not started yet")
            for node in nodes:
                await node.start()
            up = []
            for _ in range(3):
                await pool.probe_down()
                up.append(sum(w.is_up for w in pool.workers))
            assert up == [2, 4, 5]
            assert all(w.is_up for w in sorted(pool.workers, key=lambda w: w.worker_id)[:2])
    finally:
        await pool.close()
        for node in nodes:
            await node.shutdown()
