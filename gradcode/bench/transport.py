"""How fast is gradcode's transport? Gradient streaming and per-iteration overhead against the machine's limits.

    python -m gradcode.bench.transport [--quick] [--out DIR]

Everything runs on loopback with real processes, in one run, so the limits are this machine's now.

**Gradient streaming.** One real worker process (``python -m gradcode.worker``) holds a linear-regression
job with p parameters (one sample, one partition, one row: the compute is tiny), for p in {1e4, 1e5, 1e6,
4e6}. This process plays the master: it sends a Compute on the worker's Session (the model, 8p bytes, down,
as the master does), reassembles the streamed message (8p bytes, up) with
:class:`gradcode.common.transport.wire.MessageAssembler` and stops the clock when the message is complete. ``transport
= total - compute``, where ``compute`` is the worker's own ``compute_seconds`` from the message trailer; the
transport rate is ``16p bytes / transport``. It is compared with, measured in rounds interleaved with the
Compute calls (so slow drift of a shared machine hits all of them alike), medians over the rounds:

* ``raw``: a bare gRPC unary-stream call on raw bytes to a second process (no protobuf messages, no
  numpy): 8p bytes down, 8p bytes up in pre-built 1 MiB chunks; what gRPC itself costs;
* ``loopback``: the same bytes exchanged the same way (8p down, then 8p up) with a third process over a
  plain TCP socket on 127.0.0.1 (``sendall`` of the whole buffer, ``recv_into`` in 4 MiB pieces): the
  machine's loopback TCP limit for this pattern;
* ``memcpy``: ``numpy.copyto`` of the same 16p bytes between two preallocated arrays;
* ``link``: the same Compute on the worker's link (:mod:`gradcode.common.transport.link`: the Session over plain TCP
  that the master uses by default), called right after the one on the gRPC Session;
* ``shared``: the same Compute through a shared-memory directory this process offered and the worker
  accepted (:mod:`gradcode.common.transport.shared_memory`): the model written once into its tmpfs slot, the
  message left in the worker's slot, only header and trailer on the worker's link.

The master's ``ingest`` over gRPC and over the link (first chunk of the message to the complete message) is
compared with one-way loopback TCP for the same bytes. Then the CPU one Compute costs on each end, per path:
the worker process's and this process's CPU time (``/proc``, ``time.process_time``) over blocks of
calls alternating between gRPC and shared memory, beside the worker's gradient time.

``x raw`` / ``x loop`` / ``x copy`` = that time / gradcode's transport time (1.0 would be as fast as
the limit). The ``codec`` columns time, in this process and without any socket, the protobuf/numpy work
the path does on the same bytes: the master's request encoding, the worker's request decoding, the
worker's chunking (with its XXH3-64 checksum) and serialization, and the master's parsing and reassembly (with
the checksum's check); the rest of the transport time is gRPC (HTTP/2 framing, flow control, its copies, the event
loops) and the socket.

**Chunk size.** The same Compute measurement at p = 1e6 with the worker's chunk size (its
``--chunk-bytes`` option; default :data:`gradcode.common.transport.wire.DEFAULT_CHUNK_BYTES`)
set to 64 KiB, 256 KiB, 1 MiB and 4 MiB, one worker process per size, all alive at once and called
round-robin.

**TLS on the stream.** Coded-gradient ingest at p = 1e6 over plaintext and over mutual TLS
(grpcio's own credentials, throw-away certificates from :func:`gradcode.client.certs.make_certificates`):
two worker processes, alike but for TLS, called alternately (plaintext, TLS, plaintext, ...). Per mode,
medians of the Compute call's ``transport`` (total - compute, as above: the model down and the message
up) and of its ``ingest``, the time from the first chunk of the message to the complete message (the
master receiving, checking and reassembling the rest of the stream); the TLS / plaintext ratio of
each; and the load average (``/proc/loadavg``) before and after, beside the figures.

**Per-iteration overhead.** Three :class:`gradcode.client.launch.LocalCluster` s with 8 worker processes
each: one whose master sends every payload on the workers' gRPC Sessions (``--shared-memory off --link
off``), one on their links (``--shared-memory off``), one with the default (shared memory for workers on its
host, headers on the links); jobs of softmax regression on the digits data with ``cyclic`` (s = 1)
and ``uncoded`` for n in {4, 8}, no stragglers, 30 iterations each, run through the SDK on each cluster
in turn, configuration by configuration. From the reports (first two iterations left out),
medians of ``wall_seconds`` (request to optimizer step), ``decode_seconds`` (decoder + combine),
``first`` and ``gather`` (iteration start to the first and to the last message used: the smallest and
largest worker timing) and the period between reports. They are compared with the gRPC unary round
trip to one worker (a health ``Check``, median of many) measured in the same run.
``overhead = wall - compute``, where ``compute`` is one worker's gradient time for its partitions
measured in this process (workers compute in parallel); it is reported as a multiple of the round
trip, with the share of it that is decode.

**The wide model** (the n = 16, p = 1e5 target). The same jobs with 16 workers on linear regression
with p = 1e5 parameters and 40 samples (compute under 1 ms), on both paths, against the transfers they
need: ``one`` = one Compute's transport time at p = 1e5 on that path from the streaming stage, and
``master`` = every model sent (n × 8p bytes) and every used message received through the master at that
rate, which one master process must move one after the other.

Prints the tables and saves ``transport.json`` and ``transport.png`` in ``docs/results/`` (or
``--out``). ``--quick`` is a smoke run of a few seconds with small sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gradcode.bench.output import (
    RESULTS,
    benchmark_parser,
    cluster_pids,
    cpu_seconds,
    figure,
    job_medians,
    load_average,
    run_with_cpu,
    save,
    up_workers,
)
from gradcode.client.launch import LocalCluster, ServiceProcess, service_env
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.ops.cli import freeze_startup_objects
from gradcode.common.transport.link import open_link
from gradcode.common.transport.security import Security
from gradcode.common.transport.serving import limit_blas_threads, reuse_large_buffers
from gradcode.common.transport.session import Session
from gradcode.common.transport.shared_memory import DEFAULT_ROOT, SharedDirectory
from gradcode.common.transport.wire import (
    CHANNEL_OPTIONS,
    DEFAULT_CHUNK_BYTES,
    MessageAssembler,
    array_from_tensor,
    chunk_bytes_for,
    message_chunk_bytes,
    model_request_bytes,
    parse_chunk,
    payload_digest,
    row_definition,
)
from gradcode.v1 import common_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["main", "run"]

KiB = 1024
MiB = 1024 * KiB

FULL_SIZES = (10_000, 100_000, 1_000_000, 4_000_000)
QUICK_SIZES = (10_000, 100_000)
FULL_CHUNKS: tuple[int | None, ...] = (None, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB)
QUICK_CHUNKS: tuple[int | None, ...] = (None, 64 * KiB)
"""Worker chunk sizes swept; None is the default, :func:`gradcode.common.transport.wire.chunk_bytes_for` the message
size."""
FULL_CHUNK_P = 1_000_000
QUICK_CHUNK_P = 100_000
FULL_TLS_P = 1_000_000
QUICK_TLS_P = 100_000
FULL_REPEATS = 15
QUICK_REPEATS = 3
WARMUP_CALLS = 2
FULL_CLUSTER = (4, 8)
QUICK_CLUSTER = (4,)
SCHEMES = (("cyclic", 1), ("uncoded", 0))
FULL_ITERATIONS = 30
QUICK_ITERATIONS = 8
FULL_RTT_CALLS = 300
QUICK_RTT_CALLS = 50
FULL_WIDE_CLUSTER = (16,)
QUICK_WIDE_CLUSTER = (4,)
"""Workers of the wide-model overhead stage (the issue's n = 16, p = 1e5 target)."""
CPU_BLOCKS = 4
CPU_BLOCK_SECONDS = 0.15
"""The per-call CPU stage: blocks per path, and about how long one block of calls lasts."""
FULL_SHAPE_ROUNDS = 1000
QUICK_SHAPE_ROUNDS = 100
FULL_SHAPE_SERVERS = (1, 16)
QUICK_SHAPE_SERVERS = (1, 4)
"""The call-shape stage: rounds per shape, and how many bare servers each round asks at once."""
RECV_PIECE = 4 * MiB
CALL_TIMEOUT = 120.0
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Workload:
    """The model and data of the per-iteration overhead jobs (as named in a JobSpec)."""

    name: str
    model: str
    dataset: str
    num_samples: int = 0
    num_features: int = 0


DIGITS = Workload("softmax regression on digits, p = 650", "softmax", "digits")
WIDE = Workload("linear regression, p = 1e5", "linear", "linear", num_samples=40, num_features=99_999)
"""A wide model with little data: the compute is ~1 ms, so the overhead shows (p = features + bias)."""
WIDE_PARAMETERS = 100_000


# ---- helpers -------------------------------------------------------------------------------------------
def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (after one untimed call)."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _worker_argv(chunk_bytes: int | None) -> list[str]:
    """``python -m gradcode.worker`` on loopback, its gradient messages in ``chunk_bytes`` chunks (None: default)."""
    argv = [sys.executable, "-m", "gradcode.worker", "--listen", "127.0.0.1:0"]
    return argv if chunk_bytes is None else [*argv, "--chunk-bytes", str(chunk_bytes)]


# ---- gradient streaming over gRPC -----------------------------------------------------------------------
def _linear_job(p: int, shared: SharedDirectory | None = None) -> tuple[str, Iterator[worker_pb2.LoadJobChunk]]:
    """A linear-regression job with p parameters (p - 1 features + bias), one sample, one row = one partition;
    with ``shared``, offering that shared-memory directory."""
    job_id = f"transport-p{p}" + ("-shared" if shared is not None else "")
    features = np.random.default_rng(p).standard_normal(p - 1).tobytes()
    setup = worker_pb2.JobSetup(
        job_id=job_id,
        worker_id=0,
        model=common_pb2.ModelSpec(kind="linear", num_features=p - 1),
        rows=[row_definition(0, [0], [1.0])],
        num_partitions_sent=1,
    )
    if shared is not None:
        offer = shared.offer(0)
        if offer is None:
            raise RuntimeError(f"cannot write the shared-memory nonce into {shared.path}")
        setup.shared_memory.CopyFrom(offer)

    def chunks() -> Iterator[worker_pb2.LoadJobChunk]:
        yield worker_pb2.LoadJobChunk(setup=setup)
        for start in range(0, len(features), DEFAULT_CHUNK_BYTES):
            data = worker_pb2.PartitionData(
                partition=0,
                num_samples=1,
                features_offset=start,
                features=features[start : start + DEFAULT_CHUNK_BYTES],
            )
            if start == 0:
                data.labels = np.ones(1).tobytes()
            yield worker_pb2.LoadJobChunk(data=data)

    return job_id, chunks()


class CallTiming(NamedTuple):
    """One Compute call as the master saw it."""

    total: float
    """Seconds from the request until the message is complete."""
    compute: float
    """The worker's own compute_seconds (message trailer)."""
    chunks: int
    first: float
    """Seconds from the request until the message's first chunk arrived."""


async def _compute_call(
    session: Session, job_id: str, iteration: int, params: Any, shared: SharedDirectory | None = None
) -> CallTiming:
    """One Compute as the master makes it (a request on the worker's Session), timed; with ``shared``, through
    that shared-memory directory (the worker accepted it when the job was loaded)."""
    p = len(params)
    started = time.perf_counter()
    head = worker_pb2.ComputeRequest(job_id=job_id, iteration=iteration, worker_id=0, rows=[0])
    if shared is None:
        body = model_request_bytes(params)  # as the master sends it
        reader = None
    else:
        head.shared_model.CopyFrom(shared.write_model(params))
        body = b""
        reader = functools.partial(shared.message, 0)
    assembler = MessageAssembler(job_id=job_id, iteration=iteration, worker_id=0, rows=(0,), length=p, shared=reader)
    done = None
    count = 0
    first = 0.0
    async with asyncio.timeout(CALL_TIMEOUT):
        compute = session.compute(head, body)
        compute.place = assembler.place  # as the master's round does
        async for chunk in compute:
            if not count:
                first = time.perf_counter() - started
            count += 1
            done = assembler.feed(chunk) or done
    elapsed = time.perf_counter() - started
    if done is None or not assembler.complete:
        raise RuntimeError(f"Compute for p={p} ended without a complete message.")
    return CallTiming(elapsed, done.compute_seconds, count, first)


def _summary(calls: Sequence[CallTiming]) -> dict[str, float]:
    """Medians of total, compute and transport (= total - compute, per call) seconds."""
    return {
        "total_s": statistics.median(c[0] for c in calls),
        "compute_s": statistics.median(c[1] for c in calls),
        "transport_s": statistics.median(c[0] - c[1] for c in calls),
        "chunks": calls[0][2],
    }


async def _time_workers(addresses: Sequence[str], p: int, repeats: int) -> list[dict[str, float]]:
    """Load the size-p job on every worker, then time Compute calls round-robin across them; per worker."""
    channels = [grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) for address in addresses]
    try:
        return [_summary(record) for record in await _timed_calls(channels, p, repeats)]
    finally:
        for channel in channels:
            await channel.close(None)


async def _timed_calls(channels: Sequence[grpc.aio.Channel], p: int, repeats: int) -> list[list[CallTiming]]:
    """Load the size-p job through every channel, time Compute calls round-robin across them, end the job;
    the calls after the warm-up, per channel."""
    stubs = [worker_pb2_grpc.WorkerStub(channel) for channel in channels]  # type: ignore[no-untyped-call]
    job_id = ""
    for stub in stubs:
        job_id, chunks = _linear_job(p)
        await stub.LoadJob(chunks, timeout=CALL_TIMEOUT)
    params = np.random.default_rng(0).standard_normal(p)
    calls: list[list[CallTiming]] = [[] for _ in stubs]
    computes = [Session.on(channel) for channel in channels]
    for iteration in range(1, WARMUP_CALLS + repeats + 1):
        for compute, record in zip(computes, calls, strict=True):
            result = await _compute_call(compute, job_id, iteration, params)
            if iteration > WARMUP_CALLS:
                record.append(result)
    for session in computes:
        session.close()
    for stub in stubs:
        await stub.EndJob(worker_pb2.EndJobRequest(job_id=job_id), timeout=CALL_TIMEOUT)
    return calls


def _start_workers(
    chunk_sizes: Sequence[int | None], logs: Path, envs: Sequence[dict[str, str]] | None = None
) -> list[ServiceProcess]:
    """One worker process per chunk size (None: plain ``python -m gradcode.worker``), started concurrently;
    ``envs`` adds variables to each one's environment (e.g. TLS)."""
    processes: list[ServiceProcess] = []
    try:
        for i, chunk_bytes in enumerate(chunk_sizes):
            name = "worker" if chunk_bytes is None else f"worker-chunk-{chunk_bytes}"
            extra = envs[i] if envs is not None else {}
            name += "-tls" if extra else ""
            processes.append(
                ServiceProcess(_worker_argv(chunk_bytes), log_path=logs / f"{name}.log", env=service_env(extra))
            )
        for process in processes:
            process.wait_ready(START_TIMEOUT)
    except BaseException:
        for process in processes:
            process.stop()
        raise
    return processes


# ---- the limits: bare gRPC, loopback TCP, memory copy ------------------------------------------------------
RAW_SERVICE = "gradcode.bench.RawTransport"
RAW_METHOD = f"/{RAW_SERVICE}/Exchange"
"""A unary-stream method on raw bytes: the request is 8p bytes, the reply 8p bytes in pre-built chunks."""


async def _serve_raw(connection: Any) -> None:
    """Serve RAW_METHOD on loopback; the request's first 16 bytes say the reply's size and chunk size."""
    replies: dict[tuple[int, int], list[bytes]] = {}

    async def exchange(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        size, chunk = struct.unpack_from("<QQ", request)
        pieces = replies.get((size, chunk))
        if pieces is None:
            payload = np.random.default_rng(5).bytes(size)
            pieces = replies[(size, chunk)] = [payload[i : i + chunk] for i in range(0, size, chunk)]
        for piece in pieces:
            yield piece

    async def unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return request

    async def session(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(
        RAW_SERVICE,
        {
            "Exchange": grpc.unary_stream_rpc_method_handler(exchange),
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Session": grpc.stream_stream_rpc_method_handler(session),
        },
    )
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    connection.send(port)
    await asyncio.get_running_loop().run_in_executor(None, connection.recv)  # any message means stop
    await server.stop(None)


def _raw_peer(connection: Any) -> None:
    """Child process: the bare gRPC server, one BLAS thread like a worker."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    asyncio.run(_serve_raw(connection))


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    filled = 0
    while filled < len(view):
        got = sock.recv_into(view[filled : filled + RECV_PIECE])
        if got == 0:
            raise ConnectionError("loopback peer closed the connection early")
        filled += got


def _echo_peer(port: int) -> None:
    """Child process: per round, read (down, up) sizes, receive ``down`` bytes, send ``up`` bytes back."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(16)
        buffer = bytearray()
        while True:
            _recv_exactly(sock, memoryview(header))
            down, up = struct.unpack("<QQ", header)
            if down == 0 and up == 0:
                return
            if len(buffer) < max(down, up):
                buffer = bytearray(max(down, up))
            view = memoryview(buffer)
            _recv_exactly(sock, view[:down])
            sock.sendall(view[:up])


class LimitPeers:
    """Helper processes, alive together so their measurements interleave with the worker's calls.

    * ``raw_servers`` bare gRPC servers (:data:`RAW_METHOD`): gRPC's own cost for the same bytes and chunks;
    * a TCP echo peer: ``exchange`` sends n bytes over a plain socket and receives n bytes back.
    """

    def __init__(self, raw_servers: int = 1) -> None:
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe() for _ in range(raw_servers)]
        self._pipes = [ours for ours, _ in pipes]
        self._child_ends = [theirs for _, theirs in pipes]
        self._server = socket.create_server(("127.0.0.1", 0))
        self._raw = [context.Process(target=_raw_peer, args=(end,), daemon=True) for end in self._child_ends]
        echo = context.Process(target=_echo_peer, args=(self._server.getsockname()[1],), daemon=True)
        self._processes = [*self._raw, echo]
        self._socket: socket.socket | None = None
        self.raw_ports: list[int] = []

    def __enter__(self) -> LimitPeers:
        try:
            for process in self._processes:
                process.start()
            deadline = time.monotonic() + START_TIMEOUT
            for pipe in self._pipes:
                while not pipe.poll(0.05):
                    self._check_alive(deadline)
                self.raw_ports.append(int(pipe.recv()))
            self._server.settimeout(0.05)
            while self._socket is None:
                with contextlib.suppress(TimeoutError):
                    self._socket, _ = self._server.accept()
                if self._socket is None:
                    self._check_alive(deadline)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socket.settimeout(CALL_TIMEOUT)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_alive(self, deadline: float) -> None:
        for process in self._processes:
            if not process.is_alive():
                raise RuntimeError(f"helper process {process.name} exited with status {process.exitcode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the helper processes did not start within {START_TIMEOUT:.0f} s")

    @property
    def raw_port(self) -> int:
        """The first bare gRPC server's port."""
        return self.raw_ports[0]

    @property
    def raw_pids(self) -> list[int]:
        """The bare gRPC servers' process ids (for their CPU time)."""
        pids = [process.pid for process in self._raw if process.pid is not None]
        if len(pids) < len(self._raw):
            raise RuntimeError("the bare gRPC servers are not running")
        return pids

    def exchange(self, outgoing: memoryview, incoming: memoryview) -> None:
        """Send ``outgoing`` to the echo peer and receive ``len(incoming)`` bytes back."""
        assert self._socket is not None
        self._socket.sendall(struct.pack("<QQ", len(outgoing), len(incoming)))
        self._socket.sendall(outgoing)
        _recv_exactly(self._socket, incoming)

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.sendall(struct.pack("<QQ", 0, 0))
            self._socket.close()
            self._socket = None
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send("stop")
        for process in self._processes:
            if process.pid is not None:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
                    process.join()
            process.close()
        self._processes = []
        for connection in (*self._pipes, *self._child_ends):
            connection.close()
        self._server.close()


async def _raw_call(call: Any, request: bytes, size: int) -> float:
    started = time.perf_counter()
    received = 0
    async for piece in call(request, timeout=CALL_TIMEOUT):
        received += len(piece)
    elapsed = time.perf_counter() - started
    if received != size:
        raise RuntimeError(f"the bare gRPC reply had {received} bytes, expected {size}")
    return elapsed


def codec_times(p: int, repeats: int, chunk_bytes: int | None = None) -> dict[str, float]:
    """Median seconds of each protobuf/numpy step of one Compute's data path, without a socket."""
    params = np.random.default_rng(3).standard_normal(p)
    message = np.random.default_rng(4).standard_normal(p)

    def master_encode() -> bytes:
        head = worker_pb2.ComputeRequest(job_id="j", iteration=1, worker_id=0, rows=[0])
        return head.SerializeToString() + model_request_bytes(params)

    wire_request = master_encode()

    def worker_decode() -> object:
        return array_from_tensor(worker_pb2.ComputeRequest.FromString(wire_request).model)

    def worker_encode() -> list[bytes]:
        return list(message_chunk_bytes(message, job_id="j", iteration=1, worker_id=0, row=0, chunk_bytes=chunk_bytes))

    wire_chunks = worker_encode()

    def master_decode() -> object:
        assembler = MessageAssembler(job_id="j", iteration=1, worker_id=0, rows=(0,), length=p)
        done = None
        for data in wire_chunks:
            done = assembler.feed(parse_chunk(data)) or done
        return done

    return {
        "master_encode_s": median_time(master_encode, repeats),
        "worker_decode_s": median_time(worker_decode, repeats),
        "worker_encode_s": median_time(worker_encode, repeats),
        "master_decode_s": median_time(master_decode, repeats),
        "checksum_s": median_time(lambda: payload_digest(message), repeats),
    }


async def _cpu_in_blocks(
    variants: dict[str, Callable[[], Awaitable[object]]], per_block: int, peers: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Per variant and per run of it: CPU seconds of this process (``own_s``), of the ``peers`` processes together
    (``peers_s``), and wall seconds. Runs go in blocks of ``per_block`` alternating between the variants
    (A, B, A, B, :data:`CPU_BLOCKS` rounds), enough that /proc's 10 ms ticks blur little."""
    used = {name: [0.0, 0.0, 0.0] for name in variants}

    def peers_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in peers)

    for _ in range(CPU_BLOCKS):
        for name, run in variants.items():
            own, others, started = time.process_time(), peers_cpu(), time.perf_counter()
            for _ in range(per_block):
                await run()
            used[name][0] += time.process_time() - own
            used[name][1] += peers_cpu() - others
            used[name][2] += time.perf_counter() - started
    runs = CPU_BLOCKS * per_block
    return {
        name: {"own_s": a / runs, "peers_s": b / runs, "wall_s": w / runs, "runs": runs}
        for name, (a, b, w) in used.items()
    }


async def _call_cpu(
    jobs: dict[str, tuple[Session, str, SharedDirectory | None]], params: Any, worker_pid: int, first: int
) -> dict[str, dict[str, float]]:
    """CPU seconds one Compute call costs the worker process and this (the master's) process, per path (its
    session, job and shared-memory directory; :func:`_cpu_in_blocks`); iterations from ``first``, a new one for
    every call."""
    session, job_id, _ = next(iter(jobs.values()))
    estimate = (await _compute_call(session, job_id, first, params)).total
    per_block = max(2, min(15, round(CPU_BLOCK_SECONDS / max(estimate, 1e-4))))
    iterations = itertools.count(first + 1)

    def call(session: Session, job_id: str, shared: SharedDirectory | None) -> Callable[[], Awaitable[object]]:
        return lambda: _compute_call(session, job_id, next(iterations), params, shared)

    used = await _cpu_in_blocks({path: call(*job) for path, job in jobs.items()}, per_block, [worker_pid])
    return {path: {"worker_s": u["peers_s"], "master_s": u["own_s"], "calls": u["runs"]} for path, u in used.items()}


async def _measure_sizes(
    worker: ServiceProcess, peers: LimitPeers, sizes: Sequence[int], repeats: int
) -> list[dict[str, Any]]:
    """Per p: rounds of (gradcode Compute through gRPC, the same through shared memory, bare gRPC call, loopback
    TCP exchange, memory copy), medians; then the CPU each Compute costs on both ends, per path."""
    worker_address = worker.wait_ready()
    worker_channel = grpc.aio.insecure_channel(worker_address, options=CHANNEL_OPTIONS)
    raw_channel = grpc.aio.insecure_channel(f"127.0.0.1:{peers.raw_port}", options=CHANNEL_OPTIONS)
    linked: Session | None = None
    try:
        stub = worker_pb2_grpc.WorkerStub(worker_channel)  # type: ignore[no-untyped-call]
        compute = Session.on(worker_channel)
        linked = Session(await open_link(worker_channel, worker_address, Security(), START_TIMEOUT))
        raw = raw_channel.unary_stream(RAW_METHOD, request_serializer=None, response_deserializer=None)
        rows = []
        for p in sizes:
            job_id, chunks = _linear_job(p)
            await stub.LoadJob(chunks, timeout=CALL_TIMEOUT)
            shared = SharedDirectory.create()  # one per job, as the master makes them: its slots have the job's sizes
            if shared is None:
                raise RuntimeError(f"no shared-memory root ({DEFAULT_ROOT}) on this machine")
            shared_job, chunks = _linear_job(p, shared)
            reply = await stub.LoadJob(chunks, timeout=CALL_TIMEOUT)
            refused = shared.verdict(0, reply.shared_memory_proof)
            if refused:
                raise RuntimeError(f"the worker cannot use the shared-memory directory {shared.path}: {refused}")
            params = np.random.default_rng(0).standard_normal(p)
            half = 8 * p
            raw_request = struct.pack("<QQ", half, chunk_bytes_for(half)) + bytes(half - 16)  # gradcode's chunks
            outgoing, incoming = memoryview(np.random.default_rng(1).bytes(half)), memoryview(bytearray(half))
            copy_source = np.random.default_rng(2).standard_normal(2 * p)
            copy_target = np.empty_like(copy_source)
            calls: list[CallTiming] = []
            link_calls: list[CallTiming] = []
            shared_calls: list[CallTiming] = []
            raw_times: list[float] = []
            loop_times: list[float] = []
            copy_times: list[float] = []
            for iteration in range(1, WARMUP_CALLS + repeats + 1):
                call = await _compute_call(compute, job_id, iteration, params)
                link_call = await _compute_call(linked, job_id, iteration, params)
                shared_call = await _compute_call(linked, shared_job, iteration, params, shared)
                raw_s = await _raw_call(raw, raw_request, half)
                started = time.perf_counter()
                peers.exchange(outgoing, incoming)
                loop_s = time.perf_counter() - started
                started = time.perf_counter()
                np.copyto(copy_target, copy_source)
                copy_s = time.perf_counter() - started
                if iteration > WARMUP_CALLS:
                    calls.append(call)
                    link_calls.append(link_call)
                    shared_calls.append(shared_call)
                    raw_times.append(raw_s)
                    loop_times.append(loop_s)
                    copy_times.append(copy_s)
            paths = {
                "gRPC": (compute, job_id, None),
                "link": (linked, job_id, None),
                "shared memory": (linked, shared_job, shared),
            }
            cpu = await _call_cpu(paths, params, worker.process.pid, WARMUP_CALLS + repeats + 1)
            for job in (job_id, shared_job):
                await stub.EndJob(worker_pb2.EndJobRequest(job_id=job), timeout=CALL_TIMEOUT)
            shared.close()
            rows.append(
                {
                    "p": p,
                    **_summary(calls),
                    "ingest_s": statistics.median(c.total - c.first for c in calls),
                    "link": {
                        **_summary(link_calls),
                        "ingest_s": statistics.median(c.total - c.first for c in link_calls),
                    },
                    "shared": _summary(shared_calls),
                    "raw_grpc_s": statistics.median(raw_times),
                    "loopback_s": statistics.median(loop_times),
                    "memcpy_s": statistics.median(copy_times),
                    "cpu_per_call": cpu,
                }
            )
        return rows
    finally:
        if linked is not None:
            linked.close()
        await worker_channel.close(None)
        await raw_channel.close(None)


CALL_SHAPE_BYTES = 200
"""About a Compute request or a shared-memory reply: job, iteration, rows, and a header or a trailer."""


async def call_shapes(rounds: int, servers: int) -> dict[str, Any]:
    """CPU and wall time of exchanging a small message with each of ``servers`` bare gRPC servers at once (one
    round, as a master asks its workers), by the shape of the call: a new unary call, a new unary-stream call
    (Compute's shape, one reply), or one message each way on a long-lived bidirectional stream per server.
    Blocks of rounds alternate between the shapes; client CPU is this process's, server CPU all servers'."""
    message = bytes(CALL_SHAPE_BYTES)
    request = struct.pack("<QQ", CALL_SHAPE_BYTES, CALL_SHAPE_BYTES) + message[16:]
    with LimitPeers(servers) as peers:
        async with contextlib.AsyncExitStack() as channels:
            opened = [
                await channels.enter_async_context(
                    grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
                )
                for port in peers.raw_ports
            ]
            unary = [
                c.unary_unary(f"/{RAW_SERVICE}/Unary", request_serializer=None, response_deserializer=None)
                for c in opened
            ]
            stream = [c.unary_stream(RAW_METHOD, request_serializer=None, response_deserializer=None) for c in opened]
            outboxes: list[asyncio.Queue[bytes | None]] = [asyncio.Queue() for _ in opened]

            async def requests(outbox: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
                while (item := await outbox.get()) is not None:
                    yield item

            sessions = [
                c.stream_stream(f"/{RAW_SERVICE}/Session", request_serializer=None, response_deserializer=None)(
                    requests(outbox), timeout=CALL_TIMEOUT
                )
                for c, outbox in zip(opened, outboxes, strict=True)
            ]

            async def new_unary(i: int) -> None:
                await unary[i](message, timeout=CALL_TIMEOUT)

            async def new_stream(i: int) -> None:
                async for _ in stream[i](request, timeout=CALL_TIMEOUT):
                    pass

            async def on_session(i: int) -> None:
                outboxes[i].put_nowait(message)
                if await sessions[i].read() is grpc.aio.EOF:
                    raise RuntimeError("the bare gRPC session stream ended early")

            shapes: dict[str, Callable[[int], Awaitable[None]]] = {
                "new unary call": new_unary,
                "new unary-stream call": new_stream,
                "long-lived stream": on_session,
            }

            def round_of(exchange: Callable[[int], Awaitable[None]]) -> Callable[[], Awaitable[object]]:
                return lambda: asyncio.gather(*(exchange(i) for i in range(servers)))

            rounds_of = {name: round_of(exchange) for name, exchange in shapes.items()}
            for run in rounds_of.values():  # warm up each shape once
                await run()
            used = await _cpu_in_blocks(rounds_of, max(1, rounds // CPU_BLOCKS), peers.raw_pids)
            for outbox, session in zip(outboxes, sessions, strict=True):
                outbox.put_nowait(None)
                while await session.read() is not grpc.aio.EOF:
                    pass
    return {
        "message_bytes": CALL_SHAPE_BYTES,
        "servers": servers,
        "rounds": next(iter(used.values()))["runs"],
        "shapes": {
            name: {"client_cpu_s": u["own_s"], "server_cpu_s": u["peers_s"], "wall_s": u["wall_s"]}
            for name, u in used.items()
        },
        "load_average": load_average(),
    }


async def streaming(sizes: Sequence[int], repeats: int, logs: Path) -> list[dict[str, Any]]:
    """gRPC transport rate per p against bare gRPC, loopback TCP and memcpy of the same bytes, interleaved."""
    (process,) = _start_workers([None], logs)
    try:
        with LimitPeers() as peers:
            measured = await _measure_sizes(process, peers, sizes, repeats)
    finally:
        process.stop()
    rows = []
    for row in measured:
        p = int(row["p"])
        nbytes = 16 * p
        codec = codec_times(p, repeats)
        codec_total = sum(v for k, v in codec.items() if k != "checksum_s")
        rows.append(
            {
                **row,
                **_ingest_rates(row["ingest_s"], row),
                "link": {**_path_rates(row["link"], row), **_ingest_rates(row["link"]["ingest_s"], row)},
                "shared": _path_rates(row["shared"], row),
                "bytes": nbytes,
                "transport_GBps": nbytes / row["transport_s"] / 1e9,
                "raw_grpc_GBps": nbytes / row["raw_grpc_s"] / 1e9,
                "loopback_GBps": nbytes / row["loopback_s"] / 1e9,
                "memcpy_GBps": nbytes / row["memcpy_s"] / 1e9,
                "ratio_raw_grpc": row["raw_grpc_s"] / row["transport_s"],
                "ratio_loopback": row["loopback_s"] / row["transport_s"],
                "ratio_memcpy": row["memcpy_s"] / row["transport_s"],
                "codec": codec,
                "codec_s": codec_total,
                "codec_share": codec_total / row["transport_s"],
                "where": _where_time_goes(row["transport_s"], row["raw_grpc_s"], row["loopback_s"], codec_total),
            }
        )
    return rows


def _path_rates(path: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A path's Compute (``link``, ``shared``) with its rate, against loopback TCP and against gRPC's transport."""
    return {
        **path,
        "transport_GBps": 16 * row["p"] / path["transport_s"] / 1e9,
        "ratio_loopback": row["loopback_s"] / path["transport_s"],
        "speedup": row["transport_s"] / path["transport_s"],
    }


def _ingest_rates(ingest_s: float, row: dict[str, Any]) -> dict[str, float]:
    """The rate of an ingest (the message after its first chunk), and one-way loopback TCP for those bytes over it."""
    chunks = int(row["chunks"])
    if chunks < 2:
        return {"ingest_GBps": math.nan, "ingest_ratio_loopback": math.nan}
    rest = (chunks - 1) / chunks
    return {
        "ingest_GBps": 8 * row["p"] * rest / ingest_s / 1e9,
        "ingest_ratio_loopback": rest * row["loopback_s"] / 2 / ingest_s,
    }


def _where_time_goes(transport: float, raw_grpc: float, loopback: float, codec: float) -> dict[str, float]:
    """Split gradcode's transport time into the socket floor, gRPC's own cost, gradcode's codec and the rest.

    * ``loopback``: the same bytes over a plain TCP socket (the floor);
    * ``grpc``: what a bare gRPC call adds on top for the same bytes and chunks (HTTP/2, its copies, its loops);
    * ``codec``: gradcode's protobuf/numpy/checksum work on the path, timed without a socket;
    * ``rest``: what remains (per-message costs of the generated servicer and stubs, the worker's thread
      hop and event loop, allocation of fresh buffers); negative means the parts overlap (pipelining).
    """
    grpc_cost = max(raw_grpc - loopback, 0.0)
    return {
        "loopback_s": loopback,
        "grpc_s": grpc_cost,
        "codec_s": codec,
        "rest_s": transport - loopback - grpc_cost - codec,
    }


async def chunk_sweep(p: int, chunk_sizes: Sequence[int | None], repeats: int, logs: Path) -> dict[str, Any]:
    """Transport at size p for each worker chunk size (None: the default, chunk_bytes_for the message size):
    one worker process per size, calls interleaved."""
    processes = _start_workers(chunk_sizes, logs)
    try:
        timed = await _time_workers([w.wait_ready() for w in processes], p, repeats)
    finally:
        for process in processes:
            process.stop()
    auto = chunk_bytes_for(8 * p)
    rows = [
        {"chunk_bytes": chunk_bytes or auto, "auto": chunk_bytes is None, **row,
         "transport_GBps": 16 * p / row["transport_s"] / 1e9}
        for chunk_bytes, row in zip(chunk_sizes, timed, strict=True)
    ]  # fmt: skip
    best = min(rows, key=lambda r: r["transport_s"])
    default = next(r for r in rows if r["auto"])
    return {
        "p": p,
        "default_chunk_bytes": auto,
        "rows": rows,
        "best_chunk_bytes": best["chunk_bytes"],
        "best_vs_default": default["transport_s"] / best["transport_s"],
    }


# ---- TLS on the stream ------------------------------------------------------------------------------------
def _tls_summary(calls: Sequence[CallTiming], p: int) -> dict[str, float]:
    """Medians of one mode's calls, with ingest (first chunk to complete message) and the rates."""
    row = _summary(calls)
    ingest = statistics.median(c.total - c.first for c in calls)
    chunks = int(row["chunks"])
    return {
        **row,
        "ingest_s": ingest,
        "transport_GBps": 16 * p / row["transport_s"] / 1e9,
        "ingest_GBps": 8 * p * (chunks - 1) / chunks / ingest / 1e9 if chunks > 1 else math.nan,
    }


async def tls_overhead(p: int, repeats: int, logs: Path) -> dict[str, Any]:
    """Compute at size p over plaintext and over mutual TLS, two worker processes called alternately."""
    from gradcode.client.certs import make_certificates

    certs = make_certificates(logs / "certs", ["127.0.0.1"])
    tls_env = {
        "GRADCODE_TLS_CERT": str(certs.node), "GRADCODE_TLS_KEY": str(certs.node_key),
        "GRADCODE_TLS_CA": str(certs.ca), "GRADCODE_MTLS": "1",
    }  # fmt: skip
    tls = Security(cert=certs.client, key=certs.client_key, ca=certs.ca, mutual=True)
    load_before = load_average()
    processes = _start_workers([None, None], logs, envs=[{}, tls_env])
    channels = [
        Security().channel(processes[0].wait_ready(), options=CHANNEL_OPTIONS),
        tls.channel(processes[1].wait_ready(), options=CHANNEL_OPTIONS),
    ]
    try:
        calls = await _timed_calls(channels, p, repeats)  # plaintext, TLS, plaintext, TLS, ...
    finally:
        for channel in channels:
            await channel.close(None)
        for process in processes:
            process.stop()
    plain, secure = (_tls_summary(record, p) for record in calls)
    return {
        "p": p,
        "bytes": 16 * p,
        "repeats": repeats,
        "tls": "mutual TLS (grpcio ssl credentials, certificates from gradcode.client.certs)",
        "plaintext": plain,
        "mutual_tls": secure,
        "ratio_total": secure["total_s"] / plain["total_s"],
        "ratio_transport": secure["transport_s"] / plain["transport_s"],
        "ratio_ingest": secure["ingest_s"] / plain["ingest_s"],
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


# ---- per-iteration overhead of the master ------------------------------------------------------------------
async def _grpc_round_trip(address: str, calls: int) -> float:
    """Median seconds of a unary health Check on ``address`` over one open channel."""
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        times = []
        for i in range(calls + 10):
            started = time.perf_counter()
            await stub.Check(request, timeout=CALL_TIMEOUT)
            if i >= 10:
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def worker_compute_time(n: int, s: int, repeats: int, workload: Workload | None = None) -> float:
    """Median seconds of one worker's gradient over its s + 1 partitions of ``workload``'s training set."""
    from gradcode.common.training.data import load_dataset
    from gradcode.common.training.models import make_model

    workload = workload or DIGITS
    dataset = load_dataset(
        workload.dataset, num_samples=workload.num_samples or None, num_features=workload.num_features or None
    )
    model = make_model(dataset.model_kind, num_features=dataset.X_train.shape[1], num_classes=dataset.num_classes)
    rows = min(dataset.num_train, -(-dataset.num_train // n) * (s + 1))
    X, y = dataset.X_train[:rows], dataset.y_train[:rows]
    params = model.init_params()
    return median_time(lambda: model.gradient(params, X, y), max(repeats, 20))


async def _iteration_jobs(
    clusters: dict[str, LocalCluster], sizes: Sequence[int], iterations: int, rtt_calls: int, workload: Workload
) -> tuple[float, list[dict[str, Any]]]:
    """Each job on every path's cluster in turn (A, B per configuration); the round trip on the first."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for path, cluster in clusters.items():
            client = await stack.enter_async_context(GradcodeClient(cluster.master_address))
            await client.wait_ready(START_TIMEOUT)
            await up_workers(client, max(sizes), START_TIMEOUT)
            clients[path] = client
        first = next(iter(clusters.values()))
        rtt = await _grpc_round_trip(first.workers[0].wait_ready(), rtt_calls)
        rows = []
        for n in sizes:
            for scheme, s in SCHEMES:
                spec = build_job_spec(
                    scheme=scheme, n=n, s=s, iterations=iterations, seed=0, model=workload.model,
                    dataset=workload.dataset, num_samples=workload.num_samples, num_features=workload.num_features,
                )  # fmt: skip
                for path, client in clients.items():
                    load = load_average()
                    reports, cpu_master, cpu_workers = await run_with_cpu(client, spec, cluster_pids(clusters[path]))
                    rows.append({"n": n, "scheme": scheme, "s": s, "path": path, **job_medians(reports)})
                    rows[-1].update(
                        {
                            "load_average": [load, load_average()],
                            "cpu_master_s": cpu_master,
                            "cpu_workers_s": cpu_workers,
                        }
                    )
    return rtt, rows


PATHS = {"gRPC": ["--shared-memory", "off", "--link", "off"], "link": ["--shared-memory", "off"], "shared memory": []}
"""The payload paths the overhead stages compare: every model and message on the workers' gRPC Sessions, on
their links (Sessions over plain TCP), or through the job's shared-memory directory with the headers on the
links (the master's default for workers on its host)."""


async def iteration_overhead(
    sizes: Sequence[int], iterations: int, rtt_calls: int, run_dir: Path, workload: Workload | None = None
) -> dict[str, Any]:
    """Per-iteration wall and decode time of real jobs, over each payload path, against the gRPC unary round trip
    to one worker."""
    workload = workload or DIGITS
    with contextlib.ExitStack() as stack:
        clusters = {
            path: stack.enter_context(
                LocalCluster(max(sizes), run_dir=run_dir / path.replace(" ", "-"), master_args=args)
            )
            for path, args in PATHS.items()
        }
        rtt, rows = await _iteration_jobs(clusters, sizes, iterations, rtt_calls, workload)
    for row in rows:
        compute = worker_compute_time(row["n"], row["s"], 20, workload)
        overhead = max(row["wall_s"] - compute, 0.0)
        row.update(
            {
                "compute_s": compute,
                "overhead_s": overhead,
                "overhead_rtts": overhead / rtt,
                "wall_rtts": row["wall_s"] / rtt,
                "decode_share": row["decode_s"] / overhead if overhead > 0 else math.nan,
            }
        )
    return {"rtt_s": rtt, "rows": rows, "workload": asdict(workload), "load_average": load_average()}


# ---- output -----------------------------------------------------------------------------------------------
def _against_grpc(rows: Sequence[dict[str, Any]], path: str) -> list[str]:
    """The whole Compute on one path (``link``, ``shared``) per p: its times and rate against loopback and gRPC."""
    lines = [f"{'p':>9} {'total ms':>9} {'transp.':>8} {'GB/s':>6} {'x loop':>7} {'vs gRPC':>8}"]
    for r in rows:
        x = r[path]
        lines.append(
            f"{r['p']:>9} {x['total_s'] * 1e3:>9.2f} {x['transport_s'] * 1e3:>8.2f} {x['transport_GBps']:>6.2f}"
            f" {x['ratio_loopback']:>7.2f} {x['speedup']:>7.1f}x"
        )
    return lines


def _format_streaming(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "Gradient streaming: one Compute call (model down + message up, 16p bytes), median; rates in GB/s",
        f"{'p':>9} {'MB':>7} {'total ms':>9} {'compute':>8} {'transp.':>8} {'codec':>7} {'gRPC':>6}"
        f" {'raw':>6} {'loopbk':>7} {'memcpy':>7} {'x raw':>6} {'x loop':>7} {'x copy':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['p']:>9} {r['bytes'] / 1e6:>7.2f} {r['total_s'] * 1e3:>9.2f} {r['compute_s'] * 1e3:>8.2f}"
            f" {r['transport_s'] * 1e3:>8.2f} {r['codec_s'] * 1e3:>7.2f} {r['transport_GBps']:>6.2f}"
            f" {r['raw_grpc_GBps']:>6.2f} {r['loopback_GBps']:>7.2f} {r['memcpy_GBps']:>7.2f}"
            f" {r['ratio_raw_grpc']:>6.2f}"
            f" {r['ratio_loopback']:>7.3f} {r['ratio_memcpy']:>7.3f}"
        )
    lines.append("(ms columns: total call, worker compute, transport = total - compute, codec = protobuf/numpy work")
    lines.append(" of the path timed without a socket; rates: gRPC = gradcode's transport, raw = bare gRPC bytes call,")
    lines.append(
        " loopbk = plain TCP socket, memcpy = numpy copy; x raw / x loop / x copy = that time / gRPC transport)"
    )
    lines.append("")
    lines.append(
        "Ingest through gRPC: first chunk of the message to the complete message (the master receiving, checking and"
    )
    lines.append(" reassembling the rest of the stream) against one-way loopback TCP for the same bytes; the same")
    lines.append(" through the worker's link (a Session over plain TCP, the master's default), called alternately")
    lines.append(f"{'p':>9} {'ingest ms':>10} {'GB/s':>6} {'x loop':>7} {'link ms':>8} {'GB/s':>6} {'x loop':>7}")
    for r in rows:
        lk = r["link"]
        lines.append(
            f"{r['p']:>9} {r['ingest_s'] * 1e3:>10.2f} {r['ingest_GBps']:>6.2f} {r['ingest_ratio_loopback']:>7.3f}"
            f" {lk['ingest_s'] * 1e3:>8.2f} {lk['ingest_GBps']:>6.2f} {lk['ingest_ratio_loopback']:>7.3f}"
        )
    lines.append("")
    lines.append("The whole Compute through the link (model down, message up): against loopback TCP and gRPC")
    lines.extend(_against_grpc(rows, "link"))
    lines.append("")
    lines.append(
        "Through shared memory (the worker on this host accepted the job's directory): the same Compute, model"
    )
    lines.append(" written once to tmpfs, message left there, only header and trailer on the worker's link")
    lines.extend(_against_grpc(rows, "shared"))
    lines.append("(x loop = loopback TCP exchanging the same 16p bytes / this; vs gRPC = gRPC transport / this)")
    lines.append("")
    lines.append("CPU per Compute call, ms (from /proc, blocks of calls alternating between the paths): the worker")
    lines.append(" process (its gradient included) and the master's; the worker's gradient alone for comparison")
    lines.append(
        f"{'p':>9} {'gRPC worker':>12} {'master':>7} {'link worker':>12} {'master':>7} {'shm worker':>11}"
        f" {'master':>7} {'gradient':>9}"
    )
    for r in rows:
        cpu = r["cpu_per_call"]
        lines.append(
            f"{r['p']:>9}"
            + "".join(
                f" {cpu[path]['worker_s'] * 1e3:>{width}.2f} {cpu[path]['master_s'] * 1e3:>7.2f}"
                for path, width in (("gRPC", 12), ("link", 12), ("shared memory", 11))
            )
            + f" {r['compute_s'] * 1e3:>9.2f}"
        )
    lines.append("")
    lines.append("Codec steps, ms: master encode / worker decode / worker encode / master decode (each checksum alone)")
    for r in rows:
        c = r["codec"]
        lines.append(
            f"{r['p']:>9} {c['master_encode_s'] * 1e3:>8.2f} {c['worker_decode_s'] * 1e3:>8.2f}"
            f" {c['worker_encode_s'] * 1e3:>8.2f} {c['master_decode_s'] * 1e3:>8.2f}   ({c['checksum_s'] * 1e3:.2f})"
        )
    lines.append("")
    lines.append("Where the transport time goes, ms (% of transport): loopback TCP floor | gRPC's own cost over it")
    lines.append(
        " (bare gRPC call - loopback) | gradcode codec | rest (servicer/stub per-message work, thread hop, loops)"
    )
    for r in rows:
        w, t = r["where"], r["transport_s"]
        parts = " | ".join(
            f"{w[k] * 1e3:>7.2f} ({100 * w[k] / t:>4.0f}%)" for k in ("loopback_s", "grpc_s", "codec_s", "rest_s")
        )
        lines.append(f"{r['p']:>9} {parts}")
    lines.append("(a negative rest: the bare gRPC call measured longer than gradcode's whole transport, as it can at")
    lines.append(" small p, where a call's fixed cost dominates and varies run to run: the split does not apply there)")
    return "\n".join(lines)


def _format_call_shapes(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"gRPC call shapes: one {results[0]['message_bytes']}-byte message each way with each of n bare servers at"
        " once (a round), per round; blocks of rounds alternated",
        f"{'n':>3} {'':>22} {'client CPU us':>14} {'servers CPU us':>15} {'wall us':>8} {'load':>6}",
    ]
    for result in results:
        for name, r in result["shapes"].items():
            lines.append(
                f"{result['servers']:>3} {name:>22} {r['client_cpu_s'] * 1e6:>14.0f} {r['server_cpu_s'] * 1e6:>15.0f}"
                f" {r['wall_s'] * 1e6:>8.0f} {result['load_average'][0]:>6.2f}"
            )
    lines.append("(a Compute call is a new unary-stream call per worker per iteration; the master's Session, one")
    lines.append(" long-lived stream per worker, pays the last row of each n instead; n + 1 processes share the cores)")
    return "\n".join(lines)


def _format_chunks(sweep: dict[str, Any]) -> str:
    lines = [
        f"Chunk size at p = {sweep['p']} (worker's chunk_bytes; auto = chunk_bytes_for the message size, "
        f"{sweep['default_chunk_bytes'] // KiB} KiB here)",
        f"{'chunk':>9} {'chunks':>7} {'total ms':>9} {'transp. ms':>11} {'GB/s':>6}",
    ]
    for r in sweep["rows"]:
        lines.append(
            f"{r['chunk_bytes'] // KiB:>6} KiB{'*' if r['auto'] else ' '}{r['chunks']:>6} {r['total_s'] * 1e3:>9.2f}"
            f" {r['transport_s'] * 1e3:>11.2f} {r['transport_GBps']:>6.2f}"
        )
    lines.append(
        f"(* = auto, the default) best: {sweep['best_chunk_bytes'] // KiB} KiB, "
        f"{sweep['best_vs_default']:.2f}x the default's transport speed"
    )
    return "\n".join(lines)


def _format_tls(result: dict[str, Any]) -> str:
    p = result["p"]
    lines = [
        f"TLS on the stream: Compute at p = {p} ({8 * p / 1e6:.0f} MB model down, {8 * p / 1e6:.0f} MB message up), "
        "plaintext and mutual TLS called alternately; medians",
        f"{'':>10} {'total ms':>9} {'compute':>8} {'transp.':>8} {'ingest':>7} {'GB/s':>6} {'ingest GB/s':>12}",
    ]
    for name, key in (("plaintext", "plaintext"), ("mutual TLS", "mutual_tls")):
        r = result[key]
        lines.append(
            f"{name:>10} {r['total_s'] * 1e3:>9.2f} {r['compute_s'] * 1e3:>8.2f} {r['transport_s'] * 1e3:>8.2f}"
            f" {r['ingest_s'] * 1e3:>7.2f} {r['transport_GBps']:>6.2f} {r['ingest_GBps']:>12.2f}"
        )
    before, after = result["load_average_before"], result["load_average_after"]
    lines.append(
        f"TLS / plaintext: total {result['ratio_total']:.2f}x, transport {result['ratio_transport']:.2f}x, "
        f"ingest {result['ratio_ingest']:.2f}x  (load average 1/5/15 min: before "
        f"{'/'.join(f'{x:.2f}' for x in before)}, after {'/'.join(f'{x:.2f}' for x in after)}; "
        f"{os.cpu_count()} CPUs)"
    )
    lines.append("(transport = total - worker compute, both directions; ingest = first chunk of the message to the")
    lines.append(" complete message, the master receiving and checking the rest of the stream)")
    return "\n".join(lines)


def _format_iterations(result: dict[str, Any]) -> str:
    rtt = result["rtt_s"]
    lines = [
        f"Per-iteration overhead ({result['workload']['name']}, no stragglers, load {_load(result)}); gRPC unary"
        f" round trip to a worker {rtt * 1e6:.0f} us",
        f"{'n':>3} {'scheme':>8} {'path':>13} {'wall ms':>8} {'first':>6} {'gather':>7} {'decode':>7} {'compute':>8}"
        f" {'period':>7} {'overhead':>9} {'x RTT':>6} {'decode %':>9}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['n']:>3} {r['scheme']:>8} {r['path']:>13} {r['wall_s'] * 1e3:>8.2f} {r['first_s'] * 1e3:>6.2f}"
            f" {r['gather_s'] * 1e3:>7.2f} {r['decode_s'] * 1e3:>7.3f} {r['compute_s'] * 1e3:>8.3f}"
            f" {r['period_s'] * 1e3:>7.2f}"
            f" {r['overhead_s'] * 1e3:>9.2f} {r['overhead_rtts']:>6.1f} {100 * r['decode_share']:>8.1f}%"
        )
    lines.append("(medians in ms; first / gather = iteration start to the first / last message used; overhead = wall")
    lines.append(" - one worker's compute; period = time between iteration reports; x RTT = overhead / round trip)")
    return "\n".join(lines)


def _load(result: dict[str, Any]) -> str:
    return "/".join(f"{x:.2f}" for x in result["load_average"][:3])


def _format_wide(result: dict[str, Any]) -> str:
    lines = [
        "The wide model against the transfers it needs (ms): one = one Compute's transport at this p (model down,",
        " message up); master = every model sent and every used message received through the master at that rate",
        f"{'n':>3} {'scheme':>8} {'path':>13} {'overhead':>9} {'one':>6} {'beyond one':>11} {'master':>7}"
        f" {'beyond master':>14} {'CPU master':>11} {'CPU workers':>12} {'CPU / cores':>12}",
    ]
    cores = os.cpu_count() or 1
    for r in result["rows"]:
        lines.append(
            f"{r['n']:>3} {r['scheme']:>8} {r['path']:>13} {r['overhead_s'] * 1e3:>9.2f}"
            f" {r['one_transfer_s'] * 1e3:>6.2f} {r['beyond_one_transfer_s'] * 1e3:>11.2f}"
            f" {r['through_master_s'] * 1e3:>7.2f} {r['beyond_master_bytes_s'] * 1e3:>14.2f}"
            f" {r['cpu_master_s'] * 1e3:>11.2f} {r['cpu_workers_s'] * 1e3:>12.2f}"
            f" {(r['cpu_master_s'] + r['cpu_workers_s']) / cores * 1e3:>12.2f}"
        )
    lines.append(
        "(CPU = seconds of CPU per iteration the master and all workers used, from /proc; CPU / cores = their sum"
    )
    lines.append(f" over this machine's {cores} cores: the iteration cannot be shorter while the processes share them)")
    lines.append("")
    lines.append(
        "CPU per Compute call (ms): in the job (its CPU per iteration / n; every worker is called once) against one"
    )
    lines.append(" call made alone at the same p (the CPU-per-call stage above; its gradient is one sample's)")
    lines.append(
        f"{'n':>3} {'scheme':>8} {'path':>13} {'master job':>11} {'alone':>6} {'x':>5}"
        f" {'worker job':>11} {'alone':>6} {'x':>5}"
    )
    for r in result["rows"]:
        master, master_alone = r["job_call_cpu_master_s"], r["alone_call_cpu_master_s"]
        worker, worker_alone = r["job_call_cpu_worker_s"], r["alone_call_cpu_worker_s"]
        lines.append(
            f"{r['n']:>3} {r['scheme']:>8} {r['path']:>13} {master * 1e3:>11.2f} {master_alone * 1e3:>6.2f}"
            f" {master / master_alone:>5.1f} {worker * 1e3:>11.2f} {worker_alone * 1e3:>6.2f}"
            f" {worker / worker_alone:>5.1f}"
        )
    lines.append("(x = job / alone: the cost of the same call when n + 1 processes share the cores: context switches")
    lines.append(" between them and gRPC's threads, cold caches)")
    return "\n".join(lines)


def _plot(results: dict[str, Any], path: Path) -> None:
    with figure(path, 1, 4, figsize=(21, 4.8), dpi=120) as (left, middle, tls, right):
        rows = results["streaming"]
        ps = [r["p"] for r in rows]
        for key, label in [
            ("memcpy_GBps", "numpy memory copy"),
            ("loopback_GBps", "loopback TCP, plain socket"),
            ("raw_grpc_GBps", "bare gRPC bytes call, same chunks"),
            ("transport_GBps", "gRPC Compute transport"),
        ]:
            left.loglog(ps, [r[key] for r in rows], marker="o", label=label)
        left.loglog(ps, [r["link"]["transport_GBps"] for r in rows], marker="^", label="link Compute transport")
        left.loglog(
            ps, [r["shared"]["transport_GBps"] for r in rows], marker="s", label="shared-memory Compute transport"
        )
        left.set_xlabel("p (float64 parameters); 16p bytes per call")
        left.set_ylabel("GB/s (model down + message up)")
        left.set_title("Gradient streaming vs the machine's limits")
        left.grid(True, which="both", alpha=0.3)
        left.legend(fontsize=8)

        sweep = results["chunk_sweep"]
        labels = [f"{r['chunk_bytes'] // KiB} KiB" + (" (auto)" if r["auto"] else "") for r in sweep["rows"]]
        colors = ["tab:orange" if r["auto"] else "tab:blue" for r in sweep["rows"]]
        middle.bar(labels, [r["transport_GBps"] for r in sweep["rows"]], color=colors)
        middle.set_ylabel("gRPC transport GB/s")
        middle.set_title(f"Worker chunk size at p = {sweep['p']:.0e} (orange: default)")

        secure = results["tls"]
        modes = [("plaintext", "tab:blue"), ("mutual_tls", "tab:red")]
        x = np.arange(2)
        for i, (mode, color) in enumerate(modes):
            values = [secure[mode]["transport_s"] * 1e3, secure[mode]["ingest_s"] * 1e3]
            tls.bar(x + (i - 0.5) * 0.4, values, width=0.4, color=color, label=mode.replace("_", " "))
        tls.set_xticks(x, ["transport", "ingest"])
        tls.set_ylabel("ms (median)")
        load = "/".join(f"{v:.1f}" for v in secure["load_average_after"])
        tls.set_title(
            f"TLS at p = {secure['p']:.0e}: transport {secure['ratio_transport']:.2f}x, "
            f"ingest {secure['ratio_ingest']:.2f}x\n(load {load})",
            fontsize=10,
        )
        tls.legend(fontsize=8)

        it = results["iteration"]
        short = {"gRPC": "gRPC", "link": "link", "shared memory": "shm"}
        names = [f"{r['scheme'][:3]} {r['n']}\n{short.get(r['path'], r['path'])}" for r in it["rows"]]
        decode = [r["decode_s"] * 1e3 for r in it["rows"]]
        rest = [(r["wall_s"] - r["decode_s"]) * 1e3 for r in it["rows"]]
        right.bar(names, rest, label="wall − decode", color="tab:blue")
        right.bar(names, decode, bottom=rest, label="decode", color="tab:red")
        right.axhline(it["rtt_s"] * 1e3, color="black", linestyle="--", label="gRPC unary round trip")
        right.set_ylabel("ms per iteration (median)")
        right.set_title("Master per-iteration time")
        right.legend(fontsize=8)


async def _measure_all(quick: bool, repeats: int, logs: Path) -> dict[str, Any]:
    """The stages in one event loop (the helper processes and sockets block it only briefly)."""
    stream_rows = await streaming(QUICK_SIZES if quick else FULL_SIZES, repeats, logs)
    sweep = await chunk_sweep(
        QUICK_CHUNK_P if quick else FULL_CHUNK_P, QUICK_CHUNKS if quick else FULL_CHUNKS, repeats, logs
    )
    iterations = QUICK_ITERATIONS if quick else FULL_ITERATIONS
    rtt_calls = QUICK_RTT_CALLS if quick else FULL_RTT_CALLS
    secure = await tls_overhead(QUICK_TLS_P if quick else FULL_TLS_P, repeats, logs)
    shapes = [
        await call_shapes(QUICK_SHAPE_ROUNDS if quick else FULL_SHAPE_ROUNDS, servers)
        for servers in (QUICK_SHAPE_SERVERS if quick else FULL_SHAPE_SERVERS)
    ]
    iteration = await iteration_overhead(
        QUICK_CLUSTER if quick else FULL_CLUSTER, iterations, rtt_calls, logs / "cluster"
    )
    wide = await iteration_overhead(
        QUICK_WIDE_CLUSTER if quick else FULL_WIDE_CLUSTER, iterations, rtt_calls, logs / "wide", WIDE
    )
    transfer = next(row for row in stream_rows if row["p"] == WIDE_PARAMETERS)
    for row in wide["rows"]:
        one_transfer = {
            "gRPC": transfer["transport_s"],
            "link": transfer["link"]["transport_s"],
            "shared memory": transfer["shared"]["transport_s"],
        }[row["path"]]
        through_master = (row["n"] + row["used_workers"]) / 2 * one_transfer  # one transfer = 8p down + 8p up
        alone = transfer["cpu_per_call"][row["path"]]
        row.update(
            {
                "one_transfer_s": one_transfer,
                "beyond_one_transfer_s": row["overhead_s"] - one_transfer,
                "through_master_s": through_master,
                "beyond_master_bytes_s": row["overhead_s"] - through_master,
                # CPU per Compute inside the job (every worker is called once per iteration) against one call
                # made alone at the same p: what n + 1 processes sharing the cores add to each call
                "job_call_cpu_master_s": row["cpu_master_s"] / row["n"],
                "job_call_cpu_worker_s": row["cpu_workers_s"] / row["n"],
                "alone_call_cpu_master_s": alone["master_s"],
                "alone_call_cpu_worker_s": alone["worker_s"],
            }
        )
    return {
        "streaming": stream_rows,
        "chunk_sweep": sweep,
        "tls": secure,
        "call_shapes": shapes,
        "iteration": iteration,
        "wide": wide,
    }


def run(*, quick: bool = False, out: Path = RESULTS) -> dict[str, Any]:
    """Run the benchmark, print the tables, save JSON and PNG under ``out``; return the results."""
    repeats = QUICK_REPEATS if quick else FULL_REPEATS
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradcode-bench-transport-") as tmp:
        stages = asyncio.run(_measure_all(quick, repeats, Path(tmp)))
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "grpcio": grpc.__version__,
        },
        "quick": quick,
        "repeats": repeats,
        "load_average_after": load_average(),
        **stages,
        "seconds": time.perf_counter() - started,
    }
    print(_format_streaming(stages["streaming"]))
    print()
    print(_format_chunks(stages["chunk_sweep"]))
    print()
    print(_format_tls(stages["tls"]))
    print()
    print(_format_call_shapes(stages["call_shapes"]))
    print()
    print(_format_iterations(stages["iteration"]))
    print()
    print(_format_iterations(stages["wide"]))
    print(_format_wide(stages["wide"]))
    save(results, out, "transport", lambda path: _plot(results, path))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = benchmark_parser("transport", __doc__, quick="small sizes, few repeats: a smoke run of a few seconds")
    args = parser.parse_args(argv)
    # This process plays the master: the same settings as python -m gradcode.master. Without the BLAS limit,
    # OpenBLAS threads spinning after each norm used 5.5 ms of CPU per p = 1e5 Compute instead of 1.5 ms,
    # taking a core from the worker on a 2-core machine.
    limit_blas_threads(1)
    reuse_large_buffers()
    freeze_startup_objects()
    run(quick=args.quick, out=args.out)


if __name__ == "__main__":
    main()
