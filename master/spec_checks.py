"""Checks of a JobSpec's caller-chosen numbers and strings, before any planning.

Every float a caller sends (in ``code.params``, ``extra``, the straggler parameters and the scalar
fields) must be finite: a NaN or an infinity is refused here with a message naming the field, instead
of surfacing later as an internal error or a NaN model. Strings are bounded, and error texts echo at
most a short prefix of them (:func:`gradcode.common.transport.security.short`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from google.protobuf import struct_pb2

from gradcode.common.exceptions import GradcodeError
from gradcode.common.transport.security import short
from gradcode.common.transport.wire import MAX_JOB_ID_CHARS
from gradcode.v1 import master_pb2

__all__ = ["MAX_JOB_ID_CHARS", "MAX_STRUCT_VALUES", "SpecCheckError", "check_job_id", "check_spec_numbers"]

MAX_STRUCT_VALUES = 100_000
"""Numbers a Struct field (code.params, extra, straggler.params) may hold in all."""


class SpecCheckError(GradcodeError, ValueError):
    """A JobSpec field is not acceptable; the message names it."""


def check_job_id(job_id: str) -> None:
    """A job id is at most MAX_JOB_ID_CHARS printable characters."""
    if len(job_id) > MAX_JOB_ID_CHARS or not job_id.isprintable():
        raise SpecCheckError(f"Job id {short(job_id)} must be at most {MAX_JOB_ID_CHARS} printable characters.")


def _numbers(value: struct_pb2.Value, path: str) -> Iterator[tuple[str, float]]:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        yield path, value.number_value
    elif kind == "list_value":
        for i, item in enumerate(value.list_value.values):
            yield from _numbers(item, f"{path}[{i}]")
    elif kind == "struct_value":
        yield from _struct_numbers(value.struct_value, path)


def _struct_numbers(struct: struct_pb2.Struct, path: str) -> Iterator[tuple[str, float]]:
    for key, item in struct.fields.items():
        plain = key.isidentifier() and len(key) <= 32
        yield from _numbers(item, f"{path}.{key}" if plain else f"{path}[{short(key, 32)}]")


def check_struct_finite(struct: struct_pb2.Struct, path: str) -> None:
    """Every number in ``struct`` (nested lists and structs too) is finite, and there are not too many."""
    for count, (where, number) in enumerate(_struct_numbers(struct, path), start=1):
        if count > MAX_STRUCT_VALUES:
            raise SpecCheckError(f"{path} holds more than {MAX_STRUCT_VALUES} numbers.")
        if not math.isfinite(number):
            raise SpecCheckError(f"{where} is {number}; every number in {path} must be finite.")


_SCALARS: tuple[tuple[str, Any], ...] = (
    ("JobSpec.target_accuracy", lambda s: s.target_accuracy),
    ("JobSpec.iteration_deadline_seconds", lambda s: s.iteration_deadline_seconds),
    ("JobSpec.wait_for_workers_seconds", lambda s: s.wait_for_workers_seconds),
    ("JobSpec.model.l2", lambda s: s.model.l2),
    ("JobSpec.dataset.test_fraction", lambda s: s.dataset.test_fraction),
    ("JobSpec.optimizer.learning_rate", lambda s: s.optimizer.learning_rate),
    ("JobSpec.optimizer.momentum", lambda s: s.optimizer.momentum),
)


def check_spec_numbers(spec: master_pb2.JobSpec) -> None:
    """Refuse NaN/inf anywhere a caller can put a float, and an over-long job id (SpecCheckError)."""
    check_job_id(spec.job_id)
    for name, get in _SCALARS:
        value = float(get(spec))
        if not math.isfinite(value):
            raise SpecCheckError(f"{name} is {value}; it must be a finite number.")
    check_struct_finite(spec.code.params, "JobSpec.code.params")
    check_struct_finite(spec.extra, "JobSpec.extra")
    check_struct_finite(spec.straggler.params, "JobSpec.straggler.params")
