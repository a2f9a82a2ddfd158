"""Helpers shared across test areas (tests/worker, tests/e2e, ...)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.training.models import make_model, message_length
from gradcode.common.transport.security import hello_proof, new_process_secret
from gradcode.common.transport.session import serve_session
from gradcode.common.transport.wire import message_chunks, struct_from_dict
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc


def fixed_delay(seconds: float, *, seed: int = 7, **params: Any) -> common_pb2.StragglerSpec:
    """A ``fixed`` straggler spec: ``seconds`` of delay, plus any other parameter of the model (``workers``, ...)."""
    return common_pb2.StragglerSpec(
        model="fixed", params=struct_from_dict({"delay_seconds": seconds, **params}), seed=seed
    )


_EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_DIRECTORY_VARIABLE = "GRADCODE_TEST_PORTS"


def free_port() -> int:
    """A loopback port nothing listens on now and no other test of this run was given, for a process started later.

    Chosen below the kernel's ephemeral range where there is one: ports handed out by ``bind(0)`` are the ones
    outgoing connections take too, and on a busy machine (the other test process's gRPC channels) one could
    take the port before the process that should listen there starts. A port free now may still be given to two
    tests of the run before either listens (the race that failed CI twice); each port is therefore reserved for the
    run with a file created exclusively in ``GRADCODE_TEST_PORTS`` (set by ``tests/conftest.py`` for every pytest
    process of the run).
    """
    try:
        first_ephemeral = int(_EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 0
    candidates = random.SystemRandom().sample(range(20000, first_ephemeral), 200) if first_ephemeral > 20200 else []
    for port in candidates:
        with contextlib.suppress(OSError):
            _bound_port(port)
            if _reserve(port):
                return port
    while True:
        port = _bound_port(0)
        if _reserve(port):
            return port


def _reserve(port: int) -> bool:
    """Claim ``port`` for this test run; False if another test of the run has it. Always True outside a run."""
    directory = os.environ.get(PORTS_DIRECTORY_VARIABLE)
    if not directory:
        return True
    try:
        os.close(os.open(Path(directory) / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _bound_port(port: int) -> int:
    """Bind ``port`` on loopback (0: any) and release it; OSError when it is taken."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        return int(s.getsockname()[1])


Mangle = Callable[[worker_pb2.GradientChunk], None]


class HostileWorker(worker_pb2_grpc.WorkerServicer):
    """Accepts any job, then answers every Compute (at once, or after ``delay`` seconds) with a well-formed message of
    ``value`` s, its chunks altered by ``mangle`` (or ``extra_elements`` too long): a worker that lies on the wire."""

    def __init__(
        self, mangle: Mangle = lambda chunk: None, extra_elements: int = 0, *, value: float = 0.0, delay: float = 0.0
    ) -> None:
        self.mangle = mangle
        self.extra_elements = extra_elements
        self.value = value
        self.delay = delay
        """Seconds it waits before answering each Compute (0: at once)."""
        self.num_params = 0
        self.computes = 0
        self.process_secret = new_process_secret()
        """What it registers with (RegisterWorkerRequest.process_secret), and proves in Hello."""

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
        """The master's Computes on one stream (:func:`gradcode.common.transport.session.serve_session`), lying
        alike."""

        async def write(chunk: bytes) -> None:
            await context.write(worker_pb2.GradientChunk.FromString(chunk))

        await serve_session(requests, write, self._chunks, asyncio.Event())

    async def _chunks(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[bytes]:
        self.computes += 1
        await asyncio.sleep(self.delay)
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
        return worker_pb2.HelloReply(proof=hello_proof(self.process_secret, request.nonce))
