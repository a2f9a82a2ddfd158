"""A LoadJob's deadline follows its progress, not its size (:func:`gradcode.master.loading.stream_while_moving`).

Found on the emulated cluster: fractional s = 11 at n = 24, p = 1e6 ships 192 MB to each of 24 workers through a
200 Mbit/s master link, three minutes with every stream moving; the fixed 120 s deadline marked every worker DOWN.
These run a real gRPC server whose handler reads a client stream at a pace the test sets. HTTP/2's window is held
at its 64 KiB default (no BDP probing), so a chunk of 256 KiB goes out only as the server reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from gradcode.master.loading import stream_while_moving

CHUNK = b"x" * (256 << 10)
SMALL_WINDOWS = [("grpc.http2.bdp_probe", 0)]
STALL = 0.6


class Reader:
    """A stream-unary handler: reads ``before_hang`` chunks (None: all) ``pause`` seconds apart, then answers how
    many it read, or (``answer=False``, or past ``before_hang``) waits until the call is cancelled."""

    def __init__(self, pause: float, before_hang: int | None = None, *, answer: bool = True) -> None:
        self.pause, self.before_hang, self.answer = pause, before_hang, answer
        self.read = 0
        self.cancelled = asyncio.Event()

    async def handle(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            async for _ in requests:
                self.read += 1
                if self.before_hang is not None and self.read >= self.before_hang:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.pause)
            if not self.answer:
                await asyncio.Event().wait()
            return str(self.read).encode()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@asynccontextmanager
async def serving(reader: Reader) -> Any:
    """A server running ``reader`` as /t.Load/Load on loopback, and a call of it on a channel to it."""
    load = grpc.stream_unary_rpc_method_handler(reader.handle)
    handler = grpc.method_handlers_generic_handler("t.Load", {"Load": load})
    server = grpc.aio.server(options=SMALL_WINDOWS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=SMALL_WINDOWS) as channel:
            yield channel.stream_unary("/t.Load/Load")
    finally:
        await server.stop(None)


async def chunks(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield CHUNK


def sent(count: int) -> Iterator[bytes]:
    return iter([CHUNK] * count)


async def test_a_stream_that_keeps_moving_may_take_many_times_the_stall_limit() -> None:
    reader = Reader(pause=0.15)
    async with serving(reader) as call:
        started = time.monotonic()
        answer = await stream_while_moving(call, chunks(20), STALL)
    assert answer == b"20" and reader.read == 20
    assert time.monotonic() - started > 4 * STALL  # 20 x 0.15 s: the whole call outlasted the limit


async def test_the_same_stream_under_a_deadline_for_the_whole_call_fails() -> None:
    """The rule it replaces, on the same stream: why the emulated cluster's large loads failed. The call ends at its
    deadline, DEADLINE_EXCEEDED, or INTERNAL when the deadline cuts a message being sent (gRPC core's "Failed
    execute_batch" on a SendMessageOperation: one CI run of 2026-11-29 under load)."""
    async with serving(Reader(pause=0.15)) as call:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(sent(20), timeout=4 * STALL)
        elapsed = time.monotonic() - started
    code, details = caught.value.code(), str(caught.value.details())
    cut = code == grpc.StatusCode.INTERNAL and "Internal error from Core" in details
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED or cut, caught.value
    assert elapsed >= 4 * STALL - 0.05, "it failed at the whole call's deadline, before the stream ended (3 s)"


async def test_a_reader_that_stops_mid_stream_fails_the_call_one_stall_after_its_last_progress() -> None:
    reader = Reader(pause=0.05, before_hang=10)
    async with serving(reader) as call:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await stream_while_moving(call, chunks(60), STALL)
        took = time.monotonic() - started
        await asyncio.wait_for(reader.cancelled.wait(), 5)  # the call was cancelled, so the server's handler ended
    assert reader.read == 10
    assert STALL <= took < STALL + 2.0


async def test_a_worker_that_never_answers_after_the_last_chunk_fails_the_call() -> None:
    reader = Reader(pause=0.0, answer=False)
    async with serving(reader) as call:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await stream_while_moving(call, chunks(4), STALL)
        took = time.monotonic() - started
        await asyncio.wait_for(reader.cancelled.wait(), 5)
    assert reader.read == 4 and STALL <= took < STALL + 2.0


async def test_the_callers_own_cancellation_is_not_a_stall() -> None:
    reader = Reader(pause=0.0, answer=False)
    async with serving(reader) as call:
        task = asyncio.create_task(stream_while_moving(call, chunks(4), 30.0))
        while reader.read < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(reader.cancelled.wait(), 5)
