"""The clock a :class:`~gradcode.common.gather.round.Round` reads and waits on: the real one, or one a test moves by
hand.

A round's policy is made of times: its start, when each worker finished, its deadline, a strategy's hedge or
re-asking bound. It reads them from a :class:`Clock` (:meth:`Clock.now`) and waits on it (:meth:`Clock.timeout`),
so a test can hand it a :class:`ManualClock` and move time on (:meth:`ManualClock.advance`) instead of sleeping:
the timers fire in order, at once, and the same way on every run.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol, TypeVar

__all__ = ["MONOTONIC", "Clock", "ManualClock", "MonotonicClock"]

T = TypeVar("T")


class Clock(Protocol):
    """Where a round's times come from and how it waits for one."""

    def now(self) -> float:
        """Seconds on this clock (only differences mean anything)."""
        ...

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        """A context whose body is cancelled, raising TimeoutError, ``delay`` seconds from now (None: never)."""
        ...

    async def sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds."""
        ...


class MonotonicClock:
    """The real clock: ``time.perf_counter()`` and asyncio's timers (what the master and tree parents use)."""

    def now(self) -> float:
        return time.perf_counter()

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(delay)  # not wait_for: 3.11's can swallow a cancel of the caller

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(delay)


MONOTONIC = MonotonicClock()
"""The default clock."""


class ManualClock:
    """A clock that moves only when told (:meth:`advance`): the timers due meanwhile fire in order, without real
    sleeping. For tests; every method must be called from the event loop's thread."""

    SETTLE_PASSES = 20
    """Passes of the event loop :meth:`advance` lets run after each timer (the woken tasks act on it)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def _at(self, when: float) -> asyncio.Future[None]:
        """A future that :meth:`advance` resolves once the clock reaches ``when``."""
        due: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (when, next(self._order), due))
        return due

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        return _ManualTimeout(self, delay)

    async def sleep(self, delay: float) -> None:
        if delay <= 0:
            await asyncio.sleep(0)
            return
        due = self._at(self._now + delay)
        try:
            await due
        finally:
            due.cancel()

    async def settle(self) -> None:
        """Let the event loop run the tasks that are ready (what a timer or a test just woke)."""
        for _ in range(self.SETTLE_PASSES):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, firing each timer due meanwhile at its own time, in order."""
        if seconds < 0:
            raise ValueError(f"A clock moves forward only; got seconds={seconds!r} (give 0 or more).")
        target = self._now + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, due = heapq.heappop(self._timers)
            if due.done():  # a timer whose waiter left
                continue
            self._now = max(self._now, when)
            due.set_result(None)
            await self.settle()
        self._now = target
        await self.settle()

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, moving the clock on as it waits: whenever the tasks it woke have settled and it
        is not done, time jumps to the next timer (the order of events is the order of their times, whatever the
        load). Without a timer left, it waits for ``awaitable`` in real time."""
        task = asyncio.ensure_future(awaitable)
        while True:
            await self.settle()
            if task.done():
                return task.result()
            due = [when for when, _, future in self._timers if not future.done()]
            if not due:
                return await task
            await self.advance(max(min(due) - self._now, 0.0))


class _ManualTimeout:
    """:meth:`ManualClock.timeout`: asyncio's own timeout, expired by the manual clock instead of the loop's."""

    def __init__(self, clock: ManualClock, delay: float | None) -> None:
        self.clock = clock
        self.delay = delay
        self._inner = asyncio.timeout(None)
        self._due: asyncio.Future[None] | None = None
        self._active = False

    async def __aenter__(self) -> object:
        await self._inner.__aenter__()
        self._active = True
        if self.delay is not None and self.delay <= 0:
            self._expire()
        elif self.delay is not None:
            self._due = self.clock._at(self.clock.now() + self.delay)
            self._due.add_done_callback(lambda _: self._expire())
        return self

    def _expire(self) -> None:
        """The clock reached the timeout: cancel the body (unless it has left already)."""
        if self._active:
            self._inner.reschedule(asyncio.get_running_loop().time())

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._active = False
        if self._due is not None:
            self._due.cancel()
        await self._inner.__aexit__(kind, exc, traceback)  # raises TimeoutError when it cancelled the body
