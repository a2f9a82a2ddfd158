"""``python -m worker`` as a real subprocess: the ready line, LoadJob + Compute, health, reflection, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from common.codes import make_code
from common.serving import BLAS_THREAD_VARIABLES
from common.wire import CHANNEL_OPTIONS, MessageAssembler, tensor_from_array
from protos.gradcode.v1 import worker_pb2, worker_pb2_grpc
from tests.worker.conftest import (
    TOLERANCE,
    data_for,
    expected_message,
    job_setup,
    load_chunks,
    make_partitions,
    random_params,
    softmax_model,
)

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
TEST_TIMEOUT = 15.0


def _spawn() -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **dict.fromkeys(BLAS_THREAD_VARIABLES, "1")}
    env.pop("GRADCODE_MASTER", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "--listen", "127.0.0.1:0", "--log-level", "WARNING", "--grace", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = _readline(proc, START_TIMEOUT)
    prefix = "worker listening on "
    if not line.startswith(prefix):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"worker did not announce itself; first line {line!r}; stderr:\n{err}")
    return proc, line[len(prefix) :].strip()


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """First stdout line, or '' if none comes within ``timeout`` seconds (the process is killed then)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not lines:
        proc.kill()
        return ""
    return lines[0]


@pytest.fixture(scope="module")
def worker_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, address = _spawn()
    try:
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
async def channel(worker_process: tuple[subprocess.Popen[str], str]) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(worker_process[1], options=CHANNEL_OPTIONS) as ch:
        yield ch


async def test_load_and_compute_over_grpc(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        stub = worker_pb2_grpc.WorkerStub(channel)
        code = make_code("cyclic", n=4, s=1)
        partitions = make_partitions(code.k, samples=200)
        worker = 3

        async def chunks() -> AsyncIterator[worker_pb2.LoadJobChunk]:
            for c in load_chunks(job_setup(code, worker, job_id="proc"), data_for(code, worker, partitions)):
                yield c

        reply = await stub.LoadJob(chunks())
        assert list(reply.partitions) == list(code.partitions_of_worker(worker))
        theta = random_params()
        rows = code.static_assignment().rows[worker]
        request = worker_pb2.ComputeRequest(
            job_id="proc", iteration=0, worker_id=worker, model=tensor_from_array(theta), rows=list(rows)
        )
        assembler = MessageAssembler(
            job_id="proc", iteration=0, worker_id=worker, rows=tuple(rows), length=softmax_model().num_params
        )
        messages = {}
        async for chunk in stub.Compute(request):
            done = assembler.feed(chunk)
            if done is not None:
                messages[done.row] = done.vector
        for row in rows:
            want = expected_message(code, row, theta, partitions)
            np.testing.assert_allclose(messages[row], want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())
        await stub.EndJob(worker_pb2.EndJobRequest(job_id="proc"))


async def test_health_and_reflection_answer(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "gradcode.v1.Worker"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = set()
        async for response in reflection.ServerReflectionInfo(ask()):
            names |= {s.name for s in response.list_services_response.service}
        assert {"gradcode.v1.Worker", "grpc.health.v1.Health"} <= names


def test_sigterm_exits_cleanly(worker_process: tuple[subprocess.Popen[str], str]) -> None:
    """Runs last in this module: the worker stops gracefully with status 0."""
    proc, _ = worker_process
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=TEST_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("worker did not exit within 15 s of SIGTERM")
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
