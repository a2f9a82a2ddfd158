"""``gradcode worker`` as a real subprocess: the ready line, LoadJob + Compute, health, reflection, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gradcode.client.launch import ServiceProcess, service_env
from gradcode.common.codes import make_code
from gradcode.common.gather.round import WorkerFailure
from gradcode.common.transport.session import ChunkStream, Session
from gradcode.common.transport.wire import CHANNEL_OPTIONS, MessageAssembler, model_request_bytes, tensor_from_array
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from tests.helpers import fixed_delay
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

pytestmark = pytest.mark.e2e

START_TIMEOUT = 30.0
TEST_TIMEOUT = 15.0


@pytest.fixture(scope="module")
def worker_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    argv = [sys.executable, "-m", "gradcode", "worker", "--listen", "127.0.0.1:0"]
    argv += ["--log-level", "WARNING", "--grace", "1"]
    env = service_env()
    env.pop("GRADCODE_MASTER", None)
    proc = ServiceProcess(argv, log_path=tmp_path_factory.mktemp("worker") / "worker.log", env=env)
    try:
        proc.wait_ready(START_TIMEOUT)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def channel(worker_process: ServiceProcess) -> AsyncIterator[grpc.aio.Channel]:
    assert worker_process.address is not None
    async with grpc.aio.insecure_channel(worker_process.address, options=CHANNEL_OPTIONS) as ch:
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


def test_sigterm_exits_cleanly(worker_process: ServiceProcess) -> None:
    """Runs last in this module: the worker stops gracefully with status 0."""
    worker_process.process.send_signal(signal.SIGTERM)
    try:
        status = worker_process.process.wait(TEST_TIMEOUT)
    except subprocess.TimeoutExpired:
        worker_process.kill()
        pytest.fail("worker did not exit within 15 s of SIGTERM")
    worker_process.stop()  # collects the rest of its output
    output = worker_process.log_path.read_text()
    assert status == 0, output
    assert "Traceback" not in output, output


async def test_a_killed_worker_fails_the_request_on_its_session_and_breaks_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SIGKILL while a request sleeps on the worker's Session: the request fails as a Compute call would
    (UNAVAILABLE: the master marks the worker DOWN), and the session is broken, so the next one is new."""
    argv = [sys.executable, "-m", "gradcode", "worker", "--listen", "127.0.0.1:0", "--log-level", "WARNING"]
    env = service_env()
    env.pop("GRADCODE_MASTER", None)
    proc = ServiceProcess(argv, log_path=tmp_path_factory.mktemp("killed") / "worker.log", env=env)
    try:
        address = proc.wait_ready(START_TIMEOUT)
        async with asyncio.timeout(TEST_TIMEOUT), grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
            code = make_code("cyclic", n=3, s=1)
            setup = job_setup(code, 0, straggler=fixed_delay(60.0))
            await worker_pb2_grpc.WorkerStub(ch).LoadJob(
                iter(load_chunks(setup, data_for(code, 0, make_partitions(3))))
            )
            session = Session.on(ch)
            head = worker_pb2.ComputeRequest(job_id="job", iteration=0, worker_id=0, rows=[0])
            stream = session.compute(head, model_request_bytes(random_params()))
            pending = asyncio.create_task(_drain(stream))
            await asyncio.sleep(0.5)  # the request is in its 60 s straggler sleep
            assert not pending.done()
            proc.process.send_signal(signal.SIGKILL)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await pending
            assert WorkerFailure.from_exception(failed.value).status is grpc.StatusCode.UNAVAILABLE
            assert session.broken
    finally:
        proc.stop()


async def _drain(stream: ChunkStream) -> None:
    async for _ in stream:
        pass
