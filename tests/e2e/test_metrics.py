"""/metrics and JSON logs of real master and worker processes, scraped over HTTP on loopback during a
job in which one worker is always slow."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gradcode.client.launch import ServiceProcess
from gradcode.v1 import master_pb2
from tests.e2e.conftest import START_TIMEOUT, job_spec, run_job
from tests.helpers import fixed_delay, free_port

pytestmark = pytest.mark.e2e

NUM_WORKERS = 4
ITERATIONS = 12


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at http://127.0.0.1:port/metrics, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _service(role: str, argv: list[str], log: Path) -> ServiceProcess:
    return ServiceProcess([sys.executable, "-m", "gradcode", role, *argv], log_path=log)


async def test_metrics_and_json_logs_follow_a_job_with_one_slow_worker(tmp_path: Path) -> None:
    master_metrics = free_port()
    worker_metrics = [free_port() for _ in range(NUM_WORKERS)]
    processes: list[ServiceProcess] = []
    try:
        master = _service(
            "master",
            ["--listen", "127.0.0.1:0", "--run-dir", str(tmp_path), "--metrics-port", str(master_metrics),
             "--log-format", "json"],
            tmp_path / "master.log",
        )  # fmt: skip
        processes.append(master)
        address = master.wait_ready(START_TIMEOUT)
        for i in range(NUM_WORKERS):
            worker = _service(
                "worker",
                ["--listen", "127.0.0.1:0", "--master", address, "--log-format", "json",
                 "--metrics-port", str(worker_metrics[i])],
                tmp_path / f"worker-{i}.log",
            )  # fmt: skip
            processes.append(worker)
            worker.wait_ready(START_TIMEOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while _scrape(master_metrics)[("gradcode_workers_up", ())] < NUM_WORKERS:
            assert time.monotonic() < deadline, "the workers never all counted as UP"
            time.sleep(0.2)

        # Job worker 0 is 1 s slow in every iteration (far slower than the others even on a loaded machine);
        # cyclic with s=1 decodes without it.
        spec = job_spec(
            "cyclic", {"n": NUM_WORKERS, "s": 1}, iterations=ITERATIONS, worker_ids=list(range(NUM_WORKERS)),
            straggler=fixed_delay(1.0, workers=[0]), job_id="slow-worker-job",
        )  # fmt: skip
        slow = (("job_id", "slow-worker-job"), ("worker", "0"))
        during: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

        def scrape_at(report: master_pb2.IterationReport) -> None:
            if report.iteration in (3, ITERATIONS - 2):
                during.append(_scrape(master_metrics))

        info, reports = await run_job(address, spec, scrape_at)
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        late_reports = sum(0 in r.late_workers for r in reports)
        assert late_reports >= ITERATIONS - 2  # it really was the straggler

        early, late = (s.get(("gradcode_worker_late_total", slow), 0.0) for s in during)
        assert 0 < early < late, (early, late)
        assert during[0][("gradcode_jobs", (("state", "running"),))] == 1

        # Once the job ended, the master's counters match its reports exactly.
        deadline = time.monotonic() + START_TIMEOUT
        while (final := _scrape(master_metrics))[("gradcode_jobs", (("state", "succeeded"),))] != 1:
            assert time.monotonic() < deadline, "the job never counted as succeeded"
            time.sleep(0.2)
        assert final[("gradcode_worker_late_total", slow)] == late_reports
        assert final[("gradcode_jobs_finished_total", (("state", "succeeded"),))] == 1
        assert final[("gradcode_jobs", (("state", "running"),))] == 0
        assert final[("gradcode_iterations_total", (("exact", "true"),))] == len(reports)
        assert final[("gradcode_iteration_seconds_count", ())] == len(reports)
        assert final[("gradcode_first_decodable_seconds_count", ())] == len(reports)
        assert final[("gradcode_straggler_tolerance_left", ())] == 1  # s = 1, no worker failed
        responses = sum(len(r.timings) for r in reports)
        assert sum(v for (name, _), v in final.items() if name == "gradcode_worker_response_seconds_count") == responses
        for metric, field in (
            ("gradcode_worker_model_seconds_total", "model_seconds"),
            ("gradcode_worker_compute_seconds_total", "compute_seconds"),
        ):  # the workers' own account of their responses, as their reports give it
            reported = sum(getattr(t, field) for r in reports for t in r.timings)
            assert reported > 0 and sum(v for (name, _), v in final.items() if name == metric) == pytest.approx(
                reported
            )
        assert final[("process_resident_memory_bytes", ())] > 0

        workers = [_scrape(port) for port in worker_metrics]
        served = sorted(w[("gradcode_computes_served_total", ())] for w in workers)
        assert served[-1] >= ITERATIONS // 2, served  # the fast workers answer (nearly) every iteration
        # The slow worker's calls are cancelled while it straggles (each iteration decodes without it).
        cancelled = sorted(w[("gradcode_computes_cancelled_total", ())] for w in workers)
        assert cancelled[-1] >= late_reports - 1, cancelled  # its last call may end with the job instead
        # The fast workers send and compute.
        assert sum(w[("gradcode_bytes_sent_total", ())] > 0 for w in workers) >= NUM_WORKERS - 1
        assert sum(w[("gradcode_compute_seconds_total", ())] > 0 for w in workers) >= NUM_WORKERS - 1
        assert all(("gradcode_workers_up", ()) not in w for w in workers)  # a worker serves only its own metrics
    finally:
        for p in processes:
            p.stop()

    # JSON logs: every log line is one object; the master's lines about the job name it.
    records = [json.loads(line) for line in (tmp_path / "master.log").read_text().splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    ended = [r for r in records if r["message"].startswith("job slow-worker-job succeeded")]
    assert len(ended) == 1 and ended[0]["job_id"] == "slow-worker-job"
    assert any(r.get("job_id") == "slow-worker-job" and r["message"].startswith("created job") for r in records)


@pytest.mark.parametrize("role", ["master", "worker"])
def test_a_taken_metrics_port_stops_the_process_before_its_ready_line(role: str, tmp_path: Path) -> None:
    """A launcher waits for the ready line; it must not see one from a process that is about to exit (a worker
    would have registered with its master first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--run-dir", str(tmp_path)] if role == "master" else []
        process = _service(role, ["--listen", "127.0.0.1:0", "--metrics-port", str(port), *extra], tmp_path / "log")
        try:
            with pytest.raises(RuntimeError, match=f"Cannot serve metrics on 127.0.0.1:{port}"):
                process.wait_ready(START_TIMEOUT)
            assert process.process.wait(START_TIMEOUT) == 1  # 2 is a usage error (argparse)
        finally:
            process.stop()
    assert "listening on" not in (tmp_path / "log").read_text()
