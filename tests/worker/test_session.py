"""Worker.Session on a real grpc.aio server on loopback: many Computes on one stream, in-band statuses,
cancellation, a draining worker, and request ids (the caller's end is
:class:`gradcode.common.transport.session.Session`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Array, GradientCode
from gradcode.common.gather.round import ChunkStream, WorkerFailure
from gradcode.common.ops import metrics
from gradcode.common.training.models import message_length
from gradcode.common.transport.session import (
    TRAFFIC,
    CallError,
    Session,
    Traffic,
    serve_session,
    status_chunk,
)
from gradcode.common.transport.wire import (
    CHANNEL_OPTIONS,
    SESSION_METHOD,
    MessageAssembler,
    Serialized,
    model_request_bytes,
    parse_chunk,
    serialize_chunk,
)
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from gradcode.worker.runtime import JobRuntime
from tests.helpers import fixed_delay
from tests.worker.conftest import (
    TOLERANCE,
    Partitions,
    ServedWorker,
    data_for,
    expected_message,
    job_setup,
    load_chunks,
    make_partitions,
    random_params,
    softmax_model,
)

TEST_TIMEOUT = 10.0


@pytest.fixture
async def channel(served_worker: ServedWorker) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(served_worker.address, options=CHANNEL_OPTIONS) as channel:
        yield channel


@pytest.fixture
async def session(channel: grpc.aio.Channel) -> AsyncIterator[Session]:
    opened = Session.on(channel)
    try:
        yield opened
    finally:
        opened.close()


async def _load(channel: grpc.aio.Channel, setup: worker_pb2.JobSetup, data: list[worker_pb2.PartitionData]) -> None:
    stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]

    async def chunks() -> AsyncIterator[worker_pb2.LoadJobChunk]:
        for chunk in load_chunks(setup, data):
            yield chunk

    await stub.LoadJob(chunks())


CYCLIC = make_code("cyclic", n=3, s=1)


async def _load_slow_job(channel: grpc.aio.Channel, delay: float) -> dict[int, tuple[Array, Array]]:
    """Worker 0 of ``CYCLIC`` as job "job", every Compute delayed ``delay`` s; its partitions."""
    partitions = make_partitions(3)
    await _load(channel, job_setup(CYCLIC, 0, straggler=fixed_delay(delay)), data_for(CYCLIC, 0, partitions))
    return partitions


def _head(job_id: str, worker: int, rows: tuple[int, ...], iteration: int) -> worker_pb2.ComputeRequest:
    return worker_pb2.ComputeRequest(job_id=job_id, iteration=iteration, worker_id=worker, rows=list(rows))


async def _messages(stream: ChunkStream, head: worker_pb2.ComputeRequest) -> dict[int, Array]:
    """Reassemble (and validate) the messages of one request."""
    assembler = MessageAssembler(
        job_id=head.job_id, iteration=head.iteration, worker_id=head.worker_id, rows=tuple(head.rows),
        length=message_length(softmax_model(), statistics=False), dtypes=(np.dtype("<f8"),),
    )  # fmt: skip
    messages: dict[int, Array] = {}
    async for chunk in stream:
        done = assembler.feed(chunk)
        if done is not None:
            messages[done.row] = done.vector
    assert assembler.complete
    return messages


def _assert_close(got: Array, want: Array) -> None:
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())


async def _wait_until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def test_requests_of_two_jobs_on_one_session_each_get_their_own_messages(
    channel: grpc.aio.Channel, session: Session
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        codes: dict[str, GradientCode] = {"a": make_code("cyclic", n=3, s=1), "b": make_code("uncoded", n=2)}
        partitions = make_partitions(3)
        for job_id, code in codes.items():
            await _load(channel, job_setup(code, 1, job_id=job_id), data_for(code, 1, partitions))
        for iteration in range(3):
            theta = random_params(seed=iteration)
            heads = {j: _head(j, 1, codes[j].static_assignment().rows[1], iteration) for j in codes}
            streams = {j: session.compute(heads[j], model_request_bytes(theta)) for j in codes}
            got = await asyncio.gather(*(_messages(streams[j], heads[j]) for j in codes))
            for (job_id, code), messages in zip(codes.items(), got, strict=True):
                assert sorted(messages) == sorted(heads[job_id].rows)
                for row, vector in messages.items():
                    _assert_close(vector, expected_message(code, row, theta, partitions))
        assert not session.broken


async def test_a_refusal_ends_only_its_request_with_the_status_a_compute_call_would_have(
    channel: grpc.aio.Channel, session: Session
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        code = make_code("cyclic", n=3, s=1)
        partitions = make_partitions(3)
        await _load(channel, job_setup(code, 0), data_for(code, 0, partitions))
        theta = random_params()
        with pytest.raises(CallError) as unknown:
            await _messages(session.compute(_head("nope", 0, (0,), 0), model_request_bytes(theta)), _head("", 0, (), 0))
        failure = WorkerFailure.from_exception(unknown.value)
        assert failure.status is grpc.StatusCode.NOT_FOUND and "Unknown job" in failure.details
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as call:  # the same request as a Compute call
            async for _ in stub.Compute(_head("nope", 0, (0,), 0)):
                pass
        assert call.value.code() is failure.status and call.value.details() == failure.details

        with pytest.raises(CallError) as wrong_row:
            await _messages(session.compute(_head("job", 0, (2,), 0), model_request_bytes(theta)), _head("", 0, (), 0))
        assert wrong_row.value.code is grpc.StatusCode.INVALID_ARGUMENT and "Compute refused" in wrong_row.value.details

        head = _head("job", 0, code.static_assignment().rows[0], 1)  # the stream still serves
        messages = await _messages(session.compute(head, model_request_bytes(theta)), head)
        for row, vector in messages.items():
            _assert_close(vector, expected_message(code, row, theta, partitions))
        assert not session.broken


async def test_cancel_reaches_the_worker_and_wakes_its_straggler_sleep(
    channel: grpc.aio.Channel, session: Session, served_worker: ServedWorker
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        await _load_slow_job(channel, 60.0)
        runtime = served_worker.servicer.jobs["job"]
        stream = session.compute(_head("job", 0, (0,), 0), model_request_bytes(random_params()))
        reader = asyncio.create_task(_messages(stream, _head("job", 0, (0,), 0)))
        await _wait_until(lambda: 0 in runtime.active)  # sleeping now
        assert stream.cancel() and not stream.cancel()  # once
        await _wait_until(lambda: runtime.job.stats.calls_cancelled == 1)  # the 60 s sleep ended at once
        assert not runtime.active and runtime.job.stats.partitions_computed == 0
        reader.cancel()
        assert not session.broken


async def test_a_draining_worker_finishes_what_runs_then_ends_the_session(
    channel: grpc.aio.Channel, session: Session, served_worker: ServedWorker
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = await _load_slow_job(channel, 0.3)
        theta = random_params()
        head = _head("job", 0, (0,), 0)
        running = asyncio.create_task(_messages(session.compute(head, model_request_bytes(theta)), head))
        await _wait_until(lambda: 0 in served_worker.servicer.jobs["job"].active)
        served_worker.servicer.drain()
        _assert_close((await running)[0], expected_message(CYCLIC, 0, theta, partitions))  # it finished
        await _wait_until(lambda: session.broken)
        with pytest.raises(CallError) as ended:
            await _messages(session.compute(_head("job", 0, (0,), 1), model_request_bytes(theta)), head)
        assert ended.value.code is grpc.StatusCode.UNAVAILABLE


async def test_request_ids_must_be_new_and_not_zero(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        await _load_slow_job(channel, 60.0)
        call = channel.stream_stream("/gradcode.v1.Worker/Session", response_deserializer=parse_chunk)()
        request = _head("job", 0, (0,), 0)
        request.MergeFromString(model_request_bytes(random_params()))
        for request_id in (0, 5, 5):  # the first 5 sleeps 60 s, so the second is a duplicate
            request.request_id = request_id
            await call.write(request.SerializeToString())
        statuses = [(await call.read()).meta for _ in range(2)]
        invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert [(s.request_id, s.status.code) for s in statuses] == [(0, invalid), (5, invalid)]
        assert all("give each request a new id" in s.status.details for s in statuses)
        call.cancel()


class _MemoryStream:
    """A SessionStream in memory: what the caller writes is recorded, and the test hands it the replies."""

    def __init__(self) -> None:
        self.written: list[worker_pb2.ComputeRequest] = []
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    async def write(self, data: Serialized) -> None:
        self.written.append(worker_pb2.ComputeRequest.FromString(serialize_chunk(data)))

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._replies()

    async def _replies(self) -> AsyncIterator[Any]:
        while True:
            yield parse_chunk(await self.replies.get())

    def cancel(self) -> bool:
        return True


@pytest.mark.parametrize("cancelled", [True, False], ids=["cancelled", "no-longer-read"])
async def test_a_not_found_that_ends_a_request_tells_who_lost_which_job(cancelled: bool) -> None:
    """The round stops reading what it no longer needs, then cancels it; a refusal already on its way must still
    reach the pool, or a restarted worker whose NOT_FOUND always comes late would never be reloaded. Arriving
    between the two, it once reached a stream nobody read (found when requests began to leave without a hop
    through the event loop and rounds ended sooner)."""
    async with asyncio.timeout(TEST_TIMEOUT):
        stream, lost = _MemoryStream(), []
        session = Session(stream, on_lost_job=lost.append)
        try:
            computes = [session.compute(_head(job, 0, (0,), 1)) for job in ("gone", "ok", "other refusal")]
            await _wait_until(lambda: len(stream.written) == 3)
            if cancelled:
                for compute in computes:
                    compute.cancel()
                await _wait_until(lambda: len(stream.written) == 6)  # the three cancels
            replies = {
                "gone": grpc.StatusCode.NOT_FOUND, "ok": grpc.StatusCode.OK,
                "other refusal": grpc.StatusCode.INVALID_ARGUMENT,
            }  # fmt: skip
            for compute in computes:  # nobody iterates them
                stream.replies.put_nowait(status_chunk(compute.request_id, replies[compute.job_id]))
            stream.replies.put_nowait(status_chunk(999, grpc.StatusCode.NOT_FOUND))  # never asked
            await _wait_until(lambda: lost)
            await asyncio.sleep(0.05)
            assert lost == ["gone"] and not session.broken
        finally:
            session.close()


class _NowStream(_MemoryStream):
    """A _MemoryStream that can also take a frame at once (as a link with room in its send buffer does)."""

    def __init__(self) -> None:
        super().__init__()
        self.room = True

    def write_now(self, data: Serialized) -> bool:
        if self.room:
            self.written.append(worker_pb2.ComputeRequest.FromString(serialize_chunk(data)))
        return self.room


async def test_a_request_leaves_as_it_is_asked_and_never_passes_one_that_waits() -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        stream = _NowStream()
        session = Session(stream)
        try:
            session.compute(_head("job", 0, (0,), 1))
            assert [r.iteration for r in stream.written] == [1]  # written in compute(), no event-loop turn
            stream.room = False
            session.compute(_head("job", 0, (0,), 2))  # waits for the writer task
            stream.room = True
            session.compute(_head("job", 0, (0,), 3))  # may not pass iteration 2
            assert [r.iteration for r in stream.written] == [1]
            await _wait_until(lambda: len(stream.written) == 3)
            assert [r.iteration for r in stream.written] == [1, 2, 3]
            session.compute(_head("job", 0, (0,), 4))  # nothing waits any more: at once again
            assert [r.iteration for r in stream.written] == [1, 2, 3, 4]
        finally:
            session.close()


async def test_the_workers_end_sends_each_chunk_as_it_is_made_in_order_and_queues_behind_a_waiting_one() -> None:
    """serve_session with a link's ``write_now``: chunks leave from the request's own task while nothing waits;
    once one had to wait for the writer, the later ones queue behind it."""
    async with asyncio.timeout(TEST_TIMEOUT):
        sent: list[bytes] = []
        room = {"now": True}
        made = asyncio.Event()

        async def write(data: Serialized) -> None:
            sent.append(bytes(serialize_chunk(data)))

        def write_now(data: Serialized) -> bool:
            if room["now"]:
                sent.append(bytes(serialize_chunk(data)))
            return room["now"]

        async def computation(request: worker_pb2.ComputeRequest) -> AsyncIterator[Serialized]:
            for k in range(4):
                room["now"] = k != 1  # the second chunk finds the stream full
                yield f"chunk {k}".encode()
                if k == 0:
                    assert sent == [b"chunk 0"]  # written before the request's task went on
            made.set()

        requests: asyncio.Queue[worker_pb2.ComputeRequest | None] = asyncio.Queue()

        async def incoming() -> AsyncIterator[worker_pb2.ComputeRequest]:
            while (request := await requests.get()) is not None:
                yield request

        requests.put_nowait(worker_pb2.ComputeRequest(request_id=1, job_id="job"))
        serving = asyncio.create_task(
            serve_session(incoming(), write, computation, asyncio.Event(), write_now=write_now)
        )
        await made.wait()
        await _wait_until(lambda: len(sent) == 4)
        requests.put_nowait(None)
        await serving
        assert sent == [b"chunk 0", b"chunk 1", b"chunk 2", b"chunk 3"]


async def _backup_requests(
    channel: grpc.aio.Channel, served_worker: ServedWorker, flag: str
) -> tuple[Partitions, JobRuntime, Array, list[worker_pb2.ComputeRequest]]:
    """Worker 0 of the cyclic job loaded with three partitions: the partitions, its runtime, a model, and its
    requests for iterations 0 and 1 as a backup with ``flag`` (``deferred`` or ``hold``) set."""
    partitions = make_partitions(3)
    await _load(channel, job_setup(CYCLIC, 0), data_for(CYCLIC, 0, partitions))
    heads = [_head("job", 0, CYCLIC.static_assignment().rows[0], t) for t in range(2)]
    for head in heads:
        head.backup = True
        setattr(head, flag, True)
    return partitions, served_worker.servicer.jobs["job"], random_params(), heads


async def test_a_deferred_backup_computes_nothing_until_promoted_and_nothing_at_all_when_cancelled(
    channel: grpc.aio.Channel, session: Session, served_worker: ServedWorker
) -> None:
    """A backup that shares its machine with the receiver's other workers waits for its promotion before it
    computes a partition; cancelled first, it has computed none."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions, runtime, theta, heads = await _backup_requests(channel, served_worker, "deferred")
        stats = runtime.job.stats

        stream = session.compute(heads[0], model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, heads[0]))
        await _wait_until(lambda: 0 in runtime.active)
        await asyncio.sleep(0.3)  # an undeferred backup computes two partitions in well under a millisecond
        assert stats.partitions_computed == 0 and not reader.done()
        stream.promote()
        messages = await reader
        for row, vector in messages.items():
            _assert_close(vector, expected_message(CYCLIC, row, theta, partitions))
        assert stats.partitions_computed == 2

        stream = session.compute(heads[1], model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, heads[1]))
        await _wait_until(lambda: 1 in runtime.active)
        assert stream.cancel()
        await _wait_until(lambda: stats.calls_cancelled == 1)
        assert stats.partitions_computed == 2 and not runtime.active
        reader.cancel()
        assert not session.broken


async def test_a_request_that_asks_report_start_hears_when_its_computation_begins(
    channel: grpc.aio.Channel, session: Session, served_worker: ServedWorker
) -> None:
    """The worker says so once its emulated delay is over, before the message; a request that does not ask hears
    nothing, nor does a deferred backup before its promotion, nor a request whose message is computed inline
    (it goes out as soon as the news would)."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = await _load_slow_job(channel, 0.3)
        runtime = served_worker.servicer.jobs["job"]
        theta = random_params()
        rows = CYCLIC.static_assignment().rows[0]
        asked, silent, deferred, inline = (_head("job", 0, rows, t) for t in range(4))
        asked.report_start = deferred.report_start = inline.report_start = True
        silent.backup = deferred.backup = deferred.deferred = True

        runtime.message_seconds = math.inf  # as for a job's first message: computed in a thread
        stream = session.compute(asked, model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, asked))
        await asyncio.sleep(0.15)  # inside the 0.3 s delay: not begun
        assert not stream.started
        await _wait_until(lambda: stream.started)
        for row, vector in (await reader).items():  # the news was no chunk of the message
            _assert_close(vector, expected_message(CYCLIC, row, theta, partitions))

        runtime.message_seconds = math.inf
        stream = session.compute(silent, model_request_bytes(theta))
        await _messages(stream, silent)
        assert not stream.started

        runtime.message_seconds = math.inf
        stream = session.compute(deferred, model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, deferred))
        await asyncio.sleep(0.5)  # past its delay, waiting for its promotion
        assert not stream.started and not reader.done()
        stream.promote()
        await reader
        assert stream.started

        runtime.message_seconds = 0.0
        stream = session.compute(inline, model_request_bytes(theta))
        await _messages(stream, inline)
        assert not stream.started
        assert not session.broken


def _sent() -> float:
    """Message bytes this process's workers have sent (the worker's own counter)."""
    return float(metrics.BYTES_SENT._value.get())


async def test_a_held_backup_computes_at_once_says_ready_and_sends_only_when_pulled(
    channel: grpc.aio.Channel, session: Session, served_worker: ServedWorker
) -> None:
    """With ``hold``, a backup computes its messages without waiting for a promotion, says they are ready (a notice,
    no message bytes), and sends them, exact, only once promoted; cancelled while ready, it drops them unsent."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions, runtime, theta, heads = await _backup_requests(channel, served_worker, "hold")
        stats = runtime.job.stats

        before = _sent()
        stream = session.compute(heads[0], model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, heads[0]))
        await _wait_until(lambda: stream.ready)
        assert stats.partitions_computed == 2  # computed at once, unlike a deferred backup
        await asyncio.sleep(0.2)
        assert not reader.done() and _sent() == before  # held: nothing of the message crossed the stream
        stream.promote()
        for row, vector in (await reader).items():
            _assert_close(vector, expected_message(CYCLIC, row, theta, partitions))
        assert _sent() > before

        before = _sent()
        stream = session.compute(heads[1], model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, heads[1]))
        await _wait_until(lambda: stream.ready)
        assert stream.cancel()
        await _wait_until(lambda: stats.calls_cancelled == 1)
        await asyncio.sleep(0.05)
        assert not runtime.active and _sent() == before  # dropped, never sent
        reader.cancel()
        assert not session.broken


async def test_a_held_backup_promoted_before_it_is_ready_sends_as_it_computes(
    channel: grpc.aio.Channel, session: Session
) -> None:
    """Promoted during its emulated delay, a held backup has nothing to hold: no ready notice, its messages
    follow as computed."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = await _load_slow_job(channel, 0.3)
        theta = random_params()
        head = _head("job", 0, CYCLIC.static_assignment().rows[0], 0)
        head.backup = head.hold = True
        stream = session.compute(head, model_request_bytes(theta))
        reader = asyncio.create_task(_messages(stream, head))
        await asyncio.sleep(0.1)
        stream.promote()
        for row, vector in (await reader).items():
            _assert_close(vector, expected_message(CYCLIC, row, theta, partitions))
        assert not stream.ready


async def test_hold_without_backup_is_refused(channel: grpc.aio.Channel, session: Session) -> None:
    """An expected worker's messages are needed at once: hold without backup is INVALID_ARGUMENT, saying so."""
    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(3)
        await _load(channel, job_setup(CYCLIC, 0), data_for(CYCLIC, 0, partitions))
        head = _head("job", 0, CYCLIC.static_assignment().rows[0], 0)
        head.hold = True
        with pytest.raises(CallError) as refused:
            await _messages(session.compute(head, model_request_bytes(random_params())), head)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT and "set backup too" in refused.value.details


async def test_a_sessions_bytes_count_for_its_job_and_iteration_as_the_stream_carried_them(
    channel: grpc.aio.Channel,
) -> None:
    """TRAFFIC counts every request (with its model), cancel and chunk of a job's Computes at its serialized size
    plus gRPC's 5-byte message prefix: the same bytes the stream's serializers handled, recorded here beside it,
    each for its request's iteration. Each message's payload is its 8 bytes per element; the rest is a few dozen
    bytes of header and trailer."""
    sent: list[int] = []
    received: list[int] = []

    def serialize(message: Any) -> bytes:
        raw = serialize_chunk(message)
        sent.append(len(raw))
        return raw

    def parse(raw: bytes) -> Any:
        received.append(len(raw))
        return parse_chunk(raw)

    async with asyncio.timeout(TEST_TIMEOUT):
        partitions = make_partitions(3)
        await _load(channel, job_setup(CYCLIC, 0, job_id="counted"), data_for(CYCLIC, 0, partitions))
        method = channel.stream_stream(SESSION_METHOD, request_serializer=serialize, response_deserializer=parse)
        session = Session(method())
        try:
            rows = CYCLIC.static_assignment().rows[0]
            head = _head("counted", 0, rows, 0)
            await _messages(session.compute(head, model_request_bytes(random_params())), head)
            head = _head("counted", 0, rows, 1)
            head.backup = head.hold = True
            held = session.compute(head, model_request_bytes(random_params()))
            await _wait_until(lambda: held.ready)
            held.cancel()
            await _wait_until(lambda: len(received) == len(rows) + 2)  # the messages, the notice, the status
        finally:
            session.close()
        assert len(sent) == 3  # two requests and a cancel
        first = len(rows)  # iteration 0's messages; then iteration 1's notice and status
        assert TRAFFIC.take("counted", 0) == (sent[0] + 5, sum(received[:first]) + 5 * first)
        assert TRAFFIC.take("counted", 1) == (sent[1] + sent[2] + 10, sum(received[first:]) + 10)
        payload = 8 * message_length(softmax_model(), statistics=False) * len(rows)
        assert payload < sum(received[:first]) < payload + 100 * len(rows)
        assert TRAFFIC.take("counted", 1) == (0, 0), "taken"


def test_traffic_reports_an_iteration_without_the_next_ones_requests_and_late_bytes_in_the_next_report() -> None:
    """The master sends iteration 1's requests before it takes iteration 0's report: they wait for their own. The
    rest of a cancelled message of iteration 0, arriving after its report, counts in the next one; a job nobody takes
    (a tree parent's) keeps at most ITERATIONS counts, with no byte lost."""
    traffic = Traffic()
    traffic.add(("job", 0), sent=100, received=1000)
    traffic.add(("job", 1), sent=101)
    traffic.add(("other", 0), sent=7)
    assert traffic.take("job", 0) == (100, 1000)
    traffic.add(("job", 0), received=30)  # late
    traffic.add(("job", 1), received=1001)
    assert traffic.take("job", 1) == (101, 1031)
    assert traffic.take("job", 2) == (0, 0)
    assert traffic.take("other", 0) == (7, 0)
    for iteration in range(3 * Traffic.ITERATIONS):
        traffic.add(("parent", iteration), sent=1, received=2)
    assert len(traffic._jobs["parent"].pending) == Traffic.ITERATIONS
    assert traffic.take("parent", 3 * Traffic.ITERATIONS) == (3 * Traffic.ITERATIONS, 6 * Traffic.ITERATIONS)
