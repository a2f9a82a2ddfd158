"""Who owns a background task: one :class:`TaskOwner` per node and per job holds every task it starts.

A task started with a bare ``create_task`` belongs to nobody: nothing cancels it when its node or job ends, and
its crash is lost (at best a "Task exception was never retrieved" at garbage collection). A :class:`TaskOwner`
starts named tasks (:meth:`TaskOwner.spawn`) or takes over ones started elsewhere (:meth:`TaskOwner.adopt`: a
round's streams), keeps a reference to each until it ends, logs the crash of any of them with its name, and, for a
task started ``fatal`` (the default), records the first such crash and hands it to its owner: :meth:`supervise`
raises it into the owner's main work (the ``asyncio.wait(FIRST_COMPLETED)`` supervisor of temporal's worker: the
first crash of a child cancels the main work), or ``on_crash`` hears of it. :meth:`close` cancels every task
still running and waits until each has ended; nothing it held is left pending. Cancelling a task is never a crash.

Not an :class:`asyncio.TaskGroup`: a group cancels every child when one fails and accepts no child that fails
harmlessly, while an owner's tasks have different stakes (a late stream's end matters to nobody, a failed
evaluation must fail its job), and a group's children cannot be tasks started elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from gradcode.common.exceptions import TaskCrashedError

__all__ = ["Crash", "TaskCrashedError", "TaskOwner"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Crash:
    """A task of an owner ended with an exception: the task's name and that exception."""

    task: str
    error: BaseException

    def __str__(self) -> str:
        return f"{self.task} crashed: {type(self.error).__name__}: {self.error}"

    def exception(self) -> TaskCrashedError:
        """The crash as an exception to raise in the owner (its cause is the task's exception)."""
        exc = TaskCrashedError(str(self), task=self.task)
        exc.__cause__ = self.error
        return exc


class TaskOwner:
    """Holds a node's or a job's background tasks until they end; surfaces their crashes; ends them on close.

    ``name`` says whose tasks these are in logs. ``on_crash`` (optional) is called once, with the first crash of a
    ``fatal`` task, from that task's done callback; :attr:`crash` keeps it and :meth:`supervise` raises it. The crash
    of a task started with ``fatal=False`` is only logged.
    """

    def __init__(self, name: str, *, on_crash: Callable[[Crash], None] | None = None) -> None:
        self.name = name
        self.on_crash = on_crash
        self.crash: Crash | None = None
        """The first crash of a fatal task (None: none so far)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fatal: set[asyncio.Task[Any]] = set()
        self._crashed: asyncio.Future[Crash] | None = None
        self._closed = False

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        """The tasks held now (each until it ends)."""
        return frozenset(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str, fatal: bool = True) -> asyncio.Task[T]:
        """Run ``coro`` as a task named ``name``, held until it ends. RuntimeError once :meth:`close` has begun
        (the coroutine is closed unstarted): nothing starts under an owner that is ending."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.name} is closed: task {name!r} not started.")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.adopt(task, fatal=fatal)
        return task

    def adopt(self, task: asyncio.Task[Any], *, fatal: bool = True) -> None:
        """Hold ``task`` (started elsewhere) until it ends, as if spawned here; cancelled at once when closed."""
        if task.done():
            self._ended(task)
            return
        self._tasks.add(task)
        if fatal:
            self._fatal.add(task)
        task.add_done_callback(self._ended)
        if self._closed:
            task.cancel()

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        fatal = task in self._fatal
        self._fatal.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # (retrieved: asyncio never logs it again)
        if error is None:
            return
        crash = Crash(task.get_name(), error)
        log.error("%s: %s", self.name, crash, exc_info=error)
        if not fatal or self.crash is not None:
            return
        self.crash = crash
        if self._crashed is not None and not self._crashed.done():
            self._crashed.set_result(crash)
        if self.on_crash is not None:
            self.on_crash(crash)

    async def supervise(self, main: Coroutine[Any, Any, T], *, name: str | None = None) -> T:
        """Await ``main`` in a task of its own (named ``name``), unless a fatal task of this owner crashes first (or
        crashed already): then ``main`` is cancelled, awaited, and the crash raised as :class:`TaskCrashedError`.
        Cancelling the supervisor cancels ``main`` and waits until it has ended."""
        if self.crash is not None:
            main.close()
            raise self.crash.exception()
        loop = asyncio.get_running_loop()
        self._crashed = crashed = loop.create_future()
        task = loop.create_task(main, name=name or f"{self.name} (main)")
        try:
            await asyncio.wait({task, crashed}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _cancelled(task)
            raise
        finally:
            self._crashed = None
        if task.done():
            return task.result()
        await _cancelled(task)
        raise crashed.result().exception()

    async def close(self) -> None:
        """Cancel every task held and wait until each has ended (crashes are logged; none is raised). Later
        :meth:`spawn` calls are refused. Idempotent."""
        self._closed = True
        while self._tasks:
            tasks = set(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    def __repr__(self) -> str:
        return f"<TaskOwner {self.name}: {len(self._tasks)} task(s){' closed' if self._closed else ''}>"


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, whatever it ends with (its caller decides what it means); a cancel
    of the caller meanwhile does not cut the wait short (it is raised once ``task`` has ended)."""
    task.cancel()
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
            task.cancel()
    if not task.cancelled():
        task.exception()  # retrieved: its end is the caller's business, not asyncio's log
    if cancelled:
        raise asyncio.CancelledError
