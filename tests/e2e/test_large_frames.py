"""Large models over links with a worker frozen mid-job (:mod:`gradcode.common.transport.egress`), real processes.

At p = 4e5 every model and message is a large frame (3.2 MB), so the master sends its models one at a time. A frozen
worker stops reading: the model sent to it stays in the master, and would hold every later model back if its turn
never ended. It ends after two stall periods at most, so the job keeps its pace and every gradient stays exact.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from pathlib import Path

import pytest

from gradcode.common.transport.egress import LARGE_FRAME_BYTES
from gradcode.v1 import common_pb2, master_pb2
from tests.e2e.conftest import job_spec, run_job, start_cluster
from tests.e2e.test_hold import _own_machine, _struck_on_iteration_2
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

FEATURES = 400_000
ITERATIONS = 16
EXACT = 1e-9


async def test_a_frozen_worker_holds_the_masters_large_models_back_for_a_moment_only(tmp_path: Path) -> None:
    assert 8 * FEATURES >= 2 * LARGE_FRAME_BYTES
    ports = [free_port() for _ in range(4)]
    arrived: list[float] = []
    own_machines = lambda i: _own_machine(i, ports)  # noqa: E731 - links, no shared memory
    with start_cluster(4, tmp_path, own_machines, ["--max-features", str(FEATURES)]) as cluster:
        spec = job_spec(
            "cyclic", {"n": 4, "s": 1}, iterations=ITERATIONS, verify=True, worker_ids=cluster.ids,
            dataset=master_pb2.DatasetSpec(name="linear", num_samples=16, num_features=FEATURES),
            model=common_pb2.ModelSpec(kind="linear", num_features=FEATURES), iteration_deadline_seconds=20,
        )  # fmt: skip
        with _struck_on_iteration_2(cluster, "freeze", victims=(1,)) as strike:

            def watch(report: master_pb2.IterationReport) -> None:
                arrived.append(time.perf_counter())
                strike(report)

            async with asyncio.timeout(240):
                info, reports = await run_job(cluster.master_address, spec, watch)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1))
    bad = [(r.iteration, r.verify_error) for r in reports if not (r.exact and 0 <= r.verify_error <= EXACT)]
    assert not bad
    frozen = cluster.ids[1]
    assert all(frozen not in r.used_workers for r in reports[3:]), "a frozen worker's message was used"
    # the frozen worker's unread models fill the kernel's buffers within a few rounds; from then on each round's model
    # to it holds the master's turn. With the stall rule the first such round took 0.23 s, the others 0.03-0.06 s;
    # without it every round took 2.0-2.2 s (measured)
    gaps = [b - a for a, b in itertools.pairwise(arrived[2:])]
    assert statistics.median(gaps) < 1.0, gaps
