"""The one place that maps gradcode's exceptions to gRPC status codes, and the decorator that applies it.

A servicer method decorated with :func:`grpc_errors` is only its logic: it raises an error of
:mod:`gradcode.common.exceptions` and the call ends with the status :data:`STATUS_CODES` gives that
error, with the error's message as details. Any other exception is left to gRPC (UNKNOWN) and logged
there, as before: only refusals the code means are mapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc

from gradcode.common.exceptions import (
    AbortedError,
    AlreadyExistsError,
    ChildrenUnavailableError,
    ComputeCancelledError,
    FailedPreconditionError,
    InvalidRequestError,
    JobSetupError,
    JobSpecError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    WireError,
)

__all__ = ["STATUS_CODES", "drain_untrusted", "grpc_errors", "status_code"]

logger = logging.getLogger(__name__)

STATUS_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (JobSpecError, grpc.StatusCode.INVALID_ARGUMENT),
    (JobSetupError, grpc.StatusCode.INVALID_ARGUMENT),
    (WireError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (AbortedError, grpc.StatusCode.ABORTED),
    (ComputeCancelledError, grpc.StatusCode.ABORTED),
    (ChildrenUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
)
"""Each error class and the status its calls end with (the first match wins)."""

_MAPPED = tuple(cls for cls, _ in STATUS_CODES)

F = TypeVar("F", bound=Callable[..., Any])


def status_code(exc: BaseException) -> grpc.StatusCode | None:
    """The status ``exc`` maps to, or None when it is not a refusal gradcode means."""
    for cls, code in STATUS_CODES:
        if isinstance(exc, cls):
            return code
    return None


async def _drain(requests: AsyncIterator[Any]) -> None:
    """Read, and drop, what a client-streaming call's client still sends, up to its half-close.

    A status sent while a grpc.aio client is still writing fails the write it has in flight, and when
    its event loop handles that failure after the status, grpcio's aio client reports INTERNAL
    ("Internal error from Core", debug 'Failed "execute_batch": (SendMessageOperation)') in place of
    the status the server sent (grpc/grpc#36066). A client that has half-closed has no write in flight,
    so a refusal sent after the drain always reaches it as sent.
    """
    async for _ in requests:
        pass


UNTRUSTED_DRAIN_MESSAGES = 8
"""Messages :func:`drain_untrusted` reads at most from a caller it is about to refuse."""
UNTRUSTED_DRAIN_SECONDS = 1.0
"""Seconds :func:`drain_untrusted` waits at most for such a caller's half-close."""


async def drain_untrusted(requests: AsyncIterator[Any]) -> None:
    """:func:`_drain` for a caller not authenticated: the same reason (a refusal that lands during a write reaches
    a grpc.aio client as INTERNAL), but at most :data:`UNTRUSTED_DRAIN_MESSAGES` messages and
    :data:`UNTRUSTED_DRAIN_SECONDS`, so a caller that streams without end costs the server that much and no more.
    A client that sends a few messages and half-closes, as every gradcode client does, sees its refusal as sent."""
    with contextlib.suppress(TimeoutError, grpc.RpcError, asyncio.InvalidStateError):
        async with asyncio.timeout(UNTRUSTED_DRAIN_SECONDS):
            read = 0
            async for _ in requests:
                read += 1
                if read >= UNTRUSTED_DRAIN_MESSAGES:
                    return


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    code = status_code(exc)
    assert code is not None
    logger.info("refusing call: %s: %s", code.name, exc)
    await context.abort(code, str(exc))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def grpc_errors(method: F) -> F:
    """End the call with the mapped status when the servicer method raises a gradcode refusal.

    Works for unary and client-streaming methods (coroutines) and server-streaming ones (async
    generators); the servicer method's signature is ``(self, request, context)``. A client-streaming
    call is refused only once its client has sent all it meant to (:func:`_drain`).
    """
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except _MAPPED as exc:
                await _abort(context, exc)

        return cast(F, stream)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(self, request, context)
        except _MAPPED as exc:
            if isinstance(request, AsyncIterator):  # client streaming: the request iterator
                await _drain(request)
            await _abort(context, exc)

    return cast(F, unary)
