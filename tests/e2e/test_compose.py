"""docker-compose.yml, run without Docker: every service started as a local process with exactly the
command and environment the file gives it (addresses mapped to loopback, /runs to a temp dir).

No Docker engine runs on the development or CI machines; this keeps the file from rotting.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from gradcode.client.launch import ServiceProcess, service_env
from gradcode.v1 import master_pb2, master_pb2_grpc
from gradcode.worker.node import dns_name

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _argv(command: list[str]) -> list[str]:
    """The container's argv on this machine: the image's `python`/`gradcode` are this interpreter."""
    head, *rest = command
    if head == "python":
        return [sys.executable, *rest]
    if head == "gradcode":
        return [sys.executable, "-m", "gradcode", *rest]
    raise AssertionError(f"unexpected entry point {head!r} in docker-compose.yml")


def _local(value: str, master: str | None, runs: Path) -> str:
    """Map container addresses and volumes to this machine."""
    value = value.replace("/runs", str(runs)).replace("/data", str(runs.parent / "data"))
    if value.startswith("0.0.0.0:"):
        return "127.0.0.1:0"
    if master is not None:
        value = value.replace("master:50050", master)
    return value


def _env(service: dict, master: str | None, runs: Path) -> dict[str, str]:
    """The service's environment on this machine; each worker's link on a free port (the containers' own
    network namespaces all have 50052 free; the processes here share one)."""
    environment = {k: _local(str(v), master, runs) for k, v in service.get("environment", {}).items()}
    if "GRADCODE_LINK_PORT" in environment:
        environment["GRADCODE_LINK_PORT"] = "0"
    return service_env(environment)


def _healthcheck(service: dict, address: str) -> int:
    port = address.rsplit(":", 1)[1]
    test = [
        part.replace(":50050", f":{port}").replace(":50051", f":{port}") for part in service["healthcheck"]["test"][1:]
    ]
    return subprocess.run(_argv(test), capture_output=True, timeout=30, cwd=ROOT).returncode


def _registered(master_address: str, count: int, timeout: float = 60.0) -> set[str]:
    """The addresses the master lists, once it lists ``count`` workers."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(master_address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        while True:
            listed = {w.address for w in stub.ListWorkers(master_pb2.ListWorkersRequest(), timeout=10).workers}
            if len(listed) >= count or time.monotonic() > deadline:
                return listed
            time.sleep(0.2)


def test_compose_services_run_the_demo_as_described(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert set(spec) == {"master", "worker", "client"}
    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "data").mkdir()  # the ./data bind mount
    processes: list[ServiceProcess] = []
    try:
        master_svc = spec["master"]
        master = ServiceProcess(
            _argv(master_svc["command"]), log_path=tmp_path / "master.log", env=_env(master_svc, None, runs)
        )
        processes.append(master)
        master_address = master.wait_ready(60)
        assert _healthcheck(master_svc, master_address) == 0

        worker_svc = spec["worker"]
        replicas = worker_svc["deploy"]["replicas"]
        workers = [
            ServiceProcess(
                _argv(worker_svc["command"]),
                log_path=tmp_path / f"worker-{i}.log",
                env=_env(worker_svc, master_address, runs),
            )
            for i in range(replicas)
        ]
        processes += workers
        addresses = [w.wait_ready(60) for w in workers]
        assert _healthcheck(worker_svc, addresses[0]) == 0
        # Every replica advertises its own address (`--advertise auto`: its hostname in a container,
        # the loopback listen host here) and registers under it.
        assert worker_svc["command"][-2:] == ["--advertise", "auto"]
        assert _registered(master_address, len(addresses)) == set(addresses)
        # ... under the name its address resolves back to (`--name auto`; in compose, <project>-worker-<n>)
        assert worker_svc["command"][2:4] == ["--name", "auto"]
        with grpc.insecure_channel(master_address) as channel:
            names = {
                w.name for w in master_pb2_grpc.MasterStub(channel).ListWorkers(master_pb2.ListWorkersRequest()).workers
            }
        assert names == {dns_name(socket.gethostname()) or socket.gethostname()}, names

        client_svc = spec["client"]
        client_argv = [_local(part, master_address, runs) for part in _argv(client_svc["command"])]
        done = subprocess.run(
            client_argv, env=_env(client_svc, master_address, runs), capture_output=True, text=True, timeout=240,
            cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        history = json.loads((runs / "compose" / "history.json").read_text())
        assert len(history) == 60
        assert history[-1]["test_accuracy"] > 0.9
        assert (runs / "compose" / "history.png").stat().st_size > 0
    finally:
        for p in processes:
            p.stop()
