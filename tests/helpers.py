"""Helpers shared across test areas (tests/worker, tests/e2e, ...)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from gradcode.common.models import make_model, message_length
from gradcode.common.session import serve_session
from gradcode.common.wire import message_chunks, struct_from_dict
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc


def fixed_delay(seconds: float, *, seed: int = 7, **params: Any) -> common_pb2.StragglerSpec:
    """A ``fixed`` straggler spec: ``seconds`` of delay, plus any other parameter of the model (``workers``, ...)."""
    return common_pb2.StragglerSpec(
        model="fixed", params=struct_from_dict({"delay_seconds": seconds, **params}), seed=seed
    )


Mangle = Callable[[worker_pb2.GradientChunk], None]


class HostileWorker(worker_pb2_grpc.WorkerServicer):
    """Accepts any job, then answers every Compute at once with a well-formed message of ``value`` s,
    its chunks altered by ``mangle`` (or ``extra_elements`` too long): a worker that lies on the wire."""

    def __init__(self, mangle: Mangle = lambda chunk: None, extra_elements: int = 0, *, value: float = 0.0) -> None:
        self.mangle = mangle
        self.extra_elements = extra_elements
        self.value = value
        self.num_params = 0
        self.computes = 0

    async def LoadJob(self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], context: Any) -> Any:  # noqa: N802
        async for chunk in request_iterator:
            if chunk.HasField("setup"):
                setup = chunk.setup
        spec = setup.model
        model = make_model(spec.kind, num_features=spec.num_features, num_classes=spec.num_classes)
        self.length = message_length(model, statistics=setup.append_statistics)
        return worker_pb2.LoadJobReply(job_id=setup.job_id, worker_id=setup.worker_id)

    async def Compute(self, request: worker_pb2.ComputeRequest, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for chunk in self._chunks(request):
            yield worker_pb2.GradientChunk.FromString(chunk)  # the generated handlers serialize messages

    async def Session(self, requests: AsyncIterator[worker_pb2.ComputeRequest], context: Any) -> None:  # noqa: N802
        """The master's Computes on one stream (:func:`gradcode.common.session.serve_session`), lying alike."""

        async def write(chunk: bytes) -> None:
            await context.write(worker_pb2.GradientChunk.FromString(chunk))

        await serve_session(requests, write, self._chunks, asyncio.Event())

    async def _chunks(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[bytes]:
        self.computes += 1
        vector = np.full(self.length + self.extra_elements, self.value)
        for chunk in message_chunks(
            vector, job_id=request.job_id, iteration=request.iteration, worker_id=request.worker_id,
            row=request.rows[0], request_id=request.request_id, final=True,
        ):  # fmt: skip
            self.mangle(chunk)
            yield chunk.SerializeToString()

    async def EndJob(self, request: worker_pb2.EndJobRequest, context: Any) -> Any:  # noqa: N802
        return worker_pb2.EndJobReply()

    async def Hello(self, request: worker_pb2.HelloRequest, context: Any) -> Any:  # noqa: N802 - admission check
        return worker_pb2.HelloReply()
