"""Exit 0 when the gRPC server at ADDRESS reports SERVING on the standard health service.

Usage: ``python -m gradcode.client.healthcheck HOST:PORT [--service NAME] [--timeout SECONDS]`` (the
docker-compose healthchecks and the Kubernetes exec probes). With TLS it reads the same GRADCODE_TLS_*
variables (or flags) as the services, so inside a pod it presents the pod's own certificate to a master or
worker that requires client certificates (mutual TLS), which Kubernetes' native gRPC probes cannot do. The
health service needs no token. ``--service`` asks about one service (``gradcode.v1.Master``: ready for
jobs) instead of the server as a whole.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcode.common.transport.security import Security, add_security_arguments, security_from_args


def is_serving(address: str, timeout: float = 3.0, security: Security | None = None, service: str = "") -> bool:
    with (security or Security()).sync_channel(address) as channel:
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--service", default="", help="the service to ask about (default: the server as a whole)")
    add_security_arguments(parser, role="client")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        security = security_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    serving = is_serving(args.address, args.timeout, security, args.service)
    print("SERVING" if serving else "NOT SERVING")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
