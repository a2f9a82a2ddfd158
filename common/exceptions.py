"""Every error gradcode raises on purpose, in one tree.

    GradcodeError                      base of every gradcode-specific error
    ├── NotDecodableError              the messages received so far do not determine the full gradient
    ├── NumericallyUnsafeError         (also ValueError) a code whose decode error would exceed the bound
    ├── WireError                      (also ValueError) a message on the wire does not fit what the
    │                                  receiver expects (gRPC: INVALID_ARGUMENT)
    ├── JobSpecError                   (also ValueError) a job spec is malformed or refused; CreateJob
    │                                  answers INVALID_ARGUMENT
    ├── JobSetupError                  (also ValueError) a worker's JobSetup or partition data is
    │                                  invalid; LoadJob answers INVALID_ARGUMENT
    ├── JobFailedError                 (also RuntimeError) a job cannot go on (master) or ended FAILED or
    │                                  CANCELLED (client); the message says why
    ├── ComputeCancelledError          a worker's computation was abandoned (a later iteration started,
    │                                  or its job ended or was replaced); Compute answers ABORTED
    ├── ChildrenUnavailableError       a tree parent's children that answered are not decodable;
    │                                  Compute answers UNAVAILABLE
    ├── TaskCrashedError               (also RuntimeError) a background task of a node or job crashed
    │                                  (:mod:`gradcode.common.tasks`); its cause is the task's exception
    └── RequestError                   a call is refused; each subclass is one gRPC status:
        ├── InvalidRequestError        (also ValueError) INVALID_ARGUMENT
        ├── NotFoundError              (also LookupError) NOT_FOUND: an unknown or evicted job
        ├── AlreadyExistsError         ALREADY_EXISTS: a job id in use
        ├── FailedPreconditionError    FAILED_PRECONDITION: e.g. too few workers up
        ├── AbortedError               ABORTED: e.g. an iteration older than one already started
        ├── PermissionDeniedError      PERMISSION_DENIED: e.g. a removed worker registering again
        └── ResourceExhaustedError     RESOURCE_EXHAUSTED: out of memory, a full pool, a worker's budget

Errors that belong to one module are defined beside the code that raises them, in the same tree (a test walks
every module to hold it): ``PluginError`` (training.plugins), ``LinkClosedError`` and ``LinkRefusedError``
(transport.link, also ConnectionError), ``ExposedError`` (transport.security), ``CallError`` and
``SessionProtocolError`` (transport.session), ``SpecCheckError`` (master.spec_checks), ``CheckpointError``
(master.checkpoint), the pool's refusals (master.pool, under ``RequestError``) and ``TestbedUnavailableError``
(bench.testbed). ``except GradcodeError`` catches every refusal gradcode means, and nothing else.

Invalid parameters of library calls raise plain ``ValueError`` (or ``KeyError`` for an unknown
message/scheme name) with a message that says what would be valid. The gRPC status each error maps
to on the wire is decided in one place, :mod:`gradcode.common.transport.status`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "ChildrenUnavailableError",
    "ComputeCancelledError",
    "FailedPreconditionError",
    "GradcodeError",
    "InvalidRequestError",
    "JobFailedError",
    "JobSetupError",
    "JobSpecError",
    "NotDecodableError",
    "NotFoundError",
    "NumericallyUnsafeError",
    "PermissionDeniedError",
    "RequestError",
    "ResourceExhaustedError",
    "TaskCrashedError",
    "WireError",
]


class GradcodeError(Exception):
    """Base class of gradcode's own errors."""


class NotDecodableError(GradcodeError):
    """Raised when decoding coefficients are asked for before the received messages suffice."""


class NumericallyUnsafeError(GradcodeError, ValueError):
    """Raised when a code's measured worst-case decode error exceeds the configured bound.

    ``measured_error`` carries the worst relative decode error that was measured, when known.
    """

    def __init__(self, message: str, *, measured_error: float | None = None) -> None:
        super().__init__(message)
        self.measured_error = measured_error


class WireError(GradcodeError, ValueError):
    """A message on the wire does not match what the receiver expects."""


class JobSpecError(GradcodeError, ValueError):
    """The job spec is malformed or refused by the library (CreateJob answers INVALID_ARGUMENT)."""


class JobSetupError(GradcodeError, ValueError):
    """A JobSetup or its partition data is invalid; the message says what and what would be valid."""


class JobFailedError(GradcodeError, RuntimeError):
    """The job cannot go on, or ended FAILED or CANCELLED; the message says why.

    On the master ``report`` is the IterationReport of the iteration that failed, when there is one.
    """

    def __init__(self, message: str, report: Any | None = None) -> None:
        super().__init__(message)
        self.report = report


class TaskCrashedError(GradcodeError, RuntimeError):
    """A background task of a node or a job crashed (:class:`gradcode.common.tasks.TaskOwner`); ``task`` is its
    name, the exception's cause the task's own exception."""

    def __init__(self, message: str, *, task: str) -> None:
        super().__init__(message)
        self.task = task


class ComputeCancelledError(GradcodeError):
    """The iteration was cancelled (the flag was set) before its messages were complete."""


class ChildrenUnavailableError(GradcodeError):
    """Not enough children answered (in time) to decode their sum; the message names the missing ones.

    ``children_lost`` are the children that answered NOT_FOUND (they lost the job: the master reloads them).
    """

    def __init__(self, message: str, *, children_lost: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.children_lost = children_lost


class RequestError(GradcodeError):
    """A gRPC call is refused; the subclass says with which status, the message says why."""


class InvalidRequestError(RequestError, ValueError):
    """The request is malformed (INVALID_ARGUMENT)."""


class NotFoundError(RequestError, LookupError):
    """The request names something unknown, e.g. a job (NOT_FOUND)."""


class AlreadyExistsError(RequestError):
    """The request would create something that exists, e.g. a job id in use (ALREADY_EXISTS)."""


class FailedPreconditionError(RequestError):
    """The request cannot be served in the current state, e.g. too few workers (FAILED_PRECONDITION)."""


class AbortedError(RequestError):
    """The request was overtaken, e.g. a newer iteration started (ABORTED)."""


class PermissionDeniedError(RequestError):
    """The caller is known but may not do this, e.g. a removed worker registering again (PERMISSION_DENIED)."""


class ResourceExhaustedError(RequestError):
    """Serving the request ran out of a resource, e.g. memory (RESOURCE_EXHAUSTED)."""
