"""A worker's Session over a plain TCP connection: the same messages, without gRPC on the data path.

Through gRPC, every message a worker sends or receives passes its HTTP/2 framing and flow control and two of
its threads before the event loop sees it, and the master's ingest of a streamed gradient reaches about half
of what loopback TCP moves (``bench.transport``). A *link* carries exactly what ``Worker.Session`` carries --
ComputeRequest from the caller, GradientChunk back -- each message as one frame (its length as 4 bytes
big-endian, then the message), so :class:`~gradcode.common.transport.session.Session` and
:func:`~gradcode.common.transport.session.serve_session` run on it unchanged. A large frame is received straight into
a buffer of its own (:class:`FrameProtocol`): the kernel's copy is the only one before parsing. A large
GradientChunk's payload goes further, straight into the message it belongs to: once its fields have arrived,
the Session asks the request's consumer where (:meth:`LinkStream.place_with`,
:meth:`~gradcode.common.transport.wire.MessageAssembler.place`), so the master never copies it.

Trust: the caller asks for a link with ``Worker.OpenLink`` on its gRPC channel, which the worker's
interceptor has already authenticated like a Compute, and gets a port and a one-time token (32 random
bytes, good for one connection within :data:`TOKEN_SECONDS`). The link's first frame is :data:`HELLO` plus
that token; until the worker has checked it, it accepts no frame longer than the hello. So a link is open to
exactly who may call Compute. It uses TLS whenever the worker's gRPC server does, with the same
certificates (mutual TLS included), and a caller configured for TLS never opens a plaintext link.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import hmac
import logging
import secrets
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from gradcode.common.exceptions import GradcodeError
from gradcode.common.ops import metrics
from gradcode.common.transport.egress import LARGE_FRAME_BYTES, egress
from gradcode.common.transport.security import CALL_SCOPE, Security
from gradcode.common.transport.serving import parse_address
from gradcode.common.transport.session import CallError, SessionProtocolError, status_chunk
from gradcode.common.transport.wire import (
    MAX_MESSAGE_BYTES,
    Placer,
    ReceivedChunk,
    Serialized,
    chunk_head,
    parse_chunk,
    serialized_size,
)
from gradcode.v1 import worker_pb2, worker_pb2_grpc

__all__ = [
    "HELLO",
    "OPEN_TIMEOUT_SECONDS",
    "LinkClosedError",
    "LinkRefusedError",
    "LinkServer",
    "LinkStream",
    "link_opener",
    "open_link",
]

log = logging.getLogger(__name__)

HELLO = b"gradcode-link/1 "
"""The first frame a caller sends starts with this, followed by its token."""
ACCEPTED = b"ok"
TOKEN_BYTES = 32
TOKEN_SECONDS = 60.0
"""How long an offered token stays good (it is used once, at once, by a caller that asked for it)."""
MAX_PENDING_TOKENS = 256
HANDSHAKE_SECONDS = 10.0
OPEN_TIMEOUT_SECONDS = 5.0
"""Opening a link (OpenLink, connect, hello) takes at most this long; the gRPC Session serves meanwhile."""
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES + (1 << 20)
"""Largest frame after the handshake: the largest message gRPC would take, and room for its fields."""
_LENGTH = struct.Struct(">I")
_STAGING_BYTES = 256 * 1024
"""Frames up to this size are received into one reused buffer; larger ones into a buffer of their own."""
_PLACE_HEAD_BYTES = 1024
"""With a placer, a large frame's first bytes are staged up to this many before it is placed: its fields."""
_SMALL_PIECE_BYTES = 64 * 1024
"""Pieces of a frame up to this size are joined before they are written (one write); larger ones are written as
they are, uncopied."""
_QUEUE_HIGH, _QUEUE_LOW = 64, 16
"""Received frames held before the socket stops being read, and when it is read again."""
_KEEPALIVE = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    *(
        (socket.IPPROTO_TCP, getattr(socket, name), value)
        for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
        if hasattr(socket, name)
    ),
)
"""A peer whose host vanished without closing is noticed within about 25 s, as gRPC's keepalive would."""


class LinkClosedError(GradcodeError, ConnectionError):
    """The link's connection ended (the peer closed it, it broke, or a frame broke the protocol)."""


class LinkRefusedError(GradcodeError, ConnectionError):
    """The worker refused the link's hello (a token it did not offer, used or expired)."""


@dataclasses.dataclass(frozen=True)
class PlacedFrame:
    """A large frame whose tail was received where its placer said: ``head`` is what the placer made of its
    first bytes, ``payload`` the buffer it gave (now filled)."""

    head: Any
    payload: memoryview
    size: int = 0
    """The whole frame's length (its first bytes and the payload)."""


FramePlacer = Callable[[memoryview, int], "tuple[Any, int, memoryview] | None"]
"""Given the first bytes of a large frame and its length: what they say (``head``), where the frame's tail starts
in it, and the buffer to receive that tail into (exactly its size); None to receive the frame as usual."""


class FrameProtocol(asyncio.BufferedProtocol):
    """Length-prefixed frames in and out of one connection, with flow control both ways.

    ``max_frame`` bounds what the peer may announce (a longer frame closes the connection); :meth:`allow`
    raises it once the peer is trusted. Until then the connection holds a buffer of that size only.
    """

    def __init__(self, max_frame: int, on_connected: Callable[[FrameProtocol], None] | None = None) -> None:
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.error: LinkClosedError | None = None
        """Why the connection ended (None while it is open)."""
        self._on_connected = on_connected
        self._staging = bytearray(min(_STAGING_BYTES, _LENGTH.size + max_frame))
        self._start = self._end = 0
        self._big: memoryview | None = None
        self._big_head: Any = None
        """The placer's head of the frame being received into :attr:`_big` (None: not placed)."""
        self._big_size = 0
        """The length of the frame being received into :attr:`_big`."""
        self._big_filled = 0
        self.placer: FramePlacer | None = None
        """Decides where the tail of each large frame is received (:class:`PlacedFrame`); None: all frames whole."""
        self._frames: collections.deque[bytes | memoryview | PlacedFrame] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._reading_paused = False

    def allow(self, max_frame: int) -> None:
        """Accept frames up to ``max_frame`` bytes from now on (the peer is trusted)."""
        self.max_frame = max_frame
        if len(self._staging) < _STAGING_BYTES:
            unread = self._staging[self._start : self._end]
            self._staging = bytearray(_STAGING_BYTES)
            self._staging[: len(unread)] = unread
            self._start, self._end = 0, len(unread)

    # ---- asyncio's side ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for level, option, value in _KEEPALIVE:
                sock.setsockopt(level, option, value)
        if self._on_connected is not None:
            self._on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return self._big[self._big_filled :]
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._staging) - self._end < 65536 and self._start > 0:  # move the unread part to the front
            unread = self._end - self._start
            self._staging[:unread] = self._staging[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._staging)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled == len(self._big):
                frame, head, self._big, self._big_head = self._big, self._big_head, None, None
                self._deliver(frame if head is None else PlacedFrame(head, frame, self._big_size))
            return
        self._end += nbytes
        self._split()

    def _split(self) -> None:
        """Deliver every whole frame in the staging buffer; start a frame too large for it in its own buffer."""
        staging = self._staging
        while self._end - self._start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(staging, self._start)
            if length > self.max_frame:
                self._fail(f"the peer announced a frame of {length} bytes; at most {self.max_frame} are allowed")
                return
            begin = self._start + _LENGTH.size
            if self._end - begin >= length:
                self._deliver(bytes(memoryview(staging)[begin : begin + length]))
                self._start = begin + length
                continue
            if _LENGTH.size + length > len(staging):
                have = self._end - begin
                if self.placer is not None and have < _PLACE_HEAD_BYTES:
                    return  # its fields are still on the way
                staged = memoryview(staging)[begin : self._end]
                placed = None if self.placer is None else self.placer(staged, length)
                if placed is None:  # a buffer of its own, not zeroed: every byte is received into it
                    placed = None, 0, np.empty(length, dtype=np.uint8).data
                self._big_head, offset, self._big = placed
                self._big_size = length
                self._big[: have - offset] = staged[offset:]
                self._big_filled = have - offset
                self._start = self._end = 0
            return

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        egress().release(self)  # the large frame (if any) has left the process
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def eof_received(self) -> bool | None:
        return None  # close the transport: a link is never half open

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = LinkClosedError("the peer closed the link" if exc is None else f"the link broke: {exc}")
        for waiter in (self._arrived, self._writable):
            if waiter is not None and not waiter.done():
                waiter.set_exception(self.error)
                waiter.exception()  # retrieved here: the waiting coroutine (if any) sees it too
        self._arrived = self._writable = None
        egress().release(self)

    # ---- the user's side -----------------------------------------------------------------------------
    def _deliver(self, frame: bytes | memoryview | PlacedFrame) -> None:
        self._frames.append(frame)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)
        if len(self._frames) >= _QUEUE_HIGH and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _fail(self, reason: str) -> None:
        log.warning("Closing a link: %s", reason)
        self.error = LinkClosedError(reason)
        if self.transport is not None:
            self.transport.abort()

    async def receive(self) -> bytes | memoryview | PlacedFrame:
        """The next frame; :class:`LinkClosedError` once the connection has ended and every frame was received."""
        while not self._frames:
            if self.error is not None:
                raise self.error
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        frame = self._frames.popleft()
        if self._reading_paused and len(self._frames) <= _QUEUE_LOW and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return frame

    async def receive_whole(self) -> bytes | memoryview:
        """:meth:`receive` on a connection without a placer, whose frames all arrive whole."""
        frame = await self.receive()
        assert not isinstance(frame, PlacedFrame), "receive_whole() on a connection with a placer"
        return frame

    async def send(self, data: Serialized) -> None:
        """Send one frame, whole or in pieces (never joined: a large piece is written as it is); waits while the
        connection's send buffer is full; :class:`LinkClosedError` once it ended."""
        if self.error is not None or self.transport is None:
            raise self.error or LinkClosedError("the link is not connected")
        size = serialized_size(data)
        if size >= LARGE_FRAME_BYTES:
            await egress().take(self)  # (:mod:`~gradcode.common.transport.egress`)
            if self.error is not None or self.transport is None:
                egress().release(self)
                raise self.error or LinkClosedError("the link is not connected")
        self._write_frame(data, size)
        while self._writable is not None:
            await asyncio.shield(self._writable)

    def send_now(self, data: Serialized) -> bool:
        """Send one frame at once if the link takes it without waiting (open, its send buffer not full, and for a
        large frame the process's turn free); False otherwise, having sent nothing (the caller then sends it with
        :meth:`send`, in turn)."""
        if self.error is not None or self.transport is None or self._writable is not None:
            return False
        size = serialized_size(data)
        if size >= LARGE_FRAME_BYTES and not egress().try_take(self):
            return False
        self._write_frame(data, size)
        return True

    def unsent_bytes(self) -> int:
        """What this connection has yet to hand to the kernel (:class:`~gradcode.common.transport.egress.Sender`)."""
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def _write_frame(self, data: Serialized, size: int) -> None:
        """Write one frame of ``size`` bytes; a large one holds the process's turn (taken by the caller) until it
        drained, which is at once if the kernel took it all."""
        assert self.transport is not None
        pieces = (data,) if isinstance(data, bytes) else data
        small: list[bytes | memoryview] = [_LENGTH.pack(size)]
        for piece in pieces:
            if len(piece) <= _SMALL_PIECE_BYTES:
                small.append(piece)
                continue
            self.transport.write(b"".join(small))
            self.transport.write(memoryview(piece))  # asyncio slices off what the socket took: a copy of bytes
            small = []
        if small:
            self.transport.write(b"".join(small))
        if size >= LARGE_FRAME_BYTES and self._writable is None:
            egress().release(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class LinkStream:
    """The caller's end of a link, shaped like a ``Worker.Session`` call: ``write`` requests, iterate the chunks,
    ``cancel`` to close (what :class:`~gradcode.common.transport.session.Session` runs on)."""

    framing_bytes = _LENGTH.size
    """Bytes the link adds to each message it carries (its length)."""

    def __init__(self, protocol: FrameProtocol, peer: str) -> None:
        self.protocol = protocol
        self.peer = peer

    def place_with(self, place: Placer) -> None:
        """Receive each large chunk's payload where ``place`` says (its Session asks the request's consumer),
        straight from the socket: the receiver's copy into the message is saved."""

        def placer(head: memoryview, size: int) -> tuple[Any, int, memoryview] | None:
            parsed = chunk_head(head, size)
            if parsed is None:
                return None
            meta, offset = parsed
            target = place(meta, size - offset)
            return None if target is None else (meta, offset, target)

        self.protocol.placer = placer

    def _unavailable(self, closed: LinkClosedError) -> CallError:
        """How a closed link ends a request: UNAVAILABLE, as a Session call to a gone worker does."""
        return CallError(grpc.StatusCode.UNAVAILABLE, f"The link to {self.peer} closed: {closed}")

    async def write(self, data: Serialized) -> None:
        try:
            await self.protocol.send(data)
        except LinkClosedError as exc:
            raise self._unavailable(exc) from None

    def write_now(self, data: Serialized) -> bool:
        """:meth:`write` without waiting, if the link takes ``data`` at once; False (nothing sent) otherwise."""
        return self.protocol.send_now(data)

    def __aiter__(self) -> AsyncIterator[ReceivedChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[ReceivedChunk]:
        while True:
            try:
                frame = await self.protocol.receive()
            except LinkClosedError as exc:
                raise self._unavailable(exc) from None
            if isinstance(frame, PlacedFrame):
                chunk = ReceivedChunk(meta=frame.head, data=frame.payload, placed=True, nbytes=frame.size)
            else:
                chunk = parse_chunk(frame)
            del frame  # neither is held while the next frame is awaited: a placed chunk is a view of its message
            yield chunk
            del chunk

    def cancel(self) -> bool:
        self.protocol.close()
        return True


async def open_link(channel: grpc.aio.Channel, address: str, security: Security, timeout: float) -> LinkStream:
    """Ask the worker at ``address`` (on ``channel``, its gRPC channel) for a link and open it.

    Raises ``grpc.aio.AioRpcError`` from OpenLink (FAILED_PRECONDITION: the worker serves no link;
    UNIMPLEMENTED: an older worker), ``OSError`` when the offered port cannot be reached,
    :class:`LinkRefusedError` when the worker refuses the hello, ``TimeoutError`` after ``timeout`` seconds.
    """
    stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
    offer: worker_pb2.LinkOffer = await stub.OpenLink(worker_pb2.OpenLinkRequest(), timeout=timeout)
    host, _ = parse_address(address, what="worker address")
    context = security.client_ssl_context()
    if (context is not None) != offer.tls:
        raise LinkRefusedError(
            f"The worker at {address} offers a {'TLS' if offer.tls else 'plaintext'} link, but this process "
            f"{'uses' if context is not None else 'has no'} TLS; the worker's gRPC Session is used instead."
        )
    loop = asyncio.get_running_loop()
    server_hostname = (security.server_name or host) if context is not None else None
    connecting = loop.create_connection(
        lambda: FrameProtocol(MAX_FRAME_BYTES), host, offer.port, ssl=context, server_hostname=server_hostname
    )
    _, protocol = await asyncio.wait_for(connecting, timeout)
    try:
        await protocol.send(HELLO + offer.token)
        reply = await asyncio.wait_for(protocol.receive_whole(), timeout)
    except BaseException:
        protocol.close()
        raise
    if reply != ACCEPTED:
        protocol.close()
        reason = bytes(reply[:200]).decode(errors="replace")
        raise LinkRefusedError(f"The worker at {address} refused the link: {reason}")
    return LinkStream(protocol, f"{host}:{offer.port}")


def link_opener(channel: grpc.aio.Channel, address: str, security: Security) -> Callable[[], Awaitable[LinkStream]]:
    """What a :class:`~gradcode.common.transport.session.Caller` calls to open a link to the worker at ``address``."""
    return functools.partial(open_link, channel, address, security, OPEN_TIMEOUT_SECONDS)


Serve = Callable[
    [AsyncIterator[worker_pb2.ComputeRequest], Callable[[Serialized], Awaitable[None]], Callable[[Serialized], bool]],
    Awaitable[None],
]
"""What runs on an accepted link: the requests it reads, the function that sends a frame, and the one that sends it
at once if the link takes it without waiting (``serve_session``)."""


class LinkServer:
    """A worker's link listener: offers one-time tokens (:meth:`offer`) and runs ``serve`` on each accepted link."""

    def __init__(self, serve: Serve, security: Security) -> None:
        self.serve = serve
        self.ssl_context = security.server_ssl_context()
        self.port = 0
        self._tokens: dict[bytes, tuple[float, str | None]] = {}
        """Offered tokens: their expiry, and the one job their link may compute (None: any)."""
        self._server: asyncio.Server | None = None
        self._connections: dict[FrameProtocol, asyncio.Task[None]] = {}

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: a free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrameProtocol(len(HELLO) + TOKEN_BYTES, self._accepted), host, port, ssl=self.ssl_context
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def offer(self, scope: str | None = None) -> worker_pb2.LinkOffer:
        """A new one-time token for one caller (who reached us through the authenticated gRPC server); its link
        computes only job ``scope`` when one is given (:data:`~gradcode.common.transport.security.CALL_SCOPE`)."""
        if self._server is None:
            raise RuntimeError("LinkServer.offer() before start()")
        now = time.monotonic()
        self._tokens = {t: offered for t, offered in self._tokens.items() if offered[0] > now}
        while len(self._tokens) >= MAX_PENDING_TOKENS:
            del self._tokens[next(iter(self._tokens))]  # the oldest
        token = secrets.token_bytes(TOKEN_BYTES)
        self._tokens[token] = (now + TOKEN_SECONDS, scope)
        return worker_pb2.LinkOffer(port=self.port, token=token, tls=self.ssl_context is not None)

    def _accepted(self, protocol: FrameProtocol) -> None:
        task = asyncio.get_running_loop().create_task(self._run(protocol), name="link")
        self._connections[protocol] = task
        task.add_done_callback(lambda _: self._connections.pop(protocol, None))

    def _check(self, hello: bytes | memoryview) -> tuple[str | None, str | None]:
        """(None, its scope) when ``hello`` carries a token offered, unused and unexpired (it is used up); else
        (why not, None)."""
        if bytes(hello[: len(HELLO)]) != HELLO:
            return "not a gradcode link hello", None
        presented = bytes(hello[len(HELLO) :])
        now = time.monotonic()
        for token, (expiry, scope) in list(self._tokens.items()):
            if hmac.compare_digest(token, presented):
                del self._tokens[token]
                return (None, scope) if expiry > now else ("the token expired; ask Worker.OpenLink for a new one", None)
        return "a token this worker did not offer, or already used", None

    async def _run(self, protocol: FrameProtocol) -> None:
        try:
            hello = await asyncio.wait_for(protocol.receive_whole(), HANDSHAKE_SECONDS)
            refused, scope = self._check(hello)
            if refused is not None:
                log.warning("Refused a link from %s: %s", _peer(protocol), refused)
                await protocol.send(b"refused: " + refused.encode())
                return
            protocol.allow(MAX_FRAME_BYTES)
            await protocol.send(ACCEPTED)
            metrics.LINKS_OPENED.inc()
            CALL_SCOPE.set(scope)  # this link's task, and the computations it starts
            try:
                await self.serve(_requests(protocol), protocol.send, protocol.send_now)
            except SessionProtocolError as exc:  # told in band, as the status of request 0 (the stream's own)
                log.warning("Closing the link from %s: %s", _peer(protocol), exc)
                await protocol.send(status_chunk(0, grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
        except (LinkClosedError, TimeoutError):
            pass
        finally:
            protocol.close()

    async def close(self) -> None:
        """Stop listening and close every link (what runs on them is cancelled)."""
        if self._server is not None:
            self._server.close()
        for protocol, task in list(self._connections.items()):
            task.cancel()
            if protocol.transport is not None:
                protocol.transport.abort()
        await asyncio.gather(*self._connections.values(), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


async def _requests(protocol: FrameProtocol) -> AsyncIterator[worker_pb2.ComputeRequest]:
    """The ComputeRequests a caller sends on a link, until it closes; a frame that is not one raises DecodeError
    (the Session ends with INVALID_ARGUMENT, then the link closes)."""
    while True:
        try:
            frame = await protocol.receive_whole()
        except LinkClosedError:
            return
        yield worker_pb2.ComputeRequest.FromString(frame)  # type: ignore[arg-type]  # upb parses any buffer


def _peer(protocol: FrameProtocol) -> Any:
    return None if protocol.transport is None else protocol.transport.get_extra_info("peername")
