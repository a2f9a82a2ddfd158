"""Online gather-and-decode: the one loop the master and every tree parent run each iteration.

Opens one streaming call per source (a worker or child), reassembles and validates the messages as
they arrive, feeds each to the scheme's online decoder, and stops at the first decodable moment:
every call still running is cancelled (the cancellation reaches the worker, which abandons its stale
computation), so no late message can leak into a later iteration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gradcode.common.codes.base import Decoding, OnlineDecoder
from gradcode.common.wire import CompletedMessage, MessageAssembler, WireError
from gradcode.v1 import worker_pb2

__all__ = ["ChunkStream", "GatherResult", "Source", "gather"]


class ChunkStream(Protocol):
    """A server-streaming call yielding GradientChunks (``grpc.aio.UnaryStreamCall`` fits)."""

    def __aiter__(self) -> AsyncIterator[worker_pb2.GradientChunk]: ...

    def cancel(self) -> bool: ...


@dataclass(frozen=True)
class Source:
    """One worker to ask: its id, the rows it computes this iteration, and how to open its stream."""

    worker_id: int
    rows: tuple[int, ...]
    open: Callable[[], ChunkStream]


@dataclass
class GatherResult:
    """What one gather produced. ``decoding`` is None when the received set is not decodable."""

    decoding: Decoding | None
    messages: dict[int, CompletedMessage]
    failed: dict[int, str] = field(default_factory=dict)
    """Workers whose stream errored, with the reason."""
    finished: dict[int, float] = field(default_factory=dict)
    """Workers that delivered every requested row, with seconds from the start of the gather."""
    late: list[int] = field(default_factory=list)
    """Workers still running when the gather ended (cancelled)."""
    decode_seconds: float = 0.0
    timed_out: bool = False

    @property
    def exact(self) -> bool:
        """True when the decoding is exact and no message it uses was itself decoded approximately."""
        if self.decoding is None or not self.decoding.exact:
            return False
        return not any(self.messages[r].approximate for r in self.decoding.rows)

    @property
    def used_workers(self) -> list[int]:
        """Workers whose messages the decoding uses."""
        if self.decoding is None:
            return []
        return sorted({self.messages[r].worker_id for r in self.decoding.rows})

    def combine(self) -> np.ndarray[Any, Any]:
        if self.decoding is None:
            raise ValueError("Nothing to combine: the gather did not reach a decodable set.")
        started = time.perf_counter()
        out = self.decoding.combine({r: m.vector for r, m in self.messages.items()})
        self.decode_seconds += time.perf_counter() - started
        return out


async def gather(
    decoder: OnlineDecoder,
    sources: list[Source],
    *,
    job_id: str,
    iteration: int,
    length: int,
    dtypes: tuple[np.dtype[Any], ...] = (np.dtype("<f8"),),
    timeout: float | None = None,
    received: dict[int, CompletedMessage] | None = None,
) -> GatherResult:
    """Ask every source concurrently; return as soon as ``decoder`` can decode, or when no source is left.

    ``received`` carries messages from an earlier gather of the same iteration (already fed to
    ``decoder``), so a caller can retry the missing workers without losing what arrived.
    ``timeout`` bounds the whole gather; on expiry the result has ``timed_out`` set.
    """
    messages: dict[int, CompletedMessage] = dict(received or {})
    queue: asyncio.Queue[tuple[int, CompletedMessage | BaseException | None]] = asyncio.Queue()
    streams: dict[int, ChunkStream] = {}
    result = GatherResult(decoding=None, messages=messages)
    started = time.perf_counter()

    async def pump(source: Source) -> None:
        assembler = MessageAssembler(
            job_id=job_id, iteration=iteration, worker_id=source.worker_id, rows=source.rows, length=length,
            dtypes=dtypes,
        )  # fmt: skip
        try:
            stream = source.open()
            streams[source.worker_id] = stream
            async for chunk in stream:
                done = assembler.feed(chunk)
                if done is not None:
                    queue.put_nowait((source.worker_id, done))
            if not assembler.complete:
                raise WireError(f"stream ended before all rows {source.rows} were sent")
            queue.put_nowait((source.worker_id, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait((source.worker_id, exc))

    tasks = {s.worker_id: asyncio.create_task(pump(s), name=f"gather-w{s.worker_id}") for s in sources}
    pending = set(tasks)
    deadline = None if timeout is None else started + timeout
    try:
        while not decoder.decodable and pending:
            remaining = None if deadline is None else deadline - time.perf_counter()
            if remaining is not None and remaining <= 0:
                result.timed_out = True
                break
            try:
                worker_id, item = await asyncio.wait_for(queue.get(), remaining)
            except TimeoutError:
                result.timed_out = True
                break
            if isinstance(item, CompletedMessage):
                messages[item.row] = item
                t0 = time.perf_counter()
                decoder.add(item.row)
                result.decode_seconds += time.perf_counter() - t0
            elif item is None:
                pending.discard(worker_id)
                result.finished[worker_id] = time.perf_counter() - started
            else:
                pending.discard(worker_id)
                result.failed[worker_id] = _describe(item)
        if decoder.decodable:
            t0 = time.perf_counter()
            result.decoding = decoder.decoding()
            result.decode_seconds += time.perf_counter() - t0
    finally:
        rows_of = {s.worker_id: s.rows for s in sources}
        for w in list(pending):
            if all(r in messages for r in rows_of[w]):  # delivered everything; end-of-stream not seen yet
                pending.discard(w)
                result.finished[w] = time.perf_counter() - started
        result.late = sorted(pending)
        for worker_id in pending:
            stream = streams.get(worker_id)
            if stream is not None:
                stream.cancel()
            tasks[worker_id].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    return result


def _describe(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        code = exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[attr-defined]
        name = getattr(code, "name", code)
        return f"{name}: {details()}"
    return f"{type(exc).__name__}: {exc}"
