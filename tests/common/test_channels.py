"""gradcode's channels reach a peer soon after it comes back, however long it was down."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gradcode.common.transport.security import Security
from gradcode.common.transport.wire import CHANNEL_OPTIONS, RECONNECT_BACKOFF_MS

DOWN_SECONDS = 20.0


@pytest.mark.slow
async def test_a_peer_back_after_a_long_outage_is_reached_within_the_longest_backoff() -> None:
    """A channel as the master and tree parents open them, failing to reach a dead peer for 20 s, reaches it
    within about a second of its restart. With gRPC's own backoff (up to 120 s) it took 7 s and more: a tree
    parent could not reach a restarted child before its deadline."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with (
        asyncio.timeout(DOWN_SECONDS + 30),
        Security().channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as ch,
    ):
        stub = health_pb2_grpc.HealthStub(ch)  # type: ignore[no-untyped-call]
        down_until = time.monotonic() + DOWN_SECONDS
        while time.monotonic() < down_until:
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.2)
            await asyncio.sleep(0.1)
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        try:
            back = time.monotonic()
            while True:
                try:
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)
            assert time.monotonic() - back < 2 * RECONNECT_BACKOFF_MS[1] / 1000 + 0.5
        finally:
            await server.stop(None)
