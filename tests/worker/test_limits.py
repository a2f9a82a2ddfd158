"""What any one caller can make a worker hold or compute: a memory budget across jobs, a job count, finite models."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.codes.registry import make_code
from gradcode.common.transport.wire import CHANNEL_OPTIONS, tensor_from_array
from gradcode.v1 import worker_pb2, worker_pb2_grpc
from gradcode.worker.service import WorkerServicer

from .conftest import data_for, job_setup, load_chunks, make_partitions, random_params, serve_worker, stop_worker

TIMEOUT = 30.0
CODE = make_code("uncoded", n=1)
PARTITIONS = make_partitions(1, samples=20)
JOB_BYTES = sum(X.nbytes + y.nbytes for X, y in PARTITIONS.values())


def chunks(job_id: str) -> list[worker_pb2.LoadJobChunk]:
    return load_chunks(job_setup(CODE, 0, job_id=job_id), data_for(CODE, 0, PARTITIONS))


async def load(stub: worker_pb2_grpc.WorkerStub, job_id: str) -> grpc.StatusCode:
    try:
        await stub.LoadJob(iter(chunks(job_id)))
    except grpc.aio.AioRpcError as exc:
        assert len(exc.details() or "") < 400
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("budget_jobs", "max_jobs", "expected"), [(2.5, 10, 2), (10, 3, 3)])
async def test_a_worker_holds_at_most_its_budget_and_job_count(
    budget_jobs: float, max_jobs: int, expected: int
) -> None:
    servicer = WorkerServicer(max_total_bytes=int(budget_jobs * JOB_BYTES), max_jobs=max_jobs)
    served = await serve_worker(servicer)
    try:
        async with asyncio.timeout(TIMEOUT), grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)  # type: ignore[no-untyped-call]
            codes = [await load(stub, f"job-{i}") for i in range(expected + 2)]
            assert codes == [grpc.StatusCode.OK] * expected + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
            assert len(servicer.jobs) == expected
            assert await load(stub, "job-0") == grpc.StatusCode.OK  # replacing a job reuses its share
            await stub.EndJob(worker_pb2.EndJobRequest(job_id="job-1"))
            assert await load(stub, "job-new") == grpc.StatusCode.OK  # ending one frees its share
    finally:
        await stop_worker(served)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
async def test_a_worker_refuses_a_model_that_is_not_finite(bad: float) -> None:
    served = await serve_worker()
    try:
        async with asyncio.timeout(TIMEOUT), grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)  # type: ignore[no-untyped-call]
            assert await load(stub, "job") == grpc.StatusCode.OK
            params = random_params()
            params[3] = bad
            request = worker_pb2.ComputeRequest(job_id="job", iteration=0, worker_id=0, model=tensor_from_array(params))
            request.rows.extend([0])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Compute(request):
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "1 NaN or infinite values" in (info.value.details() or "")
            request.model.CopyFrom(tensor_from_array(random_params()))
            assert [c async for c in stub.Compute(request)]  # and keeps serving
    finally:
        await stop_worker(served)


async def test_concurrent_loads_count_against_the_job_bound() -> None:
    servicer = WorkerServicer(max_jobs=1)
    served = await serve_worker(servicer)
    release = asyncio.Event()

    async def slow_chunks() -> Any:
        first, *rest = chunks("slow")
        yield first
        await release.wait()  # the setup is in; the data comes later
        for chunk in rest:
            yield chunk

    try:
        async with asyncio.timeout(TIMEOUT), grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)  # type: ignore[no-untyped-call]
            slow = asyncio.ensure_future(stub.LoadJob(slow_chunks()))
            while not servicer._loading:
                await asyncio.sleep(0.01)
            assert await load(stub, "fast") == grpc.StatusCode.RESOURCE_EXHAUSTED
            release.set()
            assert (await slow).job_id == "slow" and list(servicer.jobs) == ["slow"]
    finally:
        await stop_worker(served)


async def test_a_refused_load_is_answered_once_the_client_has_sent_its_stream() -> None:
    # A status sent while a grpc.aio client is still writing can reach it as INTERNAL instead
    # (grpc/grpc#36066), so the worker reads a refused stream to its end before refusing it.
    servicer = WorkerServicer(max_jobs=1)
    served = await serve_worker(servicer)
    big = worker_pb2.LoadJobChunk(data=worker_pb2.PartitionData(partition=0, num_samples=1, features=bytes(1 << 20)))
    written = 0

    async def refused_chunks() -> Any:
        nonlocal written
        setup, *_ = chunks("refused")  # refused at once: the worker already holds its one job
        for chunk in [setup, *[big] * 8]:  # more than HTTP/2 flow control lets the client send unread
            yield chunk
            written += 1

    try:
        async with asyncio.timeout(TIMEOUT), grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)  # type: ignore[no-untyped-call]
            assert await load(stub, "held") == grpc.StatusCode.OK
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.LoadJob(refused_chunks())
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert written == 9  # every write went through: none was in flight when the refusal came
            assert list(servicer.jobs) == ["held"]
    finally:
        await stop_worker(served)


async def _held_loads(
    servicer: WorkerServicer, count: int, *, hold_after: int
) -> tuple[list[grpc.StatusCode], set[str]]:
    """``count`` LoadJobs at once, each holding its stream after ``hold_after`` chunks until all are that far (or
    a refusal is read to its end instead); their statuses, and the jobs the worker then holds."""
    release = asyncio.Event()
    served = await serve_worker(servicer)

    async def held(job_id: str) -> Any:
        parts = chunks(job_id)
        for chunk in parts[:hold_after]:
            yield chunk
        await release.wait()
        for chunk in parts[hold_after:]:
            yield chunk

    async def one(stub: worker_pb2_grpc.WorkerStub, job_id: str) -> grpc.StatusCode:
        try:
            await stub.LoadJob(held(job_id))
        except grpc.aio.AioRpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    try:
        async with asyncio.timeout(TIMEOUT), grpc.aio.insecure_channel(served.address, options=CHANNEL_OPTIONS) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)  # type: ignore[no-untyped-call]
            calls = [asyncio.ensure_future(one(stub, f"job-{i}")) for i in range(count)]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    while len(servicer._loading) < count:
                        await asyncio.sleep(0.01)
            release.set()
            codes = list(await asyncio.gather(*calls))
            assert not servicer._loading
            return codes, set(servicer.jobs)
    finally:
        await stop_worker(served)


async def test_concurrent_loads_reserve_what_they_declare_not_the_per_job_cap() -> None:
    # Issue 25: each load under way reserved the whole per-job cap, so with the default flags (8 GiB per job,
    # 16 GiB in all) the third of three concurrent loads of a few kilobytes was refused "over this worker's
    # limit of 0 bytes".
    servicer = WorkerServicer(max_job_bytes=8 * JOB_BYTES, max_total_bytes=16 * JOB_BYTES)
    codes, held = await _held_loads(servicer, 6, hold_after=1)  # every setup in before any data
    assert codes == [grpc.StatusCode.OK] * 6
    assert held == {f"job-{i}" for i in range(6)}


async def test_concurrent_loads_together_stay_within_the_budget() -> None:
    servicer = WorkerServicer(max_total_bytes=int(2.5 * JOB_BYTES))
    codes, held = await _held_loads(servicer, 3, hold_after=2)  # every partition declared before any load ends
    assert sorted(codes, key=lambda c: c.name) == [grpc.StatusCode.OK] * 2 + [grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(held) == 2
