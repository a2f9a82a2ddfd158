"""A worker process's lifecycle: serve the Worker service, register with the master, shut down cleanly.

Usage::

    async with WorkerNode("127.0.0.1", 0, master_address="127.0.0.1:50050") as node:
        print(node.address)
        await node.run()  # until node.shutdown() (or a signal handler in __main__) stops it

The lifecycle is :class:`gradcode.common.transport.serving.ServiceNode`'s: ``run()`` returns only after shutdown
completes; ``shutdown()`` is idempotent and safe before start; health goes NOT_SERVING first, then
in-flight calls get ``grace`` seconds.

With ``master_address`` the node registers with the master (``Master.RegisterWorker`` with its
advertised address), retrying with exponential backoff until the master answers, and then again
every ``reregister_seconds`` so a restarted master relearns it. The master must therefore treat a
re-registration of the same address as the same worker.

Each registration also carries this process's secret (made at start, held by the servicer, whose
``Worker.Hello`` proves it holds it): the master admits the registration only where the process
answering at the advertised address proves that secret, and answers a token only to its holder.

With a join secret, the registration reply carries the call token the master issued this process;
from then on LoadJob/Compute/EndJob answer only that token (:class:`~gradcode.common.transport.security.CallToken`),
and a later reply's token (a restarted master's) replaces it. Before the first registration they
answer nobody, nor after the master refused a registration because another process answers at this
worker's address (ALREADY_EXISTS) or this process was removed (PERMISSION_DENIED): its token is revoked.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from pathlib import Path

import grpc

from gradcode.common.ops.metrics import WORKER_EVENT_LOOP_LAG
from gradcode.common.training.datafile import MAX_DATA_FILE_BYTES
from gradcode.common.transport.link import LinkServer
from gradcode.common.transport.machine import default_machine_id
from gradcode.common.transport.security import CallToken, Security
from gradcode.common.transport.serving import ServiceNode, format_address, is_loopback, parse_address, source_address
from gradcode.common.transport.wire import CHANNEL_OPTIONS
from gradcode.v1 import master_pb2, master_pb2_grpc, worker_pb2
from gradcode.worker.compute import MAX_JOB_BYTES
from gradcode.worker.service import MAX_JOBS, MAX_TOTAL_BYTES, WorkerServicer, add_worker_service

__all__ = ["ADVERTISE_HOSTNAME", "WORKER_SERVICE_NAME", "WorkerNode", "advertised_address", "default_machine_id"]

logger = logging.getLogger(__name__)

WORKER_SERVICE_NAME: str = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
"""``gradcode.v1.Worker``: the name health checks and reflection use."""

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
ADVERTISE_HOSTNAME = "auto"
"""``advertise_address`` that advertises this machine's hostname (in a container, the name other containers reach
it by, and the one its TLS certificate may be issued for) when listening on every interface."""


def advertised_address(host: str, port: int, master_address: str | None, advertise: str | None = None) -> str:
    """What a worker listening on ``host``:``port`` tells the master at ``master_address`` to reach it at.

    ``advertise`` given: that address; ``"auto"``: this machine's hostname when listening on every interface, else
    the listen host. By default, the listen host when it is a single address (loopback only then), else the address
    of the interface by which this network namespace routes to the master (what the master reaches it at whenever
    routes go both ways, as on a LAN, a bridge or a veth pair), or, when that is loopback (the master shares this
    namespace), of the default route's; loopback when there is neither.

    Not the hostname: emulated hosts (network namespaces) share one, and hosts without DNS have none the master can
    resolve. Not the peer address the master sees: the worker would have to learn it over the wire, and behind NAT
    it names the gateway, not a port the worker serves."""
    if advertise and advertise.lower() != ADVERTISE_HOSTNAME:
        return advertise
    if host not in _WILDCARD_HOSTS:
        return format_address(host, port)
    if advertise:  # "auto"
        return format_address(socket.gethostname(), port)
    to_master = source_address(parse_address(master_address)[0]) if master_address else None
    if to_master is None or is_loopback(to_master):
        to_master = source_address(None) or to_master  # the default route's interface, if there is one
    return format_address(to_master or "127.0.0.1", port)


NAME_FROM_DNS = "auto"
"""``--name auto``: the name this host's address resolves back to (:func:`worker_name`)."""


def dns_name(host: str) -> str | None:
    """The first label of the name ``host``'s address resolves back to (None when it resolves to none).

    In a docker-compose replica the hostname is the container id, while the network's DNS names the container
    ``<project>-worker-<n>``: that is the name an operator knows it by."""
    try:
        name = socket.gethostbyaddr(socket.gethostbyname(host))[0]
    except OSError:  # no address, or no name for it
        return None
    return name.split(".", 1)[0] or None


def worker_name(name: str | None) -> str:
    """The label a worker registers with: ``name``; for :data:`NAME_FROM_DNS`, its hostname's address resolved back
    to a name (:func:`dns_name`); by default, and when that finds none, the hostname."""
    if name and name != NAME_FROM_DNS:
        return name
    hostname = socket.gethostname()
    return (dns_name(hostname) if name == NAME_FROM_DNS else None) or hostname


_REVOKING = (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED)
"""Refusals of a registration after which this process's call token is dropped: another process answers at
its address, or it was removed from the pool."""

REGISTER_TIMEOUT_SECONDS = 5.0
"""Timeout of one RegisterWorker call (it includes the master's reachability check of this worker)."""


class WorkerNode(ServiceNode):
    """One worker: a grpc.aio server with the Worker, health and reflection services.

    Args:
        host: interface to listen on (``0.0.0.0`` for all).
        port: port to listen on; 0 picks a free one (see :attr:`address` after start).
        master_address: ``host:port`` of the master to register with; None to skip registration.
        advertise_address: ``host:port`` the master should use to reach this worker; ``"auto"``: the listen
            address with this machine's hostname when listening on all interfaces; by default (None) the listen
            address with, when listening on all interfaces, the address this namespace reaches the master from
            (:func:`advertised_address`).
        name: free-form label sent to the master (default: the hostname; ``"auto"``: :func:`worker_name`).
        machine_id: which machine this worker runs on, sent to the master (default: :func:`default_machine_id`):
            workers with one id share cores, so the master does not have their backups compute speculatively.
        grace: seconds in-flight calls get to finish on shutdown.
        reregister_seconds: interval between re-registrations once registered.
        max_job_bytes: cap on the data one job may hold on this worker.
        chunk_bytes: payload bytes per gradient chunk this worker sends (None: sized to each message,
            :func:`~gradcode.common.transport.wire.chunk_bytes_for`).
        max_total_bytes: cap on the data all jobs together may hold on this worker.
        max_jobs: cap on the jobs held at once.
        data_dir: the only directory worker-local jobs read data files from (None: they may only generate).
        max_data_file_bytes: largest data file such a job may read.
        security: TLS and the join secret (:class:`gradcode.common.transport.security.Security`); default plaintext,
        open.
        link_port: port of this worker's link (:mod:`gradcode.common.transport.link`: Sessions over plain TCP, with the
            gRPC server's TLS) on ``host``; 0 picks a free one; None serves no link.

    Its background task is the registration (:attr:`tasks`; a crash shuts the worker down and :meth:`run` raises
    it, as a worker that no master relearns must not go on looking alive). The link's connections and the
    Sessions' requests are their server's and Session's (:mod:`gradcode.common.transport`); a tree parent's
    rounds are its job's (:class:`~gradcode.worker.parent.ParentRunner`).
    """

    service_name = WORKER_SERVICE_NAME
    event_loop_lag = WORKER_EVENT_LOOP_LAG

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        master_address: str | None = None,
        advertise_address: str | None = None,
        name: str | None = None,
        machine_id: str | None = None,
        grace: float = 5.0,
        reregister_seconds: float = 5.0,
        max_job_bytes: int = MAX_JOB_BYTES,
        chunk_bytes: int | None = None,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        max_jobs: int = MAX_JOBS,
        security: Security | None = None,
        data_dir: str | Path | None = None,
        max_data_file_bytes: int = MAX_DATA_FILE_BYTES,
        link_port: int | None = 0,
    ) -> None:
        if reregister_seconds <= 0:
            raise ValueError(f"Argument 'reregister_seconds' must be > 0, not {reregister_seconds!r}.")
        super().__init__(host, port, grace=grace, security=security)
        self.master_address = master_address
        self.advertise_address = advertise_address
        self.name = worker_name(name)
        self.machine_id = default_machine_id() if machine_id is None else machine_id
        self.reregister_seconds = reregister_seconds
        self.instance_id = secrets.token_hex(16)
        """Random id of this process: the master admits it only where Worker.Hello answers with it."""
        if master_address and self.security.join_secret is not None:
            self.call_token = CallToken()
        self.servicer = WorkerServicer(
            max_job_bytes=max_job_bytes, max_total_bytes=max_total_bytes, max_jobs=max_jobs,
            security=self.security, instance_id=self.instance_id, chunk_bytes=chunk_bytes,
            data_dir=None if data_dir is None else Path(data_dir), max_data_file_bytes=max_data_file_bytes,
        )  # fmt: skip
        self.worker_id: int | None = None
        """The id the master gave this worker (None until registered)."""
        self.registered = asyncio.Event()
        self.registration_failures = 0
        """Failed RegisterWorker attempts so far (for logs and tests)."""
        self.last_registration_error = ""
        """Status and message of the last refused registration (e.g. the master cannot reach this worker)."""
        self._registration: asyncio.Task[None] | None = None
        self.link_port = link_port

    @property
    def advertised(self) -> str:
        """The address sent to the master (:func:`advertised_address`)."""
        if self.advertise_address and self.advertise_address.lower() != ADVERTISE_HOSTNAME:
            return self.advertise_address
        if self._handle is None:
            raise RuntimeError("WorkerNode.advertised is known only after start().")
        return advertised_address(self.host, self._handle.port, self.master_address, self.advertise_address)

    # ---- lifecycle hooks -----------------------------------------------------------------------
    def _register(self, server: grpc.aio.Server) -> None:
        add_worker_service(self.servicer, server)

    async def _on_started(self) -> None:
        logger.info("worker %s serving on %s (%s)", self.name, self.address, self.security.describe())
        if self.link_port is not None:
            link = LinkServer(self.servicer.serve_session, self.security)
            port = await link.start(self.host, self.link_port)
            self.servicer.link = link
            logger.info("worker %s: link on port %d", self.name, port)
        if self.master_address:
            self._registration = self.tasks.spawn(self._register_forever(self.master_address), name="register")

    async def _before_stop(self) -> None:
        self.servicer.drain()
        if self._registration is not None:
            self._registration.cancel()
            await asyncio.wait({self._registration})  # (a crash is :attr:`tasks`' to report: it shut us down)

    async def _after_stop(self) -> None:
        if self.servicer.link is not None:
            await self.servicer.link.close()
        await self.servicer.close()
        logger.info("worker %s stopped", self.name)

    # ---- registration --------------------------------------------------------------------------
    async def _register_forever(self, master_address: str) -> None:
        backoff, failures = 0.1, 0
        channel = self.security.channel(master_address, bearer=self.security.join_secret, options=CHANNEL_OPTIONS)
        async with channel:
            stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
            advertised = await asyncio.to_thread(lambda: self.advertised)  # may resolve the master's name
            request = master_pb2.RegisterWorkerRequest(
                address=advertised, name=self.name, instance_id=self.instance_id, machine_id=self.machine_id,
                process_secret=self.servicer.process_secret,
            )  # fmt: skip
            while True:
                if self.call_token is not None:
                    self.call_token.registering()
                reply: master_pb2.RegisterWorkerReply | None = None
                try:
                    reply = await stub.RegisterWorker(request, timeout=REGISTER_TIMEOUT_SECONDS)
                except grpc.aio.AioRpcError as exc:
                    failures += 1
                    self.registration_failures += 1
                    self.last_registration_error = f"{exc.code().name}: {exc.details()}"
                    if exc.code() in _REVOKING and self.call_token is not None:
                        self.call_token.revoke()  # the master no longer knows this process as the worker here
                    level = logging.WARNING if failures in (1, 10) or failures % 100 == 0 else logging.DEBUG
                    logger.log(
                        level, "registering with master %s failed (%d): %s: %s; retrying in %.1f s",
                        master_address, failures, exc.code().name, exc.details(), backoff,
                    )  # fmt: skip
                finally:
                    if self.call_token is not None:
                        self.call_token.registered(reply.call_token if reply is not None else None)
                if reply is None:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.reregister_seconds)
                    continue
                if self.call_token is not None and not reply.call_token:
                    logger.warning(
                        "master %s issued no call token, so nobody may load jobs on this worker; give the master "
                        "the join secret (GRADCODE_JOIN_SECRET) too", master_address,
                    )  # fmt: skip
                if reply.worker_id != self.worker_id:
                    logger.info(
                        "registered with master %s as worker %d (%s)", master_address, reply.worker_id, request.address
                    )
                self.worker_id = int(reply.worker_id)
                self.registered.set()
                backoff, failures = 0.1, 0
                await asyncio.sleep(self.reregister_seconds)
