"""How late a node's event loop runs what is due: a histogram, and a warning when it was held up for a second or more.

A node's event loop serves every call, stream, heartbeat and relayed model; while it is held up its peers and its
master hear nothing from it, and take it for frozen or gone. On hosts starved of CPU (a spent quota, an
overcommitted or paused machine) or with a long call on the loop, that is the first thing to look at:
``gradcode_event_loop_lag_seconds`` (the master's and each worker's ``/metrics``) says how often and how long. On
the emulated cluster (24 hosts of 6 % of a core) ten relayed fetches on four peers failed within 90 ms of each
other, each peer silent for 1.5 s, and no process said its loop had been held up; the cause (the host out of
memory, the kernel's OOM killer ending a worker that second) was found in the kernel's log an hour later.
"""

from __future__ import annotations

import asyncio
import logging
import math

from prometheus_client import Histogram

__all__ = ["SAMPLE_SECONDS", "WARN_EVERY_SECONDS", "WARN_SECONDS", "watch_event_loop"]

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 0.5
"""How often the watch asks to be woken: a stall of the loop shows as a wake-up that late (0.1 ms of CPU each)."""
WARN_SECONDS = 1.0
"""A lag from which the watch logs a warning: past a relayed fetch's patience and half the master's floor for
asking a silent worker again."""
WARN_EVERY_SECONDS = 60.0
"""The least time between two warnings; the lags in between are counted into the next."""


async def watch_event_loop(
    lag: Histogram, *, sample_seconds: float = SAMPLE_SECONDS, warn_seconds: float = WARN_SECONDS
) -> None:
    """Observe into ``lag`` how late each wake-up every ``sample_seconds`` came, until cancelled; log a warning for
    a lag of ``warn_seconds`` or more (at most one per :data:`WARN_EVERY_SECONDS`, counting those in between)."""
    if not (sample_seconds > 0 and warn_seconds > 0):
        raise ValueError(f"sample_seconds and warn_seconds must be > 0, not {sample_seconds!r} and {warn_seconds!r}.")
    loop = asyncio.get_running_loop()
    warned_at, unreported, worst = -math.inf, 0, 0.0
    while True:
        due = loop.time() + sample_seconds
        await asyncio.sleep(sample_seconds)
        late = max(0.0, loop.time() - due)
        lag.observe(late)
        if late < warn_seconds:
            continue
        unreported, worst = unreported + 1, max(worst, late)
        if loop.time() - warned_at >= WARN_EVERY_SECONDS:
            log.warning(
                "this process's event loop ran %.2f s late (%d time(s) %g s or more since the last warning, the worst "
                "%.2f s): a host starved of CPU, paused, or a long call on the loop; its peers heard nothing meanwhile",
                late, unreported, warn_seconds, worst,
            )  # fmt: skip
            warned_at, unreported, worst = loop.time(), 0, 0.0
