"""What ``python -m gradcode.master`` and ``python -m gradcode.worker`` share: flags with environment defaults and the
process set-up every gradcode service does before serving; and the aligned text tables commands print."""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from gradcode.common.ops.logs import LOG_FORMATS, configure_logging
from gradcode.common.ops.metrics import MetricsServer, start_metrics_server
from gradcode.common.transport.serving import format_address, limit_blas_threads, parse_address, reuse_large_buffers

__all__ = [
    "add_data_arguments",
    "add_service_arguments",
    "check_data_arguments",
    "env_default",
    "prepare_process",
    "service_address",
    "start_metrics",
    "text_table",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def env_default(name: str, default: str | None) -> str | None:
    """The environment variable ``name`` if set and non-empty, else ``default`` (a flag still wins)."""
    value = os.environ.get(name)
    return value if value else default


def add_data_arguments(parser: argparse.ArgumentParser, *, role: str) -> None:
    """``--data-dir`` and ``--max-data-file-bytes``: where this master or worker may read data files, and how large."""
    from gradcode.common.training.datafile import DATA_DIR_ENV, DATA_FILE_SUFFIXES, MAX_DATA_FILE_BYTES

    reads = (
        "the 'file' dataset may read"
        if role == "master"
        else "worker-local jobs (DatasetSpec.worker_local) read their partitions from"
    )
    parser.add_argument(
        "--data-dir", default=env_default(DATA_DIR_ENV, None), metavar="DIR",
        help=f"directory {reads} ({', '.join(DATA_FILE_SUFFIXES)}; paths in job specs are relative to it); "
        f"default: none, data files are refused [{DATA_DIR_ENV}]",
    )  # fmt: skip
    parser.add_argument(
        "--max-data-file-bytes", type=int,
        default=int(env_default("GRADCODE_MAX_DATA_FILE_BYTES", str(MAX_DATA_FILE_BYTES)) or MAX_DATA_FILE_BYTES),
        help="largest data file a dataset may load from --data-dir [GRADCODE_MAX_DATA_FILE_BYTES] "
        "(default: %(default)s, 2 GiB)",
    )  # fmt: skip


def check_data_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with status 2 when --data-dir is not a directory or --max-data-file-bytes is not positive."""
    if args.max_data_file_bytes < 1:
        parser.error(f"--max-data-file-bytes must be >= 1, not {args.max_data_file_bytes}.")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        parser.error(f"--data-dir {args.data_dir!r} is not a directory.")


def add_service_arguments(parser: argparse.ArgumentParser, *, default_listen: str) -> None:
    """``--listen``, ``--grace`` and ``--log-level``, each also read from its GRADCODE_* variable."""
    parser.add_argument(
        "--listen", metavar="HOST:PORT", default=env_default("GRADCODE_LISTEN", default_listen),
        help="address to serve on; port 0 picks a free port [GRADCODE_LISTEN] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=float, metavar="SECONDS", default=float(env_default("GRADCODE_GRACE", "5") or 5),
        help="seconds in-flight calls get to finish on shutdown [GRADCODE_GRACE] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", default=env_default("GRADCODE_LOG_LEVEL", "INFO"), choices=LOG_LEVELS, type=str.upper,
        help="logging verbosity, on stderr [GRADCODE_LOG_LEVEL] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--log-format", default=env_default("GRADCODE_LOG_FORMAT", "text"), choices=LOG_FORMATS, type=str.lower,
        help="text for people; json for one object per line with job_id and iteration where known, for log "
        "collectors [GRADCODE_LOG_FORMAT] (default: %(default)s)",
    )  # fmt: skip
    # Off by default: several services often share one host (gradcode demo, tests), and a fixed port
    # would collide; deployments that scrape set it (deploy/kubernetes uses 9464).
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", default=env_default("GRADCODE_METRICS_PORT", "0"),
        help="serve Prometheus metrics at http://HOST:PORT/metrics on the --listen host; 0 = off "
        "[GRADCODE_METRICS_PORT] (default: %(default)s)",
    )  # fmt: skip


def service_address(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, int]:
    """Validate the shared flags; exit with a usage error (status 2) naming the bad one."""
    try:
        host, port = parse_address(args.listen, what="--listen")
    except ValueError as exc:
        parser.error(str(exc))
    if args.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, not {args.grace}.")
    # argparse checks `choices` for values given on the command line only, not for defaults (the environment).
    if args.log_level not in LOG_LEVELS:
        parser.error(
            f"--log-level / GRADCODE_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {args.log_level!r}."
        )
    if args.log_format not in LOG_FORMATS:
        parser.error(
            f"--log-format / GRADCODE_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, not {args.log_format!r}."
        )
    if not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port must be in [1, 65535], or 0 for no metrics endpoint, not {args.metrics_port}.")
    return host, port


def prepare_process(*, threads: int, log_level: str, log_format: str = "text") -> None:
    """Before serving: limit BLAS threads, keep large buffers for reuse, log to stderr as ``log_format``."""
    limit_blas_threads(threads)
    reuse_large_buffers()
    configure_logging(log_level, log_format)


def freeze_startup_objects() -> None:
    """Once the node is serving: leave what start-up made (modules, servers, descriptors) out of the cyclic GC.

    Every full collection walks all tracked objects; in a worker of the n = 16, p = 1e5 benchmark that walk
    was 16% of its CPU (``perf``: ``gc_collect_main``, ``visit_decref``, ``visit_reachable``), for objects
    that live as long as the process. Frozen objects are still freed by reference counting.
    """
    gc.collect()
    gc.freeze()


def start_metrics(
    args: argparse.Namespace, host: str, registry: CollectorRegistry, *, name: str
) -> MetricsServer | None:
    """Serve ``registry`` on ``--metrics-port`` (None when it is 0) and say where on stdout."""
    if not args.metrics_port:
        return None
    server = start_metrics_server(host, args.metrics_port, registry)
    print(f"{name} metrics on http://{format_address(host, server.port)}/metrics", flush=True)
    return server


def text_table(head: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """``head`` and ``lines`` as left-aligned columns two spaces apart."""
    table = [list(head), *[list(line) for line in lines]]
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in table)
