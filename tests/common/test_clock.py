"""The manual clock round tests run on: timers fire in order at their own times, without real sleeping."""

from __future__ import annotations

import asyncio

import pytest

from gradcode.common.gather.clock import ManualClock


async def test_sleepers_wake_in_order_at_their_own_times_and_timeouts_expire_on_the_clock() -> None:
    clock = ManualClock(start=10.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woke.append((name, clock.now()))

    async def waiter() -> None:
        try:
            async with clock.timeout(0.5):
                await asyncio.Event().wait()
        except TimeoutError:
            woke.append(("timeout", clock.now()))

    tasks = [asyncio.create_task(sleeper("late", 2.0)), asyncio.create_task(sleeper("early", 0.25))]
    tasks.append(asyncio.create_task(waiter()))
    await clock.advance(0.4)
    assert woke == [("early", 10.25)]
    await clock.advance(5.0)
    assert woke == [("early", 10.25), ("timeout", 10.5), ("late", 12.0)] and clock.now() == 15.4
    await asyncio.gather(*tasks)


async def test_a_body_that_ends_in_time_is_not_cancelled_later() -> None:
    clock = ManualClock()
    async with clock.timeout(1.0):
        pass
    async with clock.timeout(None):
        await clock.advance(3600.0)  # no timeout: nothing to cancel
    await clock.advance(2.0)  # the first timeout's time passes after its body ended
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with clock.timeout(0):
            await asyncio.sleep(3600)


async def test_the_clock_does_not_go_back() -> None:
    with pytest.raises(ValueError, match="forward only"):
        await ManualClock().advance(-1.0)


async def test_run_jumps_to_each_next_timer_until_the_awaitable_is_done() -> None:
    """Three sleepers of 3600 s, 0.002 s and 1 s: ``run`` returns the waiter's result at the clock's 3600 s,
    having woken them in the order of their times, in no real time."""
    clock = ManualClock()
    woke: list[float] = []

    async def sleeper(delay: float) -> None:
        await clock.sleep(delay)
        woke.append(clock.now())

    async def everyone() -> str:
        await asyncio.gather(sleeper(3600.0), sleeper(0.002), sleeper(1.0))
        return "done"

    async with asyncio.timeout(5.0):
        assert await clock.run(everyone()) == "done"
    assert woke == [0.002, 1.0, 3600.0] and clock.now() == 3600.0
