"""A worker's link (:mod:`gradcode.common.transport.link`) on real sockets: framing, the one-time token, TLS, and the
Session over it against the same Session over gRPC, on a real worker node."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.bench.transport import _linear_job
from gradcode.client.certs import CertificateSet, make_certificates
from gradcode.common.training.models import make_model
from gradcode.common.transport import link
from gradcode.common.transport.link import (
    FrameProtocol,
    LinkClosedError,
    LinkRefusedError,
    LinkServer,
    LinkStream,
    PlacedFrame,
    open_link,
)
from gradcode.common.transport.security import Security
from gradcode.common.transport.session import Caller, Session
from gradcode.common.transport.wire import (
    CHANNEL_OPTIONS,
    MessageAssembler,
    ReceivedChunk,
    message_chunk_bytes,
    model_request_bytes,
    parse_chunk,
)
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from gradcode.worker.node import WorkerNode
from tests.worker.conftest import data_for, expected_message, job_setup, load_chunks, make_partitions, random_params
from tests.worker.test_session import CYCLIC, _head

TIMEOUT = 20.0


# ---- frames ------------------------------------------------------------------------------------------------
async def _pair() -> tuple[FrameProtocol, FrameProtocol, asyncio.Server]:
    """Two FrameProtocols connected over loopback TCP."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[FrameProtocol] = loop.create_future()
    server = await loop.create_server(lambda: FrameProtocol(1 << 26, accepted.set_result), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await loop.create_connection(lambda: FrameProtocol(1 << 26), "127.0.0.1", port)
    return client, await accepted, server


@pytest.mark.parametrize("sizes", [[0, 1, 5, 4096], [link._STAGING_BYTES - 4, link._STAGING_BYTES - 3], [3 << 20]])
async def test_frames_of_every_size_arrive_whole_and_in_order_both_ways(sizes: list[int]) -> None:
    """Empty, small, at the staging buffer's edge and far beyond it (received into a buffer of its own)."""
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes * 3]
    async with asyncio.timeout(TIMEOUT):
        client, server_side, server = await _pair()
        try:
            for sender, receiver in ((client, server_side), (server_side, client)):
                sending = asyncio.gather(*(sender.send(f) for f in frames))
                received = [bytes(await receiver.receive()) for _ in frames]
                await sending
                assert received == frames
        finally:
            client.close()
            server.close()


async def test_a_frame_sent_in_pieces_arrives_as_their_concatenation() -> None:
    """Small pieces are joined and large ones written as they are (bytes or views): the peer sees one frame."""
    rng = np.random.default_rng(2)
    big = rng.standard_normal(300_000)
    frames = [
        (b"head", big.view(np.uint8).data),
        (b"a", b"", b"b" * 70_000, b"c", memoryview(b"tail")),
        (b"only small", b"!"),
    ]
    async with asyncio.timeout(TIMEOUT):
        client, server_side, server = await _pair()
        try:
            sending = asyncio.gather(*(client.send(f) for f in frames))
            received = [bytes(await server_side.receive()) for _ in frames]
            await sending
            assert received == [b"".join(f) for f in frames]
        finally:
            client.close()
            server.close()


_ROWS = {5: np.random.default_rng(8).standard_normal(60_000), 6: np.random.default_rng(9).standard_normal(60_000)}
_STREAM = b"".join(
    struct.pack(">I", len(chunk)) + chunk
    for row, vector in _ROWS.items()
    for chunk in message_chunk_bytes(vector, job_id="j", iteration=4, worker_id=2, row=row, chunk_bytes=300_000)
)
"""Two rows of 480 KB, each a chunk of 300 KB (larger than a link's staging buffer: placed) and one of 180 KB."""


@settings(max_examples=40, deadline=None)
@given(
    reads=st.lists(st.one_of(st.integers(1, 200), st.integers(20_000, 300_000)), min_size=1, max_size=30).filter(
        lambda reads: max(reads) >= 20_000
    ),
    lags=st.lists(st.integers(0, 3), max_size=30),
)
def test_frames_cut_anyhow_are_placed_or_received_whole_and_the_messages_are_exact(
    reads: list[int], lags: list[int]
) -> None:
    """The stream read in arbitrary pieces (a frame's head cut anywhere), the consumer falling behind by a few
    frames at random: every chunk is placed or received whole, and both messages come out bit for bit."""
    protocol = FrameProtocol(1 << 26)
    assembler = MessageAssembler(job_id="j", iteration=4, worker_id=2, rows=(5, 6), length=60_000)
    LinkStream(protocol, "peer").place_with(assembler.place)
    done = {}
    placed = 0

    def consume(keep: int) -> None:
        nonlocal placed
        while len(protocol._frames) > keep:
            frame = protocol._frames.popleft()
            if isinstance(frame, PlacedFrame):
                placed += 1
                chunk = ReceivedChunk(meta=frame.head, data=frame.payload, placed=True)
            else:
                chunk = parse_chunk(frame)
            message = assembler.feed(chunk)
            if message is not None:
                done[message.row] = message.vector

    position, step = 0, 0
    while position < len(_STREAM):
        buffer = protocol.get_buffer(-1)
        size = min(len(buffer), reads[step % len(reads)], len(_STREAM) - position)
        buffer[:size] = _STREAM[position : position + size]
        protocol.buffer_updated(size)
        position += size
        consume(lags[step % len(lags)] if lags else 0)
        step += 1
    consume(0)
    assert set(done) == {5, 6}
    assert all(np.array_equal(done[row], vector) for row, vector in _ROWS.items())
    assert 1 <= placed <= 2  # row 5's first chunk always; row 6's unless row 5 was not yet fed when it began


async def test_a_frame_over_the_limit_closes_the_connection_and_the_receiver_says_why() -> None:
    async with asyncio.timeout(TIMEOUT):
        client, server_side, server = await _pair()
        server_side.max_frame = 100
        await client.send(b"x" * 100)
        assert await server_side.receive() == b"x" * 100
        await client.send(b"x" * 101)
        with pytest.raises(LinkClosedError, match="frame of 101 bytes; at most 100"):
            await server_side.receive()
        with pytest.raises(LinkClosedError):
            for _ in range(100):  # the client learns it once the connection's end reaches it
                await client.receive()
        server.close()


# ---- the listener and its tokens ---------------------------------------------------------------------------
async def _echo(requests: AsyncIterator[worker_pb2.ComputeRequest], write: Any) -> None:
    async for request in requests:
        await write(worker_pb2.GradientChunk(request_id=request.request_id).SerializeToString())


async def _raw_hello(port: int, hello: bytes) -> bytes:
    """Connect, send ``hello`` as the first frame, and return what the listener answers (b"" if it hangs up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(struct.pack(">I", len(hello)) + hello)
    try:
        head = await reader.readexactly(4)
        return await reader.readexactly(struct.unpack(">I", head)[0])
    except asyncio.IncompleteReadError:
        return b""
    finally:
        writer.close()


async def test_only_an_offered_unused_unexpired_token_opens_a_link() -> None:
    async with asyncio.timeout(TIMEOUT):
        server = LinkServer(_echo, Security())
        port = await server.start("127.0.0.1", 0)
        try:
            offer = server.offer()
            assert offer.port == port and len(offer.token) == link.TOKEN_BYTES and not offer.tls
            assert await _raw_hello(port, link.HELLO + offer.token) == link.ACCEPTED
            reused = await _raw_hello(port, link.HELLO + offer.token)
            assert reused.startswith(b"refused: ") and b"did not offer, or already used" in reused
            assert b"did not offer" in await _raw_hello(port, link.HELLO + bytes(link.TOKEN_BYTES))
            assert b"not a gradcode link hello" in await _raw_hello(port, b"GET / HTTP/1.1\r\n\r\n")

            expired = server.offer()
            server._tokens[expired.token] = (0.0, None)  # its minute is over
            assert b"the token expired" in await _raw_hello(port, link.HELLO + expired.token)

            # before the hello is accepted, no frame longer than a hello is taken (no allocation on a stranger's word)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            while not server._connections:
                await asyncio.sleep(0.01)
            (waiting,) = server._connections  # holds a hello-sized buffer only
            assert len(waiting._staging) == 4 + len(link.HELLO) + link.TOKEN_BYTES
            writer.write(struct.pack(">I", 1 << 30))
            assert await asyncio.wait_for(reader.read(16), 5) == b""  # closed at once
            writer.close()
        finally:
            await server.close()


# ---- on a worker node: the Session over a link --------------------------------------------------------------
async def _computed(stream: Any, head: worker_pb2.ComputeRequest, length: int) -> dict[int, np.ndarray[Any, Any]]:
    assembler = MessageAssembler(
        job_id=head.job_id, iteration=head.iteration, worker_id=head.worker_id, rows=tuple(head.rows),
        length=length, dtypes=(np.dtype("<f8"),),
    )  # fmt: skip
    done = {}
    async for chunk in stream:
        message = assembler.feed(chunk)
        if message is not None:
            done[message.row] = message.vector
    return done


async def _load_job(channel: grpc.aio.Channel) -> dict[int, tuple[Any, Any]]:
    partitions = make_partitions(3)
    stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]

    async def chunks() -> AsyncIterator[worker_pb2.LoadJobChunk]:
        for chunk in load_chunks(job_setup(CYCLIC, 0), data_for(CYCLIC, 0, partitions)):
            yield chunk

    await stub.LoadJob(chunks())
    return partitions


async def test_a_session_over_a_link_answers_exactly_what_it_answers_over_grpc() -> None:
    async with (
        asyncio.timeout(TIMEOUT),
        WorkerNode(grace=0.2) as node,
        Security().channel(node.address, options=CHANNEL_OPTIONS) as channel,
    ):
        partitions = await _load_job(channel)
        linked = Session(await open_link(channel, node.address, Security(), 5.0))
        over_grpc = Session.on(channel)
        try:
            for iteration in range(1, 4):
                params = random_params(seed=iteration)
                head = _head("job", 0, tuple(CYCLIC.static_assignment().rows[0]), iteration)
                body = model_request_bytes(params)
                length = expected_message(CYCLIC, 0, params, partitions).size
                via_link = await _computed(linked.compute(head, body), head, length)
                via_grpc = await _computed(over_grpc.compute(head, body), head, length)
                assert via_link.keys() == via_grpc.keys() == {0}
                assert np.array_equal(via_link[0], via_grpc[0])
                np.testing.assert_allclose(via_link[0], expected_message(CYCLIC, 0, params, partitions), rtol=1e-12)
        finally:
            linked.close()
            over_grpc.close()


@contextlib.asynccontextmanager
async def _linear_job_on_a_worker(p: int) -> AsyncIterator[tuple[str, grpc.aio.Channel, Session]]:
    """A worker process's node holding a linear job of ``p`` parameters: the job's id, a channel to the node and a
    Session over a link to it (linear regression: its messages are as long as the model)."""
    async with (
        WorkerNode(grace=0.2) as node,
        Security().channel(node.address, options=CHANNEL_OPTIONS) as channel,
    ):
        job_id, chunks = _linear_job(p)
        await worker_pb2_grpc.WorkerStub(channel).LoadJob(chunks)  # type: ignore[no-untyped-call]
        yield job_id, channel, Session(await open_link(channel, node.address, Security(), 5.0))


async def test_large_payloads_are_received_straight_into_the_message_exactly() -> None:
    """Chunks larger than the staging buffer land in the message's own buffer (no copy on the master), and the
    message equals the same Compute's over the gRPC Session, bit for bit, and the gradient at the model sent."""
    p = 300_001  # a 2.4 MB message: chunks of 1 MiB and more
    async with asyncio.timeout(TIMEOUT), _linear_job_on_a_worker(p) as (job_id, channel, linked):
        grpc_session = Session.on(channel)
        try:
            for iteration in (1, 2, 3):
                params = np.random.default_rng(iteration).standard_normal(p)
                got = {}
                for session, placing in ((linked, True), (grpc_session, False)):
                    head = worker_pb2.ComputeRequest(job_id=job_id, iteration=iteration, worker_id=0, rows=[0])
                    assembler = MessageAssembler(job_id=job_id, iteration=iteration, worker_id=0, rows=(0,), length=p)
                    placed: list[bool] = []

                    def place(
                        meta: worker_pb2.GradientChunk, nbytes: int, asm: Any = assembler, seen: list[bool] = placed
                    ) -> memoryview | None:
                        target: memoryview | None = asm.place(meta, nbytes)
                        seen.append(target is not None)
                        return target

                    compute = session.compute(head, model_request_bytes(params))
                    compute.place = place
                    done = [m for m in [assembler.feed(c) async for c in compute] if m is not None]
                    assert len(done) == 1 and np.all(np.isfinite(done[0].vector))
                    got[placing] = done[0].vector
                    assert (len(placed) >= 2 and all(placed)) if placing else placed == []
                assert np.array_equal(got[True], got[False])
                X = np.random.default_rng(p).standard_normal((1, p - 1))  # _linear_job's one sample, label 1
                want = make_model("linear", num_features=p - 1).gradient(params, X, np.ones(1))
                np.testing.assert_allclose(got[True], want, rtol=1e-12)  # the model arrived whole on both ways
        finally:
            linked.close()
            grpc_session.close()


async def test_a_caller_moves_to_the_link_and_keeps_grpc_for_a_worker_without_one() -> None:
    async with asyncio.timeout(TIMEOUT):
        for link_port, expected in ((0, True), (None, False)):
            async with (
                WorkerNode(grace=0.2, link_port=link_port) as node,
                Security().channel(node.address, options=CHANNEL_OPTIONS) as channel,
            ):
                partitions = await _load_job(channel)
                caller = Caller(channel, "w", lambda: open_link(channel, node.address, Security(), 5.0))
                try:
                    for iteration in range(1, 30):
                        params = random_params(seed=iteration)
                        head = _head("job", 0, tuple(CYCLIC.static_assignment().rows[0]), iteration)
                        length = expected_message(CYCLIC, 0, params, partitions).size
                        got = await _computed(caller.compute(head, model_request_bytes(params)), head, length)
                        np.testing.assert_allclose(got[0], expected_message(CYCLIC, 0, params, partitions), rtol=1e-12)
                        if caller.serves_links is not None:
                            break
                        await asyncio.sleep(0.05)  # the link opens in the background
                    assert caller.serves_links is expected
                    assert (caller._linked is not None) is expected
                finally:
                    caller.close()


async def test_a_killed_link_fails_its_requests_unavailable() -> None:
    async with (
        asyncio.timeout(TIMEOUT),
        WorkerNode(grace=0.2) as node,
        Security().channel(node.address, options=CHANNEL_OPTIONS) as channel,
    ):
        stream = await open_link(channel, node.address, Security(), 5.0)
        session = Session(stream)
        assert node.servicer.link is not None
        await node.servicer.link.close()  # the worker's end goes away
        compute = session.compute(worker_pb2.ComputeRequest(job_id="job", iteration=1, rows=[0]))
        with pytest.raises(Exception) as info:
            async for _ in compute:
                pass
        assert getattr(info.value, "code", None) is grpc.StatusCode.UNAVAILABLE, info.value
        assert session.broken


# ---- TLS ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_certificates(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "localhost"])


async def test_a_link_uses_the_servers_mutual_tls_and_a_plaintext_caller_gets_none(certs: CertificateSet) -> None:
    node_tls = Security(cert=certs.node, key=certs.node_key, ca=certs.ca, mutual=True)
    client_tls = Security(cert=certs.client, key=certs.client_key, ca=certs.ca, mutual=True)
    async with (
        asyncio.timeout(TIMEOUT),
        WorkerNode(grace=0.2, security=node_tls) as node,
        client_tls.channel(node.address, options=CHANNEL_OPTIONS) as channel,
    ):
        stream = await open_link(channel, node.address, client_tls, 5.0)
        ssl_object = stream.protocol.transport.get_extra_info("ssl_object") if stream.protocol.transport else None
        assert ssl_object is not None and ssl_object.getpeercert()  # the worker's certificate, verified
        stream.cancel()
        # a caller whose own configuration has no TLS never sends over a TLS link's port in plaintext
        with pytest.raises(LinkRefusedError, match="offers a TLS link, but this process has no TLS"):
            await open_link(channel, node.address, Security(), 5.0)
        # TLS without the client certificate the worker requires: the handshake fails
        no_client_cert = Security(ca=certs.ca)
        with pytest.raises((OSError, LinkClosedError)):
            await open_link(channel, node.address, no_client_cert, 5.0)


def test_the_worker_command_line_takes_a_link_port_or_off(tmp_path: Path) -> None:
    from gradcode.worker.__main__ import parse_arguments

    assert parse_arguments(["--link-port", "off"]).link_port is None
    assert parse_arguments(["--link-port", "5000"]).link_port == 5000
    assert parse_arguments([]).link_port == 0
    with pytest.raises(SystemExit):
        parse_arguments(["--link-port", "70000"])


async def test_a_received_message_is_not_kept_alive_by_the_link_once_its_reader_lets_go() -> None:
    """A message received straight into its buffer over a link is the round's to free: neither the session's
    reader nor the link's frame iterator may hold its last chunk (a view of that buffer) while they wait for the
    next one. Held, every session pinned its last message until the next iteration's first chunk: the master kept
    two iterations of messages alive (n = 100 workers, p = 1e7: 8 GB more)."""
    p = 300_001
    async with asyncio.timeout(TIMEOUT), _linear_job_on_a_worker(p) as (job_id, _, session):
        try:
            head = worker_pb2.ComputeRequest(job_id=job_id, iteration=1, worker_id=0, rows=[0])
            assembler = MessageAssembler(job_id=job_id, iteration=1, worker_id=0, rows=(0,), length=p)
            compute = session.compute(head, model_request_bytes(np.random.default_rng(1).standard_normal(p)))
            compute.place = assembler.place
            done = [m for m in [assembler.feed(c) async for c in compute] if m is not None]
            assert len(done) == 1
            vector = weakref.ref(done[0].vector)
            del done, compute, assembler
            await asyncio.sleep(0.1)  # the reader and the link wait for the next frame, which does not come
            assert vector() is None
        finally:
            session.close()
