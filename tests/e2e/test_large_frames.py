"""Large models over links with a worker frozen mid-job (:mod:`gradcode.common.transport.egress`), real processes.

At p = 4e5 every model and message is a large frame (3.2 MB), so the master sends its models one at a time. A frozen
worker stops reading: the model sent to it stays in the master, and would hold every later model back if its turn
never ended. It ends after two stall periods at most, so the job keeps its pace and every gradient stays exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from pathlib import Path

import pytest

from gradcode.common.transport.egress import LARGE_FRAME_BYTES
from gradcode.v1 import common_pb2, master_pb2
from tests.e2e.conftest import Cluster, job_spec, run_job, start_cluster
from tests.e2e.test_hold import _own_machine, _struck_on_iteration_2
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

FEATURES = 400_000
ITERATIONS = 16
EXACT = 1e-9


def _spec(workers: list[int], iterations: int = ITERATIONS) -> master_pb2.JobSpec:
    """Linear regression with p = 4e5 parameters, cyclic n = 4, s = 1, every iteration verified (a small step: 0.5
    diverges within 40 iterations)."""
    return job_spec(
        "cyclic", {"n": 4, "s": 1}, iterations=iterations, learning_rate=0.01, verify=True, worker_ids=workers,
        dataset=master_pb2.DatasetSpec(name="linear", num_samples=16, num_features=FEATURES),
        model=common_pb2.ModelSpec(kind="linear", num_features=FEATURES), iteration_deadline_seconds=20,
    )  # fmt: skip


def _large_models_cluster(workers: int, run_dir: Path) -> contextlib.AbstractContextManager[Cluster]:
    """A master taking p = 4e5 and ``workers`` workers each on a machine of its own (links, no shared memory)."""
    ports = [free_port() for _ in range(workers)]
    return start_cluster(workers, run_dir, lambda i: _own_machine(i, ports), ["--max-features", str(FEATURES)])


def _assert_exact(info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport]) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    bad = [(r.iteration, r.verify_error) for r in reports if not (r.exact and 0 <= r.verify_error <= EXACT)]
    assert not bad


async def test_a_frozen_worker_holds_the_masters_large_models_back_for_a_moment_only(tmp_path: Path) -> None:
    assert 8 * FEATURES >= 2 * LARGE_FRAME_BYTES
    arrived: list[float] = []
    with _large_models_cluster(4, tmp_path) as cluster:
        spec = _spec(cluster.ids)
        with _struck_on_iteration_2(cluster, "freeze", victims=(1,)) as strike:

            def watch(report: master_pb2.IterationReport) -> None:
                arrived.append(time.perf_counter())
                strike(report)

            async with asyncio.timeout(240):
                info, reports = await run_job(cluster.master_address, spec, watch)
    _assert_exact(info, reports)
    assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1))
    frozen = cluster.ids[1]
    assert all(frozen not in r.used_workers for r in reports[3:]), "a frozen worker's message was used"
    # the frozen worker's unread models fill the kernel's buffers within a few rounds; from then on each round's model
    # to it holds the master's turn. With the stall rule the first such round took 0.23 s, the others 0.03-0.06 s;
    # without it every round took 2.0-2.2 s (measured)
    gaps = [b - a for a, b in itertools.pairwise(arrived[2:])]
    assert statistics.median(gaps) < 1.0, gaps


async def test_a_frozen_worker_of_one_job_does_not_hold_back_another_jobs_large_models(tmp_path: Path) -> None:
    """Turns are the master process's, shared by its jobs in arrival order. Job B starts once job A's frozen worker (A's
    worker 0, frozen on A's second report) has had its unread models fill the kernel's buffers: A's frozen models
    then hold B's back two stall periods at most, and both jobs end exact. Without the stall rule B's rounds took
    2.1-2.4 s each (measured)."""
    arrived: list[float] = []
    a_stuck = asyncio.Event()
    with _large_models_cluster(8, tmp_path) as cluster, _struck_on_iteration_2(cluster, "freeze") as strike:

        def watch_a(report: master_pb2.IterationReport) -> None:
            strike(report)
            if report.iteration == 6:
                a_stuck.set()

        def watch_b(report: master_pb2.IterationReport) -> None:
            arrived.append(time.perf_counter())

        async def run_b() -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport]]:
            await a_stuck.wait()
            return await run_job(cluster.master_address, _spec(cluster.ids[4:]), watch_b)

        async with asyncio.timeout(240):
            (a_info, a_reports), (b_info, b_reports) = await asyncio.gather(
                run_job(cluster.master_address, _spec(cluster.ids[:4], iterations=30), watch_a), run_b()
            )
    _assert_exact(a_info, a_reports)
    _assert_exact(b_info, b_reports)
    gaps = [b - a for a, b in itertools.pairwise(arrived)]
    assert statistics.median(gaps) < 1.0, gaps
