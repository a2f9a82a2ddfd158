"""The client lifecycle with real processes: `gradcode run` prints the job id first, Ctrl-C detaches
(the job goes on, the history seen so far is written), `gradcode jobs` lists it, and `gradcode watch`
re-attaches and saves the whole history with proper types and per-worker timings."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from gradcode.client.launch import service_env
from gradcode.v1 import master_pb2, master_pb2_grpc
from tests.e2e.conftest import START_TIMEOUT, start_cluster

pytestmark = pytest.mark.e2e

ITERATIONS = 30
NUM_WORKERS = 4


def _gradcode(*argv: str) -> list[str]:
    return [sys.executable, "-m", "gradcode", *argv]


def _job(master: str, job_id: str) -> master_pb2.JobInfo:
    with grpc.insecure_channel(master) as channel:
        info: master_pb2.JobInfo = master_pb2_grpc.MasterStub(channel).GetJob(
            master_pb2.GetJobRequest(job_id=job_id), timeout=10
        )
    return info


def _jobs_listing(master: str) -> dict[str, tuple[str, int]]:
    """`gradcode jobs`, parsed: job id -> (state, iterations done)."""
    done = subprocess.run(
        _gradcode("jobs", "--master", master), capture_output=True, text=True, timeout=60, env=service_env()
    )
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:3] == ["job", "state", "iterations"]
    return {row.split()[0]: (row.split()[1], int(row.split()[2])) for row in rows if not row.startswith("evicted")}


def _ctrl_c_as_in_a_terminal() -> None:
    """The client's SIGINT as a terminal delivers it: a suite started in the background of a shell without job
    control inherits SIGINT ignored (POSIX), and the client would then rightly ignore Ctrl-C too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_run_prints_the_id_detaches_on_ctrl_c_and_watch_reattaches(tmp_path: Path) -> None:
    with start_cluster(NUM_WORKERS, tmp_path / "cluster") as cluster:
        master = cluster.master_address
        # 3 of the 4 workers are 0.2 s slow in every iteration (which ones changes), so an iteration takes
        # at least 0.2 s and the run lasts long enough to be interrupted.
        run = subprocess.Popen(
            _gradcode(
                "run", "--master", master, "--scheme", "cyclic", "--n", str(NUM_WORKERS), "--s", "1",
                "--iterations", str(ITERATIONS), "--straggler", "fixed", "--straggler-param", "delay_seconds=0.2",
                "--straggler-param", "random_worker=true", "--straggler-param", f"num_workers={NUM_WORKERS}",
                "--straggler-param", "count=3", "--out", str(tmp_path / "run"),
            ),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=service_env(),
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )  # fmt: skip
        try:
            assert run.stdout is not None
            first = run.stdout.readline().split()
            assert len(first) == 2 and first[0] == "job", first
            job_id = first[1]
            deadline = time.monotonic() + START_TIMEOUT
            while _job(master, job_id).iterations_done < 3:
                assert time.monotonic() < deadline, "the job made no progress"
                time.sleep(0.1)
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 130, err
        assert f"gradcode watch {job_id} --master {master}" in err
        assert f"gradcode cancel {job_id} --master {master}" in err
        assert str(tmp_path / "run" / "history.json") in out  # says where what it saw went
        assert json.loads((tmp_path / "run" / "spec.json").read_text())["job_id"] == job_id  # and what it ran
        seen = json.loads((tmp_path / "run" / "history.json").read_text())
        assert len(seen) >= 1
        assert [r["iteration"] for r in seen] == list(range(1, len(seen) + 1))  # ints, in order

        state, done = _jobs_listing(master)[job_id]
        if state == "RUNNING":  # it goes on without the client
            assert done >= len(seen)
        else:  # it may just have finished on a loaded machine
            assert (state, done) == ("SUCCEEDED", ITERATIONS)

        watch = subprocess.run(
            _gradcode("watch", job_id, "--master", master, "--out", str(tmp_path / "watch")),
            capture_output=True, text=True, timeout=240, env=service_env(),
        )  # fmt: skip
        assert watch.returncode == 0, watch.stdout + watch.stderr
        assert f"job {job_id}: JOB_STATE_SUCCEEDED" in watch.stdout
        assert "worker  used  late" in watch.stdout  # the straggler attribution table
        assert _jobs_listing(master)[job_id] == ("SUCCEEDED", ITERATIONS)

    history = json.loads((tmp_path / "watch" / "history.json").read_text())
    assert [r["iteration"] for r in history] == list(range(1, ITERATIONS + 1))
    assert history[: len(seen)] == seen  # the detached client kept exactly what it had seen
    assert all(isinstance(t["worker_id"], int) and t["seconds"] > 0 for r in history for t in r["timings"])
    spec = json.loads((tmp_path / "watch" / "spec.json").read_text())
    assert spec["code"]["params"]["n"] == NUM_WORKERS and isinstance(spec["code"]["params"]["n"], int)
    assert spec["iterations"] == ITERATIONS and spec["job_id"] == job_id
    with (tmp_path / "watch" / "history.csv").open() as f:
        rows = list(csv.DictReader(f))
    worker_columns = [c for c in rows[0] if re.fullmatch(r"worker_\d+_seconds", c)]
    assert sorted(worker_columns) == sorted(f"worker_{w}_seconds" for w in cluster.ids)
    assert {f"worker_{w}_{name}_seconds" for w in cluster.ids for name in ("model", "compute")} <= rows[0].keys()
    for row, report in zip(rows, history, strict=True):
        timings = {f"worker_{t['worker_id']}_seconds": t["seconds"] for t in report["timings"]}
        assert {c: float(row[c]) for c in worker_columns if row[c]} == timings
    assert (tmp_path / "watch" / "workers.png").stat().st_size > 0
