"""The Worker gRPC service on a real grpc.aio server on loopback: statuses, cancellation, the tree parent."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Array, GradientCode
from gradcode.common.training.models import message_length
from gradcode.common.transport.session import Session, SessionCompute
from gradcode.common.transport.shared_memory import SharedDirectory, accept
from gradcode.common.transport.wire import (
    CHANNEL_OPTIONS,
    MessageAssembler,
    Serialized,
    model_request_bytes,
    serialize_chunk,
    struct_from_dict,
    tensor_from_array,
)
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from gradcode.worker import runtime as runtime_module
from gradcode.worker.compute import ComputeCancelledError, build_job
from gradcode.worker.node import WorkerNode
from gradcode.worker.parent import ParentRunner
from gradcode.worker.runtime import JobRuntime
from gradcode.worker.service import WorkerServicer, _write_shared
from gradcode.worker.straggling import StragglerEmulation
from tests.helpers import fixed_delay
from tests.worker.conftest import (
    TOLERANCE,
    ServedWorker,
    data_for,
    expected_message,
    job_setup,
    load_chunks,
    make_partitions,
    partition_data,
    random_params,
    serve_worker,
    softmax_model,
    stop_worker,
)

TEST_TIMEOUT = 10.0
ANY_DTYPE = (np.dtype("<f8"), np.dtype("<c16"), np.dtype("<f4"))


@pytest.fixture
async def stub(served_worker: ServedWorker) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    async with grpc.aio.insecure_channel(served_worker.address, options=CHANNEL_OPTIONS) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


async def _load(stub: worker_pb2_grpc.WorkerStub, chunks: list[worker_pb2.LoadJobChunk]) -> worker_pb2.LoadJobReply:
    async def stream() -> AsyncIterator[worker_pb2.LoadJobChunk]:
        for c in chunks:
            yield c

    reply: worker_pb2.LoadJobReply = await stub.LoadJob(stream())
    return reply


def _request(
    job_id: str, worker_id: int, rows: tuple[int, ...], params: Array, iteration: int = 0
) -> worker_pb2.ComputeRequest:
    return worker_pb2.ComputeRequest(
        job_id=job_id, iteration=iteration, worker_id=worker_id, model=tensor_from_array(params), rows=list(rows)
    )


async def _compute(
    stub: worker_pb2_grpc.WorkerStub,
    request: worker_pb2.ComputeRequest,
    *,
    statistics: bool = False,
    subtree: frozenset[int] = frozenset(),
) -> tuple[dict[int, Array], list[worker_pb2.GradientChunk]]:
    """Run one Compute call and reassemble (and validate) its messages, as the master would a worker with the nodes
    ``subtree`` below it (a tree parent's children)."""
    return await _reassemble(stub.Compute(request), request, statistics=statistics, subtree=subtree)


async def _reassemble(
    chunks: AsyncIterable[Any],
    request: worker_pb2.ComputeRequest,
    *,
    statistics: bool = False,
    subtree: frozenset[int] = frozenset(),
) -> tuple[dict[int, Array], list[Any]]:
    """The messages of one Compute's ``chunks`` (a call's or a Session request's), validated, and their last chunks."""
    assembler = MessageAssembler(
        job_id=request.job_id, iteration=request.iteration, worker_id=request.worker_id, rows=tuple(request.rows),
        length=message_length(softmax_model(), statistics=statistics), dtypes=ANY_DTYPE, subtree=subtree,
    )  # fmt: skip
    messages: dict[int, Array] = {}
    trailers = []
    async for chunk in chunks:
        done = assembler.feed(chunk)
        if done is not None:
            messages[done.row] = done.vector
            trailers.append(chunk)
    assert assembler.complete
    return messages, trailers


async def _status(awaitable: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(awaitable, "__aiter__"):
            async for _ in awaitable:  # type: ignore[attr-defined]
                pass
        else:
            await awaitable  # type: ignore[misc]
    return info.value


def _assert_close(got: Array, want: Array) -> None:
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())


# ---- happy path ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "worker"),
    [
        pytest.param(make_code("cyclic", n=4, s=1), 2, id="cyclic"),
        pytest.param(make_code("reed_solomon", n=4, k=4, w=2), 1, id="reed_solomon-complex"),
    ],
)
async def test_load_and_compute_match_direct_gradient(
    stub: worker_pb2_grpc.WorkerStub, code: GradientCode, worker: int
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(code.k)
        reply = await _load(stub, load_chunks(job_setup(code, worker), data_for(code, worker, partitions)))
        assert reply.job_id == "job" and reply.worker_id == worker
        assert list(reply.partitions) == list(code.partitions_of_worker(worker))
        assert reply.bytes_received == sum(partitions[j][0].nbytes + partitions[j][1].nbytes for j in reply.partitions)
        theta = random_params()
        rows = code.static_assignment().rows[worker]
        for iteration in range(2):
            messages, trailers = await _compute(stub, _request("job", worker, rows, theta, iteration))
            for row in rows:
                _assert_close(messages[row], expected_message(code, row, theta, partitions))
            assert all(t.trailer.compute_seconds > 0 and t.trailer.straggle_seconds == 0 for t in trailers)
            model = softmax_model()  # each leaf message carries sum_j |b_j| ||g_j||, for the certificate
            for t in trailers:
                norms = [np.linalg.norm(model.gradient(theta, *partitions[j])) for j in code.support(t.row)]
                assert t.trailer.magnitude == pytest.approx(float(np.abs(code.coefficients(t.row)) @ norms), rel=1e-12)
            theta = theta * 0.5


async def test_rows_are_streamed_in_requested_order_with_straggle_reported(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("uncoded", n=1)
        setup = job_setup(code, 0, straggler=fixed_delay(0.4))
        del setup.rows[:]
        setup.rows.add(row=5, partitions=[0], coefficients_real=[2.0])
        setup.rows.add(row=9, partitions=[0], coefficients_real=[-1.0])
        partitions = make_partitions(1)
        await _load(stub, load_chunks(setup, partition_data(0, *partitions[0])))
        theta = random_params()
        messages, trailers = await _compute(stub, _request("job", 0, (9, 5), theta))
        assert [t.row for t in trailers] == [9, 5]
        # the delay is spread over the messages: half before each row, reported cumulatively
        assert [t.trailer.straggle_seconds for t in trailers] == pytest.approx([0.2, 0.4])
        # compute_seconds is each message's own computation: not the delay, not the rows before it
        assert all(0 < t.trailer.compute_seconds < 0.2 for t in trailers)
        g = softmax_model().gradient(theta, *partitions[0])
        _assert_close(messages[5], 2 * g)
        _assert_close(messages[9], -g)


# ---- refusals --------------------------------------------------------------------------------------


async def test_load_job_refusals_are_precise_and_server_keeps_serving(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        setup = job_setup(code, 0)
        good = data_for(code, 0, partitions)
        cases: list[tuple[list[worker_pb2.LoadJobChunk], str]] = [
            ([worker_pb2.LoadJobChunk(data=good[0])], "data for partition 0 before any setup"),
            ([], "ended without a setup chunk"),
            (
                [worker_pb2.LoadJobChunk(setup=setup), worker_pb2.LoadJobChunk(setup=setup)],
                "Chunk 1 is a second setup",
            ),
            (load_chunks(setup, [partition_data(2, *partitions[2])[0]]), "partition 2, which no row of this worker"),
            (load_chunks(setup, good[:-1]), "Partition 1 is incomplete"),
            ([worker_pb2.LoadJobChunk()], "Chunk 0 is empty"),
        ]
        inconsistent = worker_pb2.PartitionData()
        inconsistent.CopyFrom(good[1])
        inconsistent.num_samples = 3
        cases.append((load_chunks(setup, [good[0], inconsistent]), "num_samples=3, an earlier one 20"))
        bad_code = job_setup(code, 0)
        bad_code.parent.child_code.name = "nope"
        cases.append((load_chunks(bad_code, good), "ParentRole.child_code is invalid: Unknown gradient code 'nope'"))
        bad_straggler = job_setup(code, 0, straggler=common_pb2.StragglerSpec(model="slowpoke"))
        cases.append((load_chunks(bad_straggler, good), "straggler is invalid: Unknown delay model 'slowpoke'"))
        for chunks, expected in cases:
            error = await _status(_load(stub, chunks))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            assert expected in error.details(), error.details()
        reply = await _load(stub, load_chunks(setup, good))  # still serving
        assert list(reply.partitions) == [0, 1]


async def test_compute_refusals(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        await _load(stub, load_chunks(job_setup(code, 1, job_id="alpha"), data_for(code, 1, partitions)))
        theta = random_params()

        error = await _status(stub.Compute(_request("beta", 1, (1,), theta)))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "Unknown job 'beta' on this worker" in error.details()
        assert "alpha" not in error.details()  # never enumerates the other jobs

        error = await _status(stub.Compute(_request("alpha", 2, (1,), theta)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "worker 1 of job 'alpha'; the request is for worker 2" in error.details()

        error = await _status(stub.Compute(_request("alpha", 1, (1,), theta[:-3])))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has 18 parameters" in error.details() and "expects 21" in error.details()

        error = await _status(stub.Compute(_request("alpha", 1, (0, 1), theta)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Row(s) [0] were not given to worker 1" in error.details() and "it has rows [1]" in error.details()

        error = await _status(stub.Compute(_request("alpha", 1, (1,), theta.astype(np.float32))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "DTYPE_FLOAT64" in error.details()

        messages, _ = await _compute(stub, _request("alpha", 1, (1,), theta))  # still serving
        _assert_close(messages[1], expected_message(code, 1, theta, partitions))


async def test_load_replaces_job_and_end_job_forgets_it(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        await _load(stub, load_chunks(job_setup(code, 0), data_for(code, 0, partitions)))
        await _load(stub, load_chunks(job_setup(code, 2), data_for(code, 2, partitions)))  # same job id
        theta = random_params()
        error = await _status(stub.Compute(_request("job", 0, (0,), theta)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        messages, _ = await _compute(stub, _request("job", 2, (2,), theta))
        _assert_close(messages[2], expected_message(code, 2, theta, partitions))

        await stub.EndJob(worker_pb2.EndJobRequest(job_id="job"))
        error = await _status(stub.Compute(_request("job", 2, (2,), theta)))
        assert error.code() == grpc.StatusCode.NOT_FOUND and "load it with LoadJob first" in error.details()
        error = await _status(stub.EndJob(worker_pb2.EndJobRequest(job_id="job")))
        assert error.code() == grpc.StatusCode.NOT_FOUND


# ---- cancellation ----------------------------------------------------------------------------------


class _Gate:
    """Partition observer that holds the compute thread after its first partition until released."""

    def __init__(self) -> None:
        self.first = threading.Event()
        self.release = threading.Event()
        self.seen: list[tuple[int, int]] = []

    def __call__(self, job_id: str, iteration: int, partition: int) -> None:
        self.seen.append((iteration, partition))
        if iteration == 0 and not self.first.is_set():
            self.first.set()
            self.release.wait(TEST_TIMEOUT)


async def _wait_until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def _gated_worker(gate: _Gate) -> tuple[ServedWorker, GradientCode, dict[int, tuple[Array, Array]]]:
    served = await serve_worker(WorkerServicer(on_partition=gate))
    code = make_code("uncoded", n=1)  # one row over one partition; widen it to 6 partitions below
    return served, code, make_partitions(6)


def _wide_setup() -> worker_pb2.JobSetup:
    setup = job_setup(make_code("uncoded", n=1), 0)
    del setup.rows[:]
    setup.rows.add(row=0, partitions=list(range(6)), coefficients_real=[1.0] * 6)
    setup.num_partitions_sent = 6
    return setup


async def test_cancelled_call_stops_the_computation_and_next_iteration_starts_fresh() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        gate = _Gate()
        served, _, partitions = await _gated_worker(gate)
        try:
            async with grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                data = [c for j in range(6) for c in partition_data(j, *partitions[j])]
                await _load(stub, load_chunks(_wide_setup(), data))
                stats = served.servicer.jobs["job"].job.stats
                theta = random_params()

                call = stub.Compute(_request("job", 0, (0,), theta, iteration=0))
                reader = asyncio.create_task(call.read())
                await asyncio.to_thread(gate.first.wait, TEST_TIMEOUT)  # iteration 0 is inside its compute
                call.cancel()
                await _wait_until(lambda: stats.calls_cancelled == 1)  # the server saw the cancellation
                gate.release.set()
                await _wait_until(lambda: stats.iterations_cancelled == 1)  # and the thread stopped early
                assert [p for it, p in gate.seen if it == 0] == [0]  # 1 of 6 partitions computed
                with pytest.raises(asyncio.CancelledError):
                    await reader

                messages, _ = await _compute(stub, _request("job", 0, (0,), theta, iteration=1))
                want = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(6))
                _assert_close(messages[0], want)
                assert [p for it, p in gate.seen if it == 1] == list(range(6))
                assert stats.iterations_completed == 1 and stats.partitions_computed == 7
        finally:
            gate.release.set()
            await stop_worker(served)


async def test_later_iteration_supersedes_a_running_one() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        gate = _Gate()
        served, _, partitions = await _gated_worker(gate)
        try:
            async with grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                data = [c for j in range(6) for c in partition_data(j, *partitions[j])]
                await _load(stub, load_chunks(_wide_setup(), data))
                theta = random_params()
                old = asyncio.create_task(_status(stub.Compute(_request("job", 0, (0,), theta, iteration=0))))
                await asyncio.to_thread(gate.first.wait, TEST_TIMEOUT)
                newer = asyncio.create_task(_compute(stub, _request("job", 0, (0,), theta, iteration=1)))
                await _wait_until(lambda: any(it == 1 for it, _ in gate.seen))  # iteration 1 has started
                gate.release.set()
                error = await old
                assert error.code() == grpc.StatusCode.ABORTED
                assert "Iteration 0 of job 'job' was abandoned" in error.details()
                messages, _ = await newer
                want = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(6))
                _assert_close(messages[0], want)
        finally:
            gate.release.set()
            await stop_worker(served)


class _ThreadRecorder:
    """Partition observer recording, per iteration, whether the partition ran on the event loop's thread;
    each partition then takes at least ``sleep`` seconds of waiting and ``busy`` seconds of its thread's CPU."""

    def __init__(self, sleep: float = 0.0, busy: float = 0.0) -> None:
        self.loop_thread = threading.get_ident()
        self.sleep = sleep
        self.busy = busy
        self.on_loop: dict[int, set[bool]] = {}

    def __call__(self, job_id: str, iteration: int, partition: int) -> None:
        self.on_loop.setdefault(iteration, set()).add(threading.get_ident() == self.loop_thread)
        time.sleep(self.sleep)
        started = time.thread_time()
        while time.thread_time() - started < self.busy:
            pass


@pytest.mark.parametrize(
    ("message_threshold", "partition_threshold", "sleep", "busy", "inline_after_first"),
    [
        (60.0, 0.0, 0.0, 0.0, True),
        (runtime_module.INLINE_MESSAGE_SECONDS, 60.0, 0.005, 0.0, True),
        (runtime_module.INLINE_MESSAGE_SECONDS, 0.004, 0.0, 0.008, False),
        (runtime_module.INLINE_MESSAGE_SECONDS, 0.004, 0.008, 0.0, True),
    ],
    ids=[
        "short messages inline",
        "short partitions on the loop one at a time",
        "partitions of long CPU in a thread",
        "partitions of long wall time but short CPU on the loop",  # a partition waiting for a core, as on busy hosts
    ],
)
async def test_short_messages_are_computed_on_the_loop_after_the_first(
    monkeypatch: pytest.MonkeyPatch,
    message_threshold: float,
    partition_threshold: float,
    sleep: float,
    busy: float,
    inline_after_first: bool,
) -> None:
    monkeypatch.setattr(runtime_module, "INLINE_MESSAGE_SECONDS", message_threshold)
    monkeypatch.setattr(runtime_module, "INLINE_PARTITION_SECONDS", partition_threshold)
    async with asyncio.timeout(TEST_TIMEOUT):
        recorder = _ThreadRecorder(sleep, busy)
        served = await serve_worker(WorkerServicer(on_partition=recorder))
        try:
            async with grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                code, partitions = make_code("cyclic", n=3, s=1), make_partitions(3)
                await _load(stub, load_chunks(job_setup(code, 1), data_for(code, 1, partitions)))
                for iteration in range(3):
                    theta = random_params(seed=iteration)
                    messages, _ = await _compute(stub, _request("job", 1, (1,), theta, iteration=iteration))
                    _assert_close(messages[1], expected_message(code, 1, theta, partitions))
        finally:
            await stop_worker(served)
    assert recorder.on_loop == {0: {False}, 1: {inline_after_first}, 2: {inline_after_first}}


async def test_cancelled_call_cancels_the_straggler_sleep(
    stub: worker_pb2_grpc.WorkerStub, served_worker: ServedWorker
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        setup = job_setup(code, 0, straggler=fixed_delay(60.0))
        await _load(stub, load_chunks(setup, data_for(code, 0, partitions)))
        stats = served_worker.servicer.jobs["job"].job.stats
        call = stub.Compute(_request("job", 0, (0,), random_params()))
        reader = asyncio.create_task(call.read())
        await _wait_until(lambda: 0 in served_worker.servicer.jobs["job"].active)  # sleeping now
        call.cancel()
        await _wait_until(lambda: stats.calls_cancelled == 1)  # the 60 s sleep ended at once
        assert not served_worker.servicer.jobs["job"].active and stats.partitions_computed == 0
        with pytest.raises(asyncio.CancelledError):
            await reader


async def test_abandoned_iteration_wakes_from_its_straggler_sleep_at_once(
    stub: worker_pb2_grpc.WorkerStub, served_worker: ServedWorker
) -> None:
    """A newer iteration, then EndJob, each end a call sleeping through a 60 s delay immediately."""
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        await _load(
            stub, load_chunks(job_setup(code, 0, straggler=fixed_delay(60.0)), data_for(code, 0, make_partitions(3)))
        )
        runtime = served_worker.servicer.jobs["job"]
        theta = random_params()
        first = asyncio.create_task(_status(stub.Compute(_request("job", 0, (0,), theta, iteration=0))))
        await _wait_until(lambda: 0 in runtime.active)  # iteration 0 is sleeping
        second = asyncio.create_task(_status(stub.Compute(_request("job", 0, (0,), theta, iteration=1))))
        error = await first
        assert error.code() == grpc.StatusCode.ABORTED
        assert "Iteration 0 of job 'job' was abandoned" in error.details()
        await _wait_until(lambda: 1 in runtime.active)  # iteration 1 is sleeping
        await stub.EndJob(worker_pb2.EndJobRequest(job_id="job"))
        error = await second
        assert error.code() == grpc.StatusCode.ABORTED
        assert "Iteration 1 of job 'job' was abandoned" in error.details()
        assert runtime.job.stats.partitions_computed == 0 and not runtime.active


async def test_older_iteration_is_refused(stub: worker_pb2_grpc.WorkerStub, served_worker: ServedWorker) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        await _load(stub, load_chunks(job_setup(code, 1), data_for(code, 1, partitions)))
        theta = random_params()
        await _compute(stub, _request("job", 1, (1,), theta, iteration=5))
        computed = served_worker.servicer.jobs["job"].job.stats.partitions_computed
        error = await _status(stub.Compute(_request("job", 1, (1,), theta, iteration=3)))
        assert error.code() == grpc.StatusCode.ABORTED
        assert "iteration 3 is older than iteration 5 already started for job 'job'" in error.details()
        assert served_worker.servicer.jobs["job"].job.stats.partitions_computed == computed  # nothing computed
        for iteration in (5, 6):  # the same iteration again (a retry) and a newer one are served
            messages, _ = await _compute(stub, _request("job", 1, (1,), theta, iteration=iteration))
            _assert_close(messages[1], expected_message(code, 1, theta, partitions))


async def test_delay_model_failure_is_invalid_argument(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        setup = job_setup(code, 2, job_id="narrow", straggler=fixed_delay(0.01, num_workers=2))  # worker 2 of 2?
        await _load(stub, load_chunks(setup, data_for(code, 2, partitions)))
        error = await _status(stub.Compute(_request("narrow", 2, (2,), random_params())))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "straggler delay model of job 'narrow' fails for worker 2, iteration 0" in error.details()
        assert "Argument 'worker_id' must be in [0, 2), not 2" in error.details()
        await _load(stub, load_chunks(job_setup(code, 0), data_for(code, 0, partitions)))  # still serving
        messages, _ = await _compute(stub, _request("job", 0, (0,), random_params()))
        _assert_close(messages[0], expected_message(code, 0, random_params(), partitions))


# ---- tree parent -----------------------------------------------------------------------------------


class _ChildWorker(WorkerServicer):
    """A real worker that counts its Computes and, if asked, marks its messages approximate.

    ``approximate=True`` plays a child that is itself a tree parent whose own decode was not exact.
    """

    def __init__(self, *, approximate: bool = False) -> None:
        super().__init__()
        self.approximate = approximate
        self.compute_calls = 0

    async def _compute(self, request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
        """What both Compute and Session run for a request."""
        self.compute_calls += 1
        async for data in super()._compute(request):
            chunk = worker_pb2.GradientChunk.FromString(serialize_chunk(data))
            if self.approximate and chunk.HasField("trailer"):
                chunk.trailer.approximate = True
            yield chunk.SerializeToString()


def _parent_role(child_code: str, params: dict[str, int], addresses: list[str], wait: float) -> worker_pb2.ParentRole:
    role = worker_pb2.ParentRole(wait_seconds=wait)
    role.child_code.name = child_code
    role.child_code.params.CopyFrom(struct_from_dict(params))
    role.children.extend(worker_pb2.ChildSpec(worker_id=i + 1, address=a) for i, a in enumerate(addresses))
    return role


async def _load_single_child_tree(
    parent: ServedWorker,
    child: ServedWorker,
    partitions: dict[int, tuple[Array, Array]],
    *,
    parent_dtype: int = common_pb2.DTYPE_FLOAT64,
    child_dtype: int = common_pb2.DTYPE_FLOAT64,
    straggler: common_pb2.StragglerSpec | None = None,
) -> None:
    """Parent (worker 0, partition 1) over one child (worker 1, partition 0, child code ``uncoded`` n=1)."""
    child_code = make_code("uncoded", n=1)
    async with grpc.aio.insecure_channel(child.address) as channel:
        setup = job_setup(child_code, 0, job_id="tree", worker_id=1, message_dtype=child_dtype)
        await _load(worker_pb2_grpc.WorkerStub(channel), load_chunks(setup, data_for(child_code, 0, partitions)))
    setup = job_setup(child_code, 0, job_id="tree", message_dtype=parent_dtype, straggler=straggler)
    del setup.rows[:]
    setup.rows.add(row=0, partitions=[1], coefficients_real=[1.0])
    setup.parent.CopyFrom(_parent_role("uncoded", {"n": 1}, [child.address], wait=5.0))
    async with grpc.aio.insecure_channel(parent.address) as channel:
        await _load(worker_pb2_grpc.WorkerStub(channel), load_chunks(setup, partition_data(1, *partitions[1])))


async def test_parent_refuses_an_approximate_child_code(stub: worker_pb2_grpc.WorkerStub) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("uncoded", n=1)
        setup = job_setup(code, 0)
        setup.parent.CopyFrom(_parent_role("ignore_stragglers", {"n": 2, "s": 1}, ["127.0.0.1:1", "127.0.0.1:2"], 1.0))
        error = await _status(_load(stub, load_chunks(setup, data_for(code, 0, make_partitions(1)))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ParentRole.child_code is invalid: 'ignore_stragglers' is an approximate scheme" in error.details()


async def test_parent_marks_its_message_approximate_when_a_child_was() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(2, seed=5)
        theta = random_params()
        full = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(2))
        child, parent = await serve_worker(_ChildWorker(approximate=True)), await serve_worker()
        try:
            await _load_single_child_tree(parent, child, partitions)
            async with grpc.aio.insecure_channel(parent.address, options=CHANNEL_OPTIONS) as channel:
                messages, trailers = await _compute(
                    worker_pb2_grpc.WorkerStub(channel), _request("tree", 0, (0,), theta), subtree=frozenset({1})
                )
            _assert_close(messages[0], full)  # the right sum, but it cannot be vouched for as exact
            assert [t.trailer.approximate for t in trailers] == [True]
        finally:
            await stop_worker(parent)
            await stop_worker(child)


async def test_parent_accepts_only_the_jobs_message_dtype_from_children() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(2, seed=6)
        theta = random_params()
        full = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(2))
        child, parent = await serve_worker(), await serve_worker()
        try:
            async with grpc.aio.insecure_channel(parent.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                await _load_single_child_tree(parent, child, partitions, child_dtype=common_pb2.DTYPE_FLOAT32)
                error = await _status(_compute(stub, _request("tree", 0, (0,), theta), subtree=frozenset({1})))
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert "has dtype float32; expected one of (dtype('float64'),)" in error.details(), error.details()

                f32 = common_pb2.DTYPE_FLOAT32  # a float32 job throughout is fine
                await _load_single_child_tree(parent, child, partitions, parent_dtype=f32, child_dtype=f32)
                messages, trailers = await _compute(stub, _request("tree", 0, (0,), theta), subtree=frozenset({1}))
                assert messages[0].dtype == np.float32 and not trailers[0].trailer.approximate
                np.testing.assert_allclose(messages[0], full, rtol=1e-5, atol=1e-4)
        finally:
            await stop_worker(parent)
            await stop_worker(child)


async def test_a_parent_asks_its_children_before_its_own_delay_and_end_job_during_it_aborts() -> None:
    """The parent's emulated delay never holds up its children: they are asked at once; EndJob during
    the delay still aborts the call and closes the parent role."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(2)
        child, parent = _ChildWorker(), WorkerServicer()
        served_child, served_parent = await serve_worker(child), await serve_worker(parent)
        try:
            await _load_single_child_tree(served_parent, served_child, partitions, straggler=fixed_delay(60.0))
            runtime = parent.jobs["tree"]
            assert runtime.parent is not None
            async with grpc.aio.insecure_channel(served_parent.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                call = asyncio.create_task(_status(stub.Compute(_request("tree", 0, (0,), random_params()))))
                await _wait_until(lambda: 0 in runtime.active and child.compute_calls == 1)  # asked; parent sleeps 60 s
                assert not call.done()
                await stub.EndJob(worker_pb2.EndJobRequest(job_id="tree"))
                error = await call
            assert error.code() == grpc.StatusCode.ABORTED and "was abandoned" in error.details()
            assert runtime.parent.closed and child.compute_calls == 1
        finally:
            await stop_worker(served_parent)
            await stop_worker(served_child)


async def test_a_parent_says_it_began_once_its_own_delay_is_over() -> None:
    """A parent's Session request that asks ``report_start`` hears it when the parent's own part begins, after its
    emulated delay (its children work from the start): a round can tell a delayed parent from one finishing."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(2, seed=8)
        theta = random_params()
        full = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(2))
        child, parent = await serve_worker(), await serve_worker()
        session = None
        try:
            await _load_single_child_tree(parent, child, partitions, straggler=fixed_delay(0.4))
            async with grpc.aio.insecure_channel(parent.address, options=CHANNEL_OPTIONS) as channel:
                session = Session.on(channel)
                head = worker_pb2.ComputeRequest(job_id="tree", iteration=0, worker_id=0, rows=[0], report_start=True)
                stream = session.compute(head, model_request_bytes(theta))
                assert isinstance(stream, SessionCompute)
                reader = asyncio.create_task(_reassemble(stream, head, subtree=frozenset({1})))
                await asyncio.sleep(0.2)  # inside the parent's 0.4 s delay
                assert not stream.started and not reader.done()
                await _wait_until(lambda: stream.started)
                messages, _ = await reader
            _assert_close(messages[0], full)
        finally:
            if session is not None:
                session.close()
            await stop_worker(parent)
            await stop_worker(child)


async def test_closed_parent_runner_opens_no_channel() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        role = _parent_role("cyclic", {"n": 3, "s": 1}, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], 1.0)
        runner = ParentRunner(role, job_id="tree", length=21, message_dtype=np.dtype("<f8"))
        await runner.close()
        with pytest.raises(ComputeCancelledError, match="tree parent of job 'tree' was closed"):
            await runner.children_sum(_request("tree", 0, (0,), random_params()), random_params())
        assert not runner.connected
        await runner.close()  # idempotent


def test_parent_runner_child_dtypes_and_refusals() -> None:
    f8, f4, c16 = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<c16")
    addresses = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]
    cyclic = _parent_role("cyclic", {"n": 3, "s": 1}, addresses[:3], 1.0)
    assert ParentRunner(cyclic, job_id="j", length=21, message_dtype=f8).child_dtypes == (f8,)
    assert ParentRunner(cyclic, job_id="j", length=21, message_dtype=f4).child_dtypes == (f4,)
    rs = _parent_role("reed_solomon", {"n": 4, "k": 4, "w": 2}, addresses, 1.0)
    assert ParentRunner(rs, job_id="j", length=21, message_dtype=f8).child_dtypes == (f8, c16)
    approximate = _parent_role("ignore_stragglers", {"n": 3, "s": 1}, addresses[:3], 1.0)
    with pytest.raises(ValueError, match="'ignore_stragglers' is an approximate scheme; a tree parent must decode"):
        ParentRunner(approximate, job_id="j", length=21, message_dtype=f8)


@pytest.mark.parametrize("statistics", [False, True], ids=["gradient", "with-statistics"])
async def test_tree_parent_decodes_three_children_and_adds_its_own_part(statistics: bool) -> None:
    """Parent 0 over children 1..3 (cyclic n=3, s=1 over partitions 0..2); the parent holds partition 3.

    With statistics every node appends [loss, score] and the parent forwards the children's decoded ones.
    """
    async with asyncio.timeout(TEST_TIMEOUT):
        child_code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(4, seed=3)
        theta = random_params()
        model = softmax_model()
        partial = model.gradient_and_statistics if statistics else model.gradient
        full = sum(partial(theta, *partitions[j]) for j in range(4))
        children = [await serve_worker() for _ in range(3)]
        parent = await serve_worker()
        try:
            for i, child in enumerate(children):
                async with grpc.aio.insecure_channel(child.address) as channel:
                    setup = job_setup(child_code, i, job_id="tree", worker_id=i + 1)
                    setup.append_statistics = statistics
                    if i == 0:  # child 1 is a bit slow, so child 3 is surely inside its sleep when cancelled
                        setup.straggler.CopyFrom(fixed_delay(0.2))
                    if i == 2:
                        setup.straggler.CopyFrom(fixed_delay(60.0))  # child 3 is a straggler
                    await _load(
                        worker_pb2_grpc.WorkerStub(channel), load_chunks(setup, data_for(child_code, i, partitions))
                    )

            setup = job_setup(make_code("uncoded", n=1), 0, job_id="tree")
            del setup.rows[:]
            setup.rows.add(row=0, partitions=[3], coefficients_real=[1.0])
            setup.parent.child_code.name = "cyclic"
            setup.parent.child_code.params.CopyFrom(struct_from_dict({"n": 3, "s": 1}))
            setup.parent.children.extend(
                worker_pb2.ChildSpec(worker_id=i + 1, address=child.address) for i, child in enumerate(children)
            )
            setup.parent.wait_seconds = 1.0
            setup.append_statistics = statistics
            async with grpc.aio.insecure_channel(parent.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                await _load(stub, load_chunks(setup, partition_data(3, *partitions[3])))

                messages, trailers = await _compute(
                    stub, _request("tree", 0, (0,), theta), statistics=statistics, subtree=frozenset({1, 2, 3})
                )
                _assert_close(messages[0], full)  # children 1, 2 decode; child 3 straggles
                if statistics:
                    X = np.concatenate([partitions[j][0] for j in range(4)])
                    y = np.concatenate([partitions[j][1] for j in range(4)])
                    assert messages[0][-2] == pytest.approx(model.loss(theta, X, y), rel=1e-12)
                    assert round(messages[0][-1]) == round(model.accuracy(theta, X, y) * len(y))
                assert not trailers[0].trailer.approximate
                straggler_stats = children[2].servicer.jobs["tree"].job.stats
                await _wait_until(lambda: straggler_stats.calls_cancelled == 1)  # the parent cancelled it

                await stop_worker(children[0])  # now only child 2 is fast: not decodable in 1 s
                error = await _status(
                    _compute(
                        stub,
                        _request("tree", 0, (0,), theta, iteration=1),
                        statistics=statistics,
                        subtree=frozenset({1, 2, 3}),
                    )
                )
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                details = error.details()
                assert "children [1, 3] did not deliver within 1 s" in details, details
                assert f"child 1 at {children[0].address}: UNAVAILABLE" in details, details
                assert "child 3" in details and "no answer in time" in details, details
                await _wait_until(lambda: straggler_stats.calls_cancelled == 2)
        finally:
            for served in [*children, parent]:
                await stop_worker(served)


# ---- node lifecycle and registration -----------------------------------------------------------------


class _RecordingMaster(master_pb2_grpc.MasterServicer):
    """Just enough of the Master service to record registrations."""

    def __init__(self) -> None:
        self.requests: list[master_pb2.RegisterWorkerRequest] = []

    async def RegisterWorker(  # noqa: N802
        self, request: master_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext
    ) -> master_pb2.RegisterWorkerReply:
        self.requests.append(request)
        return master_pb2.RegisterWorkerReply(worker_id=4)


def _reserve_port() -> socket.socket:
    """A bound but not listening SO_REUSEPORT socket: connecting to its port is refused, no other process can
    take the port, and a server that also sets SO_REUSEPORT (the fake master below) can still join it later."""
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind(("127.0.0.1", 0))
    return reserved


async def _serve_master(master: _RecordingMaster, port: int) -> grpc.aio.Server:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    master_pb2_grpc.add_MasterServicer_to_server(master, server)  # type: ignore[no-untyped-call]
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server


async def test_node_registers_with_backoff_then_reregisters() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        master = _RecordingMaster()
        with _reserve_port() as reserved:  # the master is down when the worker starts; its port stays ours
            port = reserved.getsockname()[1]
            node = WorkerNode(
                "127.0.0.1", 0, master_address=f"127.0.0.1:{port}", name="w-a", machine_id="rack-3/host-7",
                reregister_seconds=0.2,
            )  # fmt: skip
            async with node:
                assert node.is_running and node.worker_id is None
                await _wait_until(lambda: node.registration_failures >= 2)  # refused, retried with backoff
                server = await _serve_master(master, port)
                try:
                    await node.registered.wait()
                    assert node.worker_id == 4
                    await _wait_until(lambda: len(master.requests) >= 2)  # re-registration on the timer
                    assert {(r.address, r.name, r.machine_id) for r in master.requests} == {
                        (node.address, "w-a", "rack-3/host-7")
                    }
                finally:
                    await server.stop(None)
        assert node.is_shutdown and not node.is_running


async def test_node_lifecycle_run_shutdown_and_health() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        idle = WorkerNode()
        await idle.shutdown()  # safe before start
        assert idle.is_shutdown
        with pytest.raises(RuntimeError, match="only after start"):
            _ = idle.address

        node = WorkerNode("127.0.0.1", 0, grace=0.5)
        runner = asyncio.create_task(node.run())
        await _wait_until(lambda: node.is_running)
        async with grpc.aio.insecure_channel(node.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="gradcode.v1.Worker"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            taken = WorkerNode("127.0.0.1", int(node.address.rsplit(":", 1)[1]))
            try:
                with pytest.raises(OSError, match=r"Cannot listen on 127\.0\.0\.1:\d+"):
                    await taken.start()
            finally:
                await taken.shutdown()
        await asyncio.gather(node.shutdown(), node.shutdown())  # idempotent, concurrent
        await runner
        assert node.is_shutdown


async def test_the_chunk_size_is_a_worker_option() -> None:
    """``--chunk-bytes`` (WorkerServicer's ``chunk_bytes``): the same message, in chunks of at most that size."""
    code = make_code("uncoded", n=1)
    partitions = make_partitions(code.k)
    theta = random_params()
    for chunk_bytes, expect_chunks in ((1 << 20, 1), (64, -(-softmax_model().num_params * 8 // 64))):
        served = await serve_worker(WorkerServicer(chunk_bytes=chunk_bytes))
        try:
            async with asyncio.timeout(TEST_TIMEOUT), grpc.aio.insecure_channel(served.address) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                await _load(stub, load_chunks(job_setup(code, 0), data_for(code, 0, partitions)))
                chunks = [c async for c in stub.Compute(_request("job", 0, (0,), theta))]
                messages, _ = await _compute(stub, _request("job", 0, (0,), theta, iteration=1))
        finally:
            await stop_worker(served)
        assert len(chunks) == expect_chunks and all(len(c.data) <= chunk_bytes for c in chunks)
        _assert_close(messages[0], expected_message(code, 0, theta, partitions))


# ---- shared memory -------------------------------------------------------------------------------


async def test_a_worker_on_the_receivers_host_takes_the_model_and_sends_messages_through_shared_memory(
    stub: worker_pb2_grpc.WorkerStub, tmp_path: Path
) -> None:
    shared = SharedDirectory.create(tmp_path)
    assert shared is not None
    code, worker = make_code("cyclic", n=4, s=1), 2
    partitions = make_partitions(code.k)
    rows = code.static_assignment().rows[worker]
    async with asyncio.timeout(TEST_TIMEOUT):
        inline = await _load(stub, load_chunks(job_setup(code, worker), data_for(code, worker, partitions)))
        assert not inline.shared_memory_proof  # no offer, nothing read
        theta = random_params()
        shared_request = worker_pb2.ComputeRequest(
            job_id="job", iteration=1, worker_id=worker, rows=list(rows), shared_model=shared.write_model(theta)
        )
        error = await _status(stub.Compute(shared_request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "did not accept the job's shared-memory offer" in (error.details() or "")

        setup = job_setup(code, worker)
        offer = shared.offer(worker)
        assert offer is not None
        setup.shared_memory.CopyFrom(offer)
        reply = await _load(stub, load_chunks(setup, data_for(code, worker, partitions)))
        assert shared.verdict(worker, reply.shared_memory_proof) == ""  # it read the nonce: proven
        assembler = MessageAssembler(
            job_id="job", iteration=1, worker_id=worker, rows=tuple(rows),
            length=message_length(softmax_model(), statistics=False), dtypes=ANY_DTYPE,
            shared=functools.partial(shared.message, worker),
        )  # fmt: skip
        chunks = [chunk async for chunk in stub.Compute(shared_request)]
        assert all(c.shared_payload and not c.data for c in chunks) and len(chunks) == len(rows)
        for chunk in chunks:
            done = assembler.feed(chunk)
            assert done is not None
            _assert_close(done.vector, expected_message(code, done.row, theta, partitions))
        # An inline request to the same worker gets inline messages: the receiver chooses per call.
        messages, trailers = await _compute(stub, _request("job", worker, rows, theta, iteration=2))
        assert not any(t.shared_payload for t in trailers)
        for row in rows:
            _assert_close(messages[row], expected_message(code, row, theta, partitions))
        assert sorted(p.name for p in shared.path.iterdir()) == ["message-2-2", "model", "owner"]  # a slot a row
    shared.close()


async def test_a_tree_parent_never_accepts_shared_memory(tmp_path: Path) -> None:
    shared = SharedDirectory.create(tmp_path)
    assert shared is not None
    parent, child = await serve_worker(), await serve_worker()
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            partitions = make_partitions(2)
            setup = job_setup(make_code("uncoded", n=1), 0, job_id="tree")
            del setup.rows[:]
            setup.rows.add(row=0, partitions=[1], coefficients_real=[1.0])
            setup.parent.CopyFrom(_parent_role("uncoded", {"n": 1}, [child.address], wait=5.0))
            offer = shared.offer(0)
            assert offer is not None
            setup.shared_memory.CopyFrom(offer)  # it forwards its model to children inline
            async with grpc.aio.insecure_channel(parent.address) as channel:
                reply = await _load(
                    worker_pb2_grpc.WorkerStub(channel), load_chunks(setup, partition_data(1, *partitions[1]))
                )
            assert not reply.shared_memory_proof
    finally:
        await stop_worker(parent)
        await stop_worker(child)
        shared.close()


def test_a_stale_computation_never_overwrites_a_shared_slot(tmp_path: Path) -> None:
    """A computation that finishes after a later iteration started sends inline (its call is being cancelled
    anyway): the slot the receiver reads, and decodes in place, for the newest iteration keeps that iteration's
    message until a later iteration is asked for."""
    shared = SharedDirectory.create(tmp_path)
    assert shared is not None
    code, worker = make_code("cyclic", n=4, s=1), 2
    job = build_job(job_setup(code, worker), data_for(code, worker, make_partitions(code.k)))
    offer = shared.offer(worker)
    assert offer is not None
    runtime = JobRuntime(job=job, stragglers=StragglerEmulation(job.setup.straggler), shared=accept(offer, worker))
    row = code.static_assignment().rows[worker][0]
    newest = np.full(message_length(softmax_model(), statistics=False), 2.0)
    runtime.begin(2)
    assert _write_shared(runtime, 2, row, newest)
    assert not _write_shared(runtime, 1, row, newest - 1)  # iteration 1 finished late
    read = shared.message(worker, row, newest.dtype, newest.size)
    np.testing.assert_array_equal(read, newest)
    runtime.begin(3)
    assert _write_shared(runtime, 3, row, newest + 1)
    np.testing.assert_array_equal(read, newest + 1)  # the same slot, in place
    shared.close()


async def test_a_parent_computes_its_own_part_in_a_thread_while_its_loop_gathers_the_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short partitions go on the loop a partition at a time (above), but not a parent's: its loop receives and
    decodes the children's messages meanwhile."""
    monkeypatch.setattr(runtime_module, "INLINE_PARTITION_SECONDS", 60.0)
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(2, seed=7)
        recorder = _ThreadRecorder(0.005)
        child, parent = await serve_worker(), await serve_worker(WorkerServicer(on_partition=recorder))
        try:
            await _load_single_child_tree(parent, child, partitions)
            async with grpc.aio.insecure_channel(parent.address, options=CHANNEL_OPTIONS) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                for iteration in range(3):
                    theta = random_params(seed=iteration)
                    full = sum(softmax_model().gradient(theta, *partitions[j]) for j in range(2))
                    request = _request("tree", 0, (0,), theta, iteration=iteration)
                    messages, _ = await _compute(stub, request, subtree=frozenset({1}))
                    _assert_close(messages[0], full)
        finally:
            await stop_worker(parent)
            await stop_worker(child)
    assert recorder.on_loop == {0: {False}, 1: {False}, 2: {False}}
