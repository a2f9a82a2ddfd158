"""A relayed model (ComputeRequest.relayed_model, Worker.FetchModel) between real worker servers on loopback: fetched
from a peer it gives the inline gradient, however late the peer gets it while it says it is waiting; a stale, lying,
dead, frozen or endlessly waiting peer ends the Compute FAILED_PRECONDITION within a bounded wait and never yields a
gradient; a peer serves only its job's models, to the job's relay token."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Array
from gradcode.common.transport.security import Security, job_token, relay_token
from gradcode.common.transport.wire import CHANNEL_OPTIONS, float64_parts, model_digest
from gradcode.master.node import MasterNode
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from gradcode.worker import relay
from gradcode.worker.node import WorkerNode
from gradcode.worker.relay import (
    HEARTBEAT,
    HEARTBEAT_SECONDS,
    PART_BYTES,
    STALL_SECONDS,
    HeldModels,
    ModelUnavailableError,
)
from gradcode.worker.service import WorkerServicer
from tests.helpers import free_port
from tests.worker.conftest import (
    ServedWorker,
    data_for,
    expected_message,
    job_setup,
    load_chunks,
    make_partitions,
    random_params,
    serve_worker,
    stop_worker,
)
from tests.worker.test_service import _compute, _load, _request, _status

TIMEOUT = 30.0
CODE = make_code("cyclic", n=3, s=1)
PARTITIONS = make_partitions(CODE.k)


@contextlib.asynccontextmanager
async def _stub(served: ServedWorker) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    """A stub on a channel of its own to the worker server ``served``."""
    async with grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture
async def peer_and_fetcher() -> AsyncIterator[tuple[ServedWorker, ServedWorker]]:
    """Two real worker servers holding workers 0 (the peer) and 1 (the fetcher) of one job."""
    served = [await serve_worker(), await serve_worker()]
    try:
        for w, s in enumerate(served):
            async with _stub(s) as stub:
                await _load(stub, load_chunks(job_setup(CODE, w), data_for(CODE, w, PARTITIONS)))
        yield served[0], served[1]
    finally:
        for s in served:
            await stop_worker(s)


def _relayed(address: str, params: Array, iteration: int = 1, hops: int = 0) -> worker_pb2.ComputeRequest:
    """Worker 1's Compute of ``iteration`` told to fetch ``params`` from the peer at ``address``, ``hops`` fetches
    from the master's inline copy (0: one)."""
    relay = worker_pb2.RelayedModel(address=address, length=params.size, digest=model_digest(params), hops=hops)
    rows = CODE.static_assignment().rows[1]
    return worker_pb2.ComputeRequest(job_id="job", iteration=iteration, worker_id=1, rows=rows, relayed_model=relay)


async def _peer_computes(peer: ServedWorker, params: Array, iteration: int = 1) -> None:
    """The peer's own (inline) Compute of ``iteration``: it then holds ``params``."""
    async with _stub(peer) as stub:
        await _compute(stub, _request("job", 0, tuple(CODE.static_assignment().rows[0]), params, iteration))


async def _fetcher_computes(fetcher: ServedWorker, request: worker_pb2.ComputeRequest) -> dict[int, Array]:
    async with _stub(fetcher) as stub:
        messages, _ = await _compute(stub, request)
        return messages


async def _fetcher_refuses(fetcher: ServedWorker, request: worker_pb2.ComputeRequest) -> grpc.aio.AioRpcError:
    async with _stub(fetcher) as stub:
        return await _status(stub.Compute(request))


async def test_a_relayed_model_fetched_from_a_peer_gives_the_inline_gradient_even_asked_before_the_peer(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    peer, fetcher = peer_and_fetcher
    params = random_params()
    async with asyncio.timeout(TIMEOUT):
        fetched = asyncio.create_task(_fetcher_computes(fetcher, _relayed(peer.address, params)))
        await asyncio.sleep(0.2)  # the fetcher asks first: the peer waits for the model it is about to receive
        assert not fetched.done()
        await _peer_computes(peer, params)
        messages = await fetched
    for row, vector in messages.items():
        np.testing.assert_allclose(vector, expected_message(CODE, row, params, PARTITIONS), rtol=1e-12, atol=0)
    assert fetcher.servicer.jobs["job"].models.held(1) is not None, "the fetcher holds it for its own fetchers"


async def test_a_fetchers_wait_for_its_relayed_model_is_its_model_seconds(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    """Each message's trailer gives the sender's seconds from its request to its model checked (the master's reports
    show them): a fetcher's cover its wait for the peer, an inline model's its reading alone."""
    peer, fetcher = peer_and_fetcher
    params = random_params()
    wait = 0.3
    async with asyncio.timeout(TIMEOUT), _stub(fetcher) as fetcher_stub, _stub(peer) as peer_stub:
        fetched = asyncio.create_task(_compute(fetcher_stub, _relayed(peer.address, params)))
        await asyncio.sleep(wait)
        assert not fetched.done()
        _, inline = await _compute(peer_stub, _request("job", 0, tuple(CODE.static_assignment().rows[0]), params, 1))
        _, relayed = await fetched
    # (the fetcher holds its request a little after the wait began, and the peer's model comes a little after it ends)
    for chunks, (low, high) in ((relayed, (wait / 2, TIMEOUT)), (inline, (0.0, wait / 2))):
        trailers = [c.trailer for c in chunks if c.HasField("trailer")]
        assert trailers and all(low < t.model_seconds < high and t.compute_seconds > 0 for t in trailers), trailers


OLD_ONE_HOP_SECONDS = 1.0 + 0.5 + 2 * 8 * random_params().size / 20e6
"""The whole wait a fetcher one hop from the seed had before 2026-11-29 (the peer's wait, one transfer, slack)."""


@pytest.mark.parametrize("hops", [1, 3])
async def test_a_fetcher_waits_for_a_live_peer_however_late_its_model_comes(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker], hops: int
) -> None:
    """The peer gets the model well after a stall and after the fixed one-hop deadline of before (its own request
    still on a congested link): the fetcher, one hop from the seed or three, keeps waiting while the peer says it
    is waiting, and computes the inline gradient."""
    peer, fetcher = peer_and_fetcher
    params = random_params()
    late = max(STALL_SECONDS, OLD_ONE_HOP_SECONDS) + 1.0
    async with asyncio.timeout(TIMEOUT):
        fetched = asyncio.create_task(_fetcher_computes(fetcher, _relayed(peer.address, params, hops=hops)))
        await asyncio.sleep(late)
        assert not fetched.done(), "the fetch gave up on a live peer"
        await _peer_computes(peer, params)
        messages = await fetched
    for row, vector in messages.items():
        np.testing.assert_allclose(vector, expected_message(CODE, row, params, PARTITIONS), rtol=1e-12, atol=0)


async def test_a_fetcher_whose_own_loop_was_held_up_past_a_stall_does_not_blame_its_peer(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    """The whole process stops for longer than a stall while the fetcher waits (as every host of the emulated cluster
    did at once, once: a busy or paused machine): peer and fetcher wake together, the fetcher's timer due before the
    peer's next heartbeat is read. That is one late wake-up of the fetcher, not a peer silent for a stall; the fetch
    goes on and gives the inline gradient."""
    peer, fetcher = peer_and_fetcher
    params = random_params()
    held_up = STALL_SECONDS + 0.5
    async with asyncio.timeout(TIMEOUT):
        fetched = asyncio.create_task(_fetcher_computes(fetcher, _relayed(peer.address, params)))
        await asyncio.sleep(2 * HEARTBEAT_SECONDS)  # the fetch is under way, the peer saying it waits
        assert not fetched.done()
        time.sleep(held_up)  # the event loop of both, held up
        await asyncio.sleep(2 * HEARTBEAT_SECONDS)
        assert not fetched.done(), "the fetch blamed the peer for the fetcher's own stop"
        await _peer_computes(peer, params)
        messages = await fetched
    for row, vector in messages.items():
        np.testing.assert_allclose(vector, expected_message(CODE, row, params, PARTITIONS), rtol=1e-12, atol=0)


def test_a_stall_is_under_the_masters_floor_for_asking_again_and_a_model_comes_in_pieces_that_show_progress() -> None:
    from gradcode.master.rounds import AnswerTimes

    assert HEARTBEAT_SECONDS < STALL_SECONDS < AnswerTimes.FLOOR_SECONDS
    params = np.random.default_rng(1).standard_normal(1_000_000)
    parts = float64_parts(worker_pb2.FetchModelReply, "part", params, PART_BYTES)
    pieces = [worker_pb2.FetchModelReply.FromString(part).part for part in parts]
    assert len(pieces) == 2 and all(len(p) <= PART_BYTES for p in pieces), "8 MB in 4 MiB pieces"
    assert np.array_equal(np.frombuffer(b"".join(pieces), dtype="<f8"), params)
    assert PART_BYTES / 20e6 < STALL_SECONDS / 5, "a piece at the floor rate is far within a stall"


class _ScriptedPeer(WorkerServicer):
    """A peer that answers every FetchModel with ``script``: (seconds to wait, serialized reply) in turn."""

    def __init__(self, script: list[tuple[float, bytes]]) -> None:
        super().__init__()
        self.script = script

    async def FetchModel(self, request: worker_pb2.FetchModelRequest, context: object) -> AsyncIterator[bytes]:  # noqa: N802
        for seconds, reply in self.script:
            await asyncio.sleep(seconds)
            yield reply


async def test_a_model_sent_in_slow_pieces_arrives_and_a_short_or_long_one_is_refused(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    """Pieces that each come within a stall, the whole slower than one: the fetcher waits and computes the inline
    gradient. A peer that ends before the model's last byte, or whose last piece holds a byte more, is refused,
    naming it (what a peer sends after the model's last byte is never read)."""
    _, fetcher = peer_and_fetcher
    params = random_params()
    parts = float64_parts(worker_pb2.FetchModelReply, "part", params, 16)
    pace = 1.2 * STALL_SECONDS / (len(parts) - 1)
    assert len(parts) >= 3 and pace < STALL_SECONDS / 2
    last = worker_pb2.FetchModelReply.FromString(parts[-1]).part
    overlong = worker_pb2.FetchModelReply(part=last + b"x").SerializeToString()
    scripts = {
        "slow": [(0.0, HEARTBEAT), *((pace, part) for part in parts)],
        "short": [(0.0, part) for part in parts[:-1]],
        "long": [(0.0, part) for part in parts[:-1]] + [(0.0, overlong)],
    }
    for name, script in scripts.items():
        peer = await serve_worker(_ScriptedPeer(script))
        try:
            async with asyncio.timeout(TIMEOUT):
                if name == "slow":
                    started = time.perf_counter()
                    messages = await _fetcher_computes(fetcher, _relayed(peer.address, params))
                    assert time.perf_counter() - started > STALL_SECONDS, "the whole took longer than a stall"
                    for row, vector in messages.items():
                        want = expected_message(CODE, row, params, PARTITIONS)
                        np.testing.assert_allclose(vector, want, rtol=1e-12, atol=0)
                    continue
                refused = await _fetcher_refuses(fetcher, _relayed(peer.address, params, iteration=2))
        finally:
            await stop_worker(peer)
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, refused)
        said = "ended its answer after" if name == "short" else "sent more than the model's"
        assert said in str(refused.details()), (name, refused.details())


async def test_a_stale_or_lying_peer_is_caught_by_the_digest(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    """The peer holds another model for the iteration (stale, or a lie): the fetcher refuses it and computes nothing."""
    peer, fetcher = peer_and_fetcher
    params = random_params()
    async with asyncio.timeout(TIMEOUT):
        await _peer_computes(peer, params + 2.0**-40)  # one ulp-scale change is enough
        refused = await _fetcher_refuses(fetcher, _relayed(peer.address, params))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "BLAKE3 digest is not the master's" in str(refused.details()) and "Send it inline" in str(refused.details())
    assert fetcher.servicer.jobs["job"].models.held(1) is None


class _FrozenPeer(WorkerServicer):
    """A worker whose FetchModel never answers: the call is accepted on a live connection, then nothing (as a process
    stopped with SIGSTOP after its HTTP/2 connection was set up)."""

    async def FetchModel(self, request: worker_pb2.FetchModelRequest, context: object) -> AsyncIterator[bytes]:  # noqa: N802
        await asyncio.Event().wait()
        yield b""  # unreachable


class _EverWaitingPeer(WorkerServicer):
    """A worker that only ever says it is still waiting for the model (a liar, or a peer whose own model never
    comes): a heartbeat every HEARTBEAT_SECONDS, never a model."""

    async def FetchModel(self, request: worker_pb2.FetchModelRequest, context: object) -> AsyncIterator[bytes]:  # noqa: N802
        while True:
            yield HEARTBEAT
            await asyncio.sleep(HEARTBEAT_SECONDS)


async def test_a_dead_or_frozen_peer_fails_the_fetch_after_one_stall(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker],
) -> None:
    _, fetcher = peer_and_fetcher
    params = random_params()
    frozen = await serve_worker(_FrozenPeer())
    stall = STALL_SECONDS
    try:
        async with asyncio.timeout(TIMEOUT):
            for address, bound in ((f"127.0.0.1:{free_port()}", 0.5), (frozen.address, stall)):
                started = time.perf_counter()
                refused = await _fetcher_refuses(fetcher, _relayed(address, params))
                elapsed = time.perf_counter() - started
                assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused
                assert f"peer '{address}'" in str(refused.details())
                assert elapsed < bound + 0.5, (address, elapsed, refused.details())
            assert f"said nothing for {stall:g} s" in str(refused.details()) and elapsed >= stall - 0.1
    finally:
        await stop_worker(frozen)


async def test_a_peer_that_only_ever_says_it_is_waiting_fails_the_fetch_after_the_longest_wait(
    peer_and_fetcher: tuple[ServedWorker, ServedWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats keep a fetch alive, but not for ever: the fetcher drops such a peer after the longest wait (made
    2 s here; :data:`LONGEST_WAIT_SECONDS` is a minute) and a stall, its call's deadline."""
    _, fetcher = peer_and_fetcher
    params = random_params()
    monkeypatch.setattr(relay, "LONGEST_WAIT_SECONDS", 2.0)
    waiting = await serve_worker(_EverWaitingPeer())
    try:
        async with asyncio.timeout(TIMEOUT):
            started = time.perf_counter()
            refused = await _fetcher_refuses(fetcher, _relayed(waiting.address, params))
            elapsed = time.perf_counter() - started
    finally:
        await stop_worker(waiting)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused
    assert "DEADLINE_EXCEEDED" in str(refused.details()), refused.details()
    bound = 2.0 + STALL_SECONDS
    assert STALL_SECONDS + 0.5 < elapsed < bound + 0.5, "kept alive past a stall, dropped at the bound"


async def test_a_relayed_model_must_name_a_peer_and_match_the_jobs_model() -> None:
    served = await serve_worker()
    try:
        async with _stub(served) as stub:
            await _load(stub, load_chunks(job_setup(CODE, 1), data_for(CODE, 1, PARTITIONS)))
            params = random_params()
            bad = {
                "names no peer address": _relayed("", params),
                "this job's model has": _relayed("127.0.0.1:1", np.zeros(params.size + 1)),
                "a digest is 32": _relayed("127.0.0.1:1", params),
                "passes at most 32 fetches": _relayed("127.0.0.1:1", params, hops=33),
            }
            bad["a digest is 32"].relayed_model.digest = b"short"
            for expected, request in bad.items():
                refused = await _status(stub.Compute(request))
                assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and expected in str(refused.details())
    finally:
        await stop_worker(served)


async def test_held_models_keep_the_last_two_and_wake_every_waiter_at_once() -> None:
    held = HeldModels()
    async with asyncio.timeout(TIMEOUT):
        waiters = [asyncio.create_task(held.wait(3, 5.0)) for _ in range(50)]  # a burst of concurrent fetches
        await asyncio.sleep(0.01)
        held.hold(1, np.zeros(2))
        held.hold(3, np.ones(2))
        assert all(np.array_equal(got, np.ones(2)) for got in await asyncio.gather(*waiters))
        held.fail(4, "its own peer lied")
        held.hold(5, np.full(2, 5.0))
        with pytest.raises(ModelUnavailableError, match="no longer holds the model of iteration 3"):
            await held.wait(3, 0.5)
        with pytest.raises(ModelUnavailableError, match="could not get the model of iteration 4: its own peer lied"):
            await held.wait(4, 0.5)
        with pytest.raises(ModelUnavailableError, match=r"holds no model of iteration 6 \(waited 0.05 s"):
            await held.wait(6, 0.05)
        held.hold(4, np.full(2, 4.0))  # the master sent it inline since: it replaces the failure
        held.fail(4, "late news")  # and a failure never replaces a model
        assert held.held(4) is not None and held.held(5) is not None


async def _replies(held: HeldModels, iteration: int, seconds: float) -> list[bytes]:
    return [reply async for reply in held.replies(iteration, seconds)]


async def test_a_held_models_reply_is_encoded_once_for_every_fetcher_and_again_when_the_model_changes() -> None:
    held = HeldModels()
    async with asyncio.timeout(TIMEOUT):
        fetches = [asyncio.create_task(_replies(held, 2, 5.0)) for _ in range(3)]  # a peer's three fetchers, early
        await asyncio.sleep(0.01)
        held.hold(2, np.arange(4.0))
        replies = [r[-1] for r in await asyncio.gather(*fetches)]
        assert replies[0] is replies[1] is replies[2] is (await _replies(held, 2, 0.1))[-1], "encoded once"
        first = worker_pb2.FetchModelReply.FromString(replies[0])
        assert np.array_equal(np.frombuffer(first.part, dtype="<f8"), np.arange(4.0))
        held.hold(2, np.full(4, 7.0))  # replaced (sent inline since): the reply follows the model held
        again = worker_pb2.FetchModelReply.FromString((await _replies(held, 2, 0.1))[-1])
        assert np.array_equal(np.frombuffer(again.part, dtype="<f8"), np.full(4, 7.0))
        held.hold(3, np.zeros(4))
        held.hold(4, np.zeros(4))
        with pytest.raises(ModelUnavailableError, match="no longer holds the model of iteration 2"):
            await _replies(held, 2, 0.1)


async def test_held_models_say_they_are_waiting_until_the_model_comes_and_fail_at_the_wait_they_were_given() -> None:
    held = HeldModels()
    async with asyncio.timeout(TIMEOUT):
        fetch = asyncio.create_task(_replies(held, 1, 10.0))
        await asyncio.sleep(4.5 * HEARTBEAT_SECONDS)
        held.hold(1, np.arange(3.0))
        replies = await fetch
        assert 3 <= len(replies) - 1 <= 5 and set(replies[:-1]) == {HEARTBEAT}, "a heartbeat every 0.25 s it waited"
        last = worker_pb2.FetchModelReply.FromString(replies[-1])
        assert np.array_equal(np.frombuffer(last.part, dtype="<f8"), np.arange(3.0))
        assert worker_pb2.FetchModelReply.FromString(HEARTBEAT) == worker_pb2.FetchModelReply(), "an empty reply"
        started = time.perf_counter()
        beats = 0
        with pytest.raises(ModelUnavailableError, match=r"holds no model of iteration 2 \(waited 0.6 s"):
            async for reply in held.replies(2, 0.6):
                beats += reply == HEARTBEAT
        assert 0.55 < time.perf_counter() - started < 1.2 and 1 <= beats <= 2
        held.fail(3, "its own peer was silent")
        with pytest.raises(ModelUnavailableError, match="could not get the model of iteration 3"):
            await _replies(held, 3, 5.0)  # at once, not after the wait


async def test_a_relay_token_opens_fetch_model_of_its_job_only_and_nothing_else() -> None:
    """What a worker is given to fetch from a peer: FetchModel for that job only, never a Compute; a process outside
    the job (no token, a forged one, the join secret's derived token, a tree parent's job token) is refused."""
    security = Security(join_secret="join-secret-0123456789abcdef")
    async with (
        asyncio.timeout(TIMEOUT),
        MasterNode(grace=0.2, security=security) as master,
        WorkerNode(master_address=master.address, grace=0.2, security=security) as peer,
    ):
        await peer.registered.wait()
        assert peer.call_token is not None and peer.call_token.value
        token = peer.call_token.value

        async def fetch(bearer: str | None, job_id: str = "x") -> grpc.aio.AioRpcError:
            async with Security().channel(peer.address, bearer=bearer) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
                return await _status(stub.FetchModel(worker_pb2.FetchModelRequest(job_id=job_id, iteration=1)))

        let_through = await fetch(relay_token(token, "x"))  # the job is simply not loaded here
        assert let_through.code() == grpc.StatusCode.NOT_FOUND
        other = await fetch(relay_token(token, "another job"))
        assert other.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "relay token is for job 'another job', not 'x'" in str(other.details())
        for bearer in (job_token(token, "x"), security.worker_call_token):  # valid, but not for this method
            denied = await fetch(bearer)
            assert denied.code() == grpc.StatusCode.PERMISSION_DENIED, bearer
            wanted = "FetchModel needs the call token its master issued or relay token its master gave a peer"
            assert wanted in str(denied.details())
        for bearer in (None, relay_token("guessed-0123456789abcdef", "x"), "job:eA==.00"):
            refused = await fetch(bearer)
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, bearer
        async with Security().channel(peer.address, bearer=relay_token(token, "x")) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            compute = await _status(stub.Compute(worker_pb2.ComputeRequest(job_id="x")).read())
            assert compute.code() == grpc.StatusCode.PERMISSION_DENIED, "a relay token never opens a Compute"
