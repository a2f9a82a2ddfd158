"""Logging set-up every gradcode process shares: plain text or JSON lines, with the job and iteration.

Whoever runs a job or an iteration says so once with :func:`log_context` (or :func:`set_log_context`
at the top of a task or a gRPC handler); every record logged in that context, by any module, then
carries ``job_id`` and ``iteration``. The values live in :mod:`contextvars`, so each asyncio task
(and each gRPC call, which runs in its own task) sees its own, and a task inherits the values its
creator had when it was created — set the job id before creating the job's iteration tasks::

    with log_context(job_id=plan.job_id):
        ...  # every line logged here, and in tasks created here, names the job
        with log_context(iteration=t):
            log.info("decoded")  # {"message": "decoded", "job_id": "job-1", "iteration": 7, ...}

``configure_logging(level, "json")`` writes one JSON object per line on stderr (python-json-logger),
with ``level``, ``logger``, ``message``, ``job_id``/``iteration`` where known, and ``time`` (ISO 8601, UTC);
``"text"`` is the human format, with ``[job-1 it 7]`` where known.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

__all__ = [
    "LOG_FORMATS",
    "ContextFilter",
    "configure_logging",
    "current_iteration",
    "current_job_id",
    "log_context",
    "set_log_context",
]

LOG_FORMATS = ("text", "json")

_JOB_ID: ContextVar[str | None] = ContextVar("gradcode_job_id", default=None)
_ITERATION: ContextVar[int | None] = ContextVar("gradcode_iteration", default=None)


class _Keep(enum.Enum):
    """An argument left out: keep the current value."""

    KEEP = enum.auto()


KEEP = _Keep.KEEP


def current_job_id() -> str | None:
    """The job id the current context runs for, if any."""
    return _JOB_ID.get()


def current_iteration() -> int | None:
    """The iteration the current context runs, if any."""
    return _ITERATION.get()


def _set(job_id: str | _Keep | None, iteration: int | _Keep | None) -> list[Callable[[], None]]:
    """Set what is given; return the undo of each change."""
    undo: list[Callable[[], None]] = []
    if job_id is not KEEP:
        job_token = _JOB_ID.set(None if job_id is None else str(job_id))
        undo.append(lambda: _JOB_ID.reset(job_token))
    if iteration is not KEEP:
        iteration_token = _ITERATION.set(None if iteration is None else int(iteration))
        undo.append(lambda: _ITERATION.reset(iteration_token))
    return undo


def set_log_context(*, job_id: str | _Keep | None = KEEP, iteration: int | _Keep | None = KEEP) -> None:
    """Set the job id and/or iteration for the rest of the current task (a gRPC handler, a job's task).

    An argument left out keeps its value; ``None`` clears it. Use :func:`log_context` where a block,
    not the whole task, runs for the job or iteration.
    """
    _set(job_id, iteration)


@contextlib.contextmanager
def log_context(*, job_id: str | _Keep | None = KEEP, iteration: int | _Keep | None = KEEP) -> Iterator[None]:
    """Within the block, log records carry ``job_id`` / ``iteration`` (the previous values come back after)."""
    undo = _set(job_id, iteration)
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


class ContextFilter(logging.Filter):
    """Adds ``job_id`` and ``iteration`` (None where unknown) to every record, and ``context``: the text
    ``[job-1 it 7] `` for the human format (empty where neither is known)."""

    def filter(self, record: logging.LogRecord) -> bool:
        job_id = getattr(record, "job_id", None) or _JOB_ID.get()
        iteration = getattr(record, "iteration", None)
        if iteration is None:
            iteration = _ITERATION.get()
        record.job_id = job_id
        record.iteration = iteration
        parts = [p for p in (job_id, None if iteration is None else f"it {iteration}") if p]
        record.context = f"[{' '.join(parts)}] " if parts else ""
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(context)s%(message)s"


class _JsonFormatter(JsonFormatter):
    """JSON lines; ``job_id``/``iteration`` appear only where known, ``context`` (for text) never."""

    def process_log_record(self, log_data: dict[str, object]) -> dict[str, object]:
        log_data.pop("context", None)
        for key in ("job_id", "iteration"):
            if log_data.get(key) is None:
                log_data.pop(key, None)
        return log_data


def json_formatter() -> logging.Formatter:
    return _JsonFormatter(
        "{levelname}{name}{message}{job_id}{iteration}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",  # ISO 8601 in UTC, from the record's creation time
    )


def configure_logging(level: str | int = "INFO", log_format: str = "text", *, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) as ``log_format`` ("text" or "json") from ``level`` on.

    Replaces the root logger's handlers, so calling it again switches format.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"Log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}.")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
