"""The master's view of its workers: addresses, channels, UP/DOWN state and which jobs each holds.

Workers join from a fixed address list (``--workers``) and/or by calling RegisterWorker when they
start; registering an address that is already known is the same worker (workers re-register
periodically), and brings a DOWN one back UP. A worker that restarted holds no job any more: its
Compute answers NOT_FOUND and the job runner reloads it. A worker whose call errors, disconnects or is
killed is marked DOWN with the reason, and so is an idle one (holding no job) whose periodic health probe fails;
a background monitor probes DOWN workers with the standard
gRPC health service over a *fresh* channel (no reconnect back-off) and brings them back UP only if
the process answering ``Worker.Hello`` there proves it is the one that registered (a new process must
register).
A worker that comes back has lost its jobs; job runners see that through :meth:`PoolWorker.has_job`
and reload it.

Who a worker is: every worker process sends, with each registration, the random secret it made at
start (:func:`gradcode.common.transport.security.new_process_secret`); the instance id it also sends is a label
that anyone may learn from ``Worker.Hello`` and proves nothing. The master challenges the address with
a fresh nonce and admits the registration only if the process answering there returns the HMAC of the
nonce under *that* secret (:func:`gradcode.common.transport.security.proves`). So a registration naming another
worker's address is refused (ALREADY_EXISTS) while that worker answers there, whatever else it knows
(join secret, instance id, Hello's proofs of nonces of its choosing), and the worker keeps its place and
its token.

Call tokens: with a join secret, the master mints a random call token for every worker process it
admits (a new worker, or a new process at a known address once that process proved it answers there,
so the old one no longer does: its token is dropped; a restarted master mints new ones as its workers
re-register) and returns it in the registration reply; the master calls that worker with it, and gives
it to the worker's tree parents. A re-registration with the same process secret (periodic, or a
restarted registration loop) keeps the token; a reply carries a token only to the holder of the secret
it was minted for.

Admission: a worker that registers is UP only after the master reached it at its advertised address
and the process answering there proved it holds the registration's secret, so an unreachable or
foreign address is refused, and an address held by a live worker is never taken over by another
process. Names, addresses and secrets are bounded, and so is the pool; :meth:`WorkerPool.remove`
forgets a worker. :class:`LatenessWatch` turns "late for K iterations in a row" into a probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcode.common.exceptions import (
    AlreadyExistsError,
    FailedPreconditionError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from gradcode.common.ops.metrics import set_workers_up
from gradcode.common.tasks import TaskOwner
from gradcode.common.transport.link import link_opener
from gradcode.common.transport.machine import default_machine_id
from gradcode.common.transport.security import Security, check_process_secret, new_nonce, proves, short
from gradcode.common.transport.serving import format_address, parse_address
from gradcode.common.transport.session import Caller, ChunkStream
from gradcode.common.transport.wire import CHANNEL_OPTIONS
from gradcode.v1 import master_pb2, worker_pb2, worker_pb2_grpc

__all__ = [
    "ADMISSION_TIMEOUT_SECONDS",
    "HEALTH_PROBE_SECONDS",
    "IDLE_PROBE_SECONDS",
    "IDLE_PROBE_STRIKES",
    "IDLE_PROBE_TIMEOUT_SECONDS",
    "MAX_ADDRESS_CHARS",
    "MAX_NAME_CHARS",
    "MAX_WORKERS",
    "PROBES_PER_PERIOD",
    "AddressTakenError",
    "PoolFullError",
    "PoolWorker",
    "RemovedWorkerError",
    "UnreachableWorkerError",
    "WorkerPool",
    "WorkerState",
    "worker_address",
]

log = logging.getLogger(__name__)

WorkerState = int
"""``master_pb2.WORKER_STATE_UP`` or ``master_pb2.WORKER_STATE_DOWN``."""

HEALTH_PROBE_SECONDS = 0.5
"""Period of the health probe of DOWN workers, and the timeout of each probe."""
IDLE_PROBE_SECONDS = 1.0
"""Period of the health probe of UP workers that hold no job (a job's own calls watch the others)."""
IDLE_PROBE_STRIKES = 2
"""Idle probes in a row that must time out before an idle worker is DOWN: one slow answer on a loaded machine is
not a frozen worker (a refused connection, a killed worker, counts at once)."""
IDLE_PROBE_TIMEOUT_SECONDS = 2.0
"""How long an idle worker's health probe may take: a killed worker's probe fails at once (its port refuses), a
frozen one's after :data:`IDLE_PROBE_STRIKES` of these, so a dead idle worker is DOWN within about 6 s."""
PROBES_PER_PERIOD = 100
"""Most idle workers probed each :data:`IDLE_PROBE_SECONDS`, and most DOWN workers each :data:`HEALTH_PROBE_SECONDS`:
with more, they take turns (in worker id order), each probed every ``count / 100`` periods, and a dead idle one is
DOWN (a DOWN one that answers again is UP) that much later. A probe costs the master about 2 ms of CPU (16 idle
workers: 25-36 ms a second, this machine), so probing 1000 workers every second would take most of a core from the
jobs' rounds. (A DOWN worker that restarts registers itself at once; the probes are for one that comes back as it
was.)"""

ADMISSION_TIMEOUT_SECONDS = 3.0
"""How long the master waits for a registering worker to answer Worker.Hello at its advertised address."""
MAX_NAME_CHARS = 128
MAX_ADDRESS_CHARS = 255
MAX_INSTANCE_ID_CHARS = 64
MAX_WORKERS = 4096
"""Default bound on the pool (UP and DOWN workers); remove workers to make room."""


class PoolFullError(ResourceExhaustedError):
    """The pool holds its maximum number of workers."""


class UnreachableWorkerError(FailedPreconditionError):
    """The master cannot reach a registering worker at its advertised address."""


class AddressTakenError(AlreadyExistsError):
    """Another worker process answers at the address a worker registered with."""


class RemovedWorkerError(PermissionDeniedError):
    """The registering worker process was removed from the pool."""


MAX_REMOVED_REMEMBERED = 10_000
"""Removed worker processes remembered (so they cannot re-register); the oldest are forgotten."""


def worker_address(address: str) -> str:
    """A worker's ``host:port`` in canonical form (:func:`gradcode.common.transport.serving.parse_address`, port not
    0)."""
    if len(address) > MAX_ADDRESS_CHARS:
        raise ValueError(f"Worker address {short(address)} is longer than {MAX_ADDRESS_CHARS} characters.")
    host, port = parse_address(address, what="Worker address")
    if port == 0:
        raise ValueError(f"Worker address {address!r} has port 0; a worker's address needs its real port (1..65535).")
    return format_address(host, port)


def _check_label(name: str, instance_id: str, machine_id: str = "") -> None:
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(f"Worker name {short(name)} must be at most {MAX_NAME_CHARS} printable characters.")
    for what, value in (("instance id", instance_id), ("machine id", machine_id)):
        if len(value) > MAX_INSTANCE_ID_CHARS or not value.isprintable():
            raise ValueError(
                f"Worker {what} {short(value)} must be at most {MAX_INSTANCE_ID_CHARS} printable characters."
            )


@dataclass(eq=False)
class PoolWorker:
    """One worker: its id, address, channel and stubs, state, last error and the jobs it holds."""

    worker_id: int
    address: str
    name: str = ""
    state: WorkerState = master_pb2.WORKER_STATE_UP
    last_error: str = ""
    last_seen: float = field(default_factory=time.time)
    jobs: set[str] = field(default_factory=set)
    """Jobs loaded on this worker since it last (re)started."""
    loading: int = 0
    """LoadJob calls to it in flight: a worker setting a job up (a model plugin may import for seconds) is not idle."""
    idle_timeouts: int = 0
    """Idle probes in a row that timed out (:data:`IDLE_PROBE_STRIKES` make it DOWN)."""
    instance_id: str = ""
    """The worker process's random id as it registered (a label; empty for a ``--workers`` address)."""
    process_secret: bytes = field(default=b"", repr=False)
    """The secret the registered process holds (empty for a ``--workers`` address): who it is."""
    machine_id: str = ""
    """The machine it runs on, as registered: workers with one id share cores (empty: unknown, a machine of its own)."""
    transport: str = ""
    """How the last job loaded on it moves payloads, and why (``WorkerInfo.transport``; empty: no job yet)."""
    call_token: str | None = field(default=None, repr=False)
    """The call token issued to this worker process (None: none issued, the join-derived token is used)."""
    security: Security = field(default_factory=Security, repr=False)
    channel: grpc.aio.Channel | None = None
    _stub: worker_pb2_grpc.WorkerStub | None = None
    caller: Caller | None = field(default=None, repr=False)
    """This worker's Computes, on a Session over :attr:`channel` (opened by the first Compute)."""
    links: bool = True
    """Ask the worker for a link (:mod:`gradcode.common.transport.link`) to carry the Computes instead of gRPC."""
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("pool worker"), repr=False)
    """Who holds the close of a channel it replaced (:meth:`reconnect`): its pool's owner."""
    probe_channel: grpc.aio.Channel | None = field(default=None, repr=False)
    """The channel its health probes use while it is UP (Hello's bearer), kept from one to the next
    (:meth:`WorkerPool.probe`)."""

    @property
    def stub(self) -> worker_pb2_grpc.WorkerStub:
        """The Worker stub, opening the channel on first use (inside the event loop)."""
        if self._stub is None:
            self.channel = self.security.channel(self.address, bearer=self.bearer, options=CHANNEL_OPTIONS)
            self._stub = worker_pb2_grpc.WorkerStub(self.channel)  # type: ignore[no-untyped-call]
        return self._stub

    @property
    def bearer(self) -> str | None:
        """What calls to this worker present: its issued call token, else the token derived from the join secret."""
        return self.call_token or self.security.worker_call_token

    def issue_call_token(self) -> str | None:
        """Mint a fresh call token for a newly admitted process (with a join secret only); channel reopened."""
        if self.security.join_secret is None:
            return None
        self.call_token = secrets.token_urlsafe(32)
        self.reconnect()
        return self.call_token

    def compute(self, head: worker_pb2.ComputeRequest, body: bytes = b"") -> ChunkStream:
        """One Compute on this worker (:class:`~gradcode.common.transport.session.Caller`: on its Session, opened with
        the
        channel): ``head``, the worker's own fields, followed by ``body``, the iteration's model fields serialized
        once for every worker. The chunks' payloads stay views into the bytes gRPC delivered."""
        return self._caller().compute(head, body)

    def compute_call(self, head: worker_pb2.ComputeRequest, body: bytes = b"") -> ChunkStream:
        """The same Compute as :meth:`compute`, as a call of its own
        (:meth:`~gradcode.common.transport.session.Caller.call`):
        a request asked again after it went unanswered on the worker's Session or link."""
        return self._caller().call(head, body)

    def _caller(self) -> Caller:
        """This worker's :class:`~gradcode.common.transport.session.Caller`, opening the channel if needed."""
        _ = self.stub  # opens the channel if needed
        if self.caller is None:
            channel = self.channel
            assert channel is not None
            link = link_opener(channel, self.address, self.security) if self.links else None
            self.caller = Caller(channel, self.describe(), link, self.lost_job)
        return self.caller

    def lost_job(self, job_id: str) -> None:
        """The worker answered NOT_FOUND for ``job_id`` (it restarted, or a parent's child did): the job's next
        round loads it again. Also told of a NOT_FOUND that came after its round was over (the Session's)."""
        if job_id in self.jobs:
            log.info("%s no longer holds job %r: it is loaded again", self.describe(), job_id)
            self.jobs.discard(job_id)

    def reconnect(self) -> None:
        """Drop the channel so the next call opens a fresh one (no reconnect back-off)."""
        old = self.detach()
        if old is not None and not self.tasks.closed:  # (closed: the pool has shut down, its channels with it)
            self.tasks.spawn(old.close(None), name=f"close-channel-{self.worker_id}", fatal=False)

    def detach(self) -> grpc.aio.Channel | None:
        """Forget the channel, its stub and its Compute session (what runs on it fails with CANCELLED); the
        channel, for the caller to close."""
        caller, channel = self.caller, self.channel
        self.caller, self.channel, self._stub = None, None, None
        if caller is not None:
            caller.close()
        return channel

    @property
    def is_up(self) -> bool:
        return self.state == master_pb2.WORKER_STATE_UP

    def has_job(self, job_id: str) -> bool:
        return job_id in self.jobs

    def info(self) -> master_pb2.WorkerInfo:
        return master_pb2.WorkerInfo(
            worker_id=self.worker_id,
            address=self.address,
            name=self.name,
            state=self.state,  # type: ignore[arg-type]
            last_error=self.last_error,
            last_seen_unix=self.last_seen,
            machine_id=self.machine_id,
            transport=self.transport,
        )

    def describe(self) -> str:
        return f"worker {self.worker_id} ({self.address})"


class WorkerPool:
    """All known workers, by id (ids are assigned 0, 1, 2, … in order of first appearance)."""

    def __init__(
        self,
        addresses: Iterable[str] = (),
        *,
        security: Security | None = None,
        max_workers: int = MAX_WORKERS,
        links: bool = True,
        machine_id: str | None = None,
        tasks: TaskOwner | None = None,
        probes_per_period: int = PROBES_PER_PERIOD,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"Argument 'max_workers' must be >= 1, not {max_workers!r}.")
        self._idle_turns = _Turns(probes_per_period)
        self._down_turns = _Turns(probes_per_period)
        self.machine_id = default_machine_id() if machine_id is None else machine_id
        """The machine the master runs on (:mod:`gradcode.common.transport.machine`): only workers registered with this
        id,
        or with none, are offered shared memory."""
        self.security = security or Security()
        self.links = links
        """Ask workers for links (:mod:`gradcode.common.transport.link`); False keeps every Compute on gRPC."""
        self.max_workers = max_workers
        self._next_id = 0
        self._workers: dict[int, PoolWorker] = {}
        self._by_address: dict[str, int] = {}
        self._removed: OrderedDict[str, None] = OrderedDict()
        """Digests of the secrets of removed worker processes, oldest first: they may not register again."""
        self._changed = asyncio.Condition()
        self._own_tasks = tasks is None
        self.tasks = TaskOwner("worker pool") if tasks is None else tasks
        """Holds the monitors (a crash of one is fatal to the owner: the master's node shuts down rather than go on
        not watching its workers) and the closes of replaced channels (only logged); by default the pool's own,
        closed by :meth:`close`."""
        self._monitors: list[asyncio.Task[None]] = []
        for address in addresses:
            self._add(worker_address(address), name="")

    # ---- membership ----------------------------------------------------------------------------
    def _check_room(self) -> None:
        if len(self._workers) >= self.max_workers:
            raise PoolFullError(
                f"The pool already holds {len(self._workers)} workers, its maximum; remove unused ones "
                "(gradcode workers remove ID) or start the master with a larger --max-workers."
            )

    def _add(self, address: str, name: str, instance_id: str = "", secret: bytes = b"") -> PoolWorker:
        self._check_room()
        worker_id, self._next_id = self._next_id, self._next_id + 1  # ids are never reused
        worker = PoolWorker(
            worker_id=worker_id, address=address, name=name, instance_id=instance_id, process_secret=secret,
            security=self.security, links=self.links, tasks=self.tasks,
        )  # fmt: skip
        self._workers[worker_id] = worker
        self._by_address[address] = worker_id
        self._count()
        return worker

    def _fresh_channel(self, address: str) -> grpc.aio.Channel:
        """A new channel (no reconnect back-off) for admission and probes, with Hello's bearer."""
        return self.security.channel(address, bearer=self.security.worker_call_token, options=CHANNEL_OPTIONS)

    async def _admit(self, address: str, secret: bytes) -> None:
        """Reach ``address`` and check that the process answering there holds ``secret`` (module docstring)."""
        try:
            async with self._fresh_channel(address) as channel:
                answers = await _holds(channel, secret, ADMISSION_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise UnreachableWorkerError(
                    f"The worker at {address} refused the master's credential ({exc.code().name}); give the master "
                    "and every worker the same join secret (GRADCODE_JOIN_SECRET)."
                ) from None
            what = (
                f"Something other than a gradcode worker answers at {address}, the address this worker registered "
                "with (UNIMPLEMENTED: it has no Worker.Hello)"
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED
                else f"The master could not reach this worker at {address}, the address it registered with "
                f"({exc.code().name}: {short(exc.details() or '', 120)})"
            )
            raise UnreachableWorkerError(
                f"{what}. If the worker listens on 0.0.0.0, runs in a container or behind NAT, start it with "
                "--advertise HOST:PORT (GRADCODE_ADVERTISE) naming an address the master can reach."
            ) from None
        if not answers:
            raise AddressTakenError(
                f"Another worker process answers at {address}: it did not prove it holds this registration's "
                "process secret, so the registration is refused and whoever is registered there keeps its place. "
                "A worker is admitted only at an address where it itself answers (give each worker its own "
                "--advertise HOST:PORT)."
            )

    def _check_not_removed(self, secret: bytes) -> None:
        if _secret_id(secret) in self._removed:
            raise RemovedWorkerError(
                "This worker process was removed from the pool (gradcode workers remove); restart it to join again."
            )

    async def register(
        self, address: str, name: str = "", instance_id: str = "", machine_id: str = "", *, secret: bytes
    ) -> PoolWorker:
        """Admit the worker process holding ``secret`` at ``address``, or bring a known address back UP.

        The same secret at a known UP address is a re-registration: nothing changes, its token is kept.
        Otherwise the process answering at ``address`` must prove it holds ``secret`` (module docstring);
        a new process proven at a known address replaces the old one there (it holds no job, and a new
        token is minted).

        ValueError for a bad address, name, instance or machine id or secret; :class:`UnreachableWorkerError`
        when the master cannot reach it at ``address``; :class:`AddressTakenError` when the process answering
        there does not hold ``secret``; :class:`RemovedWorkerError` for a removed process;
        :class:`PoolFullError` when a new worker would exceed the pool's bound.
        """
        _check_label(name, instance_id, machine_id)
        check_process_secret(secret)
        addr = worker_address(address)
        self._check_not_removed(secret)
        known = self._known(addr)
        if known is None or not known.is_up or not _same(known.process_secret, secret):
            # a new worker, a new process at a known address, or one that was DOWN: it proves who it is first
            if known is None:
                self._check_room()
            await self._admit(addr, secret)
            self._check_not_removed(secret)  # removed while we waited
            known = self._known(addr)  # it may have registered (or been removed) concurrently while we waited
        if known is None:
            worker = self._add(addr, name, instance_id, secret)
            worker.issue_call_token()
            log.info("registered %s", worker.describe())
        else:
            worker = known
            worker.name = name or worker.name
            worker.instance_id = instance_id
            if not _same(worker.process_secret, secret):  # a new process proved it answers there: the old is gone
                if worker.is_up and worker.process_secret:
                    self.mark_down(worker, "a new worker process registered at this address")
                worker.process_secret = secret
                worker.issue_call_token()  # the old process's token is dropped
            if not worker.is_up:  # it came back: a fresh channel, and it holds no job any more
                worker.jobs.clear()
                worker.reconnect()
                self._set_state(worker, master_pb2.WORKER_STATE_UP, "")
                log.info("%s re-registered and is UP again", worker.describe())
            # An UP worker re-registers periodically (a restarted master relearns it that way); if it
            # restarted in between, its Compute answers NOT_FOUND and the job runner reloads it.
        worker.machine_id = machine_id
        worker.last_seen = time.time()
        await self._notify()
        return worker

    def _known(self, address: str) -> PoolWorker | None:
        worker_id = self._by_address.get(address)
        return None if worker_id is None else self._workers.get(worker_id)

    async def remove(self, worker_id: int) -> PoolWorker:
        """Forget a worker: DOWN for good (jobs holding it see it failed), channel closed; KeyError if unknown.

        The removed process cannot register again (a digest of its secret is remembered); restarted, it can.
        """
        worker = self.get(worker_id)
        del self._workers[worker_id]
        if self._by_address.get(worker.address) == worker_id:
            del self._by_address[worker.address]
        self.mark_down(worker, "removed from the pool")
        if worker.process_secret:  # the process keeps re-registering; it stays out until it restarts
            self._removed[_secret_id(worker.process_secret)] = None
            while len(self._removed) > MAX_REMOVED_REMEMBERED:
                self._removed.popitem(last=False)
        channel = worker.detach()
        if channel is not None:
            await channel.close(None)
        log.info("removed %s", worker.describe())
        await self._notify()
        return worker

    def get(self, worker_id: int) -> PoolWorker:
        """The worker with ``worker_id``; KeyError naming the known ids otherwise."""
        try:
            return self._workers[worker_id]
        except KeyError:
            raise KeyError(f"Unknown worker id {worker_id} (the pool has {len(self._workers)} workers).") from None

    @property
    def workers(self) -> list[PoolWorker]:
        return [self._workers[i] for i in sorted(self._workers)]

    def up(self) -> list[PoolWorker]:
        return [w for w in self.workers if w.is_up]

    # ---- state ---------------------------------------------------------------------------------
    def _set_state(self, worker: PoolWorker, state: WorkerState, error: str) -> None:
        worker.state = state
        if error:
            worker.last_error = error
        if state == master_pb2.WORKER_STATE_UP:
            worker.last_seen = time.time()
        self._count()

    def _count(self) -> None:
        """Publish how many workers are UP and known (the gradcode_workers_* metrics)."""
        set_workers_up(sum(w.is_up for w in self._workers.values()), len(self._workers))

    def mark_down(self, worker: PoolWorker, error: str) -> None:
        """Record a failure: the worker is skipped until a health probe or a registration revives it."""
        if worker.is_up:
            log.warning("%s is DOWN: %s", worker.describe(), error)
        self._set_state(worker, master_pb2.WORKER_STATE_DOWN, error)
        worker.jobs.clear()
        probe_channel, worker.probe_channel = worker.probe_channel, None  # (DOWN, it is probed over fresh ones)
        if probe_channel is not None and not worker.tasks.closed:
            worker.tasks.spawn(probe_channel.close(None), name=f"close-probe-channel-{worker.worker_id}", fatal=False)

    def mark_seen(self, worker: PoolWorker) -> None:
        worker.last_seen = time.time()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def notify_changed(self) -> None:
        """Wake :meth:`wait_changed` waiters (e.g. a worker finished loading a job in the background)."""
        await self._notify()

    async def wait_changed(self, timeout: float) -> None:
        """Wait until a worker registers or comes back UP, or ``timeout`` seconds pass."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for, which can swallow a cancel (3.11)
                    await self._changed.wait()

    # ---- health --------------------------------------------------------------------------------
    async def probe(self, worker: PoolWorker, timeout: float = HEALTH_PROBE_SECONDS, *, strikes: int = 1) -> bool:
        """Ask a worker's health service, then who answers (Worker.Hello); mark it UP (it holds no job) only if it
        serves and proves it is the process that registered.

        A DOWN worker is probed over a fresh channel each time (no reconnect back-off); an UP one over a channel kept
        between its probes (:attr:`PoolWorker.probe_channel`), dropped when a probe fails other than by timing out or
        the worker is marked DOWN. With mutual TLS, a new connection per probe made 8 idle workers cost the master
        27-40 ms of CPU a second; kept, 15-16 ms (without TLS the difference is within the noise).

        Another process at the address (the worker restarted) is not revived: it registers itself, and
        is admitted with a new call token then. A ``--workers`` address (no secret) needs SERVING only. An UP
        worker is marked DOWN after ``strikes`` probes in a row that timed out (any other failure: at once).
        """
        error, foreign, timed_out = "", False, False
        kept = worker.is_up
        channel = (worker.probe_channel if kept else None) or self._fresh_channel(worker.address)
        if kept:
            worker.probe_channel = channel
        try:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                error = "health check: the worker is not serving (shutting down)"
            elif worker.process_secret and not await _holds(channel, worker.process_secret, timeout):
                error, foreign = "another worker process answers at this address (restarted?); it must register", True
        except grpc.aio.AioRpcError as exc:
            error = f"health check: {exc.code().name}: {exc.details()}"
            timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            if not kept or (error and not timed_out):  # a failure other than a timeout marks it DOWN: a fresh one next
                if worker.probe_channel is channel:
                    worker.probe_channel = None
                await channel.close(None)
        serving = not error
        worker.idle_timeouts = worker.idle_timeouts + 1 if timed_out else 0
        if not serving and (worker.is_up or foreign) and (not timed_out or worker.idle_timeouts >= strikes):
            self.mark_down(worker, error)
        if serving and not worker.is_up:
            worker.jobs.clear()
            worker.reconnect()
            self._set_state(worker, master_pb2.WORKER_STATE_UP, "")
            log.info("%s is back UP", worker.describe())
            await self._notify()
        elif serving:
            self.mark_seen(worker)
        return bool(serving)

    async def probe_down(self) -> None:
        """Probe the DOWN workers once, concurrently, at most :data:`PROBES_PER_PERIOD` of them (the next in turn; a
        removed worker is not in the pool and stays DOWN)."""
        down = self._down_turns.next(w for w in self.workers if not w.is_up)
        if down:
            await asyncio.gather(*(self.probe(w) for w in down), return_exceptions=True)

    async def probe_idle(self, timeout: float = IDLE_PROBE_TIMEOUT_SECONDS) -> None:
        """Probe the UP workers that hold no job once, concurrently, at most :data:`PROBES_PER_PERIOD` of them (the
        next in turn): one killed or frozen while idle is DOWN before the next job would count it among its workers (a
        worker that holds a job is watched by the job's calls and :class:`~gradcode.master.liveness.LatenessWatch`)."""
        idle = self._idle_turns.next(w for w in self.workers if w.is_up and not w.jobs and not w.loading)
        if idle:
            probes = (self.probe(w, timeout, strikes=IDLE_PROBE_STRIKES) for w in idle)
            await asyncio.gather(*probes, return_exceptions=True)

    async def _monitor_loop(self) -> None:
        while True:
            await self.probe_down()
            await asyncio.sleep(HEALTH_PROBE_SECONDS)

    async def _idle_loop(self) -> None:
        while True:
            await self.probe_idle()
            await asyncio.sleep(IDLE_PROBE_SECONDS)

    def start_monitor(self) -> None:
        """Start probing DOWN and idle workers in the background (idempotent)."""
        if not self._monitors:
            self._monitors = [
                self.tasks.spawn(self._monitor_loop(), name="pool-health-monitor"),
                self.tasks.spawn(self._idle_loop(), name="pool-idle-monitor"),
            ]

    async def close(self) -> None:
        """Stop the monitors and close every channel."""
        monitors, self._monitors = self._monitors, []
        for task in monitors:
            task.cancel()
        if monitors:
            await asyncio.wait(monitors)  # (one that crashed was reported by :attr:`tasks`)
        for worker in self.workers:
            for channel in (worker.detach(), worker.probe_channel):
                if channel is not None:
                    await channel.close(None)
            worker.probe_channel = None
        if self._own_tasks:
            await self.tasks.close()


class _Turns:
    """Which of many workers a period probes: all of them up to ``limit``, else the next ``limit`` after the last one
    probed, in worker id order, wrapping around (:data:`PROBES_PER_PERIOD`)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"Argument 'probes_per_period' must be >= 1, not {limit}.")
        self.limit = limit
        self._last = -1

    def next(self, workers: Iterable[PoolWorker]) -> list[PoolWorker]:
        ordered = sorted(workers, key=lambda w: w.worker_id)
        if len(ordered) <= self.limit:
            return ordered
        later = [w for w in ordered if w.worker_id > self._last]
        chosen = (later + ordered[: len(ordered) - len(later)])[: self.limit]
        self._last = chosen[-1].worker_id
        return chosen


async def _holds(channel: grpc.aio.Channel, secret: bytes, timeout: float) -> bool:
    """The process answering Worker.Hello on ``channel`` proves it holds ``secret`` (a fresh nonce each time)."""
    nonce = new_nonce()
    stub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
    reply = await stub.Hello(worker_pb2.HelloRequest(nonce=nonce), timeout=timeout)
    return proves(secret, nonce, reply.proof)


def _same(a: bytes, b: bytes) -> bool:
    """Two process secrets are equal (constant time; an empty one, a ``--workers`` address, equals none)."""
    return bool(a) and hmac.compare_digest(a, b)


def _secret_id(secret: bytes) -> str:
    """What the pool remembers of a removed process's secret."""
    return hashlib.sha256(secret).hexdigest()
