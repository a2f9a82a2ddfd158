"""Idle workers are health-checked: one killed or frozen while it holds no job is DOWN within a few seconds.

Issue 25: an idle worker that was killed stayed listed UP indefinitely, and the next job counted it among its
workers (against the stragglers its code tolerates). The master now probes every UP worker that holds no job
(:meth:`gradcode.master.pool.WorkerPool.probe_idle`).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gradcode.master.pool import (
    HEALTH_PROBE_SECONDS,
    IDLE_PROBE_SECONDS,
    IDLE_PROBE_STRIKES,
    IDLE_PROBE_TIMEOUT_SECONDS,
)
from gradcode.v1 import master_pb2
from tests.e2e.conftest import Cluster, job_spec, run_job, start_cluster

pytestmark = pytest.mark.e2e

BOUND = IDLE_PROBE_STRIKES * (IDLE_PROBE_SECONDS + IDLE_PROBE_TIMEOUT_SECONDS) + 2.0
"""Seconds within which a dead idle worker must be listed DOWN (a frozen one: the probes in a row that must time
out, each a period and a timeout; plus slack for load)."""


def state_of(cluster: Cluster, index: int) -> int:
    return next(w.state for w in cluster.list_workers() if w.worker_id == cluster.ids[index])


def seconds_until(cluster: Cluster, index: int, state: int, limit: float) -> float:
    """Seconds until the master lists worker process ``index`` in ``state``; AssertionError after ``limit``."""
    started = time.monotonic()
    while state_of(cluster, index) != state:
        assert time.monotonic() - started < limit, f"worker {index} not {master_pb2.WorkerState.Name(state)}"
        time.sleep(0.05)
    return time.monotonic() - started


async def test_a_killed_idle_worker_is_down_within_seconds_and_not_counted_by_the_next_job(tmp_path: Path) -> None:
    with start_cluster(2, tmp_path) as cluster:
        time.sleep(IDLE_PROBE_SECONDS + 0.5)  # the idle probes of live workers leave them UP
        assert state_of(cluster, 0) == state_of(cluster, 1) == master_pb2.WORKER_STATE_UP
        cluster.kill(0)
        waited = seconds_until(cluster, 0, master_pb2.WORKER_STATE_DOWN, 3 * BOUND)
        assert waited <= BOUND, f"a killed idle worker took {waited:.1f} s to be DOWN (bound {BOUND:g} s)"
        info, reports = await run_job(cluster.master_address, job_spec("uncoded", {"n": 1}, iterations=3))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert {w for r in reports for w in r.used_workers} == {cluster.ids[1]}


async def test_a_frozen_idle_worker_is_down_within_seconds_and_up_once_it_answers(tmp_path: Path) -> None:
    with start_cluster(1, tmp_path) as cluster:
        pid = cluster.processes[0].process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            waited = seconds_until(cluster, 0, master_pb2.WORKER_STATE_DOWN, 3 * BOUND)
            assert waited <= BOUND, f"a frozen idle worker took {waited:.1f} s to be DOWN (bound {BOUND:g} s)"
        finally:
            os.kill(pid, signal.SIGCONT)
        seconds_until(cluster, 0, master_pb2.WORKER_STATE_UP, 10 * HEALTH_PROBE_SECONDS + BOUND)


def _closed_connections_to(port: int) -> int:
    """TCP connections to local ``port`` in TIME_WAIT (``/proc/net/tcp``, state 06): the closer keeps one for a
    minute after each connection it closed."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                count += int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "06"
    return count


async def test_an_idle_workers_probes_share_one_connection(tmp_path: Path) -> None:
    """A new connection per idle worker per probe (with mutual TLS, a handshake each: 8 idle workers cost the master
    27-40 ms of CPU a second, 15-16 ms with one kept): an UP worker's probes reuse one channel, so no connection to it
    is closed while it idles (this fails with a fresh channel per probe: 4 closed in 4 probe periods)."""
    with start_cluster(1, tmp_path) as cluster:
        port = int(next(w.address for w in cluster.list_workers()).rsplit(":", 1)[1])
        time.sleep(IDLE_PROBE_SECONDS + 0.5)
        before = _closed_connections_to(port)
        time.sleep(4 * IDLE_PROBE_SECONDS + 0.5)
        assert state_of(cluster, 0) == master_pb2.WORKER_STATE_UP
        assert _closed_connections_to(port) - before <= 1, "probes of an idle worker closed connections to it"


async def test_an_idle_worker_restarted_at_its_address_is_the_new_process_not_the_old_registration(
    tmp_path: Path,
) -> None:
    """The kept probe channel reconnects to whatever answers at the address: a process restarted there must still
    prove it is the one registered (it is, once it registered itself), and a job then runs on it exactly."""
    with start_cluster(1, tmp_path) as cluster:
        time.sleep(2 * IDLE_PROBE_SECONDS)  # the probe channel is open and kept
        old_id = cluster.ids[0]
        cluster.kill(0)
        cluster.restart(0)
        cluster.wait_all_up()
        info, reports = await run_job(
            cluster.master_address, job_spec("uncoded", {"n": 1}, iterations=3, verify=True, worker_ids=cluster.ids)
        )
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert all(r.exact for r in reports) and {w for r in reports for w in r.used_workers} == {cluster.ids[0]}
        if cluster.ids[0] != old_id:  # registered anew: the old registration is DOWN, never UP again
            time.sleep(2 * IDLE_PROBE_SECONDS)
            assert next(w.state for w in cluster.list_workers() if w.worker_id == old_id) != master_pb2.WORKER_STATE_UP
