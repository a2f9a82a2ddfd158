"""Errors raised by gradcode.

    GradcodeError                      base of every gradcode-specific error
    ├── NotDecodableError              the messages received so far do not determine the full gradient
    └── NumericallyUnsafeError         (also a ValueError) a code whose decode error would exceed the bound

Invalid parameters raise plain ``ValueError`` (or ``KeyError`` for an unknown message/scheme name)
with a message that says what would be valid.
"""

from __future__ import annotations

__all__ = ["GradcodeError", "NotDecodableError", "NumericallyUnsafeError"]


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
