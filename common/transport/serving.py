"""Small helpers every gradcode gRPC server shares (worker and master).

* :func:`start_server` — the canonical grpc.aio sequence: create the server with
  :data:`~gradcode.common.transport.wire.CHANNEL_OPTIONS`, register the servicers, the health service
  (grpcio-health-checking) and server reflection (grpcio-reflection), bind ``host:port`` (port 0
  picks a free port) and start; TLS, the token interceptor and whether reflection is served come from
  :class:`~gradcode.common.transport.security.Security`. Returns a :class:`ServingHandle`.
* :meth:`ServingHandle.stop` — graceful stop: health goes NOT_SERVING *before* the grace period, so
  parents and the master stop routing to a node that is leaving; then in-flight calls get ``grace``
  seconds to finish.
* :class:`ServiceNode` — the run()/shutdown()/async-with lifecycle MasterNode and WorkerNode share.
* :func:`install_shutdown_signals` — two-stage SIGINT/SIGTERM handling for ``__main__`` entry points
  only (never library code or tests): the first signal starts a graceful shutdown, a second one exits
  at once.
* :func:`reuse_large_buffers` — glibc malloc keeps freed gradient buffers for reuse; :func:`return_freed_memory`
  hands them back once a job has ended;
* :func:`limit_blas_threads` — one numpy/BLAS thread per process by default, so n workers on one
  machine do not oversubscribe its cores.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc
from grpc_health.v1 import _async as health_aio  # what health.aio re-exports; the stubs only know this name
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Histogram

from gradcode.common.ops.loop_watch import watch_event_loop
from gradcode.common.tasks import Crash, TaskOwner
from gradcode.common.transport.security import CallToken, Security, refuse_if_exposed, warn_if_exposed
from gradcode.common.transport.wire import CHANNEL_OPTIONS

__all__ = [
    "BLAS_THREAD_VARIABLES",
    "ServiceNode",
    "ServingHandle",
    "format_address",
    "install_shutdown_signals",
    "is_loopback",
    "limit_blas_threads",
    "parse_address",
    "return_freed_memory",
    "reuse_large_buffers",
    "source_address",
    "start_server",
]

logger = logging.getLogger(__name__)

BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
"""Environment variables the common BLAS builds read for their thread count."""

Registrar = Callable[[grpc.aio.Server], None]
"""Adds one servicer to a server, e.g. ``lambda s: worker_pb2_grpc.add_WorkerServicer_to_server(x, s)``."""


def parse_address(text: str, *, what: str = "address") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:50051`` for IPv6) into host and port; ValueError naming the format."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{what} must look like HOST:PORT (e.g. 127.0.0.1:50051 or [::1]:0), not {text!r}.")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 hosts."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_OUTSIDE = ("192.0.2.1", "2001:db8::1")
"""Documentation addresses (RFC 5737, RFC 3849), never local: the route to them is the default route."""


def source_address(host: str | None) -> str | None:
    """The local address this host's kernel sends from to reach ``host`` (a name or address; None: anywhere
    outside, through the default route): the address of the interface its route leaves by, in this network
    namespace. Nothing is sent (a UDP socket is only connected). None when there is no route."""
    targets = _OUTSIDE if host is None else (host,)
    for target in targets:
        try:
            infos = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)
        except OSError:
            continue
        for family, kind, proto, _, sockaddr in infos:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.connect(sockaddr)
                    return str(probe.getsockname()[0])
            except OSError:
                continue
    return None


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class ServingHandle:
    """A started server with its health servicer and the port it actually bound."""

    server: grpc.aio.Server
    health: health_aio.HealthServicer
    host: str
    port: int
    service_names: tuple[str, ...]
    _stopped: bool = False

    @property
    def address(self) -> str:
        """``host:port`` with the bound port (never 0)."""
        return format_address(self.host, self.port)

    async def set_serving(self, serving: bool) -> None:
        """Set the overall and every per-service health status."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        """NOT_SERVING first, then refuse new calls and give in-flight ones ``grace`` seconds. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        await self.set_serving(False)
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(
    host: str,
    port: int,
    *,
    registrars: Sequence[Registrar],
    service_names: Sequence[str],
    interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (),
    options: Sequence[tuple[str, Any]] = (),
    security: Security | None = None,
    call_token: CallToken | None = None,
) -> ServingHandle:
    """Create, register, bind and start a grpc.aio server; health SERVING once it accepts calls.

    ``service_names`` are the full names of the registered services (``gradcode.v1.Worker``); they
    get a health status and are listed by reflection. ``security`` (default: plaintext, open) gives the
    TLS credentials, the authentication interceptor (health stays open) and whether reflection is served;
    ``call_token`` is the token a registering worker's master issues it (:meth:`Security.interceptor`).
    Raises ``OSError`` when ``host:port`` cannot be bound (in use, or not an address of this machine), and
    :class:`~gradcode.common.transport.security.ExposedError` when ``host`` is not loopback and ``security`` has no TLS
    or no join secret, unless it says ``insecure``.
    """
    security = security or Security()
    refuse_if_exposed(host, security)
    auth = security.interceptor(call_token)
    interceptors = [auth, *interceptors] if auth is not None else list(interceptors)  # refused calls go no further
    # NOTE: SO_REUSEPORT off, so a second process on a taken port fails instead of silently sharing it.
    server_options = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0), *options]
    server = grpc.aio.server(interceptors=list(interceptors), options=server_options)
    for register in registrars:
        register(server)
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(service_names)
    if security.serve_reflection:
        reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    target = format_address(host, port)
    credentials = security.server_credentials()
    try:
        bound = server.add_insecure_port(target) if credentials is None else server.add_secure_port(target, credentials)
    except RuntimeError as exc:
        await server.stop(None)
        raise OSError(f"Cannot listen on {target}: {exc} (is the port in use, or the host not local?)") from None
    if bound == 0:
        await server.stop(None)
        raise OSError(f"Cannot listen on {target} (is the port in use, or the host not local?).")
    warn_if_exposed(host, security, names)
    await server.start()
    handle = ServingHandle(server=server, health=health_servicer, host=host, port=bound, service_names=names)
    await handle.set_serving(True)
    return handle


def install_shutdown_signals(
    shutdown: Callable[[], Awaitable[None]], *, name: str = "server", loop: asyncio.AbstractEventLoop | None = None
) -> None:
    """First SIGINT/SIGTERM: run ``shutdown()`` (graceful). Second: exit at once with status 1.

    For ``__main__`` entry points only; library code and tests never install signal handlers.
    """
    loop = loop or asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []

    def on_signal(signum: int) -> None:
        if tasks:
            print(f"{name}: second {signal.Signals(signum).name}, exiting now", file=sys.stderr, flush=True)
            os._exit(1)
        logger.info(
            "%s: %s received, shutting down gracefully (send again to exit now)", name, signal.Signals(signum).name
        )
        tasks.append(loop.create_task(_run(shutdown)))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)


async def _run(shutdown: Callable[[], Awaitable[None]]) -> None:
    await shutdown()


def reuse_large_buffers() -> bool:
    """Ask glibc's malloc to keep freed gradient-sized buffers (up to 32 MiB) for reuse.

    By default glibc returns every buffer above 128 KiB to the kernel on free, so each iteration
    page-faults its multi-megabyte messages afresh; keeping them made gradient streaming 1.4-1.6x
    faster (``python -m gradcode.bench.transport``, p = 1e5 to 4e6). Returns False where malloc is not glibc's.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def return_freed_memory() -> bool:
    """Hand the memory this process has freed back to the kernel (glibc's ``malloc_trim``), once a job's data and
    buffers are garbage: collect the cycles that may hold them, then trim every arena.

    :func:`reuse_large_buffers` keeps up to 1 GiB of freed buffers per arena for the next iteration's, which is
    right within a job and wrong after it: a worker kept every ended job's data and buffers mapped. On the emulated
    cluster (24 workers on one 24 GiB host, p = 1e6, each holding half of 384 MB of data) workers grew by about
    the data's size with each job, to 1.4-1.6 GB, and the kernel's OOM killer ended two of them mid-job (the
    master saw their links close). Returns False where malloc is not glibc's."""
    gc.collect()
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim(0)
    return True


def limit_blas_threads(threads: int = 1) -> None:
    """Limit numpy's BLAS/OpenMP pools to ``threads`` (and set the variables for child processes)."""
    if threads < 1:
        raise ValueError(f"Argument 'threads' must be a positive integer, not {threads!r}.")
    for var in BLAS_THREAD_VARIABLES:
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return
    threadpool_limits(limits=threads)


class ServiceNode:
    """A gradcode gRPC server with the lifecycle every node shares.

    :meth:`start` binds and serves (health SERVING); :meth:`run` starts if needed and returns once
    :meth:`shutdown` has completed, re-raising the crash of a background loop reported through
    :meth:`_fail`; :meth:`shutdown` is idempotent and safe before start: health NOT_SERVING, then
    :meth:`_before_stop`, then in-flight calls get ``grace`` seconds, then :meth:`_after_stop`.
    ``async with node`` starts it and shuts it down on exit.

    Subclasses set :attr:`service_name`, register their servicer in :meth:`_register` and put their
    own background work in the three hooks, its tasks in :attr:`tasks`: the node's owner, closed (every task left
    cancelled and awaited) once :meth:`_after_stop` is done. A task spawned there ``fatal`` (the default) that
    crashes shuts the node down and :meth:`run` raises its exception; one spawned with ``fatal=False`` is only logged.
    """

    service_name: str
    """Full name of the node's service (``gradcode.v1.Worker``), for health and reflection."""
    event_loop_lag: Histogram | None = None
    """Where the node's watch of its event loop records (:func:`~gradcode.common.ops.loop_watch.watch_event_loop`,
    started with the node; None: no watch)."""

    def __init__(self, host: str, port: int, *, grace: float, security: Security | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"Argument 'port' must be in [0, 65535], not {port!r}.")
        if grace < 0:
            raise ValueError(f"Argument 'grace' must be >= 0 seconds, not {grace!r}.")
        self.host = host
        self.port = port
        self.grace = grace
        self.security = security or Security()
        self.call_token: CallToken | None = None
        """Set by a node whose master issues it a call token (a registering worker with a join secret)."""
        self._handle: ServingHandle | None = None
        self._shutdown_started = False
        self._stopped = asyncio.Event()
        self._failure: BaseException | None = None
        self.tasks = TaskOwner(type(self).__name__, on_crash=self._crashed)
        """Every background task of the node (its subclass's docstring says which, and which are fatal)."""
        self._shutting_down: asyncio.Task[None] | None = None
        """The shutdown a crash started (:meth:`_fail`): not a task of :attr:`tasks`, which it closes."""

    # ---- state ---------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` actually bound (available after :meth:`start`)."""
        if self._handle is None:
            raise RuntimeError(f"{type(self).__name__}.address is known only after start().")
        return self._handle.address

    @property
    def is_running(self) -> bool:
        return self._handle is not None and not self._shutdown_started

    @property
    def is_shutdown(self) -> bool:
        return self._stopped.is_set()

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve, then run :meth:`_on_started`. Idempotent; OSError if the port is taken."""
        if self._handle is not None:
            return
        if self._shutdown_started:
            raise RuntimeError(f"This {type(self).__name__} was shut down; create a new one.")
        self._handle = await start_server(
            self.host, self.port, registrars=[self._register], service_names=[self.service_name],
            security=self.security, call_token=self.call_token,
        )  # fmt: skip
        if self.event_loop_lag is not None:
            self.tasks.spawn(watch_event_loop(self.event_loop_lag), name="event-loop-watch")
        await self._on_started()

    async def run(self) -> None:
        """Start if needed and return once shutdown has completed; re-raises a background crash."""
        await self.start()
        await self._stopped.wait()
        if self._failure is not None:
            raise self._failure

    async def shutdown(self) -> None:
        """Stop gracefully (see the class docstring) and wait until everything has stopped."""
        if self._shutdown_started:
            await self._stopped.wait()
            return
        self._shutdown_started = True
        try:
            if self._handle is not None:
                await self._handle.set_serving(False)
            await self._before_stop()
            if self._handle is not None:
                await self._handle.stop(self.grace)
            await self._after_stop()
        finally:
            try:
                await self.tasks.close()
            finally:
                self._stopped.set()

    def _fail(self, exc: BaseException) -> None:
        """A background loop crashed: remember it for :meth:`run` and shut down."""
        self._failure = exc
        logger.error("%r: background loop crashed: %r; shutting down", self, exc)
        if self._shutting_down is None:
            self._shutting_down = asyncio.get_running_loop().create_task(self.shutdown(), name="shutdown")

    def _crashed(self, crash: Crash) -> None:
        """A fatal task of :attr:`tasks` crashed: shut down, and have :meth:`run` raise its exception."""
        self._fail(crash.error)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    # ---- hooks ---------------------------------------------------------------------------------
    def _register(self, server: grpc.aio.Server) -> None:
        raise NotImplementedError

    async def _on_started(self) -> None:
        """Background work that needs the bound server (registration, monitors)."""

    async def _before_stop(self) -> None:
        """After health went NOT_SERVING, before in-flight calls get their grace period."""

    async def _after_stop(self) -> None:
        """After the server stopped: free what the node holds."""
