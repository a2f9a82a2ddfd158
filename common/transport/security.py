"""Transport security and authentication for every gradcode channel and server, in one place.

* :class:`Security` — a node's or client's configuration: TLS certificate, key and CA, mutual TLS,
  the client token and the workers' join secret. It builds the server credentials
  (:meth:`Security.server_credentials`), every outgoing channel (:meth:`Security.channel`, TLS when a
  CA is configured, with a bearer token attached by a client interceptor when one is given) and the
  one server interceptor that checks tokens (:meth:`Security.interceptor`).
* Who may call what (:class:`AuthInterceptor`): clients present the *token* on every Master method;
  workers present the *join secret* on ``Master.RegisterWorker``. A worker that registered answers
  LoadJob/Compute/EndJob only with the *call token* its master issued it at registration
  (:class:`CallToken`: random, per worker process), which only that master and the worker's tree
  parents (given it by the master) hold. ``Worker.Hello`` (the master's admission check, which changes
  nothing) and the Worker methods of a worker that never registers (a ``--workers`` list) take the
  *worker call token* derived from the join secret. The health service is always open (probes);
  reflection is off by default when authentication is on.
* Who a worker process is (:func:`new_process_secret`, :func:`hello_proof`, :func:`proves`): each worker
  process makes a random secret at start and sends it, with the join secret, only to its master when it
  registers; the master admits it (and mints or keeps its call token) only when the process answering
  ``Worker.Hello`` at the advertised address proves it holds that secret, by an HMAC of a fresh nonce.
  Hello tells anyone the proof of any nonce they choose, which helps nobody who lacks the secret: the
  master checks the proof under the secret the *registering* process sent, with a nonce of its own.
* Job tokens (:func:`job_token`): what a tree parent is given to call a child, derived from the child's call
  token and one job id. A child accepts it on Compute, Session and OpenLink only, and computes with it only
  requests of that job (:data:`CALL_SCOPE`); job ids are never reused, so it dies with the job. A relay token
  (:func:`relay_token`, derived alike under another label) is what a worker is given to fetch a job's model from
  a peer: it opens ``Worker.FetchModel`` only, for that job only.
* :func:`refuse_if_exposed` — listening beyond loopback without TLS and a join secret is refused unless
  ``--insecure`` (``GRADCODE_INSECURE``) says so.
* :func:`add_security_arguments` / :func:`security_from_args` — the flags and their environment
  variables (``GRADCODE_TLS_CERT``, ``GRADCODE_TLS_KEY``, ``GRADCODE_TLS_CA``, ``GRADCODE_MTLS``,
  ``GRADCODE_TOKEN``, ``GRADCODE_JOIN_SECRET``, ``GRADCODE_REFLECTION``, ``GRADCODE_TLS_SERVER_NAME``,
  ``GRADCODE_INSECURE``).
* :func:`short` — at most a short prefix of any caller input, for error texts.

Tokens travel as ``authorization: Bearer <token>`` metadata; over plaintext they are readable by
anyone on the path, so a token without TLS is only for loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextvars
import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gradcode.common.exceptions import GradcodeError
from gradcode.common.transport.status import drain_untrusted

__all__ = [
    "AUTH_METADATA_KEY",
    "CALL_SCOPE",
    "AuthInterceptor",
    "CallToken",
    "ExposedError",
    "Security",
    "add_security_arguments",
    "bearer_of",
    "hello_proof",
    "is_loopback",
    "job_of",
    "job_token",
    "new_process_secret",
    "proves",
    "refuse_if_exposed",
    "relay_token",
    "security_from_args",
    "short",
    "warn_if_exposed",
]

log = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
"""gRPC metadata key of the bearer token."""
_BEARER = "Bearer "
_WORKER_CALL_CONTEXT = b"gradcode/v1 worker calls"
MASTER_SERVICE = "/gradcode.v1.Master/"
WORKER_SERVICE = "/gradcode.v1.Worker/"
REGISTER_METHOD = MASTER_SERVICE + "RegisterWorker"
HELLO_METHOD = WORKER_SERVICE + "Hello"
JOB_SCOPED_METHODS = tuple(WORKER_SERVICE + name for name in ("Compute", "Session", "OpenLink"))
"""The Worker methods a job token opens (a tree parent's calls to its children): never LoadJob or EndJob."""
FETCH_MODEL_METHOD = WORKER_SERVICE + "FetchModel"
"""The one Worker method a relay token opens (:func:`relay_token`)."""
_JOB_TOKEN_PREFIX = "job:"
_JOB_TOKEN_CONTEXT = b"gradcode/v1 job token\0"
_RELAY_TOKEN_CONTEXT = b"gradcode/v1 relay token\0"
_HELLO_PROOF_CONTEXT = b"gradcode/v1 hello proof\0"
PROCESS_SECRET_BYTES = 32
"""Length of the secret each worker process makes at start."""
MIN_PROCESS_SECRET_BYTES, MAX_PROCESS_SECRET_BYTES = 16, 64
"""Bounds on a process secret the master accepts."""
NONCE_BYTES = 32
"""Length of the master's Hello challenge."""
MAX_NONCE_BYTES = 64
"""Longest Hello challenge a worker answers."""


def short(text: str, limit: int = 48) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters (with its full length), for echoing caller input."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


CALL_SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar("gradcode_call_scope", default=None)
"""The one job the current call may compute (its bearer is a :func:`job_token`), or None: any job. Set by the
worker's Compute, Session and link for their own task; the computations they start inherit it."""


def job_token(call_token: str, job_id: str, *, context: bytes = _JOB_TOKEN_CONTEXT) -> str:
    """The bearer a tree parent presents to a child for ``job_id``: the job id and an HMAC-SHA256 of it under the
    child's ``call_token``. It opens only :data:`JOB_SCOPED_METHODS`, for that job's requests only. (Under another
    ``context``, a token that opens other methods: :func:`relay_token`.)"""
    mac = hmac.new(call_token.encode(), context + job_id.encode(), hashlib.sha256).hexdigest()
    return f"{_JOB_TOKEN_PREFIX}{base64.urlsafe_b64encode(job_id.encode()).decode()}.{mac}"


def relay_token(call_token: str, job_id: str) -> str:
    """The bearer a worker presents to a peer to fetch ``job_id``'s model from it (``ComputeRequest.relayed_model``):
    a :func:`job_token` under its own label, so it opens only :data:`FETCH_MODEL_METHOD`, for that job only
    (:data:`CALL_SCOPE`), and never a Compute: a worker of the job learns no way to drive its peer."""
    return job_token(call_token, job_id, context=_RELAY_TOKEN_CONTEXT)


def job_of(bearer: str | None) -> str | None:
    """The job id a :func:`job_token` names (unchecked: the interceptor checked it), or None for any other bearer."""
    if not bearer or not bearer.startswith(_JOB_TOKEN_PREFIX):
        return None
    encoded, _, _mac = bearer[len(_JOB_TOKEN_PREFIX) :].partition(".")
    try:
        return base64.urlsafe_b64decode(encoded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def bearer_of(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The bearer token a call presented, if any."""
    return _bearer(context.invocation_metadata())


def new_process_secret() -> bytes:
    """A worker process's secret: :data:`PROCESS_SECRET_BYTES` random bytes, made once at its start."""
    return secrets.token_bytes(PROCESS_SECRET_BYTES)


def new_nonce() -> bytes:
    """A fresh Hello challenge."""
    return secrets.token_bytes(NONCE_BYTES)


def hello_proof(secret: bytes, nonce: bytes) -> bytes:
    """HMAC-SHA256 of ``nonce`` (after a fixed label) under a process ``secret``: what Hello answers.

    Anyone may ask for the proof of any nonce; it reveals nothing of the secret (HMAC is a PRF), and only
    a holder of the secret can compute the proof of a nonce it was not shown.
    """
    return hmac.new(secret, _HELLO_PROOF_CONTEXT + nonce, hashlib.sha256).digest()


def proves(secret: bytes, nonce: bytes, proof: bytes) -> bool:
    """``proof`` is :func:`hello_proof` of ``nonce`` under ``secret`` (constant-time comparison)."""
    return bool(secret) and bool(nonce) and hmac.compare_digest(hello_proof(secret, nonce), proof)


def check_process_secret(secret: bytes) -> None:
    """ValueError unless ``secret`` has a length a worker process's secret may have."""
    if not MIN_PROCESS_SECRET_BYTES <= len(secret) <= MAX_PROCESS_SECRET_BYTES:
        raise ValueError(
            f"The worker's process secret is {len(secret)} bytes; it must be {MIN_PROCESS_SECRET_BYTES} to "
            f"{MAX_PROCESS_SECRET_BYTES} random bytes (a worker from an older gradcode sends none: upgrade it)."
        )


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"Cannot read the {what} {str(path)!r}: {exc.strerror or exc}.") from None


@dataclass(frozen=True)
class Security:
    """TLS files and secrets of one process; the default is plaintext without authentication.

    Servers use TLS when ``cert`` and ``key`` are given; with ``mutual`` they also require a client
    certificate signed by ``ca``. Channels use TLS when ``ca`` is given (or ``tls`` is set, which trusts
    the system's roots), and present ``cert``/``key`` when ``mutual``. ``token`` is what clients
    present to the master; ``join_secret`` is what workers present to register, and the worker call
    token (:attr:`worker_call_token`) is derived from it.
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    mutual: bool = False
    tls: bool = False
    token: str | None = field(default=None, repr=False)
    join_secret: str | None = field(default=None, repr=False)
    reflection: bool | None = None
    """Serve gRPC reflection; None means on unless authentication is on."""
    server_name: str | None = None
    """Name to verify in the servers' certificates instead of the host of the address (a cluster
    whose certificates name a single DNS name)."""
    insecure: bool = False
    """Listen beyond loopback without TLS or a join secret anyway (:func:`refuse_if_exposed`)."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("Give both a TLS certificate and its key (--tls-cert and --tls-key), or neither.")
        if self.mutual and (self.ca is None or self.cert is None):
            raise ValueError(
                "Mutual TLS needs a CA (--tls-ca) to check peers and this process's own certificate and key "
                "(--tls-cert, --tls-key); `gradcode certs` makes them."
            )
        for name in ("token", "join_secret"):
            value = getattr(self, name)
            if value is not None and (len(value) < 16 or not value.isprintable() or value != value.strip()):
                raise ValueError(
                    f"The {name.replace('_', ' ')} must be at least 16 printable characters without surrounding "
                    "spaces (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)."
                )

    # ---- what is on ----------------------------------------------------------------------------------
    @property
    def channel_tls(self) -> bool:
        """Outgoing channels use TLS."""
        return self.tls or self.ca is not None or self.mutual

    @property
    def server_tls(self) -> bool:
        return self.cert is not None

    @property
    def authenticated(self) -> bool:
        """A token or a join secret is configured."""
        return self.token is not None or self.join_secret is not None

    @property
    def serve_reflection(self) -> bool:
        return (not self.authenticated) if self.reflection is None else self.reflection

    @property
    def worker_call_token(self) -> str | None:
        """HMAC-SHA256 of a fixed label under the join secret (None without one): the bearer of Worker.Hello.

        Every holder of the join secret can compute it, so it opens no state-changing Worker method of a
        registered worker (those take the :class:`CallToken` its master issued); only a worker that never
        registers (a ``--workers`` list) accepts it on every method. It is never the secret itself, so
        a worker's logs or a captured call do not reveal the join secret.
        """
        if self.join_secret is None:
            return None
        return hmac.new(self.join_secret.encode(), _WORKER_CALL_CONTEXT, hashlib.sha256).hexdigest()

    # ---- credentials ---------------------------------------------------------------------------------
    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS server credentials (mutual: client certificates required and checked), or None for plaintext."""
        if self.cert is None:
            return None
        cert, key = _read(self.cert, "TLS certificate"), _read(self.key, "TLS key")
        ca = _read(self.ca, "TLS CA certificate") if self.mutual else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=self.mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS channel credentials (mutual: with this process's certificate), or None for plaintext.

        Read once and reused by every channel (the master opens one per worker and per probe); new
        files take effect on restart.
        """
        return self._channel_credentials

    @functools.cached_property
    def _channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.channel_tls:
            return None
        ca = _read(self.ca, "TLS CA certificate")
        if self.mutual:
            return grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=_read(self.key, "TLS key"),
                certificate_chain=_read(self.cert, "TLS certificate"),
            )  # fmt: skip
        return grpc.ssl_channel_credentials(root_certificates=ca)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS of :meth:`server_credentials` for a plain socket (a worker's link), or None for plaintext."""
        if self.cert is None or self.key is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.mutual:
            context.load_verify_locations(cafile=self.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS of :meth:`channel_credentials` for a plain socket (a link to a worker), or None for plaintext.

        Check the peer against :attr:`server_name` when set, else against the host dialled (as channels do)."""
        if not self.channel_tls:
            return None
        context = ssl.create_default_context(cafile=self.ca)  # no CA file: the system's roots
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.mutual and self.cert is not None:
            context.load_cert_chain(self.cert, self.key)
        return context

    def _options(self, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        extra = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name and self.channel_tls else []
        return [*options, *extra]

    def channel(
        self, target: str, *, bearer: str | None = None, options: Sequence[tuple[str, Any]] = ()
    ) -> grpc.aio.Channel:
        """An asyncio channel to ``target``: TLS when configured, with ``bearer`` on every call when given."""
        interceptors = _bearer_interceptors(bearer) if bearer else None
        credentials = self.channel_credentials()
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=self._options(options), interceptors=interceptors)
        return grpc.aio.secure_channel(target, credentials, options=self._options(options), interceptors=interceptors)

    def sync_channel(self, target: str, *, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel (health checks, tests); pass the token per call with :meth:`call_metadata`."""
        credentials = self.channel_credentials()
        if credentials is None:
            return grpc.insecure_channel(target, options=self._options(options))
        return grpc.secure_channel(target, credentials, options=self._options(options))

    @staticmethod
    def call_metadata(bearer: str | None) -> tuple[tuple[str, str], ...]:
        return ((AUTH_METADATA_KEY, _BEARER + bearer),) if bearer else ()

    # ---- servers -------------------------------------------------------------------------------------
    def interceptor(self, call_token: CallToken | None = None) -> AuthInterceptor | None:
        """The server interceptor enforcing this configuration's tokens (None when no token is configured).

        With a join secret, a worker given ``call_token`` (one that registers with a master) answers
        LoadJob/Compute/EndJob only with the token its master issued (and Compute, Session and OpenLink also
        with a :func:`job_token` derived from it, FetchModel with a :func:`relay_token`); without it, with the
        worker call token derived from the join secret. Hello (changes nothing) always takes the derived token.
        """
        rules: dict[str, dict[str, Credential] | None] = {}
        if self.token is not None:
            rules[MASTER_SERVICE] = {"client token": self.token}
            rules[REGISTER_METHOD] = None  # open unless a join secret is set (mTLS may still gate it)
        if self.join_secret is not None:
            assert self.worker_call_token is not None
            derived: dict[str, Credential] = {"worker call token": self.worker_call_token}
            issued: dict[str, Credential] = {} if call_token is None else {"call token its master issued": call_token}
            rules[REGISTER_METHOD] = {"join secret": self.join_secret}
            rules[WORKER_SERVICE] = issued or derived
            rules[HELLO_METHOD] = derived  # never waits on a registration: the master's admission check calls it
            if call_token is not None:  # a tree parent's calls: one job's Computes only
                for method in JOB_SCOPED_METHODS:
                    rules[method] = {**issued, "job token its parent was given": JobToken(call_token)}
                relay = JobToken(call_token, relay_token)  # a peer's fetch: one job's model only
                rules[FETCH_MODEL_METHOD] = {**issued, "relay token its master gave a peer": relay}
        if not rules:
            return None
        known = {name: secret for rule in rules.values() for name, secret in (rule or {}).items()}
        return AuthInterceptor(rules, known=known)

    def describe(self) -> str:
        """One line for the log: transport and authentication."""
        transport = ("mutual TLS" if self.mutual else "TLS") if self.server_tls else "plaintext"
        auth = [n for n, v in (("client token", self.token), ("join secret", self.join_secret)) if v]
        return f"{transport}, {'authentication: ' + ', '.join(auth) if auth else 'no authentication'}"


class ExposedError(GradcodeError, ValueError):
    """A server would listen beyond loopback without TLS and a join secret, and ``--insecure`` was not given."""


def refuse_if_exposed(host: str, security: Security) -> None:
    """:class:`ExposedError` saying how to set security up when ``host`` is not loopback and ``security`` lacks
    TLS or a join secret, unless ``security.insecure``: with either missing, anyone who reaches the port could
    register as a worker and poison every model (or, on a worker, drive it)."""
    if is_loopback(host) or security.insecure:
        return
    missing = [what for what, on in (("TLS", security.server_tls), ("a join secret", security.join_secret)) if not on]
    if not missing:
        return
    raise ExposedError(
        f"Refusing to listen on {host or 'all interfaces'} without {' and '.join(missing)}: anyone who reaches "
        "this port could register as a worker and poison the model, or drive this node. Set security up: "
        "`gradcode certs --out certs --host NAME` (every name and IP the nodes are reached at), then give the "
        "master and every worker --tls-cert/--tls-key/--tls-ca (GRADCODE_TLS_CERT, GRADCODE_TLS_KEY, "
        "GRADCODE_TLS_CA, and GRADCODE_MTLS=1 for mutual TLS) and the same --join-secret (GRADCODE_JOIN_SECRET), "
        "and the master a client token (GRADCODE_TOKEN); see the README's Security section. Or listen on "
        "127.0.0.1, or pass --insecure (GRADCODE_INSECURE=1) on a network you trust completely."
    )


def warn_if_exposed(host: str, security: Security, services: Sequence[str] = ()) -> None:
    """Log loudly when a server listens in plaintext (or without authentication) beyond loopback."""
    if is_loopback(host):
        return
    if MASTER_SERVICE.strip("/") in services and security.token is None and not security.mutual:
        log.warning(
            "!!! No client token: anyone who reaches %s can create, read and cancel jobs. Set GRADCODE_TOKEN or "
            "--mtls. !!!", host or "all interfaces",
        )  # fmt: skip
    if not security.server_tls:
        log.warning(
            "!!! LISTENING IN PLAINTEXT ON %s, A NON-LOOPBACK ADDRESS: anyone on the network can read and forge "
            "every call%s. Use --tls-cert/--tls-key/--tls-ca (see `gradcode certs`) outside a trusted network. !!!",
            host or "all interfaces",
            "" if security.authenticated else " and drive this node without credentials",
        )
    if security.token is not None and security.join_secret is None and not security.mutual:
        log.warning(
            "!!! A client token but no join secret: anyone who reaches %s can register as a worker. Set "
            "GRADCODE_JOIN_SECRET or --mtls. !!!", host or "all interfaces",
        )  # fmt: skip
    if security.server_tls and not security.authenticated and not security.mutual:
        log.warning(
            "!!! %s serves TLS without authentication: anyone who reaches it can call it. Set GRADCODE_TOKEN and "
            "GRADCODE_JOIN_SECRET, or --mtls. !!!", host or "all interfaces",
        )  # fmt: skip


# ---- the server interceptor ---------------------------------------------------------------------------
class CallToken:
    """The call token a master issued this worker process at registration (None until it registered).

    The master may use a token it minted as soon as it admitted the worker, before the RegisterWorker
    reply has arrived here; so while a registration is in flight (:meth:`registering` ...
    :meth:`registered`), the interceptor lets a call with an unknown bearer wait for its outcome
    before judging it.
    """

    def __init__(self) -> None:
        self.value: str | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> bool:
        """A registration is in flight (its reply may carry a new token)."""
        return not self._idle.is_set()

    def registering(self) -> None:
        """A RegisterWorker call starts; pair it with :meth:`registered` (in a ``finally``)."""
        self._idle.clear()

    def registered(self, token: str | None) -> None:
        """The registration ended; ``token`` (if any) replaces the previous one."""
        if token:
            self.value = token
        self._idle.set()

    def revoke(self) -> None:
        """Forget the token: its master no longer knows this process as the worker at its address."""
        self.value = None

    async def settled(self) -> None:
        """Wait until no registration is in flight (each is bounded by its RPC timeout)."""
        await self._idle.wait()

    def matches(self, presented: str) -> bool:
        return self.value is not None and _equal(presented, self.value)


class JobToken:
    """Accepts a :func:`job_token` (or, with ``derive``, another kind of job token: :func:`relay_token`) derived from
    the current value of a :class:`CallToken`, for any job id."""

    def __init__(self, call_token: CallToken, derive: Callable[[str, str], str] = job_token) -> None:
        self.call_token = call_token
        self.derive = derive

    def matches(self, presented: str) -> bool:
        job_id, value = job_of(presented), self.call_token.value
        return job_id is not None and value is not None and _equal(presented, self.derive(value, job_id))


Credential = str | CallToken | JobToken
"""What a rule accepts: a fixed secret, the current value of a :class:`CallToken`, or a job token derived from it."""


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks the bearer token of every call whose method matches a rule; the rest (health, reflection) is open.

    ``rules`` maps a method name or a service prefix (``/gradcode.v1.Worker/``) to the credentials it
    accepts, by name; the longest matching prefix wins. A missing or unknown token is UNAUTHENTICATED;
    a valid credential of another kind (a client token on a Worker method) is PERMISSION_DENIED.
    Tokens are compared in constant time.
    """

    def __init__(
        self, rules: Mapping[str, Mapping[str, Credential] | None], *, known: Mapping[str, Credential]
    ) -> None:
        self._rules = sorted(rules.items(), key=lambda item: -len(item[0]))
        self._known = dict(known)
        self.refused = 0
        """Calls refused so far (the log shows the first ones and then every thousandth)."""

    def _rule(self, method: str) -> Mapping[str, Credential] | None:
        """The credentials ``method`` accepts; None when it is open (no rule, or a rule saying open)."""
        for prefix, accepted in self._rules:
            if method == prefix or (prefix.endswith("/") and method.startswith(prefix)):
                return accepted
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        accepted = self._rule(details.method)
        if accepted is None:
            return await continuation(details)
        presented = _bearer(details.invocation_metadata)
        if presented is not None and _any_matches(presented, accepted.values()):
            return await continuation(details)
        issuing = [c for c in accepted.values() if isinstance(c, CallToken) and c.pending]
        if presented is not None and issuing:  # the master may already use the token its reply carries
            for token in issuing:
                await token.settled()
            if _any_matches(presented, accepted.values()):
                return await continuation(details)
        wanted = " or ".join(accepted)
        if presented is None:
            code, message = grpc.StatusCode.UNAUTHENTICATED, f"{details.method} needs the {wanted} (no credential)."
        elif _any_matches(presented, self._known.values()):
            code, message = grpc.StatusCode.PERMISSION_DENIED, f"{details.method} needs the {wanted}; this "
            message += "credential is valid but not for this method."
        else:
            code = grpc.StatusCode.UNAUTHENTICATED
            message = f"{details.method} needs the {wanted} (invalid credential)."
        self.refused += 1
        level = logging.WARNING if self.refused <= 10 or self.refused % 1000 == 0 else logging.DEBUG
        log.log(level, "refused %s: %s (%d calls refused so far)", details.method, code.name, self.refused)
        handler = await continuation(details)
        return _refusing(handler, code, message)


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _any_matches(presented: str, credentials: Iterable[Credential]) -> bool:
    """``presented`` equals one of ``credentials`` (constant-time comparisons, every one made)."""
    results = [_equal(presented, c) if isinstance(c, str) else c.matches(presented) for c in credentials]
    return any(results)


def _bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == AUTH_METADATA_KEY and isinstance(value, str) and value.startswith(_BEARER):
            return value[len(_BEARER) :]
    return None


def _refusing(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that aborts every call with ``code``."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def deny_upload(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # a client-streaming caller (LoadJob) is still writing: read what it sends, boundedly, so the refusal
        # does not land on a write (grpcio's aio client would report INTERNAL in its place, grpc/grpc#36066);
        # a bidirectional caller (Session) is refused at once: it reads the status before it writes
        await drain_untrusted(requests)
        await context.abort(code, message)

    async def deny_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if handler is None:  # unknown method: refuse anyway, so probing method names reveals nothing
        return grpc.unary_unary_rpc_method_handler(deny)
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny_upload, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **serializers)
    return grpc.unary_unary_rpc_method_handler(deny, **serializers)


# ---- client interceptors: the bearer on every call -----------------------------------------------------
def _with_bearer(details: grpc.aio.ClientCallDetails, bearer: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(AUTH_METADATA_KEY, _BEARER + bearer)
    return grpc.aio.ClientCallDetails(
        method=details.method, timeout=details.timeout, metadata=metadata,
        credentials=details.credentials, wait_for_ready=details.wait_for_ready,
    )  # fmt: skip


class _BearerUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, bearer: str) -> None:
        self.bearer = bearer

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_bearer(details, self.bearer), request)


class _BearerUnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, bearer: str) -> None:
        self.bearer = bearer

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_bearer(details, self.bearer), request)


class _BearerStreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, bearer: str) -> None:
        self.bearer = bearer

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_bearer(details, self.bearer), request_iterator)


class _BearerStreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, bearer: str) -> None:
        self.bearer = bearer

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_bearer(details, self.bearer), request_iterator)


def _bearer_interceptors(bearer: str) -> list[Any]:
    kinds = (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)
    return [kind(bearer) for kind in kinds]


# ---- flags and environment ------------------------------------------------------------------------------
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be one of {sorted(_TRUE | _FALSE)}, not {value!r}.")


def add_security_arguments(parser: argparse.ArgumentParser, *, role: str) -> None:
    """TLS and authentication flags for ``role`` (``master``, ``worker`` or ``client``), each with its variable.

    Secrets are best given through the environment: command lines are visible to other users (``ps``).
    """
    env = os.environ.get
    g = parser.add_argument_group("security (see the README's Security section)")
    mine = "the certificate this process presents" if role == "client" else "this server's certificate"
    g.add_argument("--tls-cert", type=Path, default=env("GRADCODE_TLS_CERT") or None, metavar="PEM",
                   help=f"{mine} (PEM) [GRADCODE_TLS_CERT]")  # fmt: skip
    g.add_argument("--tls-key", type=Path, default=env("GRADCODE_TLS_KEY") or None, metavar="PEM",
                   help="its private key (PEM) [GRADCODE_TLS_KEY]")  # fmt: skip
    g.add_argument("--tls-ca", type=Path, default=env("GRADCODE_TLS_CA") or None, metavar="PEM",
                   help="CA certificate that signed the cluster's certificates; turns TLS on for outgoing "
                   "channels [GRADCODE_TLS_CA]")  # fmt: skip
    g.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                   help="TLS for outgoing channels even without --tls-ca, trusting the system's CAs "
                   "[GRADCODE_TLS=1]")  # fmt: skip
    g.add_argument("--mtls", action=argparse.BooleanOptionalAction, default=None,
                   help="mutual TLS: servers require, and channels present, certificates signed by --tls-ca "
                   "[GRADCODE_MTLS=1]")  # fmt: skip
    g.add_argument("--tls-server-name", default=env("GRADCODE_TLS_SERVER_NAME") or None, metavar="NAME",
                   help="name to verify in the servers' certificates instead of the address's host "
                   "[GRADCODE_TLS_SERVER_NAME]")  # fmt: skip
    if role in ("master", "client"):
        g.add_argument("--token", default=env("GRADCODE_TOKEN") or None, metavar="SECRET",
                       help=("token clients must present" if role == "master" else "token to present to the master")
                       + " (prefer the variable) [GRADCODE_TOKEN]")  # fmt: skip
    if role in ("master", "worker"):
        g.add_argument("--join-secret", default=env("GRADCODE_JOIN_SECRET") or None, metavar="SECRET",
                       help="shared secret workers present to register; the master then gives each worker "
                       "its own call token for the master's calls (prefer the variable) "
                       "[GRADCODE_JOIN_SECRET]")  # fmt: skip
        g.add_argument("--reflection", action=argparse.BooleanOptionalAction, default=None,
                       help="serve gRPC reflection (default: on without authentication, off with it) "
                       "[GRADCODE_REFLECTION]")  # fmt: skip
        g.add_argument("--insecure", action=argparse.BooleanOptionalAction, default=None,
                       help="listen on a non-loopback address even without TLS and a join secret (refused "
                       "otherwise): only on a network you trust completely [GRADCODE_INSECURE]")  # fmt: skip


def security_from_args(args: argparse.Namespace) -> Security:
    """The :class:`Security` the flags (or their variables) describe; ValueError naming what is wrong."""
    mutual = args.mtls if args.mtls is not None else bool(_env_flag("GRADCODE_MTLS"))
    tls = args.tls if args.tls is not None else bool(_env_flag("GRADCODE_TLS"))
    reflection = getattr(args, "reflection", None)
    if reflection is None:
        reflection = _env_flag("GRADCODE_REFLECTION")
    insecure = getattr(args, "insecure", None)
    if insecure is None:
        insecure = bool(_env_flag("GRADCODE_INSECURE"))
    security = Security(
        cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, mutual=mutual, tls=tls,
        token=getattr(args, "token", None), join_secret=getattr(args, "join_secret", None),
        reflection=reflection, server_name=args.tls_server_name, insecure=insecure,
    )  # fmt: skip
    security.server_credentials()  # read every file now: a missing one is a usage error, not a crash later
    security.channel_credentials()
    return security


def security_from_env() -> Security:
    """The client-side :class:`Security` from the GRADCODE_* variables alone (SDK and health check defaults)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_security_arguments(parser, role="client")
    return security_from_args(parser.parse_args([]))
