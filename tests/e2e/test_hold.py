"""Held backups (JobSpec.surplus "hold"), with real master and worker processes: backups on machines of their own
compute at once but send their messages only when the round pulls them; a round never uses a backup's message it
did not pull, and an expected worker killed or frozen mid-job is covered by pulled backups, every gradient exact."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gradcode.common.gather.primaries import START_SLACK_SECONDS
from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, metric_total, run_job, start_cluster
from tests.helpers import fixed_delay, free_port

pytestmark = pytest.mark.e2e

EXACT = 1e-9
FRACTIONAL = {"n": 4, "s": 1}
"""Replica groups {0, 2} and {1, 3}: the first rounds expect {0, 1} and ask 2 and 3 as backups."""


def _spec(cluster: Cluster, **fields: object) -> master_pb2.JobSpec:
    return job_spec(
        "fractional", FRACTIONAL, iterations=10, verify=True, worker_ids=cluster.ids[:4], surplus="hold", **fields
    )


def _used(cluster: Cluster, report: master_pb2.IterationReport) -> set[int]:
    return {cluster.ids.index(w) for w in report.used_workers}


def _assert_exact_and_only_pulled_backups_used(
    info: master_pb2.JobInfo, reports: list[master_pb2.IterationReport]
) -> None:
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == 10
    bad = [(r.iteration, r.verify_error) for r in reports if not (r.exact and 0 <= r.verify_error <= EXACT)]
    assert not bad
    unpulled = [(r.iteration, sorted(set(r.used_workers) & set(r.backup_workers) - set(r.promoted_workers)))
                for r in reports]  # fmt: skip
    assert all(not used for _, used in unpulled), f"a held message was used without being pulled: {unpulled}"


def _own_machine(i: int, ports: list[int]) -> list[str]:
    """A machine id of its own (backups compute at once, not deferred) and a metrics port."""
    return ["--machine-id", f"machine-{i}", "--metrics-port", str(ports[i])]


@contextlib.contextmanager
def _struck_on_iteration_2(
    cluster: Cluster, fault: str, victims: Sequence[int] = (0,)
) -> Iterator[Callable[[master_pb2.IterationReport], None]]:
    """A report watch for :func:`run_job` that kills (``fault`` "kill") or freezes (SIGSTOP) the cluster's worker
    processes ``victims`` (default 0) on iteration 2's report; frozen ones are resumed on leaving."""
    processes = [cluster.processes[i].process for i in victims]

    def strike(report: master_pb2.IterationReport) -> None:
        if report.iteration == 2:
            for i, process in zip(victims, processes, strict=True):
                if fault == "kill":
                    cluster.kill(i)
                else:
                    process.send_signal(signal.SIGSTOP)

    try:
        yield strike
    finally:
        if fault == "freeze":
            for process in processes:
                process.send_signal(signal.SIGCONT)


async def test_held_backups_compute_but_send_nothing_unless_pulled(tmp_path: Path) -> None:
    """A held backup answers a Compute in full only when pulled: the workers' answered Computes are at most the
    expected and pulled ones, and a backup never pulled sent no byte (that it computes at once is
    tests/worker/test_session.py's)."""
    ports = [free_port() for _ in range(4)]
    with start_cluster(4, tmp_path, worker_args=lambda i: _own_machine(i, ports)) as cluster:
        info, reports = await run_job(cluster.master_address, _spec(cluster))
        _assert_exact_and_only_pulled_backups_used(info, reports)
        assert all(r.backup_workers for r in reports)
        assert all(r.bytes_sent > 0 and r.bytes_received > 0 for r in reports), "each report counts its bytes"
        slacks = [r.start_slack_seconds for r in reports]  # the wait each round allowed a worker not yet begun
        assert all(START_SLACK_SECONDS <= slack < 1.0 for slack in slacks), slacks
        served = sum(metric_total(port, "gradcode_computes_served_total") for port in ports)
        asked = sum(4 - len(r.backup_workers) + len(r.promoted_workers) for r in reports)
        assert served <= asked < 4 * len(reports), (served, asked)  # an unpulled backup never finished a Compute
        for w, port in enumerate(ports):  # (whether a backup finished computing before its round decoded is load's)
            backup = all(cluster.ids[w] in r.backup_workers for r in reports)
            if backup and not any(cluster.ids[w] in r.promoted_workers for r in reports):
                assert metric_total(port, "gradcode_bytes_sent_total") == 0, f"backup {w}, never pulled, sent bytes"


@pytest.mark.parametrize("fault", ["kill", "freeze"])
async def test_an_expected_worker_killed_or_frozen_is_covered_by_pulled_backups(tmp_path: Path, fault: str) -> None:
    """Every worker takes 0.2 s a round, so the fault sent on iteration 2's report lands a round or two later
    even when the watch lags the master; the test finds that round from the reports."""
    ports = [free_port() for _ in range(4)]
    with start_cluster(4, tmp_path, worker_args=lambda i: _own_machine(i, ports)) as cluster:
        with _struck_on_iteration_2(cluster, fault) as strike:
            async with asyncio.timeout(60):
                info, reports = await run_job(
                    cluster.master_address, _spec(cluster, straggler=fixed_delay(0.2)), strike
                )
        _assert_exact_and_only_pulled_backups_used(info, reports)
        # the first round expects {0, 1} and holds {2, 3} (under load 0 may begin late and have 2 pulled for it)
        assert {cluster.ids.index(b) for b in reports[0].backup_workers} == {2, 3}, "the first round expects {0, 1}"
        landed = next((i for i, r in enumerate(reports) if r.iteration > 2 and 0 not in _used(cluster, r)), 99)
        assert landed <= len(reports) - 3, f"the fault took effect too late to test anything: {reports}"
        first = reports[landed]
        # 0's replica, 2, covers it: pulled (promoted) in the round the fault hit, or already expected there when
        # 0 had answered slowly the round before and the master chose 2 instead (under load, either can happen)
        replica = cluster.ids[2]
        assert 2 in _used(cluster, first) and (
            replica in first.promoted_workers or replica not in first.backup_workers
        ), "the round the fault hit decoded with 0's replica, 2, pulled or expected"
        assert all(0 not in _used(cluster, r) for r in reports[landed:])


async def test_the_first_round_pulls_a_backup_for_an_expected_worker_that_never_begins(tmp_path: Path) -> None:
    """Worker 0 is delayed 600 s in every round, the first included: the round that first asks each worker (its
    first Compute on a session not yet known to the master) times the starts and pulls 0's replica, 2, like any
    later round, and every round decodes without 0."""
    ports = [free_port() for _ in range(4)]
    with start_cluster(4, tmp_path, worker_args=lambda i: _own_machine(i, ports)) as cluster:
        async with asyncio.timeout(60):
            info, reports = await run_job(
                cluster.master_address,
                _spec(cluster, straggler=fixed_delay(600.0, workers=[0]), iteration_deadline_seconds=20),
            )
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert all(r.exact and 0 <= r.verify_error <= EXACT for r in reports)
        first = reports[0]
        assert _used(cluster, first) == {1, 2} and cluster.ids[2] in first.promoted_workers, first
        assert all(0 not in _used(cluster, r) for r in reports)
