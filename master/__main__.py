"""``gradcode master``: run the gradcode master (worker registry + job control API).

Every flag has an environment variable, so docker-compose can configure the master without a
command line; a flag given on the command line wins. Prints ``master listening on HOST:PORT`` once
it serves. The first SIGINT/SIGTERM shuts down gracefully, a second one exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from gradcode.common.ops.cli import (
    add_data_arguments,
    add_service_arguments,
    check_data_arguments,
    env_default,
    freeze_startup_objects,
    prepare_process,
    service_address,
    start_metrics,
)
from gradcode.common.transport.security import add_security_arguments, refuse_if_exposed, security_from_args
from gradcode.common.transport.serving import install_shutdown_signals
from gradcode.common.transport.shared_memory import DEFAULT_ROOT
from gradcode.master.job import DEFAULT_CHECKPOINT_EVERY
from gradcode.master.limits import MAX_FEATURES
from gradcode.master.pool import MAX_WORKERS, worker_address

DEFAULT_LISTEN = "127.0.0.1:50050"
DEFAULT_RUN_DIR = "runs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcode master",
        description=(
            "The gradcode master: keeps the list of workers, accepts training jobs from clients "
            "(gradcode run / the SDK), sends each iteration's model to the workers, decodes the "
            "exact gradient from the fastest workers and applies the optimizer step."
        ),
        epilog=(
            "Every option can also come from the environment variable shown in brackets (a flag wins).\n\n"
            "Workers join either from --workers or by registering themselves (gradcode worker --master\n"
            "HOST:PORT). Example:\n"
            "  gradcode master --listen 127.0.0.1:50050 --workers 127.0.0.1:50051,127.0.0.1:50052"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_service_arguments(parser, default_listen=DEFAULT_LISTEN)
    parser.add_argument(
        "--workers",
        default=env_default("GRADCODE_WORKERS", ""),
        metavar="ADDR,ADDR,...",
        help="comma-separated worker addresses known from the start [GRADCODE_WORKERS]",
    )
    parser.add_argument(
        "--run-dir",
        default=env_default("GRADCODE_RUN_DIR", DEFAULT_RUN_DIR),
        metavar="DIR",
        help="where each job's per-iteration history (<job>.jsonl) is written as it runs [GRADCODE_RUN_DIR] "
        "(default: %(default)s)",
    )
    add_data_arguments(parser, role="master")
    parser.add_argument(
        "--state-dir",
        default=env_default("GRADCODE_STATE_DIR", None),
        metavar="DIR",
        help=(
            "where each job's checkpoint (<job>.ckpt.npz) is written; a master started on it resumes the jobs "
            "that were running (default: none, jobs are not durable) [GRADCODE_STATE_DIR]"
        ),
    )
    parser.add_argument(
        "--checkpoint-every", type=int,
        default=int(env_default("GRADCODE_CHECKPOINT_EVERY", "") or DEFAULT_CHECKPOINT_EVERY),
        metavar="K",
        help="checkpoint every K iterations and at the end; a restart loses at most K [GRADCODE_CHECKPOINT_EVERY] "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-workers", type=int, default=int(env_default("GRADCODE_MAX_WORKERS", str(MAX_WORKERS)) or MAX_WORKERS),
        help="most workers the pool holds (UP or DOWN) [GRADCODE_MAX_WORKERS] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-features", type=int,
        default=int(env_default("GRADCODE_MAX_FEATURES", str(MAX_FEATURES)) or MAX_FEATURES), metavar="P",
        help="most features a job's dataset may have, hence the size of a linear model's parameter vector "
        "(datasets stay under 1 GiB of features either way) [GRADCODE_MAX_FEATURES] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--shared-memory",
        default=env_default("GRADCODE_SHARED_MEMORY", str(DEFAULT_ROOT)),
        metavar="DIR|off",
        help=(
            "tmpfs directory where each job offers workers on this host (same user) to exchange models and "
            "messages as files instead of through gRPC; 'off' sends everything through gRPC; a worker elsewhere "
            "always does [GRADCODE_SHARED_MEMORY] (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--machine-id", default=env_default("GRADCODE_MACHINE_ID", None),
        help="which machine the master runs on: workers registered with another id are never offered shared "
        "memory (default: a hash of the Linux boot id with the network and UTS namespaces, as workers compute "
        "theirs) [GRADCODE_MACHINE_ID]",
    )  # fmt: skip
    parser.add_argument(
        "--link", choices=("on", "off"), default=env_default("GRADCODE_LINK", "on"),
        help="ask each worker for a link, a Session over plain TCP (with the workers' TLS) that spares the data "
        "path gRPC's cost; 'off' keeps every Compute on gRPC; a worker without one keeps its gRPC Session "
        "[GRADCODE_LINK] (default: %(default)s)",
    )  # fmt: skip
    add_security_arguments(parser, role="master")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    from gradcode.common.ops.metrics import MASTER_REGISTRY
    from gradcode.master.node import MasterNode

    node = MasterNode(
        args.host, args.port, workers=args.worker_list, run_dir=args.run_dir, data_dir=args.data_dir, grace=args.grace,
        security=args.security, max_workers=args.max_workers, max_data_file_bytes=args.max_data_file_bytes,
        max_features=args.max_features,
        state_dir=args.state_dir, checkpoint_every=args.checkpoint_every,
        shared_memory=args.shared_memory_root, links=args.link == "on", machine_id=args.machine_id,
    )  # fmt: skip
    # Metrics first: a taken metrics port stops the process before it serves, and the ready line
    # below promises every port.
    metrics = start_metrics(args, args.host, MASTER_REGISTRY, name="master")
    try:
        await node.start()
        freeze_startup_objects()
        install_shutdown_signals(node.shutdown, name="master")
        print(f"master listening on {node.address}", flush=True)
        await node.run()
    finally:
        await node.shutdown()
        if metrics is not None:
            metrics.close()


def shared_memory_root(value: str) -> Path | None:
    """The --shared-memory value as a directory, or None for 'off' and for the default where this system has
    no /dev/shm (shared memory is then simply not offered); ValueError for another directory that is missing."""
    if value == "off":
        return None
    root = Path(value)
    if root.is_dir():
        return root
    if root == DEFAULT_ROOT:
        return None
    raise ValueError(f"--shared-memory {value!r} is not a directory; give a tmpfs directory, or 'off'.")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (and GRADCODE_* environment), validated; exits with status 2 naming a bad flag.

    Adds ``host``/``port`` (from --listen) and ``worker_list`` (from --workers).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.host, args.port = service_address(parser, args)
    try:
        args.worker_list = [worker_address(a) for a in args.workers.split(",") if a.strip()]
        args.security = security_from_args(args)
        refuse_if_exposed(args.host, args.security)  # before any port (metrics too) is opened
        if args.checkpoint_every < 1:
            raise ValueError(f"--checkpoint-every must be >= 1, not {args.checkpoint_every}.")
        if args.max_workers < 1:
            raise ValueError(f"--max-workers must be >= 1, not {args.max_workers}.")
        if args.max_features < 1:
            raise ValueError(f"--max-features must be >= 1, not {args.max_features}.")
        args.shared_memory_root = shared_memory_root(args.shared_memory)
    except ValueError as exc:
        parser.error(str(exc))
    check_data_arguments(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    prepare_process(threads=1, log_level=args.log_level, log_format=args.log_format)
    try:
        asyncio.run(_serve(args))
    except OSError as exc:
        print(f"master: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
