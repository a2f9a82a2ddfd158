"""Each bad input of issue 9 against real processes: its precise status, and the servers keep serving.

A master (with a data directory) and two workers (with a small memory budget) as processes on
loopback, security off: the refusals hold without credentials (with them an outsider gets no further
than the interceptor). The worker test runs before any job, so the budget holds only what it loads.
"""

from __future__ import annotations

import asyncio
import io
import math
import zipfile
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient
from gradcode.common.codes.registry import make_code
from gradcode.common.transport.security import Security, new_process_secret
from gradcode.common.transport.wire import tensor_from_array
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, job_spec
from tests.helpers import free_port
from tests.worker.conftest import data_for, job_setup, load_chunks, make_partitions, softmax_model

pytestmark = pytest.mark.e2e

SAMPLES = 10_000
PARTITIONS = make_partitions(1, samples=SAMPLES)
JOB_BYTES = sum(X.nbytes + y.nbytes for X, y in PARTITIONS.values())
BUDGET_JOBS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("issue9")
    data_dir = run_dir / "data"
    data_dir.mkdir()
    header = io.BytesIO()  # a "compressed .npz" whose headers declare 1.6 GB
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (200_000, 1000)})
    with zipfile.ZipFile(data_dir / "bomb.npz", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("X.npy", header.getvalue() + bytes(1 << 20))
        archive.writestr("y.npy", header.getvalue())
    budget_gib = (BUDGET_JOBS + 0.5) * JOB_BYTES / 1024**3
    env = {"GRADCODE_DATA_DIR": str(data_dir), "GRADCODE_MEMORY_BUDGET": f"{budget_gib:.9f}"}
    with LocalCluster(2, run_dir=run_dir, env=env) as local:
        c = Cluster(local)
        c.wait_all_up()
        yield c


async def status(call: Any) -> tuple[str, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


async def test_registration_refusals_leave_the_pool_clean(cluster: Cluster) -> None:
    async with asyncio.timeout(120), grpc.aio.insecure_channel(cluster.master_address) as channel:
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        real = cluster.addresses[0]
        secret = new_process_secret()
        cases = {
            "40 MB name": master_pb2.RegisterWorkerRequest(address=real, name="n" * (40 << 20), process_secret=secret),
            "bogus address": master_pb2.RegisterWorkerRequest(
                address=f"127.0.0.1:{free_port()}", name="bogus", process_secret=secret
            ),
            "the master's own address": master_pb2.RegisterWorkerRequest(
                address=cluster.master_address, process_secret=secret
            ),
            "a real worker's address": master_pb2.RegisterWorkerRequest(
                address=real, name="thief", instance_id="x", process_secret=secret
            ),
        }
        seen = {case: await status(stub.RegisterWorker(request)) for case, request in cases.items()}
        assert {case: code for case, (code, _) in seen.items()} == {
            "40 MB name": "INVALID_ARGUMENT",
            "bogus address": "FAILED_PRECONDITION",
            "the master's own address": "FAILED_PRECONDITION",
            "a real worker's address": "ALREADY_EXISTS",
        }
        assert all(len(details) < 600 for _, details in seen.values())
        assert "--advertise" in seen["bogus address"][1]
        workers = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
        assert sorted(w.address for w in workers) == sorted(cluster.addresses)
        assert all(w.state == master_pb2.WORKER_STATE_UP and w.name != "thief" for w in workers)


async def test_worker_refusals(cluster: Cluster) -> None:
    code = make_code("uncoded", n=1)
    async with asyncio.timeout(120), grpc.aio.insecure_channel(cluster.addresses[1]) as channel:
        stub: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        loads = []
        for i in range(BUDGET_JOBS + 2):
            chunks = load_chunks(job_setup(code, 0, job_id=f"hog-{i}"), data_for(code, 0, PARTITIONS))
            loads.append((await status(stub.LoadJob(iter(chunks))))[0])
        assert loads == ["OK"] * BUDGET_JOBS + ["RESOURCE_EXHAUSTED"] * 2
        params = np.full(softmax_model().num_params, np.nan)
        request = worker_pb2.ComputeRequest(job_id="hog-0", worker_id=0, rows=[0], model=tensor_from_array(params))
        code_name, details = await status(stub.Compute(request).read())
        assert code_name == "INVALID_ARGUMENT" and "NaN or infinite" in details
        unknown, details = await status(stub.EndJob(worker_pb2.EndJobRequest(job_id="z" * 100_000)))
        assert unknown == "NOT_FOUND" and "hog-1" not in details and len(details) < 300
        for i in range(BUDGET_JOBS):
            await stub.EndJob(worker_pb2.EndJobRequest(job_id=f"hog-{i}"))
    async with GradcodeClient(cluster.master_address, security=Security()) as client:
        info, reports = await asyncio.wait_for(client.run(job_spec("cyclic", {"n": 2, "s": 1}, iterations=3)), 120)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and all(r.exact for r in reports)


async def test_job_spec_refusals(cluster: Cluster) -> None:
    async with asyncio.timeout(120), GradcodeClient(cluster.master_address, security=Security()) as client:
        nan_params = job_spec("cyclic", {"n": 2, "s": 1})
        nan_params.code.params.update({"s": math.nan})
        inf_extra = job_spec("cyclic", {"n": 2, "s": 1})
        inf_extra.extra.update({"lr_boost": math.inf})
        bomb = job_spec("cyclic", {"n": 2, "s": 1}, dataset=master_pb2.DatasetSpec(name="file", path="bomb.npz"))
        seen = {
            "NaN in code.params": await status(client.create_job(nan_params)),
            "inf in extra": await status(client.create_job(inf_extra)),
            "100 KB job id": await status(client.get_job("j" * 100_000)),
            "compressed .npz of 1.6 GB": await status(client.create_job(bomb)),
        }
        assert {case: code for case, (code, _) in seen.items()} == {
            "NaN in code.params": "INVALID_ARGUMENT",
            "inf in extra": "INVALID_ARGUMENT",
            "100 KB job id": "NOT_FOUND",
            "compressed .npz of 1.6 GB": "INVALID_ARGUMENT",
        }
        assert "'bomb.npz' refused" in seen["compressed .npz of 1.6 GB"][1]  # the precise reason: unit test
        assert all(len(details) < 600 for _, details in seen.values())
        info, reports = await client.run(job_spec("cyclic", {"n": 2, "s": 1}, iterations=3))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED and all(r.exact for r in reports)
