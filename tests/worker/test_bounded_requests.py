"""Every request a worker serves is bounded and answered (issue 25), on a real WorkerNode on loopback: iteration
numbers beyond the job's length are refused, and every malformed Session message -- wrong order, missing fields,
unknown ids, duplicates, oversized, not a ComputeRequest at all -- gets a status with a precise message within a
bounded time, over gRPC and over a link, while the worker keeps serving."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.transport.link import open_link
from gradcode.common.transport.security import Security
from gradcode.common.transport.session import MAX_SESSION_REQUESTS, Session
from gradcode.common.transport.wire import (
    CHANNEL_OPTIONS,
    MAX_ITERATIONS,
    MAX_JOB_ID_CHARS,
    MAX_MESSAGE_BYTES,
    SESSION_METHOD,
    model_request_bytes,
    parse_chunk,
    tensor_from_array,
)
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from gradcode.worker.node import WorkerNode
from tests.helpers import fixed_delay
from tests.worker.conftest import data_for, expected_message, job_setup, load_chunks, make_partitions, random_params
from tests.worker.test_session import _assert_close as assert_close
from tests.worker.test_session import _messages as session_messages

TIMEOUT = 30.0
ANSWER_SECONDS = 10.0
"""Every request is answered within this long after the last one was sent."""
CYCLIC = make_code("cyclic", n=3, s=1)
ROWS = tuple(CYCLIC.static_assignment().rows[0])
LENGTH = 5
"""JobSetup.iterations of the job the tests load."""
INVALID, CANCELLED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.CANCELLED
CODES = {code.value[0]: code for code in grpc.StatusCode}


@pytest.fixture
async def node() -> AsyncIterator[WorkerNode]:
    async with WorkerNode(grace=0.2) as served:
        yield served


@pytest.fixture
async def channel(node: WorkerNode) -> AsyncIterator[grpc.aio.Channel]:
    async with Security().channel(node.address, options=CHANNEL_OPTIONS) as opened:
        yield opened


async def _load(channel: grpc.aio.Channel, *, iterations: int = LENGTH, delay: float = 0.0) -> dict[int, Any]:
    partitions = make_partitions(3)
    setup = job_setup(CYCLIC, 0, straggler=fixed_delay(delay) if delay else None)
    setup.iterations = iterations
    stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]

    async def chunks() -> AsyncIterator[worker_pb2.LoadJobChunk]:
        for chunk in load_chunks(setup, data_for(CYCLIC, 0, partitions)):
            yield chunk

    await stub.LoadJob(chunks())
    return partitions


def _compute(iteration: int, request_id: int = 0, **fields: Any) -> bytes:
    values: dict[str, Any] = {"job_id": "job", "worker_id": 0, "rows": list(ROWS), **fields}
    head = worker_pb2.ComputeRequest(request_id=request_id, iteration=iteration, **values)
    return head.SerializeToString() + model_request_bytes(random_params())


async def _compute_status(stub: Any, iteration: int) -> tuple[grpc.StatusCode, str]:
    try:
        async for _ in stub.Compute(worker_pb2.ComputeRequest.FromString(_compute(iteration))):
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


# ---- iteration numbers -------------------------------------------------------------------------------------------
async def test_an_iteration_beyond_the_jobs_length_is_refused_and_later_iterations_still_run(
    channel: grpc.aio.Channel,
) -> None:
    """Iteration 2^64 - 1 was accepted, after which every real iteration of the job was refused as older."""
    async with asyncio.timeout(TIMEOUT):
        await _load(channel)
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        for beyond in (2**64 - 1, MAX_ITERATIONS + 1, LENGTH + 1):
            code, details = await _compute_status(stub, beyond)
            assert code is INVALID, (beyond, code, details)
            assert f"iteration {beyond} is beyond job 'job''s last iteration, {LENGTH}" in details
        for iteration in range(1, LENGTH + 1):  # every real one runs
            assert await _compute_status(stub, iteration) == (grpc.StatusCode.OK, "")


async def test_a_job_loaded_without_its_length_is_bounded_by_the_wire_limit(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(TIMEOUT):
        await _load(channel, iterations=0)  # an older master's setup
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        code, details = await _compute_status(stub, 2**64 - 1)
        assert code is INVALID and f"last iteration, {MAX_ITERATIONS}" in details
        assert await _compute_status(stub, 2) == (grpc.StatusCode.OK, "")
        refused = job_setup(CYCLIC, 0)
        refused.iterations = MAX_ITERATIONS + 1
        with pytest.raises(grpc.aio.AioRpcError) as load:
            await stub.LoadJob(_iterate(load_chunks(refused, data_for(CYCLIC, 0, make_partitions(3)))))
        assert load.value.code() is INVALID and f"at most {MAX_ITERATIONS} iterations" in (load.value.details() or "")


async def test_a_job_id_longer_than_the_wire_limit_is_refused_before_it_is_kept(
    node: WorkerNode, channel: grpc.aio.Channel
) -> None:
    async with asyncio.timeout(TIMEOUT):
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        setup = job_setup(CYCLIC, 0, job_id="j" * (1 << 20))
        with pytest.raises(grpc.aio.AioRpcError) as load:
            await stub.LoadJob(_iterate(load_chunks(setup, data_for(CYCLIC, 0, make_partitions(3)))))
        details = load.value.details() or ""
        assert load.value.code() is INVALID and f"a job id may have at most {MAX_JOB_ID_CHARS}" in details
        assert len(details) < 300 and not node.servicer.jobs


async def _iterate(items: list[worker_pb2.LoadJobChunk]) -> AsyncIterator[worker_pb2.LoadJobChunk]:
    for item in items:
        yield item


# ---- malformed Session messages ----------------------------------------------------------------------------------
class RawSession:
    """A Worker.Session call written as raw bytes, its answers collected by request id as they arrive."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        method = channel.stream_stream(SESSION_METHOD, request_serializer=bytes, response_deserializer=parse_chunk)
        self.call: Any = method()
        self.statuses: dict[int, list[worker_pb2.CallStatus]] = {}
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self.call:
                if chunk.meta.HasField("status"):
                    self.statuses.setdefault(chunk.meta.request_id, []).append(chunk.meta.status)
        except grpc.aio.AioRpcError:
            pass  # the call's own status: ``await self.call.code()``

    async def answered(self, request_ids: set[int]) -> None:
        """Wait until each of ``request_ids`` has a status (at most ANSWER_SECONDS)."""
        async with asyncio.timeout(ANSWER_SECONDS):
            while missing := request_ids - self.statuses.keys():
                if self.reader.done():
                    raise AssertionError(f"the session ended ({self.reader}) before answering {sorted(missing)}")
                await asyncio.sleep(0.02)


def _model(kind: str) -> bytes:
    params = random_params()
    if kind == "wrong length":
        params = params[:-1]
    elif kind == "nan":
        params = params.copy()
        params[3] = np.nan
    elif kind == "float32":
        return worker_pb2.ComputeRequest(model=tensor_from_array(params.astype(np.float32))).SerializeToString()
    elif kind == "none":
        return b""
    return model_request_bytes(params)


def _fuzzed(rng: random.Random, request_id: int, used: list[int]) -> bytes:
    """One Session message of a random shape: a computation with some fields wrong or missing, or a cancel or
    promote of a running, finished, unknown or zero id, well-formed or not. (No deferred backup: it waits for a
    promotion by design.)"""
    if rng.random() < 0.3:
        target = rng.choice([request_id, 0, *(used[-3:] or [1])])
        control = worker_pb2.ComputeRequest(request_id=target)
        flags = rng.choice(["cancel", "promote", "both"])
        control.cancel = flags in ("cancel", "both")
        control.promote = flags in ("promote", "both")
        if rng.random() < 0.3:
            control.job_id, control.iteration = "job", 1
        return control.SerializeToString()
    head = worker_pb2.ComputeRequest(
        request_id=rng.choice([request_id] * 6 + [0, *(used[-2:] or [request_id])]),
        job_id=rng.choice(["job"] * 5 + ["nope", "", "j" * 300]),
        worker_id=rng.choice([0] * 5 + [7, 2**32 - 1]),
        rows=rng.choice([list(ROWS)] * 4 + [[], [5], [ROWS[0], ROWS[0]], [2**32 - 1]]),
        iteration=rng.choice([rng.randint(0, LENGTH)] * 5 + [2**64 - 1, MAX_ITERATIONS + 1, LENGTH + 1]),
        backup=rng.random() < 0.2,
        report_start=rng.random() < 0.3,
    )
    return head.SerializeToString() + _model(rng.choice(["valid"] * 5 + ["wrong length", "nan", "float32", "none"]))


async def test_every_malformed_session_message_is_answered_with_a_status_and_the_worker_stays_healthy(
    node: WorkerNode, channel: grpc.aio.Channel
) -> None:
    """400 messages of random shapes on one Session (seeded): each id sent gets a status within ANSWER_SECONDS,
    never UNKNOWN and never without a message when not OK; the stream stays open, and the worker then computes
    exactly."""
    async with asyncio.timeout(TIMEOUT):
        partitions = await _load(channel)
        raw = RawSession(channel)
        rng, used = random.Random(25), []
        for request_id in range(1, 401):
            message = _fuzzed(rng, request_id, used)
            await raw.call.write(message)
            used.append(worker_pb2.ComputeRequest.FromString(message).request_id)
            if rng.random() < 0.1:
                await asyncio.sleep(0.005)  # some requests run, end or are cancelled in between
        await raw.answered(set(used))
        statuses = [status for answers in raw.statuses.values() for status in answers]
        codes = {CODES[status.code] for status in statuses}
        assert codes >= {grpc.StatusCode.OK, INVALID, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}
        assert codes <= {  # (ABORTED: an older iteration; CANCELLED: as timing has it) and never UNKNOWN
            grpc.StatusCode.OK, INVALID, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.ABORTED, CANCELLED,
        }, codes  # fmt: skip
        assert all(status.details for status in statuses if status.code != 0)
        assert not raw.reader.done()  # the stream stays open

        await raw.call.write(_compute(LENGTH, request_id=10_000))  # the same stream still computes
        await raw.answered({10_000})
        assert [s.code for s in raw.statuses[10_000]] == [0]
        raw.call.cancel()
        session = Session.on(channel)  # and so does a new one, exactly
        try:
            params = random_params(seed=3)
            head = worker_pb2.ComputeRequest(job_id="job", worker_id=0, rows=list(ROWS), iteration=LENGTH)
            messages = await session_messages(session.compute(head, model_request_bytes(params)), head)
            for row in ROWS:
                assert_close(messages[row], expected_message(CYCLIC, row, params, partitions))
        finally:
            session.close()
        runtime = node.servicer.jobs["job"]
        while runtime.active:  # nothing left running
            await asyncio.sleep(0.02)


SHAPES: list[tuple[str, Callable[[], list[bytes]], dict[int, tuple[grpc.StatusCode, str]]]] = [
    ("empty message", lambda: [b""], {0: (INVALID, "is 0 or already used")}),
    ("id 0", lambda: [_compute(1)], {0: (INVALID, "is 0 or already used")}),
    ("cancel before its request", lambda: [_cancel(3), _compute(1, 3)], {3: (INVALID, "which this session never ran")}),
    ("promote of an unknown id", lambda: [_promote(9)], {9: (INVALID, "which this session never ran")}),
    ("cancel of id 0", lambda: [_cancel(0)], {0: (INVALID, "names request id 0")}),
    ("cancel and promote", lambda: [_control(4, cancel=True, promote=True)], {4: (INVALID, "sets both cancel and")}),
    ("cancel with a job", lambda: [_control(5, cancel=True, job_id="job")], {5: (INVALID, "carries fields of a")}),
    ("unknown job", lambda: [_compute(1, 6, job_id="nope")], {6: (grpc.StatusCode.NOT_FOUND, "Unknown job 'nope'")}),
    ("no model", lambda: [_control(7, job_id="job", rows=[0])], {7: (INVALID, "The model must be DTYPE_FLOAT64")}),
    ("iteration 2^64-1", lambda: [_compute(2**64 - 1, 8)], {8: (INVALID, "is beyond job 'job''s last iteration")}),
    ("a running request cancelled", lambda: [_compute(1, 10), _cancel(10)], {10: (CANCELLED, "cancelled by the")}),
]


def _control(request_id: int, **fields: Any) -> bytes:
    return worker_pb2.ComputeRequest(request_id=request_id, **fields).SerializeToString()


def _cancel(request_id: int) -> bytes:
    return _control(request_id, cancel=True)


def _promote(request_id: int) -> bytes:
    return _control(request_id, promote=True)


@pytest.mark.parametrize(("case", "messages", "answers"), SHAPES, ids=[shape[0] for shape in SHAPES])
async def test_each_malformed_session_shape_gets_its_precise_status(
    channel: grpc.aio.Channel,
    case: str,
    messages: Callable[[], list[bytes]],
    answers: dict[int, tuple[grpc.StatusCode, str]],
) -> None:
    async with asyncio.timeout(TIMEOUT):
        await _load(channel, delay=30.0 if case == "a running request cancelled" else 0.0)
        raw = RawSession(channel)
        for message in messages():
            await raw.call.write(message)
        await raw.answered(set(answers))
        for request_id, (code, fragment) in answers.items():
            first = raw.statuses[request_id][0]
            assert (CODES[first.code], fragment in first.details) == (code, True), (case, first)
        raw.call.cancel()


async def test_too_many_requests_running_on_one_session_are_refused_until_some_end(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(TIMEOUT):
        await _load(channel, delay=30.0)  # every request sleeps: they all run at once
        raw = RawSession(channel)
        over = range(MAX_SESSION_REQUESTS + 1, MAX_SESSION_REQUESTS + 4)
        for request_id in range(1, over.stop):
            await raw.call.write(_compute(1, request_id))
        await raw.answered(set(over))
        assert all(raw.statuses[r][0].code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] for r in over)
        assert f"{MAX_SESSION_REQUESTS} requests already run on this session" in raw.statuses[over[0]][0].details
        assert len(raw.statuses) == len(over)  # the others still run
        await raw.call.write(_cancel(1))
        await raw.call.write(_compute(1, over.stop))  # room for one again
        await raw.call.write(_cancel(over.stop))
        await raw.answered({1, over.stop})
        assert [CODES[raw.statuses[r][0].code] for r in (1, over.stop)] == [CANCELLED, CANCELLED]
        raw.call.cancel()


async def test_a_message_that_is_not_a_compute_request_ends_the_session_with_invalid_argument(
    channel: grpc.aio.Channel, node: WorkerNode
) -> None:
    """Over gRPC the call ends with the status; over a link it comes in band (request 0's) and the link closes.
    Either way the worker goes on serving."""
    async with asyncio.timeout(TIMEOUT):
        await _load(channel)
        raw = RawSession(channel)
        await raw.call.write(b"\xff\xff\xff\xff")
        await asyncio.wait({raw.reader})
        assert await raw.call.code() is INVALID
        assert "not a ComputeRequest" in (await raw.call.details() or "")

        link = await open_link(channel, node.address, Security(), 5.0)
        await link.write(b"\xff\xff\xff\xff")
        chunks = link.__aiter__()
        status = (await anext(chunks)).meta
        assert (status.request_id, CODES[status.status.code]) == (0, INVALID)
        assert "not a ComputeRequest" in status.status.details
        with pytest.raises(Exception) as closed:
            await anext(chunks)
        assert getattr(closed.value, "code", None) is grpc.StatusCode.UNAVAILABLE

        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        assert await _compute_status(stub, 1) == (grpc.StatusCode.OK, "")


async def test_an_oversized_session_message_ends_the_call_resource_exhausted(node: WorkerNode) -> None:
    async with asyncio.timeout(TIMEOUT):
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        async with Security().channel(node.address, options=options) as channel:
            await _load(channel)
            raw = RawSession(channel)
            oversized = worker_pb2.ComputeRequest(
                request_id=1, job_id="job", model=common_pb2.Tensor(data=bytes(MAX_MESSAGE_BYTES + 1))
            )
            await raw.call.write(oversized.SerializeToString())
            await asyncio.wait({raw.reader})
            assert await raw.call.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            assert await _compute_status(stub, 1) == (grpc.StatusCode.OK, "")
