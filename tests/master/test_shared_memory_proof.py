"""The master uses shared memory with a worker only once the worker proved it reads the master's directory (it sent
back the nonce the master wrote there); otherwise payloads go through the network and the worker list says why.

Real master and worker servers in this process; the workers that read another directory or lie are real
WorkerServicers with one thing changed, as a process on another host, or one lying about who it is, would be."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from gradcode.common.ops.metrics import WORKER_REGISTRY
from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.master.node import MasterNode
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2
from gradcode.worker.node import WorkerNode
from gradcode.worker.service import WorkerServicer

from .test_master_node import job_spec

TIMEOUT = 120.0
ITERATIONS = 3


class ReadsAnotherDirectory(WorkerServicer):
    """Reads its probe in another directory than the one offered, with a nonce of its own: a worker on another host
    (or in another container) whose /dev/shm holds a directory at the offered path."""

    def __init__(self, elsewhere: SharedDirectory, **options: Any) -> None:
        super().__init__(**options)
        self.elsewhere = elsewhere

    async def LoadJob(self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], context: Any) -> Any:  # noqa: N802
        async def redirected() -> AsyncIterator[worker_pb2.LoadJobChunk]:
            async for chunk in request_iterator:
                if chunk.HasField("setup") and chunk.setup.HasField("shared_memory"):
                    offer = self.elsewhere.offer(chunk.setup.worker_id)
                    assert offer is not None
                    chunk.setup.shared_memory.CopyFrom(offer)
                yield chunk

        return await super().LoadJob(redirected(), context)


class ClaimsAProof(WorkerServicer):
    """Reads nothing and answers every offer with a made-up proof: a process lying that it shares the master's
    memory."""

    async def LoadJob(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802 - proto name
        reply = await super().LoadJob(request_iterator, context)
        reply.shared_memory_proof = "0" * 32
        return reply


def _shared_bytes() -> float:
    return WORKER_REGISTRY.get_sample_value("gradcode_shared_bytes_sent_total") or 0.0


async def _run(
    tmp_path: Path, *, machine_id: str | None = None, servicer: type[WorkerServicer] | None = None, **extra: Any
) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], master_pb2.WorkerInfo, float]:
    """A job on one worker (registered with ``machine_id``, serving ``servicer``) of a master whose jobs offer
    shared memory under ``tmp_path``: its info and reports, the worker as listed after it, and the bytes the
    worker left in shared memory."""
    root = tmp_path / "shm"
    root.mkdir(mode=0o700, exist_ok=True)
    before = _shared_bytes()
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        master = await stack.enter_async_context(MasterNode(grace=0.5, shared_memory=root))
        worker = WorkerNode(master_address=master.address, name="w", grace=0.5, machine_id=machine_id)
        if servicer is not None:
            worker.servicer = servicer(instance_id=worker.instance_id, **extra)
        await stack.enter_async_context(worker)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(master.address))
        stub: Any = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        while not any(w.is_up for w in master.pool.workers):
            await asyncio.sleep(0.05)
        job = await stub.CreateJob(job_spec("uncoded", {"n": 1}, iterations=ITERATIONS, verify=True))
        reports = [r async for r in stub.WatchJob(master_pb2.WatchJobRequest(job_id=job.job_id))]
        info = await stub.GetJob(master_pb2.GetJobRequest(job_id=job.job_id))
        (listed,) = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and len(reports) == ITERATIONS, info.message
    assert all(r.exact and 0 <= r.verify_error <= 1e-9 for r in reports)
    return info, reports, listed, _shared_bytes() - before


async def test_a_worker_that_reads_the_masters_directory_proves_it_and_uses_shared_memory(tmp_path: Path) -> None:
    _, _, listed, shared = await _run(tmp_path)
    assert listed.transport == "shared memory"
    assert shared > 0


async def test_a_worker_reading_another_directory_fails_the_proof_and_uses_the_network(tmp_path: Path) -> None:
    (tmp_path / "other-host").mkdir()
    elsewhere = SharedDirectory.create(tmp_path / "other-host")
    assert elsewhere is not None
    try:
        _, _, listed, shared = await _run(tmp_path, servicer=ReadsAnotherDirectory, elsewhere=elsewhere)
    finally:
        elsewhere.close()
    assert listed.transport == "network (shared memory not shared: nonce mismatch)"
    assert shared == 0


async def test_a_worker_lying_about_its_proof_gets_the_network(tmp_path: Path) -> None:
    _, _, listed, shared = await _run(tmp_path, servicer=ClaimsAProof)
    assert listed.transport == "network (shared memory not shared: nonce mismatch)"
    assert shared == 0


async def test_a_worker_of_another_machine_is_not_offered_shared_memory(tmp_path: Path) -> None:
    _, _, listed, shared = await _run(tmp_path, machine_id="another-host")
    assert listed.transport == "network (another machine: its machine id is not the master's)"
    assert shared == 0
