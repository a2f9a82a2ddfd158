"""TLS, mutual TLS and token authentication with real in-process grpc.aio servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gradcode.client.certs import CertificateSet, make_certificates
from gradcode.client.sdk import GradcodeClient
from gradcode.common.transport.security import Security, short
from gradcode.common.transport.session import CallError
from gradcode.master.node import MasterNode
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from gradcode.worker.node import WorkerNode

TIMEOUT = 60.0
TOKEN = "client-token-0123456789abcdef"
JOIN = "join-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertificateSet]:
    yield make_certificates(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "localhost"])


def node_security(certs: CertificateSet, **extra: Any) -> Security:
    return Security(cert=certs.node, key=certs.node_key, ca=certs.ca, mutual=True, join_secret=JOIN, **extra)


def client_security(certs: CertificateSet, token: str | None = TOKEN) -> Security:
    return Security(cert=certs.client, key=certs.client_key, ca=certs.ca, mutual=True, token=token)


async def wait_up(stub: Any, count: int) -> list[master_pb2.WorkerInfo]:
    while True:
        workers = (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
        up = [w for w in workers if w.state == master_pb2.WORKER_STATE_UP]
        if len(up) >= count:
            return list(up)
        await asyncio.sleep(0.05)


async def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    code: grpc.StatusCode = info.value.code()
    return code


# ---- configuration ---------------------------------------------------------------------------------------
def test_configuration_errors_say_what_is_missing(certs: CertificateSet) -> None:
    with pytest.raises(ValueError, match="both a TLS certificate and its key"):
        Security(cert=certs.node)
    with pytest.raises(ValueError, match="Mutual TLS needs a CA"):
        Security(cert=certs.node, key=certs.node_key, mutual=True)
    with pytest.raises(ValueError, match="at least 16 printable characters"):
        Security(token="short")
    with pytest.raises(ValueError, match="Cannot read the TLS certificate"):
        Security(cert=Path("/nonexistent.pem"), key=certs.node_key).server_credentials()
    assert Security(join_secret=JOIN).worker_call_token not in (None, JOIN)
    assert not Security(token=TOKEN).serve_reflection and Security().serve_reflection
    assert short("x" * 1000).endswith("(1000 characters)") and len(short("x" * 1000)) < 80


def test_certificates_are_not_overwritten_by_accident(certs: CertificateSet) -> None:
    with pytest.raises(ValueError, match="already exist"):
        make_certificates(certs.ca.parent, ["127.0.0.1"])
    with pytest.raises(ValueError, match="at least one --host"):
        make_certificates(certs.ca.parent / "other", [])
    assert certs.ca_key.stat().st_mode & 0o077 == 0  # private keys are owner-only


# ---- a whole cluster in process: mutual TLS, client token, join secret -------------------------------------
@contextlib.asynccontextmanager
async def secure_cluster(certs: CertificateSet, workers: int) -> AsyncIterator[tuple[MasterNode, list[WorkerNode]]]:
    async with contextlib.AsyncExitStack() as stack:
        master = await stack.enter_async_context(MasterNode(grace=0.5, security=node_security(certs, token=TOKEN)))
        nodes = [
            await stack.enter_async_context(
                WorkerNode(master_address=master.address, name=f"w{i}", grace=0.5, security=node_security(certs))
            )
            for i in range(workers)
        ]
        yield master, nodes


async def test_a_job_runs_over_mutual_tls_with_tokens_and_intruders_are_refused(certs: CertificateSet) -> None:
    async with asyncio.timeout(TIMEOUT), secure_cluster(certs, 3) as (master, workers):
        async with GradcodeClient(master.address, security=client_security(certs)) as client:
            await wait_up(client._stub, 3)
            from tests.e2e.conftest import job_spec

            info, reports = await client.run(job_spec("cyclic", {"n": 3, "s": 1}, iterations=8))
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED and all(r.exact for r in reports)
            # the Computes moved to the workers' links, which use the same mutual TLS
            assert [w.caller is not None and w.caller.serves_links for w in master.pool.workers] == [True] * 3

        # a client with the right certificate but no token, or a wrong one: UNAUTHENTICATED
        for token in (None, "wrong-token-0123456789abcdef"):
            async with GradcodeClient(master.address, security=client_security(certs, token)) as client:
                assert await code_of(client.list_workers()) == grpc.StatusCode.UNAUTHENTICATED
        # a process that is not the master: the client token means nothing to a worker (UNAUTHENTICATED), and
        # the join secret itself is a credential for registering only (PERMISSION_DENIED)
        intruder = client_security(certs)
        for bearer, expected in ((TOKEN, grpc.StatusCode.UNAUTHENTICATED), (JOIN, grpc.StatusCode.PERMISSION_DENIED)):
            async with intruder.channel(workers[0].address, bearer=bearer) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
                assert await code_of(stub.EndJob(worker_pb2.EndJobRequest(job_id="x"))) == expected
                call = stub.Compute(worker_pb2.ComputeRequest(job_id="x", iteration=2**64 - 1))
                assert await code_of(call.read()) == expected
        async with intruder.channel(workers[0].address) as channel:
            # the health service stays open (probes need no token), reflection is off with authentication
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            listing = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            assert await code_of(listing.read()) == grpc.StatusCode.UNIMPLEMENTED
        # without a client certificate the TLS handshake itself fails
        async with Security(ca=certs.ca, token=TOKEN).channel(master.address, bearer=TOKEN) as channel:
            stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
            assert await code_of(stub.ListWorkers(master_pb2.ListWorkersRequest(), timeout=5)) in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
            )  # fmt: skip
        # plaintext against a TLS server: refused
        async with grpc.aio.insecure_channel(master.address) as channel:
            stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
            assert await code_of(stub.ListWorkers(master_pb2.ListWorkersRequest(), timeout=5)) in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
            )  # fmt: skip
        # a worker without the join secret never joins
        stranger = WorkerNode(
            master_address=master.address, name="stranger", grace=0.5,
            security=Security(cert=certs.node, key=certs.node_key, ca=certs.ca, mutual=True),
        )  # fmt: skip
        async with stranger:
            while stranger.registration_failures == 0:
                await asyncio.sleep(0.05)
            assert stranger.last_registration_error.startswith("UNAUTHENTICATED")
        async with GradcodeClient(master.address, security=client_security(certs)) as client:
            names = [w.name for w in await client.list_workers()]
            assert sorted(names) == ["w0", "w1", "w2"]


async def test_token_without_tls_on_loopback_and_reflection_switch() -> None:
    """Plaintext with tokens works on loopback (development); reflection can be switched back on."""
    security = Security(token=TOKEN, join_secret=JOIN, reflection=True)
    async with asyncio.timeout(TIMEOUT), MasterNode(grace=0.5, security=security) as master:
        async with GradcodeClient(master.address, security=Security(token=TOKEN)) as client:
            assert await client.list_workers() == []
        async with GradcodeClient(master.address, security=Security(token=JOIN)) as client:
            assert await code_of(client.list_workers()) == grpc.StatusCode.PERMISSION_DENIED
        async with grpc.aio.insecure_channel(master.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = [r async for r in stub.ServerReflectionInfo(iter([request]))]
            names = [s.name for s in replies[0].list_services_response.service]
            assert "gradcode.v1.Master" in names


async def test_plaintext_beyond_loopback_is_logged_loudly_when_allowed(caplog: pytest.LogCaptureFixture) -> None:
    from gradcode.common.transport.serving import start_server

    for host, loud in (("127.0.0.1", False), ("0.0.0.0", True)):
        caplog.clear()
        allowed = Security(insecure=True)  # beyond loopback it is refused without this (test_exposure.py)
        handle = await start_server(host, 0, registrars=[], service_names=["gradcode.v1.Master"], security=allowed)
        await handle.stop(None)
        assert any("LISTENING IN PLAINTEXT" in r.getMessage() for r in caplog.records) == loud, host
        assert any("No client token" in r.getMessage() for r in caplog.records) == loud, host


def test_secrets_never_appear_in_a_repr() -> None:
    text = repr(Security(token=TOKEN, join_secret=JOIN))
    assert TOKEN not in text and JOIN not in text


def test_flags_and_variables(monkeypatch: pytest.MonkeyPatch, certs: CertificateSet) -> None:
    import argparse

    from gradcode.common.transport.security import add_security_arguments, security_from_args

    def parse(role: str, *argv: str) -> Security:
        parser = argparse.ArgumentParser()
        add_security_arguments(parser, role=role)
        return security_from_args(parser.parse_args(list(argv)))

    assert parse("client") == Security()
    monkeypatch.setenv("GRADCODE_TLS_CA", str(certs.ca))
    monkeypatch.setenv("GRADCODE_MTLS", "yes")
    monkeypatch.setenv("GRADCODE_TOKEN", TOKEN)
    with pytest.raises(ValueError, match="Mutual TLS needs"):
        parse("client")
    client = parse("client", "--tls-cert", str(certs.client), "--tls-key", str(certs.client_key))
    assert client.mutual and client.token == TOKEN and client.channel_tls
    assert not parse("client", "--no-mtls").mutual  # a flag wins over its variable
    monkeypatch.setenv("GRADCODE_MTLS", "maybe")
    with pytest.raises(ValueError, match="GRADCODE_MTLS must be one of"):
        parse("client")
    monkeypatch.delenv("GRADCODE_MTLS")
    worker = parse("worker", "--join-secret", JOIN)
    assert worker.join_secret == JOIN and worker.token is None and not worker.serve_reflection
    assert parse("worker", "--join-secret", JOIN, "--reflection").serve_reflection


async def test_a_tree_job_runs_with_parents_calling_children_over_mutual_tls(certs: CertificateSet) -> None:
    """Parent ↔ child channels use TLS and a job token derived from the child's call token; after the job, the
    tokens the parents were given open nothing that matters."""
    from tests.e2e.conftest import job_spec

    async with (
        asyncio.timeout(TIMEOUT),
        secure_cluster(certs, 6) as (master, workers),
        GradcodeClient(master.address, security=client_security(certs)) as client,
    ):
        ids = sorted(w.worker_id for w in await wait_up(client._stub, 6))
        spec = job_spec("coded_reduce", {"n": 2, "s": 1, "L": 2}, iterations=3, worker_ids=ids, verify=True)
        given: list[tuple[str, str]] = []  # (child address, bearer) as the parents hold them

        async def on_report(report: master_pb2.IterationReport) -> None:
            for node in workers:
                runtime = node.servicer.jobs.get(report.job_id)
                if runtime is not None and runtime.parent is not None and not given:
                    given.extend((address, str(bearer)) for (_, address, _), bearer in
                                 zip(runtime.parent.children, runtime.parent._bearers, strict=True))  # fmt: skip

        info, reports = await client.run(spec, on_report, check=False)
        # What a parent kept of its children's tokens opens nothing once the job is over: no LoadJob, no EndJob,
        # no Compute of another job.
        assert given and all(bearer for _, bearer in given)
        for address, bearer in given:
            async with node_security(certs).channel(address, bearer=bearer) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
                setup = worker_pb2.JobSetup(job_id="planted", worker_id=0)
                load = stub.LoadJob(iter([worker_pb2.LoadJobChunk(setup=setup)]))
                end = stub.EndJob(worker_pb2.EndJobRequest(job_id=info.job_id))
                other = stub.Compute(worker_pb2.ComputeRequest(job_id="planted", iteration=1)).read()
                assert [await _status(c) for c in (load, end, other)] == [grpc.StatusCode.PERMISSION_DENIED] * 3
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(r.exact and not r.failed_workers and r.verify_error < 1e-9 for r in reports)


# ---- per-worker call tokens ------------------------------------------------------------------------------
async def _status(call: Any) -> grpc.StatusCode:
    """The status of ``call``: OK, or the code it failed with."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


async def _session_status(stub: Any) -> grpc.StatusCode:
    """What one request on a Session ends with: the call's refusal, or the request's in-band status.

    A refusal ends the call at its start, before any request: it is awaited first (up to a second), so that no
    request is in flight when it lands (grpcio's client reports a status that lands during a write as INTERNAL,
    grpc/grpc#36066)."""
    call = stub.Session()
    try:
        try:
            code: grpc.StatusCode = await asyncio.wait_for(asyncio.shield(call.code()), 1.0)
            return code
        except TimeoutError:
            pass  # not refused: the worker waits for a request
        await call.write(worker_pb2.ComputeRequest(job_id="x", request_id=1))
        reply = await call.read()
        return CallError.from_status(reply.status).code
    except grpc.aio.AioRpcError as exc:
        refused: grpc.StatusCode = exc.code()
        return refused
    finally:
        call.cancel()


async def _worker_statuses(address: str, bearer: str | None) -> dict[str, grpc.StatusCode]:
    """What a worker answers to each of its methods called with ``bearer`` (plaintext, loopback)."""
    async with Security().channel(address, bearer=bearer) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        load = stub.LoadJob(iter([worker_pb2.LoadJobChunk(setup=worker_pb2.JobSetup(job_id="x"))]))
        return {
            "LoadJob": await _status(load),
            "Compute": await _status(stub.Compute(worker_pb2.ComputeRequest(job_id="x")).read()),
            "Session": await _session_status(stub),
            "EndJob": await _status(stub.EndJob(worker_pb2.EndJobRequest(job_id="x"))),
            "Hello": await _status(stub.Hello(worker_pb2.HelloRequest())),
            "OpenLink": await _status(stub.OpenLink(worker_pb2.OpenLinkRequest())),
        }


async def test_each_registered_worker_answers_only_the_call_token_its_master_issued_it() -> None:
    """A join-secret holder (any worker) cannot drive another worker; a restarted master issues new tokens."""
    security = Security(join_secret=JOIN)
    async with asyncio.timeout(TIMEOUT), MasterNode(grace=0.2, security=security) as master:
        port = int(master.address.rpartition(":")[2])
        nodes = [WorkerNode(master_address=master.address, grace=0.2, security=security, reregister_seconds=0.2)
                 for _ in range(2)]  # fmt: skip
        async with nodes[0] as a, nodes[1] as b:
            await asyncio.gather(a.registered.wait(), b.registered.wait())
            assert a.call_token is not None and b.call_token is not None
            token_a, token_b = a.call_token.value, b.call_token.value
            assert token_a and token_b and len({token_a, token_b, security.worker_call_token}) == 3
            assert {w.address: w.call_token for w in master.pool.workers} == {a.address: token_a, b.address: token_b}
            unknown, known = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
            calls = ("LoadJob", "Compute", "Session", "EndJob", "OpenLink")
            derived = await _worker_statuses(a.address, security.worker_call_token)
            assert derived == {**dict.fromkeys(calls, known), "Hello": grpc.StatusCode.OK}
            for bearer in (None, token_b, JOIN):  # nothing, another worker's token, the join secret itself
                statuses = await _worker_statuses(a.address, bearer)
                assert [statuses[c] for c in calls] == [unknown if bearer != JOIN else known] * len(calls), bearer
            own = await _worker_statuses(a.address, token_a)  # passes the check: the worker itself answers
            assert own == {"LoadJob": grpc.StatusCode.INVALID_ARGUMENT, "Compute": grpc.StatusCode.NOT_FOUND,
                           "Session": grpc.StatusCode.NOT_FOUND, "EndJob": grpc.StatusCode.NOT_FOUND,
                           "Hello": known, "OpenLink": grpc.StatusCode.OK}  # fmt: skip
            await asyncio.sleep(0.6)  # periodic re-registrations keep the token
            assert a.call_token.value == token_a and token_a in [w.call_token for w in master.pool.workers]

            await master.shutdown()  # the master restarts at its address: the workers register again
            async with MasterNode(port=port, grace=0.2, security=security) as again:
                while len(again.pool.up()) < 2 or a.call_token.value == token_a:
                    await asyncio.sleep(0.05)
                fresh = a.call_token.value
                assert fresh != token_a and {w.address: w.call_token for w in again.pool.workers}[a.address] == fresh
                assert (await _worker_statuses(a.address, token_a))["EndJob"] == unknown  # the old token is dead
                assert (await _worker_statuses(a.address, fresh))["EndJob"] == grpc.StatusCode.NOT_FOUND


async def test_a_job_token_opens_one_jobs_computes_and_nothing_else() -> None:
    """What a tree parent is given for a child (a job token): Compute, Session and OpenLink for that job's requests
    only — never LoadJob or EndJob, never another job's request (on a Session or on a link), and nothing once the
    child holds another call token."""
    from gradcode.common.transport.link import open_link
    from gradcode.common.transport.security import job_token
    from gradcode.common.transport.session import Session

    security = Security(join_secret=JOIN)
    async with asyncio.timeout(TIMEOUT), MasterNode(grace=0.2, security=security) as master:
        nodes = [WorkerNode(master_address=master.address, grace=0.2, security=security) for _ in range(2)]
        async with nodes[0] as a, nodes[1] as b:
            await asyncio.gather(a.registered.wait(), b.registered.wait())
            assert a.call_token is not None and b.call_token is not None
            token_a, token_b = a.call_token.value, b.call_token.value
            assert token_a and token_b
            ok, unknown, known = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
            missing = grpc.StatusCode.NOT_FOUND  # the call was let through: job "x" is simply not loaded
            assert await _worker_statuses(a.address, job_token(token_a, "x")) == {
                "LoadJob": known, "Compute": missing, "Session": missing, "EndJob": known, "Hello": known,
                "OpenLink": ok,
            }  # fmt: skip
            assert await _worker_statuses(a.address, job_token(token_a, "another job")) == {
                "LoadJob": known, "Compute": known, "Session": known, "EndJob": known, "Hello": known,
                "OpenLink": ok,
            }  # fmt: skip
            for forged in (job_token(token_b, "x"), job_token("guessed-0123456789abcdef", "x"), "job:eA==.00"):
                statuses = await _worker_statuses(a.address, forged)
                assert set(statuses.values()) == {unknown}, (forged, statuses)
            # a link opened with another job's token computes nothing of job "x"
            async with Security().channel(a.address, bearer=job_token(token_a, "another job")) as channel:
                linked = Session(await open_link(channel, a.address, Security(), 5.0))
                try:
                    with pytest.raises(CallError) as refused:
                        async for _chunk in linked.compute(worker_pb2.ComputeRequest(job_id="x", iteration=1)):
                            pass
                    assert refused.value.code == known and "token is for job 'another job'" in str(refused.value)
                finally:
                    linked.close()
            a.call_token.revoke()  # the child no longer holds that call token: every job token from it is dead
            assert (await _worker_statuses(a.address, job_token(token_a, "x")))["Compute"] == unknown


async def test_a_call_with_a_token_being_issued_waits_for_the_registration_reply() -> None:
    """The master may use a token it minted before its RegisterWorker reply arrived: such a call waits."""
    from collections import namedtuple

    from gradcode.common.transport.security import AUTH_METADATA_KEY, CallToken

    details = namedtuple("details", "method invocation_metadata")
    token = CallToken()
    interceptor = Security(join_secret=JOIN).interceptor(token)
    assert interceptor is not None
    admitted = grpc.unary_unary_rpc_method_handler(lambda request, context: None)

    async def continuation(_details: Any) -> Any:
        return admitted

    def call(bearer: str) -> Any:
        metadata = ((AUTH_METADATA_KEY, f"Bearer {bearer}"),)
        return interceptor.intercept_service(continuation, details("/gradcode.v1.Worker/EndJob", metadata))

    async with asyncio.timeout(TIMEOUT):
        assert await call("minted-but-unknown") is not admitted  # no registration in flight: refused at once
        token.registering()
        waiting = asyncio.create_task(call("minted-0123456789abcdef"))
        stranger = asyncio.create_task(call("wrong-0123456789abcdef"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and not stranger.done()
        token.registered("minted-0123456789abcdef")
        assert await waiting is admitted and await stranger is not admitted
        token.registering()
        token.registered(None)  # a failed registration keeps the token
        assert await call("minted-0123456789abcdef") is admitted


# ---- safe by default: plaintext without secrets listens on loopback only ---------------------------------------
def test_listening_beyond_loopback_needs_tls_and_a_join_secret_or_an_explicit_insecure() -> None:
    from gradcode.common.transport.security import ExposedError, refuse_if_exposed

    tls = {"cert": Path("node.pem"), "key": Path("node-key.pem")}  # only whether they are set matters here
    allowed = [
        ("127.0.0.1", Security()), ("localhost", Security()), ("::1", Security()), ("127.0.0.2", Security()),
        ("0.0.0.0", Security(**tls, join_secret=JOIN)), ("10.1.2.3", Security(**tls, join_secret=JOIN, token=TOKEN)),
        ("0.0.0.0", Security(insecure=True)), ("::", Security(join_secret=JOIN, insecure=True)),
    ]  # fmt: skip
    for host, security in allowed:
        refuse_if_exposed(host, security)
    refused = [
        ("0.0.0.0", Security(), "without TLS and a join secret"),
        ("", Security(), "on all interfaces without TLS and a join secret"),
        ("::", Security(token=TOKEN), "without TLS and a join secret"),
        ("worker-1.internal", Security(join_secret=JOIN, token=TOKEN), "without TLS:"),
        ("10.1.2.3", Security(**tls), "without a join secret"),
        ("10.1.2.3", Security(**tls, token=TOKEN, mutual=True, ca=Path("ca.pem")), "without a join secret"),
    ]
    for host, security, what in refused:
        with pytest.raises(ExposedError, match=what) as info:
            refuse_if_exposed(host, security)
        assert "`gradcode certs" in str(info.value) and "--insecure (GRADCODE_INSECURE=1)" in str(info.value)


async def test_a_server_never_binds_an_exposed_address_without_security() -> None:
    from gradcode.common.transport.security import ExposedError
    from gradcode.common.transport.serving import start_server

    with pytest.raises(ExposedError, match=r"Refusing to listen on 0\.0\.0\.0"):
        await start_server("0.0.0.0", 0, registrars=[], service_names=["gradcode.v1.Worker"])
    node = WorkerNode("0.0.0.0", 0, grace=0.1)
    with pytest.raises(ExposedError, match="without TLS and a join secret"):
        await node.start()
    await node.shutdown()


@pytest.mark.parametrize("role", ["master", "worker"])
def test_the_cli_refuses_exposed_plaintext_unless_told_insecure(
    role: str, certs: CertificateSet, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradcode.master import __main__ as master_main
    from gradcode.worker import __main__ as worker_main

    parse = (master_main if role == "master" else worker_main).parse_arguments
    for name in [n for n in __import__("os").environ if n.startswith("GRADCODE_")]:
        monkeypatch.delenv(name)
    for argv in (["--listen", "0.0.0.0:50099"], ["--listen", "[::]:50099", "--join-secret", JOIN]):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "Refusing to listen" in err and "`gradcode certs" in err and "--insecure" in err
    assert parse(["--listen", "0.0.0.0:50099", "--insecure"]).security.insecure
    monkeypatch.setenv("GRADCODE_INSECURE", "1")
    assert parse(["--listen", "0.0.0.0:50099"]).security.insecure
    with pytest.raises(SystemExit):  # the flag wins over the variable
        parse(["--listen", "0.0.0.0:50099", "--no-insecure"])
    monkeypatch.setenv("GRADCODE_INSECURE", "maybe")
    with pytest.raises(SystemExit):
        parse(["--listen", "127.0.0.1:50099"])
    assert "GRADCODE_INSECURE must be one of" in capsys.readouterr().err
    monkeypatch.delenv("GRADCODE_INSECURE")
    assert not parse(["--listen", "127.0.0.1:50099"]).security.insecure  # loopback needs nothing
    tls = ["--tls-cert", str(certs.node), "--tls-key", str(certs.node_key), "--tls-ca", str(certs.ca)]
    secured = parse(["--listen", "0.0.0.0:50099", *tls, "--join-secret", JOIN])
    assert secured.security.server_tls and not secured.security.insecure
    with pytest.raises(SystemExit):
        parse(["--listen", "0.0.0.0:50099", *tls])
    assert "without a join secret" in capsys.readouterr().err


def test_the_refusal_is_a_usage_error_before_any_port_opens(tmp_path: Path) -> None:
    """The real command: exit status 2 and the advice on stderr, nothing served."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADCODE_")}
    commands = {"gradcode.master": ["--run-dir", str(tmp_path)], "gradcode.worker": []}
    for module, extra in commands.items():
        argv = [sys.executable, "-m", module, "--listen", "0.0.0.0:0", *extra]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "Refusing to listen on 0.0.0.0" in done.stderr and "gradcode certs" in done.stderr
        assert "listening on" not in done.stdout


async def test_a_burst_of_refused_uploads_each_sees_its_refusal_and_an_endless_one_is_cut_off() -> None:
    """A LoadJob (client streaming) refused for its credential is read, boundedly, before the refusal is sent: a
    refusal that lands on the client's write reaches grpcio's aio client as INTERNAL (grpc/grpc#36066). Sixty at
    once, each writing five 200 kB chunks and half-closing, all see UNAUTHENTICATED (without the drain, some read
    INTERNAL in about half the runs here); one that streams without end is cut off within the bound (its status,
    landing on a write, may read INTERNAL) and the worker goes on answering."""
    from gradcode.common.transport.status import UNTRUSTED_DRAIN_SECONDS

    security = Security(join_secret=JOIN)
    async with (
        asyncio.timeout(TIMEOUT),
        MasterNode(grace=0.2, security=security) as master,
        WorkerNode(master_address=master.address, grace=0.2, security=security) as worker,
    ):
        await worker.registered.wait()
        async with Security().channel(worker.address, bearer=None) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
            chunk = worker_pb2.LoadJobChunk(setup=worker_pb2.JobSetup(job_id="x"))
            upload = [worker_pb2.LoadJobChunk(setup=worker_pb2.JobSetup(job_id="x" * 200_000))] * 5  # still writing
            burst = await asyncio.gather(*(_status(stub.LoadJob(iter(upload))) for _ in range(60)))
            assert set(burst) == {grpc.StatusCode.UNAUTHENTICATED}, burst

            async def endless() -> AsyncIterator[worker_pb2.LoadJobChunk]:
                while True:
                    yield chunk
                    await asyncio.sleep(0.01)

            started = asyncio.get_running_loop().time()
            code = await _status(stub.LoadJob(endless()))
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INTERNAL), code
            assert asyncio.get_running_loop().time() - started < UNTRUSTED_DRAIN_SECONDS + 5
            assert await _status(stub.LoadJob(iter([chunk]))) == grpc.StatusCode.UNAUTHENTICATED
