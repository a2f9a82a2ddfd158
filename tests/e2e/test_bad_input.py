"""Bad input on the wire: every bad request gets a gRPC status with a precise message, and the server keeps serving.

A real master with two real worker processes (module scope). Gradient chunks that are stale, for an
unknown job, of the wrong length, from a worker id that was not asked, or corrupted are sent to the
master by a hostile worker: a small Worker server in this test process that the master reaches over
gRPC like any other (registered through RegisterWorker). The master's gather refuses each one, names
the reason and the worker, and fails the job at its deadline instead of using a wrong gradient.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.transport.security import new_process_secret
from gradcode.common.transport.serving import start_server
from gradcode.common.transport.wire import tensor_from_array
from gradcode.v1 import common_pb2, master_pb2, worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job, start_cluster
from tests.helpers import HostileWorker, Mangle, fixed_delay

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(2, tmp_path_factory.mktemp("cluster2")) as cluster:
        yield cluster


async def expect_error(call: Any, code: grpc.StatusCode, *fragments: str) -> str:
    """Await ``call``; assert it fails with ``code`` and a message containing every fragment."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    details = info.value.details() or ""
    for fragment in fragments:
        assert fragment in details, details
    return details


async def still_serving(stub: Any, expected_workers: int = 2) -> None:
    reply = await stub.ListWorkers(master_pb2.ListWorkersRequest(), timeout=5)
    assert len(reply.workers) >= expected_workers


# ---- the master's control API ------------------------------------------------------------------------
CREATE_JOB_REFUSALS = [
    ("malformed: no iterations", job_spec("uncoded", {"n": 2}, iterations=0), "JobSpec.iterations must be in [1, "),
    (
        "unknown scheme",
        job_spec("turbo", {"n": 2}),
        "Unknown gradient code 'turbo'; available schemes: binary, ",
    ),
    (
        "invalid code parameters",
        job_spec("fractional", {"n": 6, "s": 3}),
        "Invalid parameters for gradient code 'fractional': Argument 's' must satisfy (s + 1) | n",
    ),
    (
        "unknown code parameter",
        job_spec("cyclic", {"n": 2, "s": 1, "speed": 3}),
        "does not take parameter(s) ['speed']",
    ),
    (
        "unknown dataset",
        job_spec("uncoded", {"n": 2}, dataset=master_pb2.DatasetSpec(name="imagenet")),
        "Unknown dataset 'imagenet'; valid names are ['digits'",
    ),
    (
        "unknown model",
        job_spec("uncoded", {"n": 2}, model=common_pb2.ModelSpec(kind="mlp")),
        "Unknown model kind 'mlp'; valid kinds are ['linear', 'logistic', 'softmax', 'digits_cnn', 'digits_mlp']",
    ),
    (
        "unknown optimizer",
        job_spec("uncoded", {"n": 2}, optimizer=master_pb2.OptimizerSpec(kind="adam", learning_rate=0.1)),
        "Unknown optimizer 'adam'; valid optimizers are ['gd', 'nesterov']",
    ),
    (
        "unknown worker id",
        job_spec("uncoded", {"n": 2}, worker_ids=[0, 99]),
        "JobSpec.worker_ids names unknown worker id(s) [99]; known worker ids are [0, 1",
    ),
    (
        "invalid straggler model",
        job_spec("uncoded", {"n": 2}, straggler=fixed_delay(-1.0)),
        "Straggler model 'fixed' refused: Argument 'delay_seconds' must be a finite number >= 0",
    ),
]


@pytest.mark.parametrize(("case", "spec", "fragment"), CREATE_JOB_REFUSALS, ids=[c[0] for c in CREATE_JOB_REFUSALS])
async def test_create_job_refuses_bad_specs_precisely(
    cluster2: Cluster, case: str, spec: master_pb2.JobSpec, fragment: str
) -> None:
    async with asyncio.timeout(120), master_stub(cluster2.master_address) as stub:
        await expect_error(stub.CreateJob(spec), grpc.StatusCode.INVALID_ARGUMENT, fragment)
        await still_serving(stub)


async def test_too_few_workers_without_waiting_is_a_failed_precondition(cluster2: Cluster) -> None:
    async with asyncio.timeout(120), master_stub(cluster2.master_address) as stub:
        await expect_error(
            stub.CreateJob(job_spec("binary", {"n": 40, "s": 1})),
            grpc.StatusCode.FAILED_PRECONDITION,
            "needs 40 workers but",
            "start more workers or set wait_for_workers_seconds",
        )
        await still_serving(stub)


async def test_unknown_job_ids_are_not_found(cluster2: Cluster) -> None:
    async with asyncio.timeout(120), master_stub(cluster2.master_address) as stub:
        calls = [
            stub.GetJob(master_pb2.GetJobRequest(job_id="ghost")),
            stub.GetModel(master_pb2.GetModelRequest(job_id="ghost")),
            stub.CancelJob(master_pb2.CancelJobRequest(job_id="ghost")),
        ]
        for call in calls:
            await expect_error(call, grpc.StatusCode.NOT_FOUND, "Unknown job 'ghost'.")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.WatchJob(master_pb2.WatchJobRequest(job_id="ghost")):
                pass
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "Unknown job 'ghost'" in (info.value.details() or "")
        await still_serving(stub)


async def test_duplicate_job_id_and_bad_worker_address_are_refused(cluster2: Cluster) -> None:
    spec = job_spec("uncoded", {"n": 2}, iterations=1, job_id="dup-job", worker_ids=cluster2.ids)
    async with asyncio.timeout(120), master_stub(cluster2.master_address) as stub:
        info, _ = await run_job(cluster2.master_address, spec)
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        await expect_error(stub.CreateJob(spec), grpc.StatusCode.ALREADY_EXISTS, "Job 'dup-job' already exists")
        await expect_error(
            stub.RegisterWorker(
                master_pb2.RegisterWorkerRequest(address="no-port-here", process_secret=new_process_secret())
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Worker address must look like HOST:PORT",
            "not 'no-port-here'",
        )
        await still_serving(stub)


# ---- the worker's API ----------------------------------------------------------------------------
def tiny_job(job_id: str, *, straggler: common_pb2.StragglerSpec | None = None) -> list[worker_pb2.LoadJobChunk]:
    """A linear model on 3 samples of 2 features: one partition, one row (coefficient 1)."""
    setup = worker_pb2.JobSetup(
        job_id=job_id,
        worker_id=0,
        model=common_pb2.ModelSpec(kind="linear", num_features=2),
        rows=[worker_pb2.RowDefinition(row=0, partitions=[0], coefficients_real=[1.0])],
        num_partitions_sent=1,
        message_dtype=common_pb2.DTYPE_FLOAT64,
    )
    if straggler is not None:
        setup.straggler.CopyFrom(straggler)
    data = worker_pb2.PartitionData(
        partition=0,
        num_samples=3,
        features=np.arange(6, dtype="<f8").tobytes(),
        labels=np.ones(3, dtype="<f8").tobytes(),
    )
    return [worker_pb2.LoadJobChunk(setup=setup), worker_pb2.LoadJobChunk(data=data)]


def compute(
    job_id: str, iteration: int = 1, *, worker_id: int = 0, length: int = 3, rows: tuple[int, ...] = (0,)
) -> Any:
    return worker_pb2.ComputeRequest(
        job_id=job_id, iteration=iteration, worker_id=worker_id, model=tensor_from_array(np.zeros(length)), rows=rows
    )


async def drain(call: Any) -> list[worker_pb2.GradientChunk]:
    return [chunk async for chunk in call]


async def test_worker_refuses_bad_jobs_and_requests_and_keeps_serving(cluster2: Cluster) -> None:
    async with asyncio.timeout(120), grpc.aio.insecure_channel(cluster2.addresses[0]) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        await expect_error(drain(stub.Compute(compute("ghost"))), grpc.StatusCode.NOT_FOUND, "Unknown job 'ghost'")
        wrong_count = tiny_job("bad-load")
        wrong_count[0].setup.num_partitions_sent = 2
        await expect_error(
            stub.LoadJob(iter(wrong_count)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "announces 2 partitions",
            "need exactly 1",
        )
        await expect_error(
            stub.LoadJob(iter(tiny_job("bad-order")[::-1])), grpc.StatusCode.INVALID_ARGUMENT, "before any setup"
        )
        await stub.LoadJob(iter(tiny_job("tiny")))
        await expect_error(
            drain(stub.Compute(compute("tiny", length=5))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "The model has 5 parameters",
            "expects 3",
        )
        await expect_error(
            drain(stub.Compute(compute("tiny", worker_id=4))),
            grpc.StatusCode.FAILED_PRECONDITION,
            "the request is for worker 4",
        )
        await expect_error(
            drain(stub.Compute(compute("tiny", rows=(7,)))), grpc.StatusCode.INVALID_ARGUMENT, "Row(s) [7] were not"
        )
        chunks = await drain(stub.Compute(compute("tiny")))  # and a good request still works
        assert chunks and chunks[0].header.length == 3 and chunks[-1].HasField("trailer")


async def test_a_computation_for_a_stale_iteration_is_abandoned_not_sent(cluster2: Cluster) -> None:
    async with asyncio.timeout(120), grpc.aio.insecure_channel(cluster2.addresses[1]) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        await stub.LoadJob(iter(tiny_job("slow", straggler=fixed_delay(1.0))))
        stale = asyncio.ensure_future(drain(stub.Compute(compute("slow", iteration=2))))
        await until_started(stub, "slow", 2)
        newer = stub.Compute(compute("slow", iteration=3))
        await expect_error(stale, grpc.StatusCode.ABORTED, "Iteration 2 of job 'slow' was abandoned")
        newer.cancel()
        await stub.EndJob(worker_pb2.EndJobRequest(job_id="slow"))


async def until_started(stub: Any, job_id: str, iteration: int) -> None:
    """Poll until the worker has started ``iteration`` of ``job_id``: it then refuses an older one as stale."""
    while True:
        probe = stub.Compute(compute(job_id, iteration=iteration - 1))
        try:
            await asyncio.wait_for(drain(probe), 0.05)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED and f"older than iteration {iteration}" in (exc.details() or ""):
                return
        except TimeoutError:  # the probe itself started (it sleeps in the straggler delay): not yet
            probe.cancel()
        await asyncio.sleep(0.01)


# ---- bad gradient chunks reaching the master ----------------------------------------------------
def _stale(c: worker_pb2.GradientChunk) -> None:
    c.iteration -= 1


def _other_job(c: worker_pb2.GradientChunk) -> None:
    c.job_id = "someone-elses-job"


def _other_worker(c: worker_pb2.GradientChunk) -> None:
    c.worker_id = 9


def _corrupt(c: worker_pb2.GradientChunk) -> None:
    if c.HasField("trailer"):
        c.trailer.xxh3 ^= 1


def _unrequested_row(c: worker_pb2.GradientChunk) -> None:
    c.row = 5


def _untouched(c: worker_pb2.GradientChunk) -> None:
    pass


def _timeless(c: worker_pb2.GradientChunk) -> None:
    if c.HasField("trailer"):
        c.trailer.model_seconds = math.nan


BAD_CHUNKS = [
    ("stale iteration", _stale, 0, "Chunk for stale or future iteration 0 arrived on the stream of worker 0"),
    ("unknown job", _other_job, 0, "Chunk for job 'someone-elses-job' arrived on the stream of worker 0"),
    ("wrong gradient length", _untouched, 1, "has 653 elements; the gradient has 652"),  # 650 params + 2 statistics
    ("unknown worker id", _other_worker, 0, "Chunk claims worker 9 on the stream of worker 0"),
    ("failed checksum", _corrupt, 0, "failed its XXH3-64 check"),
    ("row not asked for", _unrequested_row, 0, "Row 5 was not requested"),
    ("a time that is no time", _timeless, 0, "reports its model_seconds nan, which must be a finite number >= 0"),
]


@pytest.mark.parametrize(("case", "mangle", "extra", "reason"), BAD_CHUNKS, ids=[c[0] for c in BAD_CHUNKS])
async def test_master_refuses_bad_gradient_chunks_and_fails_the_job_naming_the_worker(
    cluster2: Cluster, case: str, mangle: Mangle, extra: int, reason: str
) -> None:
    hostile = HostileWorker(mangle, extra)
    handle = await start_server(
        "127.0.0.1",
        0,
        registrars=[lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(hostile, server)],
        service_names=["gradcode.v1.Worker"],
    )
    try:
        async with asyncio.timeout(120), master_stub(cluster2.master_address) as stub:
            request = master_pb2.RegisterWorkerRequest(
                address=handle.address, name="hostile", process_secret=hostile.process_secret
            )
            reply = await stub.RegisterWorker(request)
            spec = job_spec(
                "uncoded",
                {"n": 1},
                iterations=2,
                worker_ids=[reply.worker_id],
                iteration_deadline_seconds=1.0,
                dataset=master_pb2.DatasetSpec(name="digits", num_samples=200),
            )
            info, reports = await run_job(cluster2.master_address, spec)
            assert info.state == master_pb2.JOB_STATE_FAILED
            assert f"missing workers [{reply.worker_id}]" in info.message and handle.address in info.message
            assert "WireError: " in info.message and reason in info.message, info.message
            assert info.iterations_done == 0 and hostile.computes >= 1
            assert reports[-1].state == master_pb2.JOB_STATE_FAILED
            workers = {w.worker_id: w for w in (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers}
            assert reason in workers[reply.worker_id].last_error
            # The master keeps serving, and the real workers still train.
            good = job_spec("uncoded", {"n": 2}, iterations=1, worker_ids=cluster2.ids)
            good_info, _ = await run_job(cluster2.master_address, good)
            assert good_info.state == master_pb2.JOB_STATE_SUCCEEDED, good_info.message
    finally:
        await handle.stop(0)
