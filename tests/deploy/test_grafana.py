"""The Grafana dashboard (deploy/grafana/gradcode.json) queries only what the services export (issue 30)."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from gradcode.common.ops import metrics
from gradcode.v1 import master_pb2

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gradcode.json"
METRIC = re.compile(r"\b((?:gradcode|process)_[a-z_]+)\b")
SELECTOR = re.compile(r"\b((?:gradcode|process)_[a-z_]+)\{([^}]*)\}")
GROUPING = re.compile(r"by \(([^)]*)\) \(rate\(((?:gradcode|process)_[a-z_]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_dashboard", DASHBOARD.with_name("make_dashboard.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _exported() -> dict[str, set[str]]:
    """Every sample name the master and a worker export, with the labels it carries (a report recorded first, so
    the per-worker series exist)."""
    metrics.record_iteration(
        master_pb2.IterationReport(
            job_id="grafana-check", iteration=1, late_workers=[1], failed_workers=[1], backup_workers=[1],
            promoted_workers=[1], timings=[master_pb2.WorkerTiming(worker_id=1, seconds=0.1)],
        )
    )  # fmt: skip
    metrics.JOBS_FINISHED.labels(state="succeeded")  # a labelled counter shows its labels once a child exists
    metrics.watch_jobs(list)  # the master's collector of job states (registered when a master starts)
    names: dict[str, set[str]] = {}
    try:
        for registry in (metrics.MASTER_REGISTRY, metrics.WORKER_REGISTRY):
            for family in registry.collect():
                for suffix in SUFFIXES.get(family.type, ("",)):
                    names.setdefault(family.name + suffix, set())
                for sample in family.samples:
                    names.setdefault(sample.name, set()).update(sample.labels)
    finally:
        metrics.forget_job("grafana-check")
    return names


def _queries() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in document["panels"] for t in panel["targets"]]
    queries += [v["query"] for v in document["templating"]["list"] if v["type"] == "query"]
    return queries


def test_the_checked_in_dashboard_is_what_its_script_writes() -> None:
    assert DASHBOARD.read_text() == _maker().render(), "run python deploy/grafana/make_dashboard.py"


@pytest.mark.parametrize("query", _queries())
def test_every_query_names_exported_metrics_and_their_labels(query: str) -> None:
    exported = _exported()
    names = METRIC.findall(query)
    assert names, f"no gradcode metric in {query!r}"
    for name in names:
        assert name in exported, f"{name} is not exported (known: {sorted(n for n in exported if 'gradcode' in n)})"
    for name, matchers in SELECTOR.findall(query):
        for label in re.findall(r"([a-z_]+)=~?", matchers):
            assert label in exported[name], f"{name} has no label {label!r}: {sorted(exported[name])}"
    for labels, name in GROUPING.findall(query):
        for label in (part.strip() for part in labels.split(",")):
            assert label == "le" or label in exported[name], f"{name} has no label {label!r}"


def test_the_job_variable_lists_the_per_worker_series_jobs() -> None:
    """Per-job labels on the per-worker series, named job_id (Prometheus' own `job` is the scrape job)."""
    exported = _exported()
    for name in ("gradcode_worker_late_total", "gradcode_worker_response_seconds_bucket"):
        assert {"job_id", "worker"} <= exported[name]
