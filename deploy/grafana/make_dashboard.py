"""Write ``gradcode.json``, the Grafana dashboard for the metrics of ``common/ops/metrics.py``.

Run ``python deploy/grafana/make_dashboard.py`` after changing a panel; ``tests/deploy/test_grafana.py`` checks
that the file is what this script writes and that every query names a metric the services export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RATE = "$__rate_interval"
JOB = 'job_id=~"$job_id"'

PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    # (title, unit, [(legend, PromQL)])
    (
        "Iteration time",
        "s",
        [
            ("p50", f"histogram_quantile(0.5, sum by (le) (rate(gradcode_iteration_seconds_bucket[{RATE}])))"),
            ("p90", f"histogram_quantile(0.9, sum by (le) (rate(gradcode_iteration_seconds_bucket[{RATE}])))"),
            (
                "first decodable p50",
                f"histogram_quantile(0.5, sum by (le) (rate(gradcode_first_decodable_seconds_bucket[{RATE}])))",
            ),
            ("decode p50", f"histogram_quantile(0.5, sum by (le) (rate(gradcode_decode_seconds_bucket[{RATE}])))"),
            # What a round that held backups waited past its expected workers' beginnings before pulling them.
            ("held backups' start slack", "gradcode_start_slack_seconds"),
        ],
    ),
    (
        "Iterations per second, exact or not",
        "ops",
        [
            ("exact={{exact}}", f"sum by (exact) (rate(gradcode_iterations_total[{RATE}]))"),
        ],
    ),
    (
        "Workers",
        "short",
        [
            ("up", "gradcode_workers_up"),
            ("known", "gradcode_workers_known"),
            ("straggler tolerance left", "gradcode_straggler_tolerance_left"),
        ],
    ),
    (
        "Jobs by state",
        "short",
        [
            ("{{state}}", "gradcode_jobs"),
            ("finished {{state}} / s", f"sum by (state) (rate(gradcode_jobs_finished_total[{RATE}]))"),
        ],
    ),
    (
        "Worker response time p90",
        "s",
        [
            (
                "worker {{worker}}",
                "histogram_quantile(0.9, sum by (le, worker) "
                f"(rate(gradcode_worker_response_seconds_bucket{{{JOB}}}[{RATE}])))",
            ),
        ],
    ),
    (
        "Worker response, mean, and the worker's own account of it",
        "s",
        [
            (
                f"{name} {{{{worker}}}}",
                f"sum by (worker) (rate({metric}{{{JOB}}}[{RATE}])) "
                f"/ sum by (worker) (rate(gradcode_worker_response_seconds_count{{{JOB}}}[{RATE}]))",
            )
            for name, metric in (
                ("response", "gradcode_worker_response_seconds_sum"),
                ("model", "gradcode_worker_model_seconds_total"),
                ("compute", "gradcode_worker_compute_seconds_total"),
            )
        ],
    ),
    (
        "Late (straggling) iterations per second, per worker",
        "ops",
        [
            ("worker {{worker}}", f"sum by (worker) (rate(gradcode_worker_late_total{{{JOB}}}[{RATE}]))"),
        ],
    ),
    (
        "Failed calls per second, per worker",
        "ops",
        [
            ("worker {{worker}}", f"sum by (worker) (rate(gradcode_worker_failed_total{{{JOB}}}[{RATE}]))"),
        ],
    ),
    (
        "Backups asked and promoted per second, per worker",
        "ops",
        [
            ("backup {{worker}}", f"sum by (worker) (rate(gradcode_worker_backup_total{{{JOB}}}[{RATE}]))"),
            ("promoted {{worker}}", f"sum by (worker) (rate(gradcode_worker_promoted_total{{{JOB}}}[{RATE}]))"),
        ],
    ),
    (
        "Worker computes per second",
        "ops",
        [
            ("served {{instance}}", f"rate(gradcode_computes_served_total[{RATE}])"),
            ("cancelled {{instance}}", f"rate(gradcode_computes_cancelled_total[{RATE}])"),
        ],
    ),
    (
        "Worker busy fraction",
        "percentunit",
        [
            ("{{instance}}", f"rate(gradcode_compute_seconds_total[{RATE}])"),
        ],
    ),
    (
        "Bytes sent",
        "Bps",
        [
            ("worker gRPC {{instance}}", f"rate(gradcode_bytes_sent_total[{RATE}])"),
            ("worker shared memory {{instance}}", f"rate(gradcode_shared_bytes_sent_total[{RATE}])"),
            ("master LoadJob", f"rate(gradcode_load_bytes_sent_total[{RATE}])"),
        ],
    ),
    (
        "Resident memory",
        "bytes",
        [
            ("{{instance}}", "process_resident_memory_bytes"),
        ],
    ),
]


def dashboard() -> dict[str, Any]:
    panels = []
    for index, (title, unit, queries) in enumerate(PANELS):
        panels.append({
            "id": index + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                for i, (legend, expr) in enumerate(queries)
            ],
        })  # fmt: skip
    return {
        "title": "gradcode",
        "uid": "gradcode",
        "schemaVersion": 39,
        "version": 1,
        "tags": ["gradcode"],
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "job_id",
                    "label": "gradcode job",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(gradcode_worker_response_seconds_count, job_id)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("gradcode.json").write_text(render())
