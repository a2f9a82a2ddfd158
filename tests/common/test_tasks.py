"""TaskOwner: every background task held until it ends, its crash surfaced, nothing left pending on close."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from gradcode.common.tasks import Crash, TaskCrashedError, TaskOwner


async def _forever() -> None:
    await asyncio.Event().wait()


async def _crash(after: float = 0.0, message: str = "boom") -> None:
    await asyncio.sleep(after)
    raise ValueError(message)


def _pending_besides(current: asyncio.Task[object] | None) -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not current and not t.done()}


async def test_close_cancels_and_awaits_every_task_and_refuses_new_ones() -> None:
    before = _pending_besides(asyncio.current_task())
    ended: list[str] = []

    async def stubborn(name: str) -> None:
        try:
            await _forever()
        finally:
            await asyncio.sleep(0.01)  # its cleanup takes a while: close waits for it
            ended.append(name)

    owner = TaskOwner("test")
    tasks = [owner.spawn(stubborn(f"t{i}"), name=f"t{i}") for i in range(3)]
    await asyncio.sleep(0)
    assert owner.tasks == set(tasks)
    await owner.close()
    assert sorted(ended) == ["t0", "t1", "t2"] and all(t.cancelled() for t in tasks)
    assert owner.tasks == frozenset() and owner.crash is None
    assert _pending_besides(asyncio.current_task()) == before  # nothing it started is left pending
    coro = _forever()
    with pytest.raises(RuntimeError, match="closed"):
        owner.spawn(coro, name="late")
    assert coro.cr_frame is None  # closed unstarted: no "never awaited" warning


async def test_a_task_that_ends_is_let_go() -> None:
    owner = TaskOwner("test")

    async def quick() -> int:
        return 7

    task = owner.spawn(quick(), name="quick")
    assert await task == 7
    await asyncio.sleep(0)
    assert owner.tasks == frozenset() and owner.crash is None


async def test_a_fatal_crash_is_logged_with_its_name_and_reaches_the_owner(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[Crash] = []
    owner = TaskOwner("job j", on_crash=heard.append)
    owner.spawn(_crash(message="first"), name="job-j-evaluate-3")
    owner.spawn(_crash(0.01, message="second"), name="job-j-evaluate-4")
    with caplog.at_level(logging.ERROR, logger="gradcode.common.tasks"):
        await asyncio.sleep(0.05)
    assert [str(c) for c in heard] == ["job-j-evaluate-3 crashed: ValueError: first"]  # the first, once
    assert owner.crash is heard[0] and isinstance(owner.crash.error, ValueError)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "job j: job-j-evaluate-3 crashed: ValueError: first",
        "job j: job-j-evaluate-4 crashed: ValueError: second",
    ]
    await owner.close()


async def test_a_crash_that_is_not_fatal_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[Crash] = []
    owner = TaskOwner("round", on_crash=heard.append)
    with caplog.at_level(logging.ERROR, logger="gradcode.common.tasks"):
        owner.spawn(_crash(), name="gather-w1", fatal=False)
        await asyncio.sleep(0.01)
    assert heard == [] and owner.crash is None
    assert [r.getMessage() for r in caplog.records] == ["round: gather-w1 crashed: ValueError: boom"]
    assert await owner.supervise(asyncio.sleep(0, result="main")) == "main"


async def test_supervise_cancels_the_main_work_when_a_child_crashes() -> None:
    owner = TaskOwner("job")
    cleaned = asyncio.Event()

    async def main() -> None:
        owner.spawn(_crash(0.01), name="job-publish")
        try:
            await _forever()
        finally:
            cleaned.set()

    async with asyncio.timeout(5):  # the old way, a crash nobody awaited, hung here
        with pytest.raises(TaskCrashedError, match="job-publish crashed: ValueError: boom") as raised:
            await owner.supervise(main())
    assert cleaned.is_set() and isinstance(raised.value.__cause__, ValueError) and raised.value.task == "job-publish"
    with pytest.raises(TaskCrashedError):  # crashed already: the next main work does not even start
        await owner.supervise(_forever())
    await owner.close()
    assert _pending_besides(asyncio.current_task()) == set()


async def test_supervise_returns_the_main_result_and_a_cancel_reaches_the_main_work() -> None:
    owner = TaskOwner("job")
    assert await owner.supervise(asyncio.sleep(0, result=3)) == 3
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def main() -> None:
        started.set()
        try:
            await _forever()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    supervisor = asyncio.create_task(owner.supervise(main()))
    await started.wait()
    supervisor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await supervisor
    assert cancelled.is_set() and _pending_besides(asyncio.current_task()) == set()


async def test_an_adopted_task_is_held_and_cancelled_on_close() -> None:
    owner = TaskOwner("parent")
    task = asyncio.create_task(_forever(), name="gather-w2")
    owner.adopt(task, fatal=False)
    assert owner.tasks == {task}
    await owner.close()
    assert task.cancelled() and owner.tasks == frozenset()
    late = asyncio.create_task(_forever())
    owner.adopt(late)  # adopted after close: cancelled at once, still awaited by nobody but held until it ends
    await asyncio.sleep(0)
    assert late.cancelled()


async def test_a_second_cancel_of_the_supervisor_still_waits_for_the_main_work_to_end() -> None:
    owner = TaskOwner("job")
    started, release = asyncio.Event(), asyncio.Event()
    ended: list[str] = []

    async def main() -> None:
        started.set()
        try:
            await _forever()
        finally:
            while not release.is_set():  # a teardown that takes its time, cancelled or not
                with contextlib.suppress(asyncio.CancelledError):
                    await release.wait()
            ended.append("main")

    supervisor = asyncio.create_task(owner.supervise(main(), name="job-j-loop"))
    await started.wait()
    assert "job-j-loop" in {t.get_name() for t in asyncio.all_tasks()}
    for _ in range(2):
        supervisor.cancel()
        await asyncio.sleep(0.01)
    assert not supervisor.done() and ended == []  # the supervisor never returns before its main work has ended
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await supervisor
    assert ended == ["main"] and _pending_besides(asyncio.current_task()) == set()
