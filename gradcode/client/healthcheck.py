"""Exit 0 when the gRPC server at ADDRESS reports SERVING on the standard health service.

Usage: ``python -m gradcode.client.healthcheck HOST:PORT [--timeout SECONDS]`` (used by docker-compose).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, timeout: float = 3.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    serving = is_serving(args.address, args.timeout)
    print("SERVING" if serving else "NOT SERVING")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
