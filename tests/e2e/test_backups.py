"""Backups at low priority, with real master and worker processes: each round expects the code's minimal decoding
set, the other workers compute at niceness 19 (read from /proc, per thread; a job's first message always runs in a
thread, later short ones inline), every gradient stays exact, and a primary killed mid-job is covered by a backup.
Which messages a decode uses is up to the scheduler, so only the kill's aftermath is asserted of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, run_job, start_cluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is a Linux feature"),
]

EXACT = 1e-9
BINARY = {"n": 4, "s": 1}
"""Congruence classes {0, 2} and {1, 3}: the first round expects {0, 2}, and asks 1 and 3 as backups."""


def _niced_threads(pid: int) -> int:
    """Threads of process ``pid`` at niceness 19 (field 19 of /proc/<pid>/task/<tid>/stat)."""
    count = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()
        count += int(fields[16]) == 19
    return count


def _spec(cluster: Cluster, **fields: object) -> master_pb2.JobSpec:
    return job_spec("binary", BINARY, iterations=8, verify=True, worker_ids=cluster.ids[:4], **fields)


def _used(cluster: Cluster, report: master_pb2.IterationReport) -> tuple[int, ...]:
    """The job workers (indices) whose messages ``report``'s decode used (reports name pool ids)."""
    return tuple(sorted(cluster.ids.index(w) for w in report.used_workers))


def _assert_exact(info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport]) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    bad = [(r.iteration, r.verify_error) for r in reports if not (r.exact and 0 <= r.verify_error <= EXACT)]
    assert not bad


async def test_backups_compute_in_a_niced_thread_the_expected_workers_do_not(tmp_path: Path) -> None:
    with start_cluster(4, tmp_path) as cluster:
        pids = [p.process.pid for p in cluster.processes]
        info, reports = await run_job(cluster.master_address, _spec(cluster, backup_priority="normal"))
        _assert_exact(info, reports)
        assert [_niced_threads(pid) for pid in pids] == [0, 0, 0, 0], "'normal' asks everyone alike"
        assert not any(r.backup_workers or r.promoted_workers for r in reports)

        info, reports = await run_job(cluster.master_address, _spec(cluster))  # the default: low
        _assert_exact(info, reports)
        niced = [_niced_threads(pid) for pid in pids]  # (0 or 2, late in a round, may be a backup later on)
        assert niced[1] >= 1 and niced[3] >= 1, (
            f"the first round's backups, 1 and 3, computed in a niced thread: {niced}"
        )
        # The reports say so; a backup still computing when its round decoded is not late, only spare.
        assert list(reports[0].backup_workers) == [cluster.ids[1], cluster.ids[3]]
        assert all(set(r.backup_workers).isdisjoint(r.late_workers) for r in reports)
        assert all(set(r.promoted_workers) <= set(r.backup_workers) for r in reports)


async def test_a_killed_primary_is_covered_by_a_backup_and_every_gradient_stays_exact(tmp_path: Path) -> None:
    with start_cluster(4, tmp_path) as cluster:

        def kill_primary(report: master_pb2.IterationReport) -> None:
            if report.iteration == 2:
                cluster.kill(0)

        info, reports = await run_job(cluster.master_address, _spec(cluster), kill_primary)
        _assert_exact(info, reports)
        after = [r for r in reports if r.iteration >= 4]
        assert after and all(0 not in _used(cluster, r) for r in after)
        assert {1, 3} & {w for r in after for w in _used(cluster, r)}, "a backup's messages decoded"
