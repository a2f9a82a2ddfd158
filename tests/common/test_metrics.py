"""common.ops.metrics.record_iteration: one report's numbers land in the master's metrics."""

from __future__ import annotations

from gradcode.common.ops import metrics
from gradcode.v1 import master_pb2
from tests.helpers import free_port


def _value(name: str, **labels: str) -> float:
    value = metrics.MASTER_REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _report(iteration: int, **fields: object) -> master_pb2.IterationReport:
    timings = [master_pb2.WorkerTiming(worker_id=w, seconds=s) for w, s in ((900, 0.1), (901, 0.3), (902, 0.2))]
    return master_pb2.IterationReport(
        job_id="j", iteration=iteration, wall_seconds=0.35, decode_seconds=0.01, used_workers=[900, 901],
        late_workers=[902], failed_workers=[903], timings=timings, exact=True, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_report_counts_late_failed_and_timings_per_worker() -> None:
    before = {
        "late": _value("gradcode_worker_late_total", job_id="j", worker="902"),
        "failed": _value("gradcode_worker_failed_total", job_id="j", worker="903"),
        "iterations": _value("gradcode_iterations_total", exact="true"),
        "response": _value("gradcode_worker_response_seconds_sum", job_id="j", worker="901"),
        "first": _value("gradcode_first_decodable_seconds_sum"),
    }
    metrics.record_iteration(_report(1), stragglers_tolerated=2)
    assert _value("gradcode_worker_late_total", job_id="j", worker="902") == before["late"] + 1
    assert _value("gradcode_worker_failed_total", job_id="j", worker="903") == before["failed"] + 1
    assert _value("gradcode_iterations_total", exact="true") == before["iterations"] + 1
    assert _value("gradcode_worker_response_seconds_sum", job_id="j", worker="901") == before["response"] + 0.3
    # the first decodable set was complete when the slower used worker (901, 0.3 s) answered
    assert _value("gradcode_first_decodable_seconds_sum") == before["first"] + 0.3
    assert _value("gradcode_straggler_tolerance_left") == 1  # 2 tolerated, 1 failed


def test_a_report_adds_each_workers_own_account_of_its_response_and_forgetting_the_job_removes_it() -> None:
    labels = {"job_id": "account", "worker": "7"}
    for seconds in (0.5, 0.25):
        timing = master_pb2.WorkerTiming(
            worker_id=7, seconds=seconds, model_seconds=seconds / 4, compute_seconds=seconds / 2
        )
        metrics.record_iteration(master_pb2.IterationReport(job_id="account", iteration=1, timings=[timing]))
    assert _value("gradcode_worker_response_seconds_sum", **labels) == 0.75
    assert _value("gradcode_worker_model_seconds_total", **labels) == 0.1875
    assert _value("gradcode_worker_compute_seconds_total", **labels) == 0.375
    metrics.forget_job("account")
    for name in ("gradcode_worker_model_seconds_total", "gradcode_worker_compute_seconds_total"):
        assert metrics.MASTER_REGISTRY.get_sample_value(name, labels) is None


def test_the_start_slack_gauge_is_the_last_held_rounds_and_a_round_without_held_backups_leaves_it() -> None:
    metrics.record_iteration(_report(4, start_slack_seconds=0.042))
    assert _value("gradcode_start_slack_seconds") == 0.042
    metrics.record_iteration(_report(5))  # held no backups: says nothing about the slack
    assert _value("gradcode_start_slack_seconds") == 0.042
    metrics.record_iteration(_report(6, start_slack_seconds=0.003))
    assert _value("gradcode_start_slack_seconds") == 0.003


def test_a_report_counts_its_backups_and_promotions_per_worker() -> None:
    backup, promoted = (
        _value("gradcode_worker_backup_total", job_id="j", worker="904"),
        _value("gradcode_worker_promoted_total", job_id="j", worker="905"),
    )
    metrics.record_iteration(_report(3, backup_workers=[904, 905], promoted_workers=[905]))
    assert _value("gradcode_worker_backup_total", job_id="j", worker="904") == backup + 1
    assert _value("gradcode_worker_promoted_total", job_id="j", worker="905") == promoted + 1
    assert _value("gradcode_worker_promoted_total", job_id="j", worker="904") == 0


def test_a_failure_report_counts_its_workers_but_no_iteration() -> None:
    iterations = _value("gradcode_iterations_total", exact="true")
    late = _value("gradcode_worker_late_total", job_id="j", worker="902")
    metrics.record_iteration(_report(2, state=master_pb2.JOB_STATE_FAILED))
    assert _value("gradcode_iterations_total", exact="true") == iterations
    assert _value("gradcode_worker_late_total", job_id="j", worker="902") == late + 1


def test_first_decodable_is_unknown_without_timings_of_the_used_workers() -> None:
    assert metrics.first_decodable_seconds(master_pb2.IterationReport(used_workers=[1])) is None


def test_the_endpoint_serves_its_registry_and_refuses_a_taken_port() -> None:
    import socket
    import urllib.request

    import pytest

    server = metrics.start_metrics_server("127.0.0.1", free_port(), metrics.WORKER_REGISTRY)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert "gradcode_computes_served_total" in text and "gradcode_workers_up" not in text
        with pytest.raises(OSError, match=f"Cannot serve metrics on 127.0.0.1:{server.port}"):
            metrics.start_metrics_server("127.0.0.1", server.port, metrics.WORKER_REGISTRY)
    finally:
        server.close()
    with socket.socket() as probe:  # closed: nothing listens there any more
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT may remain, a listener may not
        probe.bind(("127.0.0.1", server.port))
        probe.listen()


def test_a_forgotten_job_leaves_no_per_worker_series_and_other_jobs_keep_theirs() -> None:
    metrics.record_iteration(master_pb2.IterationReport(job_id="gone", iteration=1, late_workers=[910]))
    metrics.record_iteration(master_pb2.IterationReport(job_id="kept", iteration=1, late_workers=[910]))
    assert _value("gradcode_worker_late_total", job_id="gone", worker="910") == 1
    metrics.forget_job("gone")
    assert (
        metrics.MASTER_REGISTRY.get_sample_value("gradcode_worker_late_total", {"job_id": "gone", "worker": "910"})
        is None
    )
    assert _value("gradcode_worker_late_total", job_id="kept", worker="910") == 1
    metrics.forget_job("never-seen")  # nothing to remove: no error
