"""Straggler emulation on a worker: a job's delay model and the cancellable sleep that applies it.

A straggler is slow, not dead: the emulated delay is a sleep the worker takes before its messages,
cancelled at once when the computation is abandoned (:class:`Cancellation`), so an abandoned call
never delays the next iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, TypeVar

from gradcode.common.exceptions import ComputeCancelledError
from gradcode.common.sim.stragglers import make_delay_model
from gradcode.common.transport.wire import dict_from_struct
from gradcode.v1 import common_pb2

__all__ = ["Cancellation", "StragglerEmulation"]

_T = TypeVar("_T")


class Cancellation:
    """One computation's cancel flag: polled by its compute thread, awaited by its straggler sleep.

    :meth:`set` must be called from the event loop's thread (every caller in this package is).
    """

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._event = asyncio.Event()

    def set(self) -> None:
        self._flag.set()
        self._event.set()

    def is_set(self) -> bool:
        return self._flag.is_set()

    async def wait(self) -> None:
        """Return once the flag is set."""
        await self._event.wait()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, but raise ComputeCancelledError as soon as the flag is set."""
        if seconds > 0 and not self.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):  # not wait_for, which can swallow a cancel (3.11)
                    await self._event.wait()
        if self.is_set():
            raise ComputeCancelledError("Cancelled during the emulated straggler delay.")

    async def race(self, task: asyncio.Task[_T], waiting_for: str = "the children") -> _T:
        """``task``'s result, or ComputeCancelledError as soon as the flag is set (``task`` keeps running)."""
        waiter = asyncio.create_task(self._event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.is_set():
            raise ComputeCancelledError(f"Cancelled while waiting for {waiting_for}.")
        return task.result()


class StragglerEmulation:
    """A job's straggler delay model (none when emulation is off)."""

    def __init__(self, spec: common_pb2.StragglerSpec) -> None:
        self._model: Any | None = None
        if spec.model not in ("", "none"):
            try:
                self._model = make_delay_model(spec.model, dict_from_struct(spec.params), int(spec.seed))
            except ValueError as exc:
                raise ValueError(f"JobSetup.straggler is invalid: {exc}") from None

    def delay(self, worker_id: int, iteration: int) -> float:
        """This iteration's emulated delay for ``worker_id`` (0 without emulation); ValueError if the model fails."""
        if self._model is None:
            return 0.0
        return max(0.0, float(self._model.delay(worker_id, iteration)))
