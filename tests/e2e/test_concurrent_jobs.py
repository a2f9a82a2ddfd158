"""Many jobs created at once on a few workers, each watched by several clients: every one succeeds, exactly as alone.

Issue 25: six jobs created at once on three workers (cyclic n = 3, s = 1) failed three of six, twelve on eight
workers eight of twelve: a worker refused its third concurrent LoadJob (each load in flight reserved the whole
per-job memory cap out of the worker's budget) and the master then marked that worker DOWN for every job. Here
each job's final parameters must equal those of the same job run alone (one decode differs from another only
by rounding, so to ``rtol`` 1e-9).

The full-size check of the issue (16 jobs on 8 workers, 3 watchers each) is the ``slow`` case:
``python -m pytest -q -m slow tests/e2e/test_concurrent_jobs.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradcode.client.sdk import GradcodeClient
from gradcode.common.transport.wire import struct_from_dict
from gradcode.v1 import common_pb2, master_pb2
from tests.e2e.conftest import start_cluster
from tests.e2e.test_training import EXACT

pytestmark = pytest.mark.e2e

ITERATIONS = 8
TREE = ("coded_reduce", {"n": 2, "s": 1, "L": 2})
"""A CodedReduce tree of six nodes."""
SMALL = [
    ("cyclic", {"n": 3, "s": 1, "seed": 0}),  # the configuration
    ("fractional", {"n": 4, "s": 1}),
    ("binary", {"n": 4, "s": 1}),
    ("reed_solomon", {"n": 4, "k": 4, "w": 2}),
    ("cyclic", {"n": 4, "s": 2, "seed": 1}),
    ("coded_reduce", {"n": 4, "s": 1}),
]
FULL = [
    ("cyclic", {"n": 3, "s": 1, "seed": 0}),
    ("cyclic", {"n": 8, "s": 2, "seed": 0}),
    ("fractional", {"n": 8, "s": 1}),
    ("binary", {"n": 8, "s": 1}),
    ("reed_solomon", {"n": 8, "k": 8, "w": 3}),
    TREE,
]


def spec_for(scheme: str, params: dict[str, Any], seed: int) -> master_pb2.JobSpec:
    """A verified job on the digits data; ``seed`` varies the partitioning and so the run."""
    return master_pb2.JobSpec(
        code=common_pb2.CodeSpec(name=scheme, params=struct_from_dict(params)),
        dataset=master_pb2.DatasetSpec(name="digits"),
        model=common_pb2.ModelSpec(kind="softmax"),
        optimizer=master_pb2.OptimizerSpec(kind="gd", learning_rate=0.5),
        iterations=ITERATIONS,
        verify=True,
        seed=seed,
        iteration_deadline_seconds=30.0,
        wait_for_workers_seconds=30.0,
    )


async def watch(address: str, job_id: str) -> list[master_pb2.IterationReport]:
    """Every report of ``job_id``, on a connection of its own."""
    async with GradcodeClient(address) as client:
        return [report async for report in client.watch(job_id)]


async def solo(client: GradcodeClient, spec: master_pb2.JobSpec) -> np.ndarray:
    info, _ = await client.run(spec)
    return await client.get_model(info.job_id)


async def check_concurrent_jobs(tmp_path: Path, workers: int, schemes: list[tuple[str, dict[str, Any]]],
                                jobs: int, watchers: int) -> str:  # fmt: skip
    """Run ``jobs`` jobs (``schemes`` in turn) alone, then all at once with ``watchers`` watchers each; assert
    every one succeeded, exactly, with the parameters of its solo run. Returns a summary line."""
    specs = [spec_for(*schemes[i % len(schemes)], seed=i // len(schemes)) for i in range(jobs)]
    with start_cluster(workers, tmp_path) as cluster:
        async with GradcodeClient(cluster.master_address) as client:
            alone = [await solo(client, spec) for spec in specs]
            started = time.perf_counter()
            created = await asyncio.gather(*(client.create_job(spec) for spec in specs))
            ids = [job.job_id for job in created]
            seen = await asyncio.gather(
                *(watch(cluster.master_address, job_id) for job_id in ids for _ in range(watchers))
            )
            infos = [await client.get_job(job_id) for job_id in ids]
            seconds = time.perf_counter() - started
            failed = [(i, info.message) for i, info in enumerate(infos) if info.state != master_pb2.JOB_STATE_SUCCEEDED]
            assert not failed, f"{len(failed)} of {jobs} jobs failed: {failed}"
            for i, job_id in enumerate(ids):
                for reports in seen[i * watchers : (i + 1) * watchers]:
                    assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1)), (i, specs[i].code)
                    assert all(r.exact and 0 <= r.verify_error <= EXACT for r in reports), (i, specs[i].code)
                together = await client.get_model(job_id)
                np.testing.assert_allclose(together, alone[i], rtol=1e-9, err_msg=f"job {i}: {specs[i].code}")
            down = [w.worker_id for w in await client.list_workers() if w.state != master_pb2.WORKER_STATE_UP]
            assert not down, f"workers marked DOWN by concurrent jobs: {down}"
    return f"{jobs} of {jobs} jobs succeeded on {workers} workers, {watchers} watchers each, in {seconds:.1f} s"


async def test_jobs_created_at_once_all_succeed_as_they_would_alone(tmp_path: Path) -> None:
    print(await check_concurrent_jobs(tmp_path, workers=4, schemes=SMALL, jobs=6, watchers=2))


@pytest.mark.slow
async def test_sixteen_jobs_on_eight_workers_with_three_watchers_each(tmp_path: Path) -> None:
    print(await check_concurrent_jobs(tmp_path, workers=8, schemes=FULL, jobs=16, watchers=3))
