"""Every Prometheus metric gradcode exports, and the HTTP endpoint that serves them (prometheus-client).

The master's metrics live in :data:`MASTER_REGISTRY`, a worker's in :data:`WORKER_REGISTRY`; a process
serves its role's registry (plus the standard ``process_*`` and ``python_*`` collectors) with
:func:`start_metrics_server` when ``--metrics-port`` is set. Names start with ``gradcode_``; time is
in seconds, sizes in bytes.

Labels are bounded on purpose: per-worker series carry the job id and the pool's worker id, and a job's series
are removed when the master forgets the job (:func:`forget_job`, at eviction: the master holds a bounded number
of finished jobs), so they are bounded by the jobs held times the fleet; job states are counted by state.
A dashboard sums over ``job_id`` for a worker's view across jobs (``deploy/grafana/gradcode.json``).

Where each is recorded:

* per iteration (master): :func:`record_iteration`, called with each published
  :class:`~gradcode.v1.master_pb2.IterationReport` (the master servicer watches every job it creates
  and records each report) — iteration time, time to the first decodable set,
  decode time, per-worker response time (and the worker's own account of it: model and compute seconds), late,
  failed, backup and promoted counts, exact/approximate
  iterations, the straggler tolerance left and the start slack of held backups;
* workers up (master): :func:`set_workers_up`, from the pool whenever a worker's state changes;
* job states (master): :func:`watch_jobs`, a collector that counts the jobs the servicer holds at
  scrape time, and :data:`JOBS_FINISHED` when a job ends; :data:`LOAD_BYTES_SENT`, the LoadJob bytes;
  :data:`COMPUTE_BYTES_SENT` and :data:`COMPUTE_BYTES_RECEIVED`, the Computes' bytes, as the streams carry them
  (:class:`gradcode.common.transport.session.Traffic`; each iteration's share is in its report);
* both: :data:`MASTER_EVENT_LOOP_LAG` and :data:`WORKER_EVENT_LOOP_LAG`, how late the node's event loop runs what
  is due (:mod:`gradcode.common.ops.loop_watch`, a task of every node);
* worker: :data:`COMPUTES_SERVED`, :data:`COMPUTES_CANCELLED`, :data:`COMPUTE_SECONDS`, :data:`BYTES_SENT`,
  :data:`SHARED_BYTES_SENT`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gradcode.v1 import master_pb2

__all__ = [
    "BYTES_SENT",
    "COMPUTES_CANCELLED",
    "COMPUTES_SERVED",
    "COMPUTE_BYTES_RECEIVED",
    "COMPUTE_BYTES_SENT",
    "COMPUTE_SECONDS",
    "JOBS_FINISHED",
    "LOAD_BYTES_SENT",
    "MASTER_EVENT_LOOP_LAG",
    "MASTER_REGISTRY",
    "MODELS_RELAYED",
    "SHARED_BYTES_SENT",
    "WORKER_EVENT_LOOP_LAG",
    "WORKER_REGISTRY",
    "MetricsServer",
    "first_decodable_seconds",
    "forget_job",
    "record_iteration",
    "set_workers_up",
    "start_metrics_server",
    "watch_jobs",
]

log = logging.getLogger(__name__)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, cpu, open fds
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


MASTER_REGISTRY = _registry()
WORKER_REGISTRY = _registry()


def _event_loop_lag(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "gradcode_event_loop_lag_seconds",
        "How late this process's event loop woke its watch, sampled every 0.5 s: a host starved of CPU, paused, or "
        "a long call on the loop (gradcode.common.ops.loop_watch).",
        buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2.5, 5, 10, 30), registry=registry,
    )  # fmt: skip


MASTER_EVENT_LOOP_LAG = _event_loop_lag(MASTER_REGISTRY)
WORKER_EVENT_LOOP_LAG = _event_loop_lag(WORKER_REGISTRY)

# Iteration latencies span milliseconds (in-process tests) to minutes (deadline-bound fleets).
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# ---- master ------------------------------------------------------------------------------------------
_PER_WORKER = ["job_id", "worker"]
"""Labels of the per-worker series: the job and the pool's worker id (``job_id``: Prometheus gives every series
a ``job`` label of its own, the scrape job's name)."""
ITERATIONS = Counter(
    "gradcode_iterations", "Iterations committed, by whether every decode was exact.", ["exact"],
    registry=MASTER_REGISTRY,
)  # fmt: skip
ITERATION_SECONDS = Histogram(
    "gradcode_iteration_seconds", "Wall time of one iteration, from request to optimizer step.",
    buckets=_SECONDS_BUCKETS, registry=MASTER_REGISTRY,
)  # fmt: skip
FIRST_DECODABLE_SECONDS = Histogram(
    "gradcode_first_decodable_seconds",
    "Time from the request to the arrival of the first decodable set (the slowest worker that was used).",
    buckets=_SECONDS_BUCKETS, registry=MASTER_REGISTRY,
)  # fmt: skip
DECODE_SECONDS = Histogram(
    "gradcode_decode_seconds", "Decoder plus combine time of one iteration.",
    buckets=_SECONDS_BUCKETS, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_RESPONSE_SECONDS = Histogram(
    "gradcode_worker_response_seconds", "Time from request to a worker's last chunk, per job and worker.", _PER_WORKER,
    buckets=_SECONDS_BUCKETS, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_MODEL_SECONDS = Counter(
    "gradcode_worker_model_seconds",
    "Of the responses counted in gradcode_worker_response_seconds, the worker's own seconds getting its model checked "
    "(a relayed model: the fetch from its peer), summed; per job and worker.",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_COMPUTE_SECONDS = Counter(
    "gradcode_worker_compute_seconds",
    "Of the responses counted in gradcode_worker_response_seconds, the worker's own seconds computing (a tree "
    "parent's: until its children's decode), summed; per job and worker.",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_LATE = Counter(
    "gradcode_worker_late", "Iterations that decoded without this worker because it was slower (a straggler).",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_BACKUP = Counter(
    "gradcode_worker_backup",
    "Iterations that asked this worker as a backup, at low priority (JobSpec.backup_priority): the round expected "
    "to decode without it.",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_PROMOTED = Counter(
    "gradcode_worker_promoted",
    "Iterations that promoted this worker from backup to normal priority because expected workers were late.",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
WORKER_FAILED = Counter(
    "gradcode_worker_failed", "Iterations in which this worker's call failed (error, disconnect, not loaded).",
    _PER_WORKER, registry=MASTER_REGISTRY,
)  # fmt: skip
STRAGGLER_TOLERANCE_LEFT = Gauge(
    "gradcode_straggler_tolerance_left",
    "In the last iteration: the stragglers the code tolerates minus the workers that failed "
    "(how many more may be slow before an iteration cannot decode).",
    registry=MASTER_REGISTRY,
)  # fmt: skip
HELD_START_SLACK = Gauge(
    "gradcode_start_slack_seconds",
    "In the last iteration that held backups: how long past the last expected worker's beginning the round waited "
    "for one not yet begun before pulling its backups (learnt from recent rounds, at least 3 ms).",
    registry=MASTER_REGISTRY,
)  # fmt: skip
WORKERS_UP = Gauge("gradcode_workers_up", "Workers the master sees UP.", registry=MASTER_REGISTRY)
WORKERS_KNOWN = Gauge("gradcode_workers_known", "Workers the master knows (UP or DOWN).", registry=MASTER_REGISTRY)
JOBS_FINISHED = Counter(
    "gradcode_jobs_finished", "Jobs that ended, by final state.", ["state"], registry=MASTER_REGISTRY
)
COMPUTE_BYTES_SENT = Counter(
    "gradcode_compute_bytes_sent",
    "Bytes the master sent to workers on their Computes (requests with the model, cancels, promotions), counted "
    "at the stream: serialized size plus the stream's per-message framing (gRPC's 5 bytes, a link's 4).",
    registry=MASTER_REGISTRY,
)  # fmt: skip
COMPUTE_BYTES_RECEIVED = Counter(
    "gradcode_compute_bytes_received",
    "Bytes the master received from workers on their Computes (messages, notices, statuses), counted at the "
    "stream like gradcode_compute_bytes_sent; payloads left in shared memory do not count.",
    registry=MASTER_REGISTRY,
)  # fmt: skip
LOAD_BYTES_SENT = Counter(
    "gradcode_load_bytes_sent",
    "Bytes of LoadJob chunks the master sent to workers (serialized size): the data it streams, or with "
    "worker-local data only each worker's setup.",
    registry=MASTER_REGISTRY,
)

# ---- worker ------------------------------------------------------------------------------------------
COMPUTES_SERVED = Counter(
    "gradcode_computes_served", "Compute calls this worker answered in full.", registry=WORKER_REGISTRY
)
COMPUTES_CANCELLED = Counter(
    "gradcode_computes_cancelled",
    "Compute calls this worker did not finish: cancelled by the master (it was late, or a backup the round did "
    "not need) or abandoned for a later iteration or a new job.",
    registry=WORKER_REGISTRY,
)
COMPUTE_SECONDS = Counter(
    "gradcode_compute_seconds", "Seconds this worker spent computing its coded messages.", registry=WORKER_REGISTRY
)
BYTES_SENT = Counter(
    "gradcode_bytes_sent", "Bytes of gradient chunks this worker sent (serialized size).", registry=WORKER_REGISTRY
)
SHARED_BYTES_SENT = Counter(
    "gradcode_shared_bytes_sent",
    "Bytes of coded messages this worker left in its receiver's shared-memory directory instead of sending "
    "them through gRPC (the receiver is on this host).",
    registry=WORKER_REGISTRY,
)
MODELS_RELAYED = Counter(
    "gradcode_models_relayed",
    "Models this worker served to peers of its jobs (Worker.FetchModel), so the master sent them once.",
    registry=WORKER_REGISTRY,
)

LINKS_OPENED = Counter(
    "gradcode_links_opened",
    "Links (Sessions over plain TCP, beside gRPC) this worker accepted from a master or a tree parent.",
    registry=WORKER_REGISTRY,
)


def job_state_label(state: int) -> str:
    """``JOB_STATE_RUNNING`` -> ``running``."""
    return master_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def first_decodable_seconds(report: master_pb2.IterationReport) -> float | None:
    """When the first decodable set was complete: the latest response among the workers used (None if
    the report has no timing for them)."""
    used = set(report.used_workers)
    times = [t.seconds for t in report.timings if t.worker_id in used]
    return max(times) if times else None


def record_iteration(report: master_pb2.IterationReport, *, stragglers_tolerated: int | None = None) -> None:
    """Record everything one committed iteration's report says.

    ``stragglers_tolerated`` is the number of stragglers the job's code tolerates (``plan.code.s``);
    with it the tolerance left (that minus the failed workers) is set. Call once per report, where reports are
    published. A failure report (state FAILED: no step was taken) counts only its late, failed, backup and
    promoted workers; a report without an iteration is skipped.
    """
    if report.iteration == 0:
        return
    job = report.job_id
    seen = _job_workers.setdefault(job, set())
    for metric, workers in (
        (WORKER_LATE, report.late_workers), (WORKER_FAILED, report.failed_workers),
        (WORKER_BACKUP, report.backup_workers), (WORKER_PROMOTED, report.promoted_workers),
    ):  # fmt: skip
        for worker in workers:
            seen.add(str(worker))
            metric.labels(job_id=job, worker=str(worker)).inc()
    if report.state == master_pb2.JOB_STATE_FAILED:
        return
    ITERATIONS.labels(exact=str(bool(report.exact)).lower()).inc()
    ITERATION_SECONDS.observe(report.wall_seconds)
    DECODE_SECONDS.observe(report.decode_seconds)
    first = first_decodable_seconds(report)
    if first is not None:
        FIRST_DECODABLE_SECONDS.observe(first)
    for timing in report.timings:
        seen.add(str(timing.worker_id))
        response, model, compute = _timing_series(job, str(timing.worker_id))
        response.observe(timing.seconds)
        model.inc(timing.model_seconds)
        compute.inc(timing.compute_seconds)
    if stragglers_tolerated is not None:
        STRAGGLER_TOLERANCE_LEFT.set(stragglers_tolerated - len(report.failed_workers))
    if report.start_slack_seconds > 0:
        HELD_START_SLACK.set(report.start_slack_seconds)


_job_workers: dict[str, set[str]] = {}
"""The worker labels each job's per-worker series carry (what :func:`forget_job` removes)."""

_timings: dict[tuple[str, str], tuple[Histogram, Counter, Counter]] = {}
"""Per (job, worker): its response, model and compute series, looked up once (``labels()`` took about 3 µs a call,
three calls a worker every iteration)."""


def _timing_series(job: str, worker: str) -> tuple[Histogram, Counter, Counter]:
    series = _timings.get((job, worker))
    if series is None:
        labels = {"job_id": job, "worker": worker}
        series = _timings[job, worker] = (
            WORKER_RESPONSE_SECONDS.labels(**labels), WORKER_MODEL_SECONDS.labels(**labels),
            WORKER_COMPUTE_SECONDS.labels(**labels),
        )  # fmt: skip
    return series


def forget_job(job_id: str) -> None:
    """Remove the job's per-worker series: the master no longer holds it."""
    for worker in _job_workers.pop(job_id, ()):
        _timings.pop((job_id, worker), None)
        for metric in (
            WORKER_RESPONSE_SECONDS, WORKER_MODEL_SECONDS, WORKER_COMPUTE_SECONDS, WORKER_LATE, WORKER_FAILED,
            WORKER_BACKUP, WORKER_PROMOTED,
        ):  # fmt: skip
            with contextlib.suppress(KeyError):  # a series it never had
                metric.remove(job_id, worker)


def set_workers_up(up: int, known: int) -> None:
    """The pool's counts, set whenever a worker joins or changes state."""
    WORKERS_UP.set(up)
    WORKERS_KNOWN.set(known)


class _JobStates(Collector):
    """``gradcode_jobs{state=...}``: how many of the jobs the master holds are in each state, at scrape time."""

    def __init__(self, states: Callable[[], Iterable[int]]) -> None:
        self.states = states

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("gradcode_jobs", "Jobs the master holds, by state.", labels=["state"])
        counts = Tally(job_state_label(s) for s in self.states())
        for state in master_pb2.JobState.values():
            if state != master_pb2.JOB_STATE_UNSPECIFIED:
                family.add_metric([job_state_label(state)], counts.get(job_state_label(state), 0))
        yield family


_job_states: _JobStates | None = None


def watch_jobs(states: Callable[[], Iterable[int]]) -> None:
    """Export ``gradcode_jobs{state}`` from ``states()`` (the states of the jobs held); the last call wins.

    ``states`` runs in the scrape thread: it must only read (e.g. ``list(jobs.values())`` first).
    """
    global _job_states
    if _job_states is None:
        _job_states = _JobStates(states)
        MASTER_REGISTRY.register(_job_states)
    else:
        _job_states.states = states


class MetricsServer:
    """A running ``/metrics`` endpoint (prometheus-client's threaded HTTP server)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; OSError if the port is taken."""
    if not 1 <= port <= 65535:
        raise ValueError(f"Metrics port must be in [1, 65535], not {port!r}.")
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(f"Cannot serve metrics on {host}:{port}: {exc.strerror or exc} (is the port in use?)") from None
    return MetricsServer(server, thread)
