"""Hosts that share /dev/shm but not a network identity exchange payloads through the network unless shared memory
is proven (issue 31).

Two network namespaces made for the test (``ip netns``, joined by a veth pair of their own; the host's network is
never touched) play two hosts on one kernel and one filesystem, as containers that mount one /dev/shm. The master
runs in host A with its shared-memory root in a directory every process sees. Four workers, all without
--advertise, join one job:

- in host A: the master's machine, and it reads the master's directory: shared memory, proven;
- in host B: another machine id by default (the network namespace differs): the network;
- in host B claiming the master's machine id, with the same files in view: it proves it reads them, so shared
  memory (shared memory that is truly shared is used, whatever the network says);
- in host B claiming the master's machine id, but with a tmpfs of its own over the root (another host's /dev/shm):
  it cannot read the master's nonce, so the network, however it lies.

Every worker advertises the address the master reaches it at (host B's veth address for those in B), and the
worker list says which transport each got and why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradcode.client.launch import ServiceProcess
from tests.e2e.conftest import START_TIMEOUT, log_tails

pytestmark = pytest.mark.e2e

HOST_A, HOST_B = "10.250.31.1", "10.250.31.2"
MASTER_PORT = 50050
ITERATIONS = 4

CLIENT = """
import asyncio, json, sys, time
import grpc
from gradcode.v1 import master_pb2, master_pb2_grpc
from tests.e2e.conftest import job_spec, run_job

address, names, iterations = sys.argv[1], sys.argv[2].split(","), int(sys.argv[4])

def listed():
    with grpc.insecure_channel(address) as channel:
        return master_pb2_grpc.MasterStub(channel).ListWorkers(master_pb2.ListWorkersRequest(), timeout=5).workers

deadline = time.monotonic() + float(sys.argv[3])
while True:
    up = {w.name: w.worker_id for w in listed() if w.state == master_pb2.WORKER_STATE_UP}
    if all(n in up for n in names) or time.monotonic() > deadline:
        break
    time.sleep(0.1)
if not all(n in up for n in names):
    print(json.dumps({"error": f"not all UP: {[(w.name, w.address, w.state, w.last_error) for w in listed()]}"}))
    sys.exit(0)
spec = job_spec("uncoded", {"n": len(names)}, iterations=iterations, worker_ids=[up[n] for n in names], verify=True)
info, reports = asyncio.run(run_job(address, spec))
from gradcode.client.__main__ import main
main(["workers", "--master", address])  # what an operator sees
print(json.dumps({
    "state": master_pb2.JobState.Name(info.state), "message": info.message,
    "exact": [r.exact and 0 <= r.verify_error <= 1e-9 for r in reports],
    "workers": {w.name: {"address": w.address, "transport": w.transport, "machine": w.machine_id} for w in listed()},
}))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Two fresh network namespaces joined by a veth pair (HOST_A in the first, HOST_B in the second); deleted after."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, iproute2's ip and util-linux's unshare to make two network namespaces")
    a, b = f"gcshm{os.getpid()}a", f"gcshm{os.getpid()}b"
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", a, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", b)  # never in the host
        for ns, dev, address in ((a, "veth-a", HOST_A), (b, "veth-b", HOST_B)):
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)


def _in(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def test_hosts_sharing_dev_shm_but_not_a_network_use_it_only_where_it_is_proven(
    tmp_path: Path, two_hosts: tuple[str, str]
) -> None:
    a, b = two_hosts
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    python = sys.executable
    print_id = "from gradcode.worker.node import default_machine_id; print(default_machine_id())"  # what workers send
    master_id = subprocess.run(_in(a, python, "-c", print_id), capture_output=True, text=True, check=True).stdout
    master_id = master_id.strip()
    master_address = f"{HOST_A}:{MASTER_PORT}"
    worker = [python, "-m", "gradcode", "worker", "--listen", "0.0.0.0:50061", "--master", master_address, "--insecure"]
    private_shm = f'mount -t tmpfs -o mode=0700 tmpfs {root} && exec "$@"'
    commands = {
        "same-host": _in(a, *worker, "--name", "same-host"),
        "other-host": _in(b, *worker[:5], "0.0.0.0:50062", *worker[6:], "--name", "other-host"),
        "claims-shared": _in(
            b, *worker[:5], "0.0.0.0:50063", *worker[6:], "--name", "claims-shared", "--machine-id", master_id
        ),
        "claims-private": _in(
            b, "unshare", "--mount", "--propagation", "private", "sh", "-c", private_shm, "sh",
            *worker[:5], "0.0.0.0:50064", *worker[6:], "--name", "claims-private", "--machine-id", master_id,
        ),
    }  # fmt: skip
    processes: list[ServiceProcess] = []
    try:
        master = ServiceProcess(
            _in(a, python, "-m", "gradcode", "master", "--listen", f"{HOST_A}:{MASTER_PORT}", "--insecure",
                "--run-dir", str(tmp_path), "--shared-memory", str(root)),
            log_path=tmp_path / "master.log",
        )  # fmt: skip
        processes.append(master)
        master.wait_ready(START_TIMEOUT)
        for name, argv in commands.items():
            processes.append(ServiceProcess(argv, log_path=tmp_path / f"{name}.log"))
            processes[-1].wait_ready(START_TIMEOUT)
        client = subprocess.Popen(
            _in(a, python, "-c", CLIENT, master_address, ",".join(commands), str(START_TIMEOUT), str(ITERATIONS)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        messages: set[str] = set()  # the message slots the workers wrote in the master's directory
        deadline = time.monotonic() + 4 * START_TIMEOUT
        while client.poll() is None:
            messages.update(p.name.rsplit("-", 1)[0] for p in root.glob("gradcode-*/message-*"))
            assert time.monotonic() < deadline, log_tails(processes)
            time.sleep(0.01)
        out, err = client.communicate()
        assert client.returncode == 0 and out, f"{err}\n{log_tails(processes)}"
        *listing, last = out.splitlines()
        result = json.loads(last)
        assert "error" not in result, f"{result}\n{log_tails(processes)}"
    finally:
        for process in processes:
            process.stop()
    assert result["state"] == "JOB_STATE_SUCCEEDED", result["message"]
    assert result["exact"] == [True] * ITERATIONS
    workers = result["workers"]
    assert {name: w["transport"] for name, w in workers.items()} == {
        "same-host": "shared memory",
        "other-host": "network (another machine: its machine id is not the master's)",
        "claims-shared": "shared memory",
        "claims-private": "network (shared memory not shared: the worker cannot read the master's directory)",
    }, workers
    # `gradcode workers` says it too, at the end of each worker's line.
    for name, w in workers.items():
        (line,) = [line for line in listing if f" {name} " in line]
        assert line.endswith(f"  transport: {w['transport']}"), listing
    # Job worker i is the i-th name: only the two that proved it left messages in the master's directory.
    assert messages == {"message-0", "message-2"}, messages
    # Without --advertise, each advertised the address of its interface towards the master.
    assert {name: w["address"] for name, w in workers.items()} == {
        "same-host": f"{HOST_A}:50061",
        "other-host": f"{HOST_B}:50062",
        "claims-shared": f"{HOST_B}:50063",
        "claims-private": f"{HOST_B}:50064",
    }, workers
    assert workers["same-host"]["machine"] == master_id != workers["other-host"]["machine"]
