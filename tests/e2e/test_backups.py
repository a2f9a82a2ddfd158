"""Backups at low priority, with real master and worker processes: each round expects the code's minimal decoding
set; the other workers compute at niceness 19 when each has a machine of its own (read from /proc, per thread; a
job's first message always runs in a thread, later short ones inline) and nothing until promoted when they share
one; every gradient stays exact, and a primary killed mid-job is covered by a backup.
Which messages a decode uses is up to the scheduler, so only the kill's aftermath is asserted of it."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, metric_total, run_job, start_cluster
from tests.helpers import fixed_delay, free_port

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


def _own_machines(i: int) -> list[str]:
    return ["--machine-id", f"machine-{i}"]


async def test_backups_compute_in_a_niced_thread_the_expected_workers_do_not(tmp_path: Path) -> None:
    """Each worker says it has a machine of its own: backups compute at once, at niceness 19.

    The first round's expected workers, 0 and 2, are delayed 0.1 s, so that round cannot end (and cancel its
    backups) before the backups 1 and 3 begin: with no delay, a backup request that reaches a loaded worker late can
    be cancelled before it computes, and a worker that the master later expects computes its short messages inline
    from then on, never in a thread (it failed so once in CI)."""
    with start_cluster(4, tmp_path, worker_args=_own_machines) as cluster:
        pids = [p.process.pid for p in cluster.processes]
        info, reports = await run_job(cluster.master_address, _spec(cluster, backup_priority="normal"))
        _assert_exact(info, reports)
        assert [_niced_threads(pid) for pid in pids] == [0, 0, 0, 0], "'normal' asks everyone alike"
        assert not any(r.backup_workers or r.promoted_workers for r in reports)

        expected_late = fixed_delay(0.1, workers=[0, 2])
        info, reports = await run_job(cluster.master_address, _spec(cluster, straggler=expected_late))  # default: low
        _assert_exact(info, reports)
        niced = [_niced_threads(pid) for pid in pids]  # (0 or 2, late in a round, may be a backup later on)
        assert niced[1] >= 1 and niced[3] >= 1, (
            f"the first round's backups, 1 and 3, computed in a niced thread: {niced}"
        )
        # The reports say so; a backup still computing when its round decoded is not late, only spare.
        assert sorted(reports[0].backup_workers) == sorted([cluster.ids[1], cluster.ids[3]])
        assert all(set(r.backup_workers).isdisjoint(r.late_workers) for r in reports)
        assert all(set(r.promoted_workers) <= set(r.backup_workers) for r in reports)


async def test_backups_on_one_machine_compute_only_once_promoted(tmp_path: Path) -> None:
    """Workers on one machine (one boot and namespaces: the same default machine id): a backup computes nothing
    until it is promoted, so the workers' computed partitions are the ones of the expected and the promoted
    workers."""
    ports = [free_port() for _ in range(4)]
    with start_cluster(4, tmp_path, worker_args=lambda i: ["--metrics-port", str(ports[i])]) as cluster:
        pids = [p.process.pid for p in cluster.processes]
        info, reports = await run_job(cluster.master_address, _spec(cluster))
        _assert_exact(info, reports)
        assert reports[0].backup_workers and all(r.backup_workers for r in reports)
        assert all(r.start_slack_seconds == 0 for r in reports), "backups on the master's machine are not held"
        assert [_niced_threads(pid) for pid in pids] == [0, 0, 0, 0], "no backup computed at low priority"
        computes = sum(metric_total(port, "gradcode_computes_served_total") for port in ports)
        asked = sum(4 - len(r.backup_workers) + len(r.promoted_workers) for r in reports)
        assert computes <= asked, (computes, asked)  # an unpromoted backup never finished a Compute


async def test_a_killed_primary_is_covered_by_a_backup_and_every_gradient_stays_exact(tmp_path: Path) -> None:
    with start_cluster(4, tmp_path) as cluster:

        def kill_primary(report: master_pb2.IterationReport) -> None:
            if report.iteration == 2:
                cluster.kill(0)

        # 0.2 s a round for everyone, so the watch keeps up with the master.
        info, reports = await run_job(cluster.master_address, _spec(cluster, straggler=fixed_delay(0.2)), kill_primary)
        _assert_exact(info, reports)
        # The kill lands a round or two after iteration 2's report (the watch may lag the master).
        landed = next((i for i, r in enumerate(reports) if r.iteration > 2 and 0 not in _used(cluster, r)), 99)
        assert landed <= len(reports) - 3, f"the kill took effect too late to test anything: {reports}"
        after = reports[landed:]
        assert all(0 not in _used(cluster, r) for r in after)
        assert {1, 3} & {w for r in after for w in _used(cluster, r)}, "a backup's messages decoded"


async def test_more_expected_workers_frozen_than_s_are_covered_by_the_hedge(tmp_path: Path) -> None:
    """Fractional, n = 4, s = 1 (replica groups {0, 2} and {1, 3}), workers on one machine: a round expects one
    worker of each group (the first ones {0, 1}). Both expected workers are frozen (SIGSTOP: nothing ends, so no
    promotion starts when expected workers end); the backups, which compute nothing until promoted, are promoted by
    the round's hedge and decode.

    Every worker takes 0.2 s a round, so the freeze, sent on a report, lands a round or two later, during that
    round's delay, even when the watch lags the master; the test finds that round from the reports instead of
    assuming it. The pair frozen is the one the next rounds expect, read from the first report from iteration 2 on
    whose messages are its expected workers' (none of its backups): a worker that begins its computation a few
    milliseconds after the other under load can be covered by the start rule, and a backup whose emulated delay
    ran meanwhile then answers instead, after which the rounds expect the pair that answered (it failed so once).
    Under load the start rule promotes a backup in most rounds, so a round that promoted nobody can come too late
    (it did, beside three busy loops); a promoted backup that lost the race leaves the expected pair as it was."""
    with start_cluster(4, tmp_path) as cluster:
        spec = job_spec(
            "fractional", {"n": 4, "s": 1}, iterations=10, verify=True, worker_ids=cluster.ids[:4],
            straggler=fixed_delay(0.2),
        )  # fmt: skip
        frozen: list[int] = []
        """The job workers (indices) frozen, once chosen."""

        def freeze(report: master_pb2.IterationReport) -> None:
            if frozen or report.iteration < 2 or set(report.used_workers) & set(report.backup_workers):
                return
            frozen.extend(_used(cluster, report))
            for w in frozen:
                cluster.processes[w].process.send_signal(signal.SIGSTOP)

        try:
            async with asyncio.timeout(60):
                info, reports = await run_job(cluster.master_address, spec, freeze)
        finally:
            for w in frozen:
                cluster.processes[w].process.send_signal(signal.SIGCONT)
        _assert_exact(info, reports)
        assert sorted(reports[0].backup_workers) == sorted(cluster.ids[2:4]), "the first round expects {0, 1}"
        assert len(frozen) == 2, f"a round from iteration 2 on promoted nobody and used two workers: {reports}"
        others = sorted(set(range(4)) - set(frozen))
        # The first round without a message of the frozen pair; from then on only the other two answer.
        landed = next(
            (i for i, r in enumerate(reports) if r.iteration > 2 and set(_used(cluster, r)).isdisjoint(frozen)),
            len(reports),
        )
        assert landed <= len(reports) - 4, f"the freeze took effect too late to test anything: {reports}"
        assert all(_used(cluster, r) == tuple(others) for r in reports[landed:])
        assert any({cluster.ids[w] for w in others} <= set(r.promoted_workers) for r in reports[landed:]), (
            "the hedge promoted both backups"
        )
