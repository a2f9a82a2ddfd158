"""Per-worker attribution of a job's reports: used, late, failed, and spare (a backup the round did not need)."""

from __future__ import annotations

from gradcode.client.history import format_worker_table, worker_records
from gradcode.v1 import master_pb2


def _report(**fields: list[int]) -> master_pb2.IterationReport:
    timings = [master_pb2.WorkerTiming(worker_id=w, seconds=0.01 * (w + 1)) for w in fields.get("used_workers", [])]
    return master_pb2.IterationReport(iteration=1, timings=timings, **fields)  # type: ignore[arg-type]


def test_a_backup_the_round_did_not_need_is_spare_one_it_used_is_used_and_neither_is_late() -> None:
    reports = [
        _report(used_workers=[0, 2], backup_workers=[1, 3]),  # both backups spare
        _report(used_workers=[2, 3], late_workers=[0], backup_workers=[1, 3], promoted_workers=[3]),  # 3 covered 0
        _report(used_workers=[0, 2], failed_workers=[1], backup_workers=[1, 3]),  # 1 failed: not spare
    ]
    records = {r.worker_id: r for r in worker_records(reports)}
    counts = {w: (r.iterations, r.used, r.late, r.failed, r.spare) for w, r in records.items()}
    assert counts == {0: (3, 2, 1, 0, 0), 1: (3, 0, 0, 1, 2), 2: (3, 3, 0, 0, 0), 3: (3, 1, 0, 0, 2)}
    table = format_worker_table(reports).splitlines()
    assert table[0].split() == ["worker", "used", "late", "failed", "spare", "median", "response"]
    assert table[2].split()[:5] == ["1", "0", "0", "(0%)", "1"] and table[2].split()[5] == "2"
