"""What a job tells its watchers: IterationReports, their metrics, and the history file.

Worker ids in reports are the pool's ids (as in ListWorkers). A report is built from the iteration's
:class:`~gradcode.common.round.Round` (:func:`iteration_report`, or :func:`failure_report` when the
iteration could not be decoded) with its metrics still NaN; :func:`metrics` computes the
full-training-set loss and accuracies (in a thread, off the critical path). :class:`History` appends
every report to ``<run_dir>/<job_id>.jsonl`` (flushed every iteration, so a crash never loses what
was measured) next to the normalised spec, ``<job_id>.spec.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from google.protobuf.json_format import MessageToDict

from gradcode.common.models import Model
from gradcode.common.round import Decoded, Round
from gradcode.master.spec import JobPlan
from gradcode.v1 import master_pb2

__all__ = ["History", "failure_report", "iteration_report", "metrics", "regularised_loss", "score"]


def regularised_loss(
    model: Model, params: np.ndarray[Any, Any], X: np.ndarray[Any, Any], y: np.ndarray[Any, Any], l2: float
) -> float:
    """The objective the optimizer minimises: mean loss plus ``l2 / 2 * ||params||^2``."""
    return model.loss(params, X, y) / max(len(y), 1) + 0.5 * l2 * float(params @ params)


def metrics(plan: JobPlan, params: np.ndarray[Any, Any]) -> tuple[float, float, float]:
    """(regularised training loss, training accuracy, test accuracy or NaN without a test split)."""
    ds, model, l2 = plan.dataset, plan.model, plan.spec.model.l2
    loss = regularised_loss(model, params, ds.X_train, ds.y_train, l2)
    train = model.accuracy(params, ds.X_train, ds.y_train)
    test = model.accuracy(params, ds.X_test, ds.y_test) if len(ds.y_test) else math.nan
    return loss, train, test


def score(report: master_pb2.IterationReport) -> float:
    """Test accuracy, or train accuracy when the dataset has no test split."""
    return report.train_accuracy if math.isnan(report.test_accuracy) else report.test_accuracy


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
) -> master_pb2.IterationReport:
    """The report of a decoded iteration (metrics NaN); ``asked`` are the worker indices it had rows for."""
    nan = math.nan
    finished = round_.finished
    return master_pb2.IterationReport(
        job_id=job_id,
        iteration=t,
        loss=nan,
        train_accuracy=nan,
        test_accuracy=nan,
        wall_seconds=wall_seconds,
        elapsed_seconds=elapsed_seconds,
        decode_seconds=decoded.decode_seconds,
        used_workers=sorted(pool_ids[w] for w in decoded.used_workers),
        late_workers=sorted(pool_ids[w] for w in round_.late),
        failed_workers=sorted(pool_ids[w] for w in round_.failed if w not in finished and w in asked),
        timings=[master_pb2.WorkerTiming(worker_id=pool_ids[w], seconds=s) for w, s in sorted(finished.items())],
        exact=decoded.exact,
        verify_error=verify_error,
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
        late_workers=sorted(pool_ids[w] for w in round_.late),
        failed_workers=sorted(pool_ids[w] for w in round_.failed),
        timings=[master_pb2.WorkerTiming(worker_id=pool_ids[w], seconds=s) for w, s in round_.finished.items()],
        exact=exact,
        verify_error=-1.0,
    )


class History:
    """The job's history file (none without a run directory): the spec once, then one JSON line per report."""

    def __init__(self, run_dir: Path | None, job_id: str) -> None:
        self.path = None if run_dir is None else Path(run_dir) / f"{job_id}.jsonl"
        self._file: TextIO | None = None

    def open(self, spec: master_pb2.JobSpec) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(MessageToDict(spec, preserving_proto_field_name=True), indent=2))
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, report: master_pb2.IterationReport) -> None:
        if self._file is not None:
            row = MessageToDict(report, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
