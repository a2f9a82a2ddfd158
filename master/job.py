"""One training job on the master: the runner that composes the pieces, top to bottom.

:class:`JobRunner` runs a planned job (:mod:`gradcode.master.spec`) against the pool:

1. pick the workers and load the job onto them (:mod:`gradcode.master.loading`);
2. each iteration: ``code.assign(observation)`` (dynamic codes choose rows from the stragglers seen in
   the previous iteration), run the round (:mod:`gradcode.master.rounds`: ask, retry, give up at the
   deadline), decode it (:meth:`gradcode.common.gather.round.Round.decode`), verify it (optional) and step a
   copy of the optimizer (:mod:`gradcode.master.step`). The step and ``iterations_done`` are committed
   together, so GetModel never runs ahead of its iteration number; ``wall_seconds`` ends there. A
   report is ``exact`` only when the decode is exact, its certified error bound (``error_bound``)
   is within the job's tolerance, no message it used was decoded approximately by a tree parent,
   and (under the ``detect``/``locate`` integrity policies, :mod:`gradcode.common.gather.integrity`) no
   consistency check of the surplus messages failed;
3. report: the training loss and accuracy come from the decode itself (workers append their
   partitions' summed loss and correct count to every message; :mod:`gradcode.master.reporting`), so
   nothing on the master touches the dataset per iteration and the next iteration starts at once.
   Every ``evaluate_every`` iterations, and at the last, the held-out accuracy of the new parameters
   is computed in a thread *beside* training (:func:`~gradcode.master.reporting.evaluate`); reports
   go out in iteration order, an evaluated one as soon as its evaluation is done, and each once the next
   round has asked its workers (the history file and the watchers are off the critical path).

Target accuracy: the job stops at the first *evaluated* iteration whose held-out accuracy (the
training accuracy without a test split) reaches the target. Training does not wait for the
evaluation, so a few more iterations may have been computed meanwhile: they are discarded (never
reported), and the job ends with that evaluated iteration's model and iteration count, exactly as if
it had stopped there. A target can therefore be noticed up to ``evaluate_every - 1`` iterations
after the first iteration that would have met it.

Durable jobs: with a state directory the runner saves a :class:`~gradcode.master.checkpoint.Checkpoint`
every ``checkpoint_every`` iterations (in a thread, beside training) and when the job ends; a runner
built with ``resume=`` goes on from one: from the next iteration, with the checkpoint's optimizer and
dynamic-code observation, keeping the history file's reports up to that iteration (later ones, from
after the checkpoint, are dropped: they are computed again). A job stopped because the master shuts
down (:meth:`JobRunner.suspend`) keeps a ``running`` checkpoint, so the next master resumes it.
An evaluation still running when the master died is not redone: a target accuracy it would have
met is noticed at the next evaluated iteration.

Background tasks: every task the job starts is held by its :class:`~gradcode.common.tasks.TaskOwner`
(:attr:`JobRunner.tasks`): evaluations, publishes and checkpoints (here), reloads and lateness probes
(:mod:`gradcode.master.liveness`), partition serialisations (:mod:`gradcode.master.loading`) and the rounds' late
streams. The loop runs supervised by it: a crash of any of them while the job trains fails the job with that error
(``internal error: <task> crashed: ...``) instead of leaving it to hang or to fail later for another reason; the
crash of a late stream or of a partition serialisation (whose LoadJob gets the error) is only logged, as is one
after the loop has ended. When the job ends the owner cancels and awaits what is left: no task outlives its job.

A code with a topology (a CodedReduce tree) is run the same way: the master asks only the code's own
workers (the first layer) and decodes with the code's decoder; what happens below is the parents'
business, except that a parent names the children that lost the job (they restarted) and the
master reloads them (:mod:`gradcode.master.rounds`), so every node of the tree stays in the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import Observation
from gradcode.common.exceptions import JobFailedError, TaskCrashedError
from gradcode.common.gather.round import Decoded, Round
from gradcode.common.ops.logs import set_log_context
from gradcode.common.ops.metrics import job_state_label
from gradcode.common.tasks import TaskOwner
from gradcode.common.training.models import TrainingMetrics, training_metrics
from gradcode.common.transport.shared_memory import DEFAULT_ROOT, SharedDirectory
from gradcode.master import reporting
from gradcode.master.checkpoint import Checkpoint
from gradcode.master.loading import WorkerLoader
from gradcode.master.optimizer import Optimizer, make_optimizer
from gradcode.master.pool import WorkerPool
from gradcode.master.reporting import History, iteration_report
from gradcode.master.rounds import RoundPolicy
from gradcode.master.spec import JobPlan
from gradcode.master.step import stepped, verify_error
from gradcode.v1 import master_pb2

__all__ = ["DEFAULT_CHECKPOINT_EVERY", "JobRunner"]

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_EVERY = 10
"""Iterations between checkpoints (a master option); a restarted master loses at most this many."""

_TERMINAL = (master_pb2.JOB_STATE_SUCCEEDED, master_pb2.JOB_STATE_FAILED, master_pb2.JOB_STATE_CANCELLED)


class JobRunner:
    """Runs one planned job against the pool; watchers get every IterationReport."""

    def __init__(
        self,
        plan: JobPlan,
        pool: WorkerPool,
        *,
        run_dir: Path | None = None,
        state_dir: Path | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        resume: Checkpoint | None = None,
        shared_memory: Path | None = DEFAULT_ROOT,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"Argument 'checkpoint_every' must be >= 1, not {checkpoint_every!r}.")
        self.plan = plan
        self.pool = pool
        self.state: int = master_pb2.JOB_STATE_PENDING
        self.message = "waiting for workers"
        self.history: list[master_pb2.IterationReport] = []
        self.iterations_done = 0
        self.tasks = TaskOwner(f"job {plan.job_id}")
        """Holds every background task of the job (module docstring, "Background tasks")."""
        self.loader = WorkerLoader(plan, pool, tasks=self.tasks)
        self.shared_memory = shared_memory
        """Where the job makes its shared-memory directory for workers on this host (None: no shared memory)."""
        self.rounds = RoundPolicy(self.loader, pool, tasks=self.tasks)
        self.history_file = History(run_dir, plan.job_id)
        spec = plan.spec
        self.state_dir = state_dir
        self.checkpoint_every = checkpoint_every
        self.resumed_from = resume
        """The checkpoint this runner goes on from (None for a new job)."""
        if resume is None:
            self.optimizer: Optimizer = make_optimizer(
                spec.optimizer.kind,
                plan.start_params(),
                learning_rate=spec.optimizer.learning_rate,
                momentum=spec.optimizer.momentum,
            )
        else:
            params = resume.optimizer.params
            if resume.optimizer.kind != spec.optimizer.kind or params.shape != (plan.model.num_params,):
                raise ValueError(
                    f"Checkpoint of job {resume.job_id!r} holds a {resume.optimizer.kind!r} optimizer over "
                    f"{params.size} parameters; the job needs {spec.optimizer.kind!r} over {plan.model.num_params}."
                )
            self.optimizer = copy.copy(resume.optimizer)  # steps rebind its arrays, never write into them
            self.iterations_done = resume.iteration
        self.finished_at: float | None = None
        """time.monotonic() when the job reached its final state (None while it runs)."""
        self._observation: Observation | None = None if resume is None else resume.observation
        self._suspended = False
        self._saving = asyncio.Lock()
        self._saves: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0
        self._outbox: deque[_Outgoing] = deque()
        """Committed iterations whose reports are not published yet (an evaluation ahead of them runs)."""
        self._flushing = asyncio.Lock()
        self._publishing: asyncio.Task[bool] | None = None
        """The publish running beside the next round (:meth:`_publish_beside`), kept until the loop sees it done."""
        self._stopped = asyncio.Event()
        """Set when a report has ended the job (its last iteration, or a reached target)."""
        self._gathering: asyncio.Task[Any] | None = None
        """The loop's task while it gathers an iteration (:meth:`_unless_stopped`)."""
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
        return self.checkpoint().model_reply()

    def start(self, owner: TaskOwner, on_done: Callable[[JobRunner], None] | None = None) -> None:
        """Run the job in the background, as a task of ``owner`` (the master's); ``on_done(self)`` is called as soon
        as it has reached its final state. The job ends every failure of its own in a final state, so a crash of
        its task (in its clean-up) is only logged by the owner."""
        if self._task is None:
            self._task = owner.spawn(self._run(), name=f"job-{self.job_id}", fatal=False)
            self._on_done = on_done

    def suspend(self) -> None:
        """Stop because the master shuts down: the job ends here, but its checkpoint stays resumable."""
        self._suspended = True
        if self._task is not None and not self.done:
            self._task.cancel()

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
            if self.resumed_from is None:
                self.history_file.open(self.plan.spec)
            else:
                self.history.extend(self.history_file.resume(self.plan.spec, self.iterations_done))
            await self.loader.select()
            if self.shared_memory is not None:
                self.loader.shared = SharedDirectory.create(self.shared_memory)
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "loading workers")
            self._started = time.perf_counter()
            await self.loader.load_all()
            await self._set_state(master_pb2.JOB_STATE_RUNNING, "running")
            await self.tasks.supervise(self._loop(), name=f"job-{self.job_id}-loop")
        except asyncio.CancelledError:
            await self._drain()  # the last committed iteration's report still goes out
            if not self.done:
                why = "cancelled"
                if self._suspended:
                    why = "stopped with the master" + (" (resumable from its checkpoint)" if self.state_dir else "")
                await self._set_state(master_pb2.JOB_STATE_CANCELLED, f"{why} after {self.iterations_done} iterations")
        except JobFailedError as exc:
            if not await self._drain():  # unless the previous iteration already ended the job
                if exc.report is not None:
                    exc.report.state = master_pb2.JOB_STATE_FAILED
                    exc.report.message = str(exc)
                    await self._publish(exc.report)
                await self._set_state(master_pb2.JOB_STATE_FAILED, str(exc))
        except TaskCrashedError as exc:  # (its owner logged it, with the task's traceback)
            await self._set_state(master_pb2.JOB_STATE_FAILED, f"internal error: {exc}")
        except Exception as exc:
            log.exception("job %s crashed", self.job_id)
            await self._set_state(master_pb2.JOB_STATE_FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            await self._publishes_done()
            await self._final_checkpoint()
            await self.rounds.close()
            await self.tasks.close()
            await self.loader.end()
            self.plan = self.loader.plan  # without its samples now
            self.history_file.close()

    async def _loop(self) -> None:
        """Gather, decode, commit and report each iteration; evaluations run beside it (see the module docstring)."""
        last = self.plan.spec.iterations
        if self.iterations_done >= last:  # resumed from a checkpoint of its last iteration
            await self._set_state(master_pb2.JOB_STATE_SUCCEEDED, f"completed {self.iterations_done} iterations")
            return
        for t in range(self.iterations_done + 1, last + 1):
            gathered = await self._unless_stopped(t)
            if gathered is None:
                return  # an evaluation reached the target while iteration t gathered
            report, params = self._commit(t, gathered)
            outgoing = _Outgoing(report)
            if t % self.plan.evaluate_every == 0 or t == last:
                outgoing.snapshot = (copy.copy(self.optimizer), t)  # a snapshot: steps rebind, never mutate
                outgoing.evaluation = self.tasks.spawn(
                    self._evaluate(outgoing, params), name=f"job-{self.job_id}-evaluate-{t}"
                )
            self._outbox.append(outgoing)
            if t % self.checkpoint_every == 0 and t < last:
                self._checkpoint_beside()
            if t < last:
                self._publish_beside()
            elif await self._flush():
                return
        while self._outbox and not self.done:  # the last evaluation(s) still running
            await asyncio.wait({o.evaluation for o in self._outbox if o.evaluation is not None})
            await self._flush()

    async def _unless_stopped(self, t: int) -> _Gathered | None:
        """Iteration ``t``'s gather, unless the job ends meanwhile (an evaluation reached the target).

        The gather runs in this task, so its result goes to the step without a hop through the event
        loop (each hop ran the late workers' stream teardown first: 0.5 ms median, 2 ms p90 of the time
        from the last needed message to the step); an evaluation that ends the job cancels it
        (:meth:`_end_gather`).
        """
        task = asyncio.current_task()
        self._gathering = task
        try:
            return await self._iteration(t)
        except asyncio.CancelledError:
            if self._stopped.is_set() and task is not None and task.uncancel() == 0:
                return None  # only the evaluation's cancel: the job has ended, this iteration is dropped
            raise
        finally:
            self._gathering = None

    def _end_gather(self) -> None:
        """Cancel the gather running in the loop task, if any (the job has just ended)."""
        if self._gathering is not None and self._gathering is not asyncio.current_task():
            self._gathering.cancel()

    async def _evaluate(self, outgoing: _Outgoing, params: np.ndarray[Any, Any]) -> None:
        outgoing.result = await asyncio.to_thread(reporting.evaluate, self.plan, params)
        outgoing.report.test_accuracy = outgoing.result.test_accuracy
        await self._flush()

    def _publish_beside(self) -> None:
        """Publish the committed reports once the next round has asked its workers (a task: it runs at the round's
        first wait), so the next iteration never waits for the history file and the watchers. One still running
        publishes this report too (it flushes to the end of the outbox). A publish that fails fails the job (its
        crash reaches the loop through :attr:`tasks`), as a publish in the loop itself would."""
        previous = self._publishing
        if previous is not None and not previous.done():
            return
        self._publishing = self.tasks.spawn(self._flush(), name=f"job-{self.job_id}-publish")

    async def _publishes_done(self) -> None:
        """Wait for the publish still running beside the loop (on the way out; its failure is logged by
        :attr:`tasks`)."""
        task, self._publishing = self._publishing, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})

    async def _flush(self) -> bool:
        """Publish the reports at the head of the outbox whose evaluation is done, in iteration order.

        Returns True when the job has ended with one of them (the last iteration, or a target reached:
        then the model goes back to that iteration's snapshot and the later iterations are dropped).
        """
        async with self._flushing:
            spec = self.plan.spec
            while self._outbox and not self.done:
                head = self._outbox[0]
                if head.evaluation is not None and head.result is None:
                    return False
                self._outbox.popleft()
                report = head.report
                reached = head.result is not None and 0 < spec.target_accuracy <= head.result.score
                if not reached and report.iteration < spec.iterations:
                    report.state = master_pb2.JOB_STATE_RUNNING
                    await self._publish(report)
                    continue
                if reached and head.snapshot is not None:
                    self.optimizer, self.iterations_done = head.snapshot
                for dropped in self._outbox:
                    if dropped.evaluation is not None:
                        dropped.evaluation.cancel()
                self._outbox.clear()
                report.state = master_pb2.JOB_STATE_SUCCEEDED
                report.message = (
                    f"reached target accuracy {spec.target_accuracy:g} after {report.iteration} iterations "
                    f"(held-out accuracy evaluated every {self.plan.evaluate_every})"
                    if reached
                    else f"completed {report.iteration} iterations"
                ) + self._inexact_summary(report)
                self.state, self.message = report.state, report.message
                self._stopped.set()
                self._end_gather()
                await self._publish(report)
                self._ended()
                return True
            return self.done

    def _inexact_summary(self, last: master_pb2.IterationReport) -> str:
        """``"; K not exact (J unchecked ...)"`` over this run's reports and ``last`` (empty when all were exact): a
        user who asked for integrity is never told "completed" alone about gradients nobody checked."""
        reports = {r.iteration: r for r in self.history} | {last.iteration: last}
        inexact = [r for r in reports.values() if not r.exact]
        if not inexact:
            return ""
        unchecked = sum(1 for r in inexact if r.unchecked_workers)
        detail = f", {unchecked} of them unchecked by the consistency checks" if unchecked else ""
        return f"; {len(inexact)} of {len(reports)} iterations not exact{detail}"

    async def _drain(self) -> bool:
        """On the way out (cancel or failure): publish what was committed, evaluations included; never raises.

        True when one of those reports ended the job (it reached its target or was the last)."""
        try:
            running = {o.evaluation for o in self._outbox if o.evaluation is not None}
            if running:
                await asyncio.shield(asyncio.wait(running))
            for o in self._outbox:  # an evaluation that failed or was cancelled: report without it
                if o.evaluation is not None and o.result is None:
                    o.evaluation = None
            return await asyncio.shield(self._flush())
        except asyncio.CancelledError:  # cancelled again while draining: give up on those reports
            return self.done
        except Exception:
            log.exception("job %s: the reports after iteration %d failed", self.job_id, self.iterations_done)
            return self.done

    # ---- one iteration -----------------------------------------------------------------------------
    async def _iteration(self, t: int) -> _Gathered:
        """Gather, decode and verify iteration ``t``; nothing is committed here."""
        set_log_context(iteration=t)  # this task's log lines name the iteration (the job id is inherited)
        started = time.perf_counter()
        code = self.plan.code
        assignment = code.assign(self._observation) if code.dynamic else code.static_assignment()
        point = self.optimizer.point  # never written into: a step rebinds the optimizer's arrays
        round_ = await self.rounds.run(t, assignment, point, started=started, job_started=self._started)
        decoded = round_.decode()
        plan = self.plan
        training = training_metrics(plan.model, decoded.vector, point, plan.dataset.y_train, l2=plan.spec.model.l2)
        error = await verify_error(plan, t, point, decoded, training.gradient, self._pool_ids())
        asked = [w for w in range(code.n) if assignment.rows[w]]
        return _Gathered(round_, decoded, training, asked, point, error, self.rounds.start_slack)

    def _commit(self, t: int, it: _Gathered) -> tuple[master_pb2.IterationReport, np.ndarray[Any, Any]]:
        """Step and record iteration ``t`` as done, together (no await in between, so a cancel sees both or
        neither). Returns the report (metrics still NaN) and the new parameters."""
        self.optimizer, params = stepped(self.optimizer, self.plan, t, it.point, it.training.gradient)
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
            training=it.training, start_slack_seconds=it.start_slack,
        )  # fmt: skip
        return report, params

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, state: str = "running") -> Checkpoint:
        """The job as committed now (the optimizer is replaced, never mutated, by a step: no copy needed)."""
        return Checkpoint(
            spec=self.plan.spec,
            iteration=self.iterations_done,
            optimizer=self.optimizer,
            observation=self._observation,
            state=state,
        )

    def _checkpoint_beside(self) -> None:
        """Save a checkpoint of the committed state in a thread while training goes on (saves keep their order)."""
        if self.state_dir is None:
            return
        task = self.tasks.spawn(
            self._save(self.checkpoint()), name=f"job-{self.job_id}-checkpoint-{self.iterations_done}"
        )
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    async def _save(self, checkpoint: Checkpoint) -> None:
        assert self.state_dir is not None
        async with self._saving:
            try:
                await asyncio.to_thread(checkpoint.save, self.state_dir)
            except OSError as exc:
                log.error("job %s: checkpoint of iteration %d not saved: %s", self.job_id, checkpoint.iteration, exc)
            else:
                log.debug("job %s: checkpoint of iteration %d saved", self.job_id, checkpoint.iteration)

    async def _final_checkpoint(self) -> None:
        """The last checkpoint, after the pending ones: ``running`` when suspended, else the final state."""
        if self.state_dir is None:
            return
        state = "running" if self._suspended or not self.done else job_state_label(self.state)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(asyncio.gather(*self._saves, return_exceptions=True))
            await asyncio.shield(self._save(self.checkpoint(state)))

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
    training: TrainingMetrics
    """The decode's gradient part and what its statistics say about the training set."""
    asked: list[int]
    """Worker indices that had rows this iteration."""
    point: np.ndarray[Any, Any]
    verify_error: float
    start_slack: float
    """How long the round waited past its expected workers' beginnings before pulling held backups (0: none held)."""


@dataclass(eq=False)
class _Outgoing:
    """A committed iteration's report on its way out: published once its evaluation (if any) is done."""

    report: master_pb2.IterationReport
    evaluation: asyncio.Task[None] | None = None
    result: reporting.Evaluation | None = None
    snapshot: tuple[Optimizer, int] | None = None
    """The optimizer and iteration count right after this (evaluated) iteration, to end the job at it."""
