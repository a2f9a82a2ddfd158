"""Helpers shared across test areas (tests/worker, tests/e2e, ...)."""

from __future__ import annotations

from typing import Any

from gradcode.common.wire import struct_from_dict
from gradcode.v1 import common_pb2


def fixed_delay(seconds: float, *, seed: int = 7, **params: Any) -> common_pb2.StragglerSpec:
    """A ``fixed`` straggler spec: ``seconds`` of delay, plus any other parameter of the model (``workers``, ...)."""
    return common_pb2.StragglerSpec(
        model="fixed", params=struct_from_dict({"delay_seconds": seconds, **params}), seed=seed
    )
