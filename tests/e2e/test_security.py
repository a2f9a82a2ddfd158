"""Security end to end: real master and worker processes on loopback, over mutual TLS with tokens.

A whole job runs; meanwhile a client without the token, a worker without the join secret and a
process that is not the master calling a worker's LoadJob/Compute/EndJob are refused with
UNAUTHENTICATED or PERMISSION_DENIED — even one holding the join secret, the token derived from it, or
the call token the master issued to another registered worker — and the job is undisturbed. A tree
job runs with every parent calling its children with the children's own call tokens. A worker that
registers at an address where the master cannot reach it is never UP.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gradcode.client.certs import CertificateSet, make_certificates
from gradcode.client.launch import LocalCluster, ServiceProcess, service_env
from gradcode.client.sdk import GradcodeClient
from gradcode.common.transport.security import Security, new_process_secret
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from gradcode.worker.node import WorkerNode, default_machine_id

from .conftest import START_TIMEOUT, job_spec

pytestmark = pytest.mark.e2e

TOKEN = "e2e-client-token-0123456789abcdef"
JOIN = "e2e-join-secret-0123456789abcdef"
WORKERS = 3


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertificateSet]:
    yield make_certificates(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "localhost"])


def server_env(certs: CertificateSet, **extra: str) -> dict[str, str]:
    env = {
        "GRADCODE_TLS_CERT": str(certs.node), "GRADCODE_TLS_KEY": str(certs.node_key),
        "GRADCODE_TLS_CA": str(certs.ca), "GRADCODE_MTLS": "1",
        "GRADCODE_TOKEN": TOKEN, "GRADCODE_JOIN_SECRET": JOIN,
    }  # fmt: skip
    env.update(extra)
    return env


def client(certs: CertificateSet, address: str, token: str | None = TOKEN) -> GradcodeClient:
    security = Security(cert=certs.client, key=certs.client_key, ca=certs.ca, mutual=True, token=token)
    return GradcodeClient(address, security=security)


async def wait_up(c: GradcodeClient, count: int) -> list[master_pb2.WorkerInfo]:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        up = [w for w in await c.list_workers() if w.state == master_pb2.WORKER_STATE_UP]
        if len(up) >= count:
            return up
        assert time.monotonic() < deadline, f"only {len(up)} of {count} workers UP"
        await asyncio.sleep(0.1)


async def refused(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    code: grpc.StatusCode = info.value.code()
    return code


async def intrusions(certs: CertificateSet, master: str, workers: list[str], job_id: str) -> list[str]:
    """Everything an outsider tries while the job runs; returns the statuses, one line per attempt.

    The insider is a worker that registers with the master now (a process holding the certificates and
    the join secret, admitted and issued its own call token): neither that token nor the join secret
    nor the token derived from it lets it drive another worker.
    """
    seen: list[str] = []
    async with client(certs, master, token=None) as anonymous:
        seen.append(f"client without token ListWorkers: {(await refused(anonymous.list_workers())).name}")
        seen.append(f"client without token CancelJob: {(await refused(anonymous.cancel(job_id))).name}")
        spec = job_spec("cyclic", {"n": 3, "s": 1})
        seen.append(f"client without token CreateJob: {(await refused(anonymous.create_job(spec))).name}")
    outsider = Security(cert=certs.client, key=certs.client_key, ca=certs.ca, mutual=True)
    insider_security = Security(cert=certs.node, key=certs.node_key, ca=certs.ca, mutual=True, join_secret=JOIN)
    async with WorkerNode(master_address=master, name="insider", grace=0.2, security=insider_security) as insider:
        await asyncio.wait_for(insider.registered.wait(), START_TIMEOUT)
        assert insider.call_token is not None and insider.call_token.value is not None
        insider_token = insider.call_token.value
    credentials = (
        ("no credential", None), ("the client token", TOKEN), ("the join secret", JOIN),
        ("the join-derived token", insider_security.worker_call_token),
        ("another worker's call token", insider_token),
    )  # fmt: skip
    for label, bearer in credentials:
        async with outsider.channel(workers[0], bearer=bearer) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            load = stub.LoadJob(iter([worker_pb2.LoadJobChunk(setup=worker_pb2.JobSetup(job_id=job_id))]))
            compute = stub.Compute(worker_pb2.ComputeRequest(job_id=job_id, iteration=2**64 - 1)).read()
            end = stub.EndJob(worker_pb2.EndJobRequest(job_id=job_id))
            for name, call in (("LoadJob", load), ("Compute", compute), ("EndJob", end)):
                seen.append(f"outsider with {label} {name}: {(await refused(call)).name}")
    return seen


def test_a_job_over_mutual_tls_with_tokens_is_undisturbed_by_intruders(certs: CertificateSet, tmp_path: Path) -> None:
    with LocalCluster(WORKERS, run_dir=tmp_path, env=server_env(certs)) as cluster:
        # a worker that has the certificates but not the join secret
        stranger_env = service_env(server_env(certs, GRADCODE_JOIN_SECRET="not-the-join-secret-0123456789"))
        argv = [sys.executable, "-m", "gradcode.worker", "--listen", "127.0.0.1:0", "--master", cluster.master_address]
        stranger = ServiceProcess([*argv, "--name", "stranger"], log_path=tmp_path / "stranger.log", env=stranger_env)
        try:
            stranger.wait_ready(START_TIMEOUT)
            attempts: list[str] = []

            async def scenario() -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], list[str]]:
                async with client(certs, cluster.master_address) as c:
                    up = await wait_up(c, WORKERS)
                    addresses = [w.address for w in up]
                    spec = job_spec("cyclic", {"n": WORKERS, "s": 1}, iterations=8)

                    async def on_report(report: master_pb2.IterationReport) -> None:
                        if report.iteration == 2:  # mid-job
                            attempts.extend(await intrusions(certs, cluster.master_address, addresses, report.job_id))

                    info, reports = await c.run(spec, on_report, check=False)
                    return info, reports, [w.name for w in await c.list_workers()]

            info, reports, names = asyncio.run(asyncio.wait_for(scenario(), 180))
            stranger_log = (tmp_path / "stranger.log").read_text()
        finally:
            stranger.stop()
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == 8 and all(r.exact for r in reports)
    assert all(not r.failed_workers for r in reports), [list(r.failed_workers) for r in reports]
    assert attempts == [
        "client without token ListWorkers: UNAUTHENTICATED",
        "client without token CancelJob: UNAUTHENTICATED",
        "client without token CreateJob: UNAUTHENTICATED",
        *(
            f"outsider with {label} {name}: {status}"
            for label, status in (
                ("no credential", "UNAUTHENTICATED"),
                ("the client token", "UNAUTHENTICATED"),
                ("the join secret", "PERMISSION_DENIED"),
                ("the join-derived token", "PERMISSION_DENIED"),
                ("another worker's call token", "UNAUTHENTICATED"),
            )
            for name in ("LoadJob", "Compute", "EndJob")
        ),
    ]
    assert "stranger" not in names and len(names) == WORKERS + 1 and "insider" in names
    assert "UNAUTHENTICATED" in stranger_log


def test_a_tree_job_with_call_tokens_reaches_every_child(certs: CertificateSet, tmp_path: Path) -> None:
    """CodedReduce n = 2, s = 1, L = 2 over mutual TLS with tokens: six worker processes, two of them
    parents that call their children with the call tokens the master issued those children. Every
    iteration is exact and verified against the centralized gradient, and no worker refused a call."""
    with LocalCluster(6, run_dir=tmp_path, env=server_env(certs)) as cluster:

        async def scenario() -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], list[int]]:
            async with client(certs, cluster.master_address) as c:
                ids = [w.worker_id for w in await wait_up(c, 6)]
                spec = job_spec("coded_reduce", {"n": 2, "s": 1, "L": 2}, iterations=6, verify=True, worker_ids=ids)
                info, reports = await c.run(spec, check=False)
                return info, reports, ids[:2]

        info, reports, first_layer = asyncio.run(asyncio.wait_for(scenario(), 180))
        logs = [(tmp_path / "logs" / f"worker-{i}.log").read_text() for i in range(6)]
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert len(reports) == 6 and all(r.exact and 0 <= r.verify_error <= 1e-9 for r in reports)
    # the master decodes from the first layer, whose messages hold their children's decoded sum
    assert all(set(r.used_workers) <= set(first_layer) for r in reports), [list(r.used_workers) for r in reports]
    assert not [line for log in logs for line in log.splitlines() if "refused" in line]


def test_a_worker_advertising_an_unreachable_address_is_never_up(tmp_path: Path) -> None:
    with LocalCluster(1, run_dir=tmp_path) as cluster:
        argv = [
            sys.executable, "-m", "gradcode.worker", "--listen", "127.0.0.1:0", "--master", cluster.master_address,
            "--advertise", "127.0.0.1:1", "--name", "lost",
        ]  # fmt: skip
        lost = ServiceProcess(argv, log_path=tmp_path / "lost.log")
        try:
            lost.wait_ready(START_TIMEOUT)

            async def check() -> list[master_pb2.WorkerInfo]:
                async with GradcodeClient(cluster.master_address, security=Security()) as c:
                    await wait_up(c, 1)
                    deadline = time.monotonic() + START_TIMEOUT
                    while "--advertise" not in (tmp_path / "lost.log").read_text():
                        assert time.monotonic() < deadline, "the worker was never told why it is refused"
                        await asyncio.sleep(0.1)
                    return await c.list_workers()

            workers = asyncio.run(check())
        finally:
            lost.stop()
    assert [w.name for w in workers] == ["worker-0"] and workers[0].state == master_pb2.WORKER_STATE_UP
    assert "FAILED_PRECONDITION" in (tmp_path / "lost.log").read_text()


def test_the_cli_makes_certificates_lists_and_removes_workers_over_mutual_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradcode.client.__main__ import main
    from gradcode.client.healthcheck import is_serving

    out = tmp_path / "certs"
    assert main(["certs", "--host", "127.0.0.1", "--out", str(out)]) == 0
    assert "keep" in capsys.readouterr().out and (out / "node.pem").is_file()
    files = CertificateSet(*(out / n for n in ("ca.pem", "ca-key.pem", "node.pem", "node-key.pem", "client.pem",
                                              "client-key.pem")))  # fmt: skip
    with LocalCluster(2, run_dir=tmp_path / "run", env=server_env(files)) as cluster:
        master = cluster.master_address
        for name, value in (("GRADCODE_TLS_CA", files.ca), ("GRADCODE_TLS_CERT", files.client),
                            ("GRADCODE_TLS_KEY", files.client_key), ("GRADCODE_MTLS", "1")):  # fmt: skip
            monkeypatch.setenv(name, str(value))
        monkeypatch.delenv("GRADCODE_TOKEN", raising=False)
        assert main(["workers", "--master", master]) == 1  # no token: refused
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        monkeypatch.setenv("GRADCODE_TOKEN", TOKEN)
        deadline = time.monotonic() + START_TIMEOUT
        while main(["workers", "--master", master]) == 0 and capsys.readouterr().out.count(" UP ") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert main(["workers", "remove", "0", "--master", master]) == 0
        assert "removed worker 0" in capsys.readouterr().out
        assert main(["workers", "--master", master]) == 0
        listing = capsys.readouterr().out
        assert "   0 " not in listing and listing.count(" UP ") == 1
        assert f" UP    {default_machine_id()[:8] or '-':<8}  " in listing  # the machine it registered
        tls = Security(cert=files.client, key=files.client_key, ca=files.ca, mutual=True)
        assert is_serving(master, 5.0, tls) and not is_serving(master, 2.0, Security())  # the probe needs TLS too


async def thefts(certs: CertificateSet, master: str, victim: str) -> list[str]:
    """A holder of the certificates and the join secret asks the master to register it at ``victim``'s address,
    with and without the instance id Hello tells it, with no process secret and with one of its own; returns
    each outcome (the status, or the call token a reply carried)."""
    thief = Security(cert=certs.node, key=certs.node_key, ca=certs.ca, mutual=True, join_secret=JOIN)
    async with thief.channel(victim, bearer=thief.worker_call_token) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        told = (await stub.Hello(worker_pb2.HelloRequest(nonce=b"n" * 32))).instance_id
    assert told, "Hello tells anyone holding the join secret the victim's instance id"
    seen = []
    async with thief.channel(master, bearer=JOIN) as channel:
        stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        for label, instance_id in (("no instance id", ""), ("Hello's instance id", told)):
            for secret_label, secret in (("no secret", b""), ("its own secret", new_process_secret())):
                request = master_pb2.RegisterWorkerRequest(
                    address=victim, name="thief", instance_id=instance_id, process_secret=secret
                )
                try:
                    reply = await stub.RegisterWorker(request, timeout=30)
                    outcome = f"OK, call token {reply.call_token!r}"
                except grpc.aio.AioRpcError as exc:
                    outcome = exc.code().name
                seen.append(f"{label}, {secret_label}: {outcome}")
    return seen


def test_the_join_secret_registers_no_one_at_an_honest_workers_address_and_restarts_still_join(
    certs: CertificateSet, tmp_path: Path
) -> None:
    """Token theft (issue 25): mid-job, a holder of the join secret (and the certificates) registers at an honest
    worker's address in every way it can; each is refused, no reply carries a token, the worker keeps its place
    and token and the job is undisturbed. Then the worker is SIGKILLed and a new process at its freed address
    registers (with a new token) and the next job runs on it."""
    with LocalCluster(WORKERS, run_dir=tmp_path, env=server_env(certs)) as cluster:
        attempts: list[str] = []

        async def scenario() -> tuple[list[Any], list[list[master_pb2.WorkerInfo]]]:
            async with client(certs, cluster.master_address) as c:
                before = sorted(await wait_up(c, WORKERS), key=lambda w: w.worker_id)
                victim = before[0]
                spec = job_spec(
                    "cyclic", {"n": WORKERS, "s": 1}, iterations=8, worker_ids=[w.worker_id for w in before],
                    verify=True,
                )  # fmt: skip

                async def on_report(report: master_pb2.IterationReport) -> None:
                    if report.iteration == 2:  # mid-job
                        attempts.extend(await thefts(certs, cluster.master_address, victim.address))

                first = await c.run(spec, on_report, check=False)
                after_attack = sorted(await c.list_workers(), key=lambda w: w.worker_id)
                # the victim dies; a new process takes its freed port and registers
                next(p for p in cluster.workers if p.address == victim.address).kill()
                port = victim.address.rpartition(":")[2]
                argv = [sys.executable, "-m", "gradcode.worker", "--listen", f"127.0.0.1:{port}", "--master",
                        cluster.master_address, "--name", "successor"]  # fmt: skip
                env = service_env(server_env(certs))
                successor = ServiceProcess(argv, log_path=tmp_path / "successor.log", env=env)
                cluster.workers.append(successor)  # stopped with the cluster
                assert successor.wait_ready(START_TIMEOUT) == victim.address
                deadline = time.monotonic() + START_TIMEOUT
                while True:
                    last = sorted(await c.list_workers(), key=lambda w: w.worker_id)
                    if any(w.name == "successor" and w.state == master_pb2.WORKER_STATE_UP for w in last):
                        break
                    assert time.monotonic() < deadline, "the new process at the freed address never came UP"
                    await asyncio.sleep(0.1)
                second = await c.run(spec, check=False)
                return [first, second], [before, after_attack, last]

        runs, (before, after_attack, last) = asyncio.run(asyncio.wait_for(scenario(), 240))
        logs = "".join(p.log_path.read_text() for p in cluster.workers[:WORKERS])
    assert attempts == [
        "no instance id, no secret: INVALID_ARGUMENT",
        "no instance id, its own secret: ALREADY_EXISTS",
        "Hello's instance id, no secret: INVALID_ARGUMENT",
        "Hello's instance id, its own secret: ALREADY_EXISTS",
    ]
    for info, reports in runs:
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert len(reports) == 8 and all(r.exact and r.verify_error <= 1e-9 for r in reports)
        assert all(not r.failed_workers for r in reports), [list(r.failed_workers) for r in reports]
    # the victim kept its place (id, address, name, UP); the successor took the same pool entry
    places = [(w.worker_id, w.address) for w in before]
    assert [(w.worker_id, w.address, w.name, w.state) for w in after_attack] == [
        (w.worker_id, w.address, w.name, master_pb2.WORKER_STATE_UP) for w in before
    ]
    assert [(w.worker_id, w.address) for w in last] == places and last[0].name == "successor"
    assert all(w.state == master_pb2.WORKER_STATE_UP for w in last)
    assert "refused" not in logs  # no worker was ever called with a token it did not hold
