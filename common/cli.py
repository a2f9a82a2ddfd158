"""What ``python -m gradcode.master`` and ``python -m gradcode.worker`` share: flags with environment defaults and the
process set-up every gradcode service does before serving."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gradcode.common.serving import limit_blas_threads, parse_address, reuse_large_buffers

__all__ = ["add_service_arguments", "env_default", "prepare_process", "service_address"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def env_default(name: str, default: str | None) -> str | None:
    """The environment variable ``name`` if set and non-empty, else ``default`` (a flag still wins)."""
    value = os.environ.get(name)
    return value if value else default


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


def service_address(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, int]:
    """Validate the shared flags; exit with a usage error (status 2) naming the bad one."""
    try:
        host, port = parse_address(args.listen, what="--listen")
    except ValueError as exc:
        parser.error(str(exc))
    if args.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, not {args.grace}.")
    return host, port


def prepare_process(*, threads: int, log_level: str) -> None:
    """Before serving: limit BLAS threads, keep large buffers for reuse, log to stderr."""
    limit_blas_threads(threads)
    reuse_large_buffers()
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
