"""The one exception-to-status table: every refusal class maps to its status, anything else to none."""

from __future__ import annotations

import grpc
import pytest

from gradcode.common import exceptions
from gradcode.common.transport.status import STATUS_CODES, status_code


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (exceptions.InvalidRequestError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (exceptions.JobSpecError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (exceptions.JobSetupError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (exceptions.WireError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (exceptions.NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (exceptions.AlreadyExistsError("x"), grpc.StatusCode.ALREADY_EXISTS),
        (exceptions.FailedPreconditionError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (exceptions.AbortedError("x"), grpc.StatusCode.ABORTED),
        (exceptions.ComputeCancelledError("x"), grpc.StatusCode.ABORTED),
        (exceptions.ChildrenUnavailableError("x"), grpc.StatusCode.UNAVAILABLE),
        (exceptions.ResourceExhaustedError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
def test_each_refusal_maps_to_its_status(error: Exception, code: grpc.StatusCode) -> None:
    assert status_code(error) == code


@pytest.mark.parametrize("error", [ValueError("bug"), KeyError("bug"), RuntimeError("bug"), MemoryError()])
def test_errors_gradcode_does_not_mean_are_left_to_grpc(error: Exception) -> None:
    assert status_code(error) is None


def test_every_error_is_in_the_gradcode_tree_and_every_mapped_class_is_an_error_of_it() -> None:
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), exceptions.GradcodeError), name
    for cls, _ in STATUS_CODES:
        assert issubclass(cls, exceptions.GradcodeError), cls
    assert str(exceptions.NotFoundError("Unknown job 'a'.")) == "Unknown job 'a'."  # no KeyError quoting
