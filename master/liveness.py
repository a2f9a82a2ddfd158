"""Failure detection that does not eat the straggler tolerance, for the round policy.

* :class:`LatenessWatch`: a worker late several iterations in a row is probed, and marked DOWN when
  the probe fails (a cut link never errors, it is only late, and each late worker uses up one of the
  ``s`` stragglers the code tolerates);
* :class:`BackgroundLoads`: (re)loads run beside the rounds, so a slow or hung LoadJob never delays
  the gather of the other workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from gradcode.common.tasks import TaskOwner
from gradcode.master.pool import PoolWorker, WorkerPool

__all__ = ["BackgroundLoads", "LatenessWatch"]

log = logging.getLogger(__name__)


class LatenessWatch:
    """Failure detection that does not eat the straggler tolerance.

    A worker whose link is cut never errors, it is only *late*, and every late worker uses up one of
    the s stragglers the code tolerates. After each iteration the runner calls :meth:`observe` with
    who delivered and who was late; a worker late for ``consecutive`` iterations in a row is probed
    (a health check on a fresh channel, in the background, bounded by ``probe_timeout``) and marked
    DOWN if the probe fails, so the job stops waiting for it and the pool probes it back UP later. A
    worker that answers the probe is only slow: its count starts again.

    The probes are tasks of ``tasks`` (the job's :class:`~gradcode.common.tasks.TaskOwner`; by default one of the
    watch's own): a probe that crashes fails the job (a worker left unprobed would silently eat the tolerance).
    """

    def __init__(
        self, pool: WorkerPool, *, consecutive: int = 3, probe_timeout: float = 2.0, tasks: TaskOwner | None = None
    ) -> None:
        if consecutive < 1:
            raise ValueError(f"Argument 'consecutive' must be >= 1, not {consecutive!r}.")
        if probe_timeout <= 0:
            raise ValueError(f"Argument 'probe_timeout' must be > 0 seconds, not {probe_timeout!r}.")
        self.pool = pool
        self.consecutive = consecutive
        self.probe_timeout = probe_timeout
        self.late_streak: dict[int, int] = {}
        self.tasks = TaskOwner("lateness probes") if tasks is None else tasks
        self._probes: dict[int, asyncio.Task[bool]] = {}

    def observe(self, *, on_time: Iterable[PoolWorker], late: Iterable[PoolWorker]) -> list[PoolWorker]:
        """Record one iteration; start (without waiting) a probe of each worker late ``consecutive`` times.

        Returns the workers whose probe was started now. Never blocks: the iteration loop goes on.
        """
        for worker in on_time:
            self.late_streak.pop(worker.worker_id, None)
        started = []
        for worker in late:
            streak = self.late_streak.get(worker.worker_id, 0) + 1
            self.late_streak[worker.worker_id] = streak
            if streak >= self.consecutive and worker.is_up and worker.worker_id not in self._probes:
                self.late_streak[worker.worker_id] = 0
                task = self.tasks.spawn(self._probe(worker), name=f"probe-{worker.worker_id}")
                self._probes[worker.worker_id] = task
                started.append(worker)
        return started

    async def _probe(self, worker: PoolWorker) -> bool:
        try:
            alive = await self.pool.probe(worker, timeout=self.probe_timeout)
            if alive:
                log.info("%s was late %d iterations in a row but answers its health check", worker.describe(),
                         self.consecutive)  # fmt: skip
            return alive
        finally:
            self._probes.pop(worker.worker_id, None)

    async def wait_probes(self) -> None:
        """Wait for the probes under way (tests, and a runner that ends)."""
        if self._probes:
            await asyncio.gather(*self._probes.values(), return_exceptions=True)

    def close(self) -> None:
        """Cancel the probes under way (the job ended; its owner awaits them)."""
        for task in self._probes.values():
            task.cancel()


class BackgroundLoads:
    """(Re)loads that run beside the iterations, so a slow or hung LoadJob never delays the gather of the others.

    The runner calls :meth:`start` for each worker that must (re)load the job and asks only the workers
    that hold it; a worker still loading is simply not asked this iteration (it counts against the
    straggler tolerance like any late worker, and only for as long as it loads). Each load is bounded by
    its own timeout (its LoadJob call's), and when it ends the pool's waiters are woken so the runner can
    ask the worker in the same iteration if the deadline allows.

    The loads are tasks of ``tasks`` (the job's :class:`~gradcode.common.tasks.TaskOwner`; by default one of their
    own): a load that crashes (a failed LoadJob returns False; a crash is a fault of the master's) fails the job
    rather than leave the worker out until the iteration deadline names it missing.
    """

    def __init__(self, pool: WorkerPool, *, tasks: TaskOwner | None = None) -> None:
        self.pool = pool
        self.tasks = TaskOwner("background loads") if tasks is None else tasks
        self._tasks: dict[int, asyncio.Task[bool]] = {}

    def loading(self, key: int) -> bool:
        """A load for ``key`` (the runner's worker index) is under way."""
        return key in self._tasks

    def start(self, key: int, load: Callable[[], Awaitable[bool]]) -> bool:
        """Start ``load()`` in the background unless one for ``key`` is under way; True if started now."""
        if key in self._tasks:
            return False
        task = self.tasks.spawn(self._run(key, load), name=f"load-{key}")
        self._tasks[key] = task
        return True

    async def _run(self, key: int, load: Callable[[], Awaitable[bool]]) -> bool:
        try:
            return await load()
        finally:
            self._tasks.pop(key, None)
            await self.pool.notify_changed()

    async def close(self) -> None:
        """Cancel the loads under way and wait for them (the job ended)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()  # a task cancelled before it ran never reached its own cleanup
