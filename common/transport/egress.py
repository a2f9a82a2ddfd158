"""Large frames leave a process one at a time, first come first served.

A node that sends the same model to several peers (a tree parent to its children, a master to its workers) shares one
network link among them. Written all at once, the copies share the link fairly and all arrive at the end of the
transfer, so no receiver starts before the last byte of the last copy. Written one after another, the first receiver
has its model after a k-th of that time and starts computing; its message comes back while the others still receive,
and the set a decode needs is complete sooner (on the emulated cluster at p = 10⁶, docs/cluster.md: a flat code with
its model sent to each of 24 workers 0.83 of its time per iteration, a tree of 20 workers 0.97). Small frames
(requests without a model, chunks of small messages, controls) never wait.

A turn ends when the frame has left the process (its connection's send buffer drained, or the connection ended), or
when it drains nothing for :data:`STALL_SECONDS`: a frozen or vanished peer holds the others back at most twice that,
and its frame then drains beside theirs.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Protocol

__all__ = ["LARGE_FRAME_BYTES", "STALL_SECONDS", "Egress", "egress"]

LARGE_FRAME_BYTES = 1 << 20
"""A frame this large waits for its turn (a model or a gradient chunk of a p >= 131 072 float64 message)."""

STALL_SECONDS = 0.1
"""How long a turn's frame may stop draining before the next frame goes anyway (a host at 6 % of a core may not run
its event loop for most of 0.1 s, so shorter would release turns of frames that are draining)."""


class Sender(Protocol):
    """A connection's sending side, as a turn needs it: how much it has yet to hand to the kernel."""

    def unsent_bytes(self) -> int: ...


class Egress:
    """The turns of one event loop's connections (:func:`egress`)."""

    def __init__(self) -> None:
        self.holder: Sender | None = None
        self._waiting: collections.deque[tuple[Sender, asyncio.Future[None]]] = collections.deque()
        self._watch: asyncio.TimerHandle | None = None

    def try_take(self, sender: Sender) -> bool:
        """Take the turn if it is free and nobody waits for it; False otherwise."""
        if self.holder is not None or self._waiting:
            return False
        self._grant(sender)
        return True

    async def take(self, sender: Sender) -> None:
        """Wait for the turn, behind those already waiting; cancelling the wait passes a turn just granted on."""
        if self.try_take(sender):
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append((sender, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted just before the cancel
                self.release(sender)
            elif (sender, turn) in self._waiting:  # (a release may have dropped it already)
                self._waiting.remove((sender, turn))
            raise

    def release(self, sender: Sender) -> None:
        """End ``sender``'s turn (nothing if it holds none) and grant the next waiter's."""
        if self.holder is not sender:
            return
        self.holder = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        while self._waiting:
            waiter, turn = self._waiting.popleft()
            if not turn.done():
                self._grant(waiter)
                turn.set_result(None)
                return

    def _grant(self, sender: Sender) -> None:
        self.holder = sender
        self._watch = asyncio.get_running_loop().call_later(STALL_SECONDS, self._check, sender, None)

    def _check(self, sender: Sender, unsent: int | None) -> None:
        """Release a turn whose frame drained nothing since the last check (its peer stopped reading); the first
        check, a period after the turn began (the frame written), only notes what is left."""
        self._watch = None
        if self.holder is not sender:
            return
        now = sender.unsent_bytes()
        if unsent is not None and now >= unsent:
            self.release(sender)
        else:
            self._watch = asyncio.get_running_loop().call_later(STALL_SECONDS, self._check, sender, now)


_EGRESS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Egress] = weakref.WeakKeyDictionary()


def egress() -> Egress:
    """The running event loop's turns (a process has one loop; tests run several, one after another)."""
    loop = asyncio.get_running_loop()
    turns = _EGRESS.get(loop)
    if turns is None:
        turns = _EGRESS[loop] = Egress()
    return turns
