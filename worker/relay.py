"""A job's model relayed between workers (``ComputeRequest.relayed_model``, ``Worker.FetchModel``), worker side.

The master of a flat job with ``JobSpec.model_delivery`` "relay" sends each iteration's model inline to one worker and
tells the others to fetch it from a peer (:mod:`gradcode.master.rounds`), so its own link carries the model about once
instead of once per worker. Every worker keeps the models it received for its own Computes (:class:`HeldModels`, the
last :data:`HeldModels.KEEP` iterations) and serves them to its job's peers; a worker told to fetch one
(:class:`PeerFetcher`) checks its length and BLAKE3 digest (:func:`~gradcode.common.transport.wire.model_digest`)
against what the master sent, so a stale or lying peer is caught and never yields a gradient.

A fetch waits as long as its peer shows progress. A peer that does not hold the model yet (its own request, or its
own fetch, still arriving) answers FetchModel with an empty reply every :data:`HEARTBEAT_SECONDS` until it does, then
with the model in pieces of up to :data:`PART_BYTES`; the fetcher gives up only when its peer says nothing for
:data:`STALL_SECONDS` of its own listening (a frozen or vanished peer; a fetcher held up itself does not count the
time it could not listen) or after :data:`LONGEST_WAIT_SECONDS` in all (a peer that only
ever says it is waiting, or sends without end). A fixed deadline per hop, as before 2026-11-29, failed live relays
on starved hosts: at n = 24 workers of 6 % of a core, p = 1e6, a seed sometimes did not answer its fetchers within
the one hop's 2.3 s (its own 8 MB request still on the master's link, or the seed too starved to serve), every fetch
below it failed, and the master sent the model inline to 13-23 workers through its 200 Mbit/s link; those copies
delayed the next iteration's seed in turn, and the relay stayed collapsed (8.9 s an iteration instead of 2.1). With
heartbeats alone and the model in one 8 MB message, fetchers three hops deep still found their peers silent for a
stall of 1.4 s in a first iteration: a peer's model is progress too.

Failure is simple on purpose: a fetch that fails (a dead peer, a silent one, a wrong digest) ends the worker's
Compute with FAILED_PRECONDITION (:class:`ModelUnavailableError`), and the master sends that worker the model inline
at once, in the same round. The worker does not hunt for another peer: the master already knows who holds the model
(itself), and one inline copy for a failed fetch keeps the bytes bounded and the answer exact. A peer whose own
fetch failed tells its waiting fetchers at once (:meth:`HeldModels.fail`), so a failure does not cost each level of
the relay a wait.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
import numpy as np

from gradcode.common.codes.base import Array
from gradcode.common.exceptions import FailedPreconditionError
from gradcode.common.transport.security import Security, short
from gradcode.common.transport.wire import CHANNEL_OPTIONS, FLOAT64, MODEL_DIGEST_BYTES, float64_parts, model_digest
from gradcode.v1 import worker_pb2, worker_pb2_grpc

__all__ = [
    "HEARTBEAT",
    "HEARTBEAT_SECONDS",
    "LONGEST_WAIT_SECONDS",
    "MAX_HOPS",
    "PART_BYTES",
    "STALL_SECONDS",
    "HeldModels",
    "ModelUnavailableError",
    "PeerFetcher",
    "check_relayed",
    "relayed",
]

HEARTBEAT_SECONDS = 0.25
"""How often a peer that does not hold the model it is asked for yet says it is still waiting for it."""
HEARTBEAT = b""
"""That word: an empty FetchModelReply (no ``part``), serialized."""
PART_BYTES = 4 << 20
"""The most model bytes one FetchModelReply carries, each piece a sign of progress: 2 pieces for a p = 1e6 model,
20 for p = 1e7 (0.2 s each at 20 MB/s). Each piece costs both ends a turn of their event loops: on hosts of 6 % of a
core, with pieces of 1 MiB the relayed model of p = 1e6 reached its fetchers 0.81-0.98 s after their requests
(medians of three jobs of one run), against 0.54-0.66 s as one message (another run, not interleaved)."""
STALL_SECONDS = 1.5
"""How long a fetcher waits for any word from its peer (a heartbeat, or the model's next piece) before it takes the
peer for frozen or gone: under the master's floor for asking a silent worker again
(:attr:`gradcode.master.rounds.AnswerTimes.FLOOR_SECONDS`, 2 s), so a frozen seed costs one stall, then an inline
copy (at the floor itself, the e2e test of a frozen seed found the master asking the fetchers again first, once
under load); a piece needs 0.2 s at 20 MB/s, and the rest is room for a starved host's event loop."""
LISTEN_SECONDS = 0.25
"""The slice of a fetcher's listening: how much of a stall one late wake-up of its event loop can count for."""
MAX_HOPS = 32
"""The most fetches a relayed model may pass (``RelayedModel.hops``): a fan-out-3 relay reaches 3**32 workers."""
LONGEST_WAIT_SECONDS = 60.0
"""How long a peer waits, at most, for a model it does not hold yet while its fetchers wait for it, and so about the
longest a fetch lasts (one more stall): a model behind 1.5 GB on a 200 Mbit/s master link. A peer that only ever
says it is waiting, or sends pieces without end, is dropped then."""


class ModelUnavailableError(FailedPreconditionError):
    """The relayed model could not be had from the peer: ask again with the model inline (FAILED_PRECONDITION)."""


class _NotYetError(ModelUnavailableError):
    """The model was not held within the wait (it may still come)."""


class HeldModels:
    """The models one job's worker holds, by iteration (the last :data:`KEEP`), for its peers' FetchModel: each is
    the array a Compute of that iteration was admitted with, or why this worker could not get it (its own fetch
    failed), so peers waiting for it learn that at once."""

    KEEP = 2

    def __init__(self) -> None:
        self._models: dict[int, Array | str] = {}
        self._changed = asyncio.Event()
        self._reply: tuple[Array, list[bytes]] | None = None
        """The last model's FetchModel replies serialized, and the model they carry: made at a model's first fetch
        and sent to every later one (encoding a p = 1e6 model takes milliseconds of a core, and a peer serves up to
        three fetchers: the relay's ``RELAY_FANOUT``); a model held since is another array, so never served stale."""

    def hold(self, iteration: int, params: Array) -> None:
        """``params`` is iteration ``iteration``'s model (it replaces a failure: the master sent it inline since)."""
        self._put(iteration, params)

    def fail(self, iteration: int, reason: str) -> None:
        """This worker could not get ``iteration``'s model; a model already held stays."""
        if self.held(iteration) is None:
            self._put(iteration, reason)

    def held(self, iteration: int) -> Array | None:
        value = self._models.get(iteration)
        return None if value is None or isinstance(value, str) else value

    def _put(self, iteration: int, value: Array | str) -> None:
        self._models[iteration] = value
        for old in sorted(self._models)[: -self.KEEP]:
            del self._models[old]
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, iteration: int, seconds: float) -> Array:
        """Iteration ``iteration``'s model, waiting up to ``seconds`` for it to arrive; ModelUnavailableError when it
        does not, when this worker failed to get it, or when it is older than the models kept."""
        try:
            async with asyncio.timeout(seconds):
                while (value := self._models.get(iteration)) is None:
                    if self._models and iteration < min(self._models):
                        raise ModelUnavailableError(
                            f"This worker no longer holds the model of iteration {iteration} (it keeps the last "
                            f"{self.KEEP}: {sorted(self._models)})."
                        )
                    changed = self._changed
                    await changed.wait()
        except TimeoutError:
            raise self._not_yet(iteration, seconds) from None
        if isinstance(value, str):
            raise ModelUnavailableError(f"This worker could not get the model of iteration {iteration}: {value}")
        return value

    def _not_yet(self, iteration: int, seconds: float) -> _NotYetError:
        return _NotYetError(
            f"This worker holds no model of iteration {iteration} (waited {seconds:g} s; it holds "
            f"{sorted(self._models) or 'none'})."
        )

    async def replies(self, iteration: int, seconds: float) -> AsyncIterator[bytes]:
        """FetchModel's serialized replies for iteration ``iteration``: a :data:`HEARTBEAT` every
        :data:`HEARTBEAT_SECONDS` while this worker waits for the model (up to ``seconds``), then the model's pieces,
        encoded once per model however many peers fetch it; ModelUnavailableError as :meth:`wait` raises it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            left = deadline - loop.time()
            try:
                params = await self.wait(iteration, min(HEARTBEAT_SECONDS, max(left, 0.0)))
                break
            except _NotYetError:
                if left <= HEARTBEAT_SECONDS:
                    raise self._not_yet(iteration, seconds) from None
                yield HEARTBEAT
        if self._reply is None or self._reply[0] is not params:
            self._reply = (params, float64_parts(worker_pb2.FetchModelReply, "part", params, PART_BYTES))
        for part in self._reply[1]:
            yield part


class PeerFetcher:
    """One job's fetches from its peers: a channel per peer (kept for the job's life), each fetch checked."""

    def __init__(self, job_id: str, security: Security) -> None:
        self.job_id = job_id
        self.security = security
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}

    def _stub(self, address: str, bearer: str) -> worker_pb2_grpc.WorkerStub:
        channel = self._channels.get((address, bearer))
        if channel is None:
            presented = bearer or self.security.worker_call_token
            channel = self.security.channel(address, bearer=presented, options=CHANNEL_OPTIONS)
            self._channels[(address, bearer)] = channel
        return worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]

    async def fetch(self, relay: worker_pb2.RelayedModel, iteration: int) -> Array:
        """Iteration ``iteration``'s model as the peer ``relay`` names sends it, of the length ``relay`` says (its
        digest is :func:`relayed`'s to check), waiting as long as the peer shows progress; ModelUnavailableError
        naming the peer and what went wrong after its silence of :data:`STALL_SECONDS`, or
        :data:`LONGEST_WAIT_SECONDS` and a stall in all."""
        peer = short(relay.address)
        model = bytearray(8 * int(relay.length))
        filled = 0
        call = self._stub(relay.address, relay.bearer).FetchModel(
            worker_pb2.FetchModelRequest(job_id=self.job_id, iteration=iteration),
            timeout=LONGEST_WAIT_SECONDS + STALL_SECONDS,
        )
        try:
            while filled < len(model):
                reply = await _unless_silent(call.read())
                if reply is grpc.aio.EOF:
                    raise ModelUnavailableError(
                        f"peer {peer} ended its answer after {filled} of the model's {len(model)} bytes"
                    )
                if len(reply.part) > len(model) - filled:
                    call.cancel()
                    raise ModelUnavailableError(f"peer {peer} sent more than the model's {len(model)} bytes")
                model[filled : filled + len(reply.part)] = reply.part
                filled += len(reply.part)
        except TimeoutError:
            call.cancel()
            raise ModelUnavailableError(
                f"peer {peer} said nothing for {STALL_SECONDS:g} s ({filled} of the model's {len(model)} bytes in; the "
                f"model {max(1, relay.hops)} fetches from the master's copy): frozen, gone or starved"
            ) from None
        except grpc.aio.AioRpcError as exc:
            raise ModelUnavailableError(
                f"fetching it from peer {peer} failed ({exc.code().name}: {exc.details()})"
            ) from None
        return np.frombuffer(model, dtype="<f8")

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


_Word = TypeVar("_Word")


async def _unless_silent(word: Awaitable[_Word]) -> _Word:
    """The peer's next ``word`` (a reply, or EOF); TimeoutError once it has said nothing for :data:`STALL_SECONDS` of
    the time this fetcher was listening.

    Silence is counted in :data:`LISTEN_SECONDS` slices, each counting at most its own length: a fetcher whose own
    event loop was held up (a starved or paused host, a long call on its loop) wakes with its timer due before it has
    read what came meanwhile, and a plain timeout then blamed the peer. On the emulated cluster (n = 24 hosts of 6 % of
    a core, p = 1e6) ten fetchers on four peers failed within 90 ms of each other, no heartbeat read, in the second
    the kernel's OOM killer ended a worker (workers then kept every ended job's memory): a host short of memory
    stalls every process on it, fetchers included. A peer frozen while its fetcher runs is still dropped after
    :data:`STALL_SECONDS`."""
    loop = asyncio.get_running_loop()
    read = asyncio.ensure_future(word)
    silence = 0.0
    try:
        while silence < STALL_SECONDS:
            started = loop.time()
            done, _ = await asyncio.wait((read,), timeout=LISTEN_SECONDS)
            if done:
                return read.result()
            silence += min(loop.time() - started, LISTEN_SECONDS)
    finally:
        if not read.done():
            read.cancel()
    raise TimeoutError


def check_relayed(relay: worker_pb2.RelayedModel, num_params: int) -> None:
    """ValueError unless ``relay`` names a peer and a model of this job's size with a full digest."""
    if not relay.address:
        raise ValueError("relayed_model names no peer address.")
    if relay.length != num_params:
        raise ValueError(f"relayed_model.length is {relay.length}; this job's model has {num_params} parameters.")
    if len(relay.digest) != MODEL_DIGEST_BYTES:
        raise ValueError(f"relayed_model.digest is {len(relay.digest)} bytes; a digest is {MODEL_DIGEST_BYTES}.")
    if relay.hops > MAX_HOPS:
        raise ValueError(f"relayed_model.hops is {relay.hops}; a relayed model passes at most {MAX_HOPS} fetches.")


async def relayed(
    held: HeldModels,
    relay: worker_pb2.RelayedModel,
    iteration: int,
    fetch: Callable[[], Awaitable[Array]],
    check: Callable[[Array], Array],
) -> Array:
    """The relayed model of ``iteration``: the one this worker holds already, else ``fetch``'s, ``check``ed and then
    held for its own peers; either only when its digest is ``relay``'s (a stale or lying peer's model is never used).
    A failure is held too (peers waiting for this worker's model learn it at once) and raised as
    ModelUnavailableError."""
    params = held.held(iteration)
    if params is not None and _digest_matches(params, relay):
        return params
    try:
        params = check(await fetch())
        if not _digest_matches(params, relay):
            raise ModelUnavailableError(
                f"peer {short(relay.address)} sent a model whose BLAKE3 digest is not the master's (a stale or lying "
                "peer); it is not used"
            )
    except (ModelUnavailableError, ValueError) as exc:
        held.fail(iteration, str(exc))
        raise ModelUnavailableError(
            f"The relayed model of iteration {iteration} is unavailable: {exc}. Send it inline."
        ) from None
    held.hold(iteration, params)
    return params


def _digest_matches(params: Array, relay: worker_pb2.RelayedModel) -> bool:
    return params.dtype == FLOAT64 and hmac.compare_digest(model_digest(params), relay.digest)
