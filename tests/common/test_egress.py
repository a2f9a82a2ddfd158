"""Large frames leave a process one at a time (:mod:`gradcode.common.transport.egress`): on real sockets, a second
peer's frame waits for the first's, a peer that stops reading holds nobody back for long, and the turns' own order."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest

from gradcode.common.transport import egress as egress_module
from gradcode.common.transport.egress import LARGE_FRAME_BYTES, STALL_SECONDS, Egress
from gradcode.common.transport.link import FrameProtocol

FRAME_BYTES = 16 << 20
TIMEOUT = 20.0


class _Receiver:
    """A TCP peer reading at a pace of its own (``chunk`` bytes every ``pause`` seconds; ``pause`` None: never),
    recording when each byte count arrived."""

    def __init__(self, chunk: int, pause: float | None) -> None:
        self.chunk, self.pause = chunk, pause
        self.received = 0
        self.done = asyncio.Event()
        self.closed = asyncio.Event()
        self.handlers: list[asyncio.Task[object] | None] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # inherited: a small window
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        self.server = await asyncio.start_server(self._serve, sock=sock)
        return int(sock.getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.append(asyncio.current_task())
        try:
            while self.pause is not None and self.received < 4 + FRAME_BYTES:
                data = await reader.read(self.chunk)
                if not data:
                    break
                self.received += len(data)
                await asyncio.sleep(self.pause)
            self.done.set()
            if self.pause is None:
                await self.closed.wait()  # holds the connection open, unread
        finally:
            writer.close()
            await writer.wait_closed()

    async def close(self) -> None:
        self.closed.set()
        if self.server is not None:
            self.server.close()
            await asyncio.gather(*(h for h in self.handlers if h is not None), return_exceptions=True)
            await self.server.wait_closed()


async def _close(senders: tuple[FrameProtocol, ...], receivers: tuple[_Receiver, ...]) -> None:
    for sender in senders:
        if sender.transport is not None:
            sender.transport.abort()  # a frame still in the process: closing would wait for it
    for receiver in receivers:
        await receiver.close()


async def _connect(port: int) -> FrameProtocol:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: FrameProtocol(1 << 26), "127.0.0.1", port)
    return protocol


@pytest.fixture
def frame() -> bytes:
    return np.random.default_rng(3).integers(0, 256, FRAME_BYTES, dtype=np.uint8).tobytes()


async def test_a_second_peers_large_frame_leaves_after_the_first_peers(frame: bytes) -> None:
    """The first receiver reads slowly (about 40 MB/s); the second as fast as it can. Sent at once, the second frame
    would arrive at once; sent in turn, it arrives only once most of the first has left the process (all but the
    kernel's buffers)."""
    slow, fast = _Receiver(256 * 1024, 0.005), _Receiver(1 << 20, 0.0)
    async with asyncio.timeout(TIMEOUT):
        first, second = await _connect(await slow.start()), await _connect(await fast.start())
        try:
            sends = asyncio.gather(first.send(frame), second.send(frame))
            await fast.done.wait()
            slow_had = slow.received
            await slow.done.wait()
            await sends
        finally:
            await _close((first, second), (slow, fast))
    assert slow.received == fast.received == 4 + FRAME_BYTES
    assert slow_had >= FRAME_BYTES // 2, (
        f"the second peer had its whole frame when the first had {slow_had} of {FRAME_BYTES} bytes"
    )


async def test_a_peer_that_stops_reading_holds_the_next_frame_back_two_stall_periods_at_most(frame: bytes) -> None:
    frozen, fast = _Receiver(0, None), _Receiver(1 << 20, 0.0)
    async with asyncio.timeout(TIMEOUT):
        first, second = await _connect(await frozen.start()), await _connect(await fast.start())
        try:
            assert first.send_now(frame)  # took the turn; stays in the process: the peer does not read
            started = time.perf_counter()
            assert not second.send_now(frame), "a large frame went out while another held the turn"
            await second.send(frame)
            await fast.done.wait()
            waited = time.perf_counter() - started
            assert first.unsent_bytes() > FRAME_BYTES // 2  # the frozen peer's frame is still here
        finally:
            await _close((first, second), (frozen, fast))
    assert fast.received == 4 + FRAME_BYTES
    assert 0.5 * STALL_SECONDS <= waited <= 2 * STALL_SECONDS + 1.0, waited


async def test_small_frames_never_wait_for_a_turn(frame: bytes) -> None:
    frozen, fast = _Receiver(0, None), _Receiver(1 << 20, 0.0)
    async with asyncio.timeout(TIMEOUT):
        first, second = await _connect(await frozen.start()), await _connect(await fast.start())
        try:
            assert first.send_now(frame)
            assert second.send_now(b"x" * (LARGE_FRAME_BYTES - 5))  # with its 4-byte length, just under large
        finally:
            await _close((first, second), (frozen, fast))


class _Sender:
    def __init__(self, unsent: int = 0) -> None:
        self.unsent = unsent

    def unsent_bytes(self) -> int:
        return self.unsent


_Waits = tuple[asyncio.Task[None], asyncio.Task[None]]


async def _a_holding_b_and_c_waiting() -> tuple[Egress, tuple[_Sender, _Sender, _Sender], _Waits]:
    """Turns held by ``a``, with ``b`` then ``c`` waiting (their tasks started)."""
    turns = Egress()
    a, b, c = _Sender(), _Sender(), _Sender()
    assert turns.try_take(a)
    waits = asyncio.create_task(turns.take(b)), asyncio.create_task(turns.take(c))
    await asyncio.sleep(0)
    return turns, (a, b, c), waits


async def test_turns_are_granted_in_the_order_asked_and_a_cancelled_wait_passes_its_turn_on() -> None:
    turns = Egress()
    a, b, c, d = _Sender(), _Sender(), _Sender(), _Sender()
    assert turns.try_take(a)
    assert not turns.try_take(b)
    order: list[_Sender] = []

    async def wait(sender: _Sender) -> None:
        await turns.take(sender)
        order.append(sender)

    waits = {s: asyncio.create_task(wait(s)) for s in (b, c, d)}
    await asyncio.sleep(0)
    assert not turns.try_take(_Sender()), "a newcomer went before those waiting"
    waits[c].cancel()  # cancelled while waiting: leaves the queue
    turns.release(b)  # not the holder: nothing happens
    assert turns.holder is a
    turns.release(a)
    await asyncio.sleep(0)
    assert order == [b] and turns.holder is b
    turns.release(b)
    await asyncio.sleep(0)
    assert order == [b, d] and turns.holder is d
    turns.release(d)
    assert turns.holder is None and turns.try_take(a)
    turns.release(a)


async def test_a_wait_cancelled_after_its_turn_was_granted_passes_it_to_the_next() -> None:
    turns, (a, _, c), (waiting_b, waiting_c) = await _a_holding_b_and_c_waiting()
    turns.release(a)  # b's turn is granted, but b is cancelled before it runs
    waiting_b.cancel()
    await asyncio.gather(waiting_b, return_exceptions=True)
    await asyncio.wait_for(waiting_c, 1.0)
    assert turns.holder is c


async def test_a_turn_that_keeps_draining_is_kept_and_one_that_stops_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(egress_module, "STALL_SECONDS", 0.02)
    turns = Egress()
    draining = _Sender(10_000)
    assert turns.try_take(draining)
    for _ in range(20):  # drains between every two checks
        await asyncio.sleep(0.005)
        draining.unsent -= 100
    assert turns.holder is draining
    await asyncio.sleep(0.1)  # no progress for several periods
    assert turns.holder is None


async def test_a_wait_cancelled_while_a_release_passes_over_it_leaves_the_turns_consistent() -> None:
    """The cancelled waiter's future is dropped by the release before the waiter's task handles its cancel."""
    turns, (a, _, c), (waiting_b, waiting_c) = await _a_holding_b_and_c_waiting()
    waiting_b.cancel()
    turns.release(a)  # runs before b's task sees its cancel: skips b's cancelled wait, grants c
    results = await asyncio.gather(waiting_b, waiting_c, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError) and results[1] is None
    assert turns.holder is c
    turns.release(c)
    assert turns.holder is None and turns.try_take(a)
