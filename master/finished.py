"""A job that finished under an earlier master, as a restarted master holds it (issue 30).

A master started on a state directory finds there the checkpoints of the jobs it ran before, and in its run
directory their histories. The running ones it resumes (:meth:`MasterServicer.resume_saved
<gradcode.master.service.MasterServicer.resume_saved>`); a finished one it holds as a :class:`FinishedJob`, so
that ``gradcode jobs`` lists it, ``gradcode watch`` replays its history and ``gradcode model`` returns its
parameters, as before the restart. It answers the calls the servicer makes of a job, and is already done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from gradcode.master.checkpoint import Checkpoint
from gradcode.master.reporting import read_history
from gradcode.v1 import master_pb2

__all__ = ["FINAL_STATES", "FinishedJob"]

FINAL_STATES = {
    "succeeded": master_pb2.JOB_STATE_SUCCEEDED,
    "failed": master_pb2.JOB_STATE_FAILED,
    "cancelled": master_pb2.JOB_STATE_CANCELLED,
}
"""A checkpoint's final state (:attr:`Checkpoint.state`) and the job state it stands for."""


def _reports(path: Path) -> list[master_pb2.IterationReport]:
    return [report for _, report in read_history(path)]


class FinishedJob:
    """A finished job restored from its checkpoint and its history file (None: the master keeps no history)."""

    done = True

    def __init__(self, checkpoint: Checkpoint, history: Path | None, finished_at: float) -> None:
        if checkpoint.state not in FINAL_STATES:
            raise ValueError(
                f"Checkpoint of job {checkpoint.job_id!r} says {checkpoint.state!r}: a finished job is one of "
                f"{sorted(FINAL_STATES)}."
            )
        self.checkpoint = checkpoint
        self.history = history
        self.finished_at = finished_at
        """When it finished, on the checkpoint file's clock (orders it among the jobs the master evicts)."""

    @property
    def job_id(self) -> str:
        return self.checkpoint.job_id

    def info(self) -> master_pb2.JobInfo:
        return master_pb2.JobInfo(
            job_id=self.job_id,
            state=FINAL_STATES[self.checkpoint.state],
            message=f"{self.checkpoint.state} under an earlier master (restored from its checkpoint)",
            iterations_done=self.checkpoint.iteration,
            spec=self.checkpoint.spec,
        )

    def model_reply(self) -> master_pb2.ModelReply:
        return self.checkpoint.model_reply()

    async def watch(self) -> AsyncIterator[master_pb2.IterationReport]:
        """Its history's reports (none without a history file), read in a thread."""
        if self.history is None or not self.history.exists():
            return
        for report in await asyncio.to_thread(_reports, self.history):
            yield report

    async def cancel(self) -> None:
        """Nothing to cancel: it has ended."""

    async def wait(self) -> None:
        """It has ended."""

    def suspend(self) -> None:
        """Nothing runs."""
