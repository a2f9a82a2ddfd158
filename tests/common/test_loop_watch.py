"""The watch of a node's event loop: a held-up loop shows in the histogram and in one warning per minute at most,
counting the lags in between; a node starts it and its shutdown ends it; /metrics serves it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gradcode.common.ops import loop_watch
from gradcode.common.ops.loop_watch import watch_event_loop
from gradcode.common.ops.metrics import WORKER_EVENT_LOOP_LAG, WORKER_REGISTRY
from gradcode.worker.node import WorkerNode

SAMPLE = 0.05


def _lag() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("lag_seconds", "test", buckets=(0.1, 0.3, 1.0), registry=registry)


def _count(registry: CollectorRegistry, le: str | None = None) -> float:
    name, labels = ("lag_seconds_count", {}) if le is None else ("lag_seconds_bucket", {"le": le})
    return registry.get_sample_value(name, labels) or 0.0


async def test_a_held_up_loop_is_observed_and_warned_of_once_a_minute_counting_the_lags_between(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, lag = _lag()
    caplog.set_level(logging.WARNING, logger=loop_watch.__name__)
    watch = asyncio.create_task(watch_event_loop(lag, sample_seconds=SAMPLE, warn_seconds=0.3))
    try:
        await asyncio.sleep(4 * SAMPLE)
        assert _count(registry) >= 2 and _count(registry, "0.1") == _count(registry), "an idle loop is on time"
        assert not caplog.records
        time.sleep(0.5)  # the loop, held up
        await asyncio.sleep(2 * SAMPLE)
        assert _count(registry, "0.3") < _count(registry), "the held-up wake-up is in the histogram"
        (warning,) = caplog.records
        assert "event loop ran 0.4" in warning.getMessage() or "event loop ran 0.5" in warning.getMessage()
        assert "1 time(s) 0.3 s or more since the last warning" in warning.getMessage()
        for _ in range(2):  # within the minute: counted, not logged
            time.sleep(0.4)
            await asyncio.sleep(2 * SAMPLE)
        assert len(caplog.records) == 1
        monkeypatch.setattr(loop_watch, "WARN_EVERY_SECONDS", 0.0)
        time.sleep(0.4)
        await asyncio.sleep(2 * SAMPLE)
        assert len(caplog.records) == 2
        assert "3 time(s) 0.3 s or more since the last warning" in caplog.records[1].getMessage()
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)


@pytest.mark.parametrize(("sample", "warn"), [(0.0, 1.0), (0.5, -1.0), (float("nan"), 1.0)])
async def test_a_watch_needs_positive_periods(sample: float, warn: float) -> None:
    _, lag = _lag()
    with pytest.raises(ValueError, match="must be > 0"):
        await watch_event_loop(lag, sample_seconds=sample, warn_seconds=warn)


async def test_a_node_watches_its_loop_from_start_to_shutdown() -> None:
    before = WORKER_REGISTRY.get_sample_value("gradcode_event_loop_lag_seconds_count") or 0.0
    node = WorkerNode(port=0, grace=0.1)
    async with node:
        watches = [t for t in node.tasks.tasks if t.get_name() == "event-loop-watch"]
        assert len(watches) == 1 and node.event_loop_lag is WORKER_EVENT_LOOP_LAG
        await asyncio.sleep(3 * loop_watch.SAMPLE_SECONDS)
        after = WORKER_REGISTRY.get_sample_value("gradcode_event_loop_lag_seconds_count") or 0.0
        assert after >= before + 2
    assert watches[0].done() and not node.tasks.tasks
