"""What a job tells its watchers: IterationReports, their metrics, and the history file.

Worker ids in reports are the pool's ids (as in ListWorkers). A report is built from the iteration's
:class:`~gradcode.common.gather.round.Round` (:func:`iteration_report`, or :func:`failure_report` when the
iteration could not be decoded). Its training loss and accuracy come from the decode itself (the
workers append their partitions' summed loss and correct count to every message, which decode with
the gradient's coefficients: :func:`~gradcode.common.training.models.training_metrics`), so they are exact,
free, and describe the point the iteration's gradient was evaluated at (the parameters before the
step; Nesterov's look-ahead point). Nothing here touches the whole dataset per iteration:
:func:`evaluate` computes the held-out accuracy every ``evaluate_every`` iterations, in a thread,
beside training. :class:`History` appends
every report to ``<run_dir>/<job_id>.jsonl`` (flushed every iteration, so a crash never loses what
was measured) next to the normalised spec, ``<job_id>.spec.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from google.protobuf import json_format

from gradcode.common.gather.round import Decoded, Round
from gradcode.common.training.models import TrainingMetrics
from gradcode.common.transport.session import TRAFFIC
from gradcode.common.transport.wire import Timing, message_to_dict
from gradcode.master.spec import JobPlan
from gradcode.v1 import master_pb2

__all__ = ["Evaluation", "History", "evaluate", "failure_report", "iteration_report", "read_history"]


@dataclass(frozen=True)
class Evaluation:
    """The held-out view of one iteration's parameters (after its step)."""

    test_accuracy: float
    """Accuracy on the test split (NaN when the dataset has none)."""
    score: float
    """What a target accuracy is compared with: the test accuracy, or without a test split the
    accuracy over the whole training set."""


def evaluate(plan: JobPlan, params: np.ndarray[Any, Any]) -> Evaluation:
    """Held-out metrics of ``params``: one pass over the test split (or the training set without one)."""
    ds, model = plan.dataset, plan.model
    if len(ds.y_test):
        test = model.accuracy(params, ds.X_test, ds.y_test)
        return Evaluation(test_accuracy=test, score=test)
    return Evaluation(test_accuracy=math.nan, score=model.accuracy(params, ds.X_train, ds.y_train))


def iteration_report(
    job_id: str,
    t: int,
    round_: Round,
    decoded: Decoded,
    *,
    asked: list[int],
    pool_ids: list[int],
    wall_seconds: float,
    elapsed_seconds: float,
    verify_error: float,
    training: TrainingMetrics,
    start_slack_seconds: float = 0.0,
) -> master_pb2.IterationReport:
    """The report of a decoded iteration (test accuracy NaN until evaluated); ``asked`` are the worker
    indices it had rows for; ``training`` is what the decode says about the training set; ``start_slack_seconds``
    how long the round waited past its expected workers' beginnings before pulling held backups (0: none held)."""
    timings = round_.timings()
    return master_pb2.IterationReport(
        job_id=job_id,
        iteration=t,
        loss=training.loss,
        train_accuracy=training.accuracy,
        test_accuracy=math.nan,
        wall_seconds=wall_seconds,
        elapsed_seconds=elapsed_seconds,
        decode_seconds=decoded.decode_seconds,
        used_workers=sorted(pool_ids[w] for w in decoded.used_workers),
        failed_workers=sorted(pool_ids[w] for w in round_.failed if w not in timings and w in asked),
        timings=_worker_timings(timings, pool_ids),
        exact=decoded.exact,
        verify_error=verify_error,
        error_bound=decoded.error_bound,
        start_slack_seconds=start_slack_seconds,
        **_round_fields(round_, pool_ids),
    )


def failure_report(
    job_id: str, t: int, round_: Round, *, pool_ids: list[int], exact: bool, elapsed_seconds: float, wall_seconds: float
) -> master_pb2.IterationReport:
    """The report of an iteration that could not be decoded (metrics NaN)."""
    nan = math.nan
    return master_pb2.IterationReport(
        job_id=job_id,
        iteration=t,
        loss=nan,
        train_accuracy=nan,
        test_accuracy=nan,
        wall_seconds=wall_seconds,
        elapsed_seconds=elapsed_seconds,
        failed_workers=sorted(pool_ids[w] for w in round_.failed),
        timings=_worker_timings(round_.timings(), pool_ids),
        exact=exact,
        verify_error=-1.0,
        error_bound=-1.0,
        **_round_fields(round_, pool_ids),
    )


def _worker_timings(timings: Mapping[int, Timing], pool_ids: Sequence[int]) -> list[master_pb2.WorkerTiming]:
    """``timings`` by job worker index (a round's, or what a tree's first layer said of the nodes below it) as the
    report's WorkerTimings, by pool id."""
    return sorted(
        (t.message(master_pb2.WorkerTiming, pool_ids[w]) for w, t in timings.items()),
        key=lambda timing: timing.worker_id,
    )


def _round_fields(round_: Round, pool_ids: list[int]) -> dict[str, Any]:
    """Who was late, asked as a backup or promoted, what the consistency checks found, in the report's terms (pool
    ids), and the bytes the job's Computes carried for this iteration
    (:data:`~gradcode.common.transport.session.TRAFFIC`)."""
    integrity = round_.integrity
    child_timings: dict[int, Timing] = {}
    late_children: set[int] = set()
    for message in round_.messages.values():  # a tree's first layer: what each parent saw of the nodes below it
        child_timings.update((c, t) for c, t in message.subtree.timings if c < len(pool_ids))
        late_children.update(c for c in message.subtree.late if c < len(pool_ids))
    bytes_sent, bytes_received = TRAFFIC.take(round_.job_id, round_.iteration)
    return {
        "bytes_sent": bytes_sent,
        "bytes_received": bytes_received,
        "child_timings": _worker_timings(child_timings, pool_ids),
        "late_children": sorted(pool_ids[c] for c in late_children - child_timings.keys()),
        "late_workers": sorted(pool_ids[w] for w in round_.stragglers),
        "backup_workers": sorted(pool_ids[w] for w in round_.backups),
        "promoted_workers": sorted(pool_ids[w] for w in round_.promoted),
        "consistency_checks": integrity.checks,
        "suspect_workers": sorted(pool_ids[w] for w in integrity.suspects),
        "unchecked_workers": sorted(pool_ids[w] for w in integrity.unchecked),
        "integrity": integrity.note,
    }


def history_path(run_dir: Path, job_id: str) -> Path:
    """Where a job's history is written: ``<run_dir>/<job_id>.jsonl``."""
    return Path(run_dir) / f"{job_id}.jsonl"


def read_history(path: Path) -> Iterator[tuple[str, master_pb2.IterationReport]]:
    """Each line of a history file with its report, up to the first that does not parse (a line cut short by a
    crash: everything after it is lost anyway)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            report = json_format.ParseDict(json.loads(line), master_pb2.IterationReport())
        except (ValueError, json_format.ParseError):
            return
        yield line, report


class History:
    """The job's history file (none without a run directory): the spec once, then one JSON line per report."""

    def __init__(self, run_dir: Path | None, job_id: str) -> None:
        self.path = None if run_dir is None else history_path(run_dir, job_id)
        self._file: TextIO | None = None

    def open(self, spec: master_pb2.JobSpec) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(message_to_dict(spec), indent=2))
        self._file = self.path.open("a", encoding="utf-8")

    def resume(self, spec: master_pb2.JobSpec, upto: int) -> list[master_pb2.IterationReport]:
        """Go on with the history of a job resumed after iteration ``upto``: keep (and return) its reports up
        to ``upto``, drop the later ones (they are computed again), append from there. A master without
        the old file (another run directory) starts a fresh one."""
        if self.path is None:
            return []
        kept: list[master_pb2.IterationReport] = []
        lines: list[str] = []
        if self.path.exists():
            for line, report in read_history(self.path):
                if report.iteration > upto:
                    break
                kept.append(report)
                lines.append(line)
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            tmp.replace(self.path)
        self.open(spec)
        return kept

    def append(self, report: master_pb2.IterationReport) -> None:
        if self._file is not None:
            row = message_to_dict(report)
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
