"""One training job on the master: the runner that composes the pieces, top to bottom.

:class:`JobRunner` runs a planned job (:mod:`gradcode.master.spec`) against the pool:

1. pick the workers and load the job onto them (:mod:`gradcode.master.loading`);
2. each iteration: ``code.assign(observation)`` (dynamic codes choose rows from the stragglers seen in
   the previous iteration), run the round (:mod:`gradcode.master.rounds`: ask, retry, give up at the
   deadline), decode it (:meth:`gradcode.common.round.Round.decode`), verify it (optional) and step a
   copy of the optimizer (:mod:`gradcode.master.step`). The step and ``iterations_done`` are committed
   together, so GetModel never runs ahead of its iteration number; ``wall_seconds`` ends there. A
   report is ``exact`` only when the decode is exact and no message it used was decoded
   approximately by a tree parent;
3. compute the full-training-set loss and accuracies in a thread *while the next iteration gathers*
   (off the critical path), then report the IterationReport to every watcher and append it to the
   history file (:mod:`gradcode.master.reporting`). The next iteration commits only after that
   report, so a target accuracy stops the job exactly at the iteration that reached it.

A code with a topology (a CodedReduce tree) is run the same way: the master asks only the code's own
workers (the first layer) and decodes with the code's decoder; what happens below is the parents'
business. A deeper node the master never hears from is not monitored: a leaf that restarts stays
missing for its parent (the parent tolerates ``s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import Observation
from gradcode.common.exceptions import JobFailedError
from gradcode.common.round import Decoded, Round
from gradcode.common.wire import tensor_from_array
from gradcode.master import reporting
from gradcode.master.loading import WorkerLoader
from gradcode.master.optimizer import Optimizer, make_optimizer
from gradcode.master.pool import WorkerPool
from gradcode.master.reporting import History, iteration_report, score
from gradcode.master.rounds import RoundPolicy
from gradcode.master.spec import JobPlan
from gradcode.master.step import stepped, verify_error
from gradcode.v1 import master_pb2, worker_pb2

__all__ = ["JobRunner"]

log = logging.getLogger(__name__)

_TERMINAL = (master_pb2.JOB_STATE_SUCCEEDED, master_pb2.JOB_STATE_FAILED, master_pb2.JOB_STATE_CANCELLED)


class JobRunner:
    """Runs one planned job against the pool; watchers get every IterationReport."""

    def __init__(self, plan: JobPlan, pool: WorkerPool, *, run_dir: Path | None = None) -> None:
        self.plan = plan
        self.pool = pool
        self.state: int = master_pb2.JOB_STATE_PENDING
        self.message = "waiting for workers"
        self.history: list[master_pb2.IterationReport] = []
        self.iterations_done = 0
        self.loader = WorkerLoader(plan, pool)
        self.rounds = RoundPolicy(self.loader, pool)
        self.history_file = History(run_dir, plan.job_id)
        spec = plan.spec
        self.optimizer: Optimizer = make_optimizer(
            spec.optimizer.kind,
            plan.model.init_params(),
            learning_rate=spec.optimizer.learning_rate,
            momentum=spec.optimizer.momentum,
        )
        self.finished_at: float | None = None
        """time.monotonic() when the job reached its final state (None while it runs)."""
        self._observation: Observation | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._pending: asyncio.Task[bool] | None = None
        """Publishes the last committed iteration's report once its metrics are computed (see _loop)."""
        self._on_done: Callable[[JobRunner], None] | None = None

    # ---- public surface ----------------------------------------------------------------------------
    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def done(self) -> bool:
        return self.state in _TERMINAL

    def info(self) -> master_pb2.JobInfo:
        return master_pb2.JobInfo(
            job_id=self.job_id,
            state=self.state,  # type: ignore[arg-type]
            message=self.message,
            iterations_done=self.iterations_done,
            spec=self.plan.spec,
        )

    def model_reply(self) -> master_pb2.ModelReply:
        return master_pb2.ModelReply(
            job_id=self.job_id,
            iteration=self.iterations_done,
            parameters=tensor_from_array(self.optimizer.params),
            model=self.plan.spec.model,
        )

    def start(self, on_done: Callable[[JobRunner], None] | None = None) -> None:
        """Run the job in the background; ``on_done(self)`` is called as soon as it has reached its final state."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"job-{self.job_id}")
            self._on_done = on_done

    async def cancel(self) -> None:
        """Cancel the job (no-op once it has ended) and wait until it has stopped."""
        if self._task is not None and not self.done:
            self._task.cancel()
        await self.wait()

    async def wait(self) -> None:
        """Wait until the job has ended."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def watch(self) -> AsyncIterator[master_pb2.IterationReport]:
        """The reports so far, then each new one, until the job has ended."""
        sent = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda n=sent: len(self.history) > n or self.done)  # type: ignore[misc]
                batch = self.history[sent:]
                finished = self.done
            for report in batch:
                yield report
            sent += len(batch)
            if finished and sent == len(self.history):
                return

    # ---- the job -----------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            self.history_file.open(self.plan.spec)
            await self.loader.select()
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "loading workers")
            self._started = time.perf_counter()
            await self.loader.load_all()
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "running")
            await self._loop()
        except asyncio.CancelledError:
            await self._drain()  # the last committed iteration's report still goes out
            if not self.done:
                await self._set_state(
                    master_pb2.JOB_STATE_CANCELLED, f"cancelled after {self.iterations_done} iterations"
                )
        except JobFailedError as exc:
            if not await self._drain():  # unless the previous iteration already ended the job
                if exc.report is not None:
                    exc.report.state = master_pb2.JOB_STATE_FAILED
                    exc.report.message = str(exc)
                    await self._publish(exc.report)
                await self._set_state(master_pb2.JOB_STATE_FAILED, str(exc))
        except Exception as exc:
            log.exception("job %s crashed", self.job_id)
            await self._set_state(master_pb2.JOB_STATE_FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            await self.loader.end()
            self.history_file.close()

    async def _loop(self) -> None:
        """Gather, decode and commit each iteration; its report's metrics overlap the next gather.

        The full-training-set loss/accuracy of iteration ``t`` is computed in a thread while iteration
        ``t + 1`` gathers, and its report is published as soon as they are known. Iteration ``t + 1``
        commits its step only after that report: if iteration ``t`` reached the target accuracy the
        job ends there (iteration ``t + 1`` is cancelled or discarded, never stepped).
        """
        spec = self.plan.spec
        for t in range(1, spec.iterations + 1):
            task = asyncio.get_running_loop().create_task(self._iteration(t), name=f"job-{self.job_id}-{t}")
            try:
                pending = self._pending
                if pending is not None:
                    await asyncio.wait({task, pending}, return_when=asyncio.FIRST_COMPLETED)
                    if pending.done() and await self._settle():
                        return  # iteration t - 1 reached the target while t was gathering
                decoded = await task
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if await self._settle():
                return
            report, params = self._commit(t, decoded)
            self._pending = asyncio.get_running_loop().create_task(
                self._complete_report(report, params, last=t == spec.iterations), name=f"job-{self.job_id}-report-{t}"
            )
        await self._settle()

    async def _settle(self) -> bool:
        """Wait for the previous iteration's report to be published; True when that iteration ended the job."""
        pending = self._pending
        if pending is None:
            return False
        ended = await asyncio.shield(pending)  # shielded and kept until done: a cancel drains it (_drain)
        self._pending = None
        return ended

    async def _drain(self) -> bool:
        """:meth:`_settle` on the way out (cancel or failure): never raises."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:  # cancelled again while draining: give up on that report
            return False
        except Exception:
            log.exception("job %s: the report of iteration %d failed", self.job_id, self.iterations_done)
            return False

    async def _complete_report(
        self, report: master_pb2.IterationReport, params: np.ndarray[Any, Any], *, last: bool
    ) -> bool:
        """Fill in the metrics of a committed iteration and publish it; True when the job ends with it."""
        spec = self.plan.spec
        report.loss, report.train_accuracy, report.test_accuracy = await asyncio.to_thread(
            reporting.metrics, self.plan, params
        )
        reached = spec.target_accuracy > 0 and score(report) >= spec.target_accuracy
        if not (last or reached):
            report.state = master_pb2.JOB_STATE_RUNNING
            await self._publish(report)
            return False
        report.state = master_pb2.JOB_STATE_SUCCEEDED
        report.message = (
            f"reached target accuracy {spec.target_accuracy:g} after {report.iteration} iterations"
            if reached
            else f"completed {report.iteration} iterations"
        )
        self.state, self.message = report.state, report.message
        await self._publish(report)
        self._ended()
        return True

    # ---- one iteration -----------------------------------------------------------------------------
    async def _iteration(self, t: int) -> _Gathered:
        """Gather, decode and verify iteration ``t``; nothing is committed here."""
        started = time.perf_counter()
        code = self.plan.code
        assignment = code.assign(self._observation) if code.dynamic else code.static_assignment()
        point = self.optimizer.point.copy()
        model_bytes = worker_pb2.ComputeRequest(model=tensor_from_array(point)).SerializeToString()
        round_ = await self.rounds.run(t, assignment, model_bytes, started=started, job_started=self._started)
        decoded = round_.decode()
        error = await verify_error(self.plan, t, point, decoded, self._pool_ids())
        asked = [w for w in range(code.n) if assignment.rows[w]]
        return _Gathered(round_, decoded, asked, point, error)

    def _commit(self, t: int, it: _Gathered) -> tuple[master_pb2.IterationReport, np.ndarray[Any, Any]]:
        """Step and record iteration ``t`` as done, together (no await in between, so a cancel sees both or
        neither). Returns the report (metrics still NaN) and the new parameters."""
        self.optimizer, params = stepped(self.optimizer, self.plan, t, it.point, it.decoded)
        self.iterations_done = t
        now = time.perf_counter()
        # Observation for dynamic codes: late, failed or unasked workers straggled; speed = 1 / time.
        n, finished = self.plan.code.n, it.round.finished
        self._observation = Observation(
            straggling=tuple(w not in finished for w in range(n)),
            speed=tuple(1.0 / finished[w] if finished.get(w) else 0.0 for w in range(n)),
        )
        report = iteration_report(
            self.job_id, t, it.round, it.decoded, asked=it.asked, pool_ids=self._pool_ids(),
            wall_seconds=now - it.round.started, elapsed_seconds=now - self._started, verify_error=it.verify_error,
        )  # fmt: skip
        return report, params

    def _pool_ids(self) -> list[int]:
        return [w.worker_id for w in self.loader.workers]

    # ---- reporting ---------------------------------------------------------------------------------
    async def _publish(self, report: master_pb2.IterationReport) -> None:
        self.history_file.append(report)
        async with self._changed:
            self.history.append(report)
            self._changed.notify_all()

    async def _set_state(self, state: int, message: str) -> None:
        async with self._changed:
            self.state, self.message = state, message
            self._changed.notify_all()
        self._ended()

    def _ended(self) -> None:
        """Once the state is final: note when, and tell ``on_done`` (the servicer evicts old jobs then)."""
        if self.done and self.finished_at is None:
            self.finished_at = time.monotonic()
            if self._on_done is not None:
                self._on_done(self)


@dataclass(frozen=True)
class _Gathered:
    """One iteration gathered, decoded and verified, waiting to be committed (:meth:`JobRunner._commit`)."""

    round: Round
    decoded: Decoded
    asked: list[int]
    """Worker indices that had rows this iteration."""
    point: np.ndarray[Any, Any]
    verify_error: float
