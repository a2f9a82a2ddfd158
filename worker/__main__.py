"""Run one gradcode worker: ``gradcode worker --listen HOST:PORT [--master HOST:PORT] ...``.

Prints ``worker listening on HOST:PORT`` (with the bound port) once it serves, so launchers can
wait for that line. The first SIGINT/SIGTERM shuts down gracefully (exit status 0); a second one
exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

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
from gradcode.common.transport.serving import install_shutdown_signals, parse_address
from gradcode.common.transport.wire import MAX_MESSAGE_BYTES

__all__ = ["ADVERTISE_AUTO", "build_parser", "main", "parse_arguments"]

ADVERTISE_AUTO = "auto"
"""``--advertise auto``: this machine's hostname (in a container, the name other containers reach it by)
when listening on every interface, else the listen host; with the bound port (``WorkerNode``'s
``ADVERTISE_HOSTNAME``)."""

_EPILOG = """\
Every option can also come from the environment variable shown in brackets (a flag wins over the
variable).

examples:
  gradcode worker --listen 127.0.0.1:50061
      a worker on a fixed local port; point the master at it (--workers 127.0.0.1:50061).
  gradcode worker --listen 0.0.0.0:50061 --master master:50050 --advertise worker-1:50061
      listen on every interface and register with the master, which reaches it as worker-1:50061
      (what deploy/kubernetes does, with each pod's stable DNS name).
  gradcode worker --listen 0.0.0.0:50051 --master master:50050 --advertise auto
      the same, advertising this container's hostname: what docker-compose does, so replicas need
      no name of their own.
  gradcode worker --listen 127.0.0.1:0
      any free port; read the chosen one from the "worker listening on HOST:PORT" line.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradcode worker",
        description=(
            "A gradcode worker: holds the data partitions the master sends it (or, for worker-local data, loads "
            "its own from --data-dir), computes coded partial "
            "gradients on request and streams them back; in a tree it also decodes its children."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_service_arguments(parser, default_listen="127.0.0.1:50051")
    parser.add_argument(
        "--master", metavar="HOST:PORT", default=env_default("GRADCODE_MASTER", None),
        help="master to register with; without it the master must be told this worker's address [GRADCODE_MASTER]",
    )  # fmt: skip
    parser.add_argument(
        "--advertise", metavar="HOST:PORT", default=env_default("GRADCODE_ADVERTISE", None),
        help="address the master should use to reach this worker, or 'auto': the listen address with this "
        "machine's hostname when listening on 0.0.0.0, and the bound port. Default: the listen address, and when "
        "listening on 0.0.0.0 the address of the interface this host routes to the master by (of the default "
        "route's when the master is on loopback; loopback only when there is neither) [GRADCODE_ADVERTISE]",
    )  # fmt: skip
    parser.add_argument(
        "--name", default=env_default("GRADCODE_NAME", None),
        help="label shown by the master (default: the hostname; auto: the name this host's address resolves back "
        "to, e.g. a compose replica's <project>-worker-<n> where the hostname is the container id) [GRADCODE_NAME]",
    )  # fmt: skip
    parser.add_argument(
        "--machine-id", default=env_default("GRADCODE_MACHINE_ID", None),
        help="which machine this worker runs on, for the master: workers with one id share cores, and their "
        "backups then compute only once promoted; only a worker with the master's id is offered shared memory "
        "(default: a hash of the Linux boot id with the network and UTS namespaces, so network namespaces and "
        "containers on one kernel differ; give workers pinned to disjoint cores their own ids) [GRADCODE_MACHINE_ID]",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-bytes", type=int, default=int(env_default("GRADCODE_CHUNK_BYTES", "0") or 0),
        help="payload bytes per gradient chunk sent back; 0 sizes chunks to each message "
        "[GRADCODE_CHUNK_BYTES] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=int(env_default("GRADCODE_THREADS", "1") or 1),
        help="numpy/BLAS threads; 1 keeps n workers on one machine from oversubscribing it [GRADCODE_THREADS] "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-budget", type=float, metavar="GIB", default=float(env_default("GRADCODE_MEMORY_BUDGET", "16") or 16),
        help="GiB of data all jobs together may hold on this worker; a LoadJob beyond it is refused "
        "(RESOURCE_EXHAUSTED) [GRADCODE_MEMORY_BUDGET] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-jobs", type=int, default=int(env_default("GRADCODE_MAX_JOBS", "16") or 16),
        help="jobs this worker holds at once [GRADCODE_MAX_JOBS] (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--link-port", default=env_default("GRADCODE_LINK_PORT", "0") or "0",
        help="port of this worker's link, a Session over plain TCP (with this server's TLS) that spares the "
        "data path gRPC's cost, on the --listen host: 0 picks a free one, 'off' serves none (the master then "
        "uses the gRPC Session) [GRADCODE_LINK_PORT] (default: %(default)s)",
    )  # fmt: skip
    add_data_arguments(parser, role="worker")
    add_security_arguments(parser, role="worker")
    return parser


def link_port(value: str) -> int | None:
    """The --link-port value: a port (0: any free one), or None for 'off'."""
    text = value.strip().lower()
    if text == "off":
        return None
    if text.isdigit() and int(text) <= 65535:
        return int(text)
    raise ValueError(f"--link-port must be a port (0 to 65535; 0 picks a free one) or 'off', not {value!r}.")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (and GRADCODE_* environment), validated; exits with status 2 naming a bad flag.

    Adds ``host``/``port`` (from --listen); ``advertise`` is ``auto`` in lower case however it was spelled.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.host, args.port = service_address(parser, args)
    if args.advertise is not None and args.advertise.strip().lower() == ADVERTISE_AUTO:
        args.advertise = ADVERTISE_AUTO
    try:
        for flag in ("master", "advertise"):
            if getattr(args, flag) and getattr(args, flag) != ADVERTISE_AUTO:
                parse_address(getattr(args, flag), what=f"--{flag}")
        if args.threads < 1:
            raise ValueError(f"--threads must be a positive integer, not {args.threads}.")
        if args.chunk_bytes != 0 and not 16 <= args.chunk_bytes <= MAX_MESSAGE_BYTES // 2:
            raise ValueError(
                f"--chunk-bytes must be 0 (sized to each message) or in [16, {MAX_MESSAGE_BYTES // 2}], "
                f"not {args.chunk_bytes}."
            )
        if not args.memory_budget > 0 or args.max_jobs < 1:
            raise ValueError(
                f"--memory-budget must be > 0 and --max-jobs >= 1, not {args.memory_budget} and {args.max_jobs}."
            )
        args.link_port = link_port(args.link_port)
        args.security = security_from_args(args)
        refuse_if_exposed(args.host, args.security)  # before any port (metrics, link too) is opened
    except ValueError as exc:
        parser.error(str(exc))
    check_data_arguments(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    prepare_process(threads=args.threads, log_level=args.log_level, log_format=args.log_format)
    try:
        asyncio.run(_serve(args, args.host, args.port))
    except OSError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(args: argparse.Namespace, host: str, port: int) -> None:
    from gradcode.worker.node import WorkerNode  # after the BLAS limit, so numpy's pools start small

    node = WorkerNode(
        host, port, master_address=args.master, advertise_address=args.advertise, name=args.name,
        machine_id=args.machine_id, grace=args.grace, chunk_bytes=args.chunk_bytes or None,
        max_total_bytes=int(args.memory_budget * 1024**3), max_jobs=args.max_jobs, security=args.security,
        data_dir=args.data_dir, max_data_file_bytes=args.max_data_file_bytes, link_port=args.link_port,
    )  # fmt: skip
    from gradcode.common.ops.metrics import WORKER_REGISTRY

    # Metrics first: a taken metrics port stops the process before it registers, and the ready line
    # below promises every port.
    metrics = start_metrics(args, host, WORKER_REGISTRY, name="worker")
    try:
        await node.start()
        freeze_startup_objects()
        install_shutdown_signals(node.shutdown, name="worker")
        print(f"worker listening on {node.address}", flush=True)
        await node.run()
    finally:
        await node.shutdown()
        if metrics is not None:
            metrics.close()


if __name__ == "__main__":
    sys.exit(main())
