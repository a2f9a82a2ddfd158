"""Exit 0 when the gRPC server at ADDRESS reports SERVING on the standard health service.

Usage: ``python -m gradcode.client.healthcheck HOST:PORT [--timeout SECONDS]`` (used by docker-compose).
With TLS it reads the same GRADCODE_TLS_* variables (or flags) as the services; the health service
needs no token.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcode.common.security import Security, add_security_arguments, security_from_args


def is_serving(address: str, timeout: float = 3.0, security: Security | None = None) -> bool:
    with (security or Security()).sync_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--timeout", type=float, default=3.0)
    add_security_arguments(parser, role="client")
    args = parser.parse_args(argv)
    try:
        security = security_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    serving = is_serving(args.address, args.timeout, security)
    print("SERVING" if serving else "NOT SERVING")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
