"""Chunking and validated reassembly of coded messages."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import xxhash
from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import DecodeError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcode.common.transport.wire import (
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    MessageAssembler,
    ReceivedChunk,
    Subtree,
    Timing,
    WireError,
    array_from_tensor,
    children_lost_from_metadata,
    children_lost_metadata,
    chunk_bytes_for,
    chunk_head,
    compute_stream,
    dict_from_struct,
    message_chunk_bytes,
    message_chunk_pieces,
    message_chunks,
    message_to_dict,
    model_digest,
    model_request_bytes,
    parse_chunk,
    payload_digest,
    serialize_chunk,
    serialized_size,
    struct_from_dict,
    tensor_from_array,
)
from gradcode.v1 import common_pb2, master_pb2, worker_pb2


def _assembler(**overrides: object) -> MessageAssembler:
    kwargs: dict[str, object] = {"job_id": "j", "iteration": 3, "worker_id": 1, "rows": (5, 6), "length": 1000}
    kwargs.update(overrides)
    return MessageAssembler(**kwargs)  # type: ignore[arg-type]


def _chunks(vec: np.ndarray, row: int = 5, **kw: object) -> list:
    args: dict[str, object] = {"job_id": "j", "iteration": 3, "worker_id": 1, "row": row, "chunk_bytes": 800}
    args.update(kw)
    return list(message_chunks(vec, **args))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["<f8", "<c16", "<f4"])
def test_round_trip_in_chunks(dtype: str) -> None:
    rng = np.random.default_rng(0)
    vec = rng.standard_normal(1000).astype(dtype)
    if dtype == "<c16":
        vec = vec + 1j * rng.standard_normal(1000)
    chunks = _chunks(vec, compute_seconds=0.25)
    assert len(chunks) == -(-vec.nbytes // 800)
    asm = _assembler(dtypes=(np.dtype(dtype),))
    done = [asm.feed(c) for c in chunks]
    assert all(d is None for d in done[:-1])
    assert done[-1] is not None
    np.testing.assert_array_equal(done[-1].vector, vec)
    assert done[-1].compute_seconds == 0.25
    assert not asm.complete


def test_two_rows_complete_the_stream() -> None:
    asm = _assembler()
    for row in (5, 6):
        for c in _chunks(np.arange(1000.0), row=row):
            asm.feed(c)
    assert asm.complete


@pytest.mark.parametrize(
    ("chunk_kw", "asm_kw", "message"),
    [
        ({"job_id": "other"}, {}, "Chunk for job 'other'"),
        ({"iteration": 2}, {}, "stale or future iteration 2"),
        ({"worker_id": 9}, {}, "claims worker 9"),
        ({"row": 7}, {}, "Row 7 was not requested"),
        ({}, {"length": 999}, "has 1000 elements; the gradient has 999"),
        ({}, {"dtypes": (np.dtype("<f4"),)}, "has dtype float64"),
    ],
)
def test_mismatches_are_refused_precisely(chunk_kw: dict, asm_kw: dict, message: str) -> None:
    row = chunk_kw.pop("row", 5)
    chunks = _chunks(np.arange(1000.0), row=row, **chunk_kw)
    with pytest.raises(WireError, match=message):
        _assembler(**asm_kw).feed(chunks[0])


def test_corruption_and_gaps_are_detected() -> None:
    chunks = _chunks(np.arange(1000.0))
    asm = _assembler()
    with pytest.raises(WireError, match="has no header"):
        asm.feed(chunks[1])
    asm = _assembler()
    asm.feed(chunks[0])
    with pytest.raises(WireError, match="offset 200, expected 100"):
        asm.feed(chunks[2])
    chunks[3].data = bytes(len(chunks[3].data))
    asm = _assembler()
    with pytest.raises(WireError, match="XXH3-64"):
        for c in chunks:
            asm.feed(c)


def test_tensor_and_struct_helpers() -> None:
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(array_from_tensor(tensor_from_array(a)), a)
    t = tensor_from_array(a)
    t.data = t.data[:-8]
    with pytest.raises(WireError, match="needs 48 bytes, got 40"):
        array_from_tensor(t)
    assert dict_from_struct(struct_from_dict({"n": 6, "alpha": 0.5, "xs": [1, 2]})) == {
        "n": 6,
        "alpha": 0.5,
        "xs": [1, 2],
    }


@pytest.mark.parametrize("dtype", ["<f8", "<c16", "<f4"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 499, 997, 999], ids=["first", "middle", "statistics", "last"])
def test_a_non_finite_entry_anywhere_is_refused(dtype: str, bad: float, where: int) -> None:
    vec = np.arange(1000.0).astype(dtype)
    vec[where] = bad
    asm = _assembler(norm_length=997, dtypes=(np.dtype(dtype),))  # the last 3 entries are statistics
    with pytest.raises(WireError, match="NaN or infinite"):
        for c in _chunks(vec):
            asm.feed(c)


def test_huge_finite_entries_are_accepted_though_their_squares_overflow() -> None:
    vec = np.full(1000, 1e200)
    asm = _assembler()
    done = [m for c in _chunks(vec) if (m := asm.feed(c)) is not None]
    assert len(done) == 1 and done[0].norm == math.inf
    np.testing.assert_array_equal(done[0].vector, vec)


def test_non_finite_values_and_repeated_headers_are_refused() -> None:
    vec = np.arange(1000.0)
    vec[500] = np.nan
    asm = _assembler()
    with pytest.raises(WireError, match="NaN or infinite"):
        for c in _chunks(vec):
            asm.feed(c)
    chunks = _chunks(np.arange(1000.0))
    chunks[1].header.length = 5
    asm = _assembler()
    asm.feed(chunks[0])
    with pytest.raises(WireError, match="second header"):
        asm.feed(chunks[1])


def test_approximate_flag_travels_in_the_trailer() -> None:
    asm = _assembler()
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0), approximate=True)][-1]
    assert done is not None and done.approximate
    asm = _assembler()
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0))][-1]
    assert done is not None and not done.approximate


def test_a_parents_lost_children_travel_in_its_trailer_and_error_metadata() -> None:
    asm = _assembler(subtree=frozenset({2, 4}))
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0), subtree=Subtree(lost=(4, 2)))][-1]
    assert done is not None and done.subtree.lost == (4, 2)
    asm = _assembler()
    done = [asm.feed(parse_chunk(c.SerializeToString())) for c in _chunks(np.arange(1000.0))][-1]
    assert done is not None and done.subtree.lost == ()
    assert children_lost_from_metadata(children_lost_metadata([3, 5])) == (3, 5)
    assert children_lost_metadata([]) == () and children_lost_from_metadata(None) == ()
    assert children_lost_from_metadata((("other", "1"), ("gradcode-children-lost", "x,1"))) == ()


def test_absurd_tensor_shapes_get_a_precise_error() -> None:
    t = tensor_from_array(np.zeros(2))
    del t.shape[:]
    t.shape.extend([2**32, 2**32])
    with pytest.raises(WireError, match="needs 147573952589676412928 bytes"):
        array_from_tensor(t)


# ---- the copy-light gradient path: serialized chunks, parse_chunk views, checksum -------------------------------


def _bytes_chunks(vec: np.ndarray, row: int = 5, **kw: object) -> list[bytes]:
    args: dict[str, object] = {"job_id": "j", "iteration": 3, "worker_id": 1, "row": row, "chunk_bytes": 800}
    args.update(kw)
    return list(message_chunk_bytes(vec, **args))  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 700),
    chunk=st.integers(1, 3000),
    job_id=st.text(max_size=20),
    compute=st.floats(0, 1e3),
    approximate=st.booleans(),
)
def test_serialized_chunks_parse_like_protobuf_and_reassemble(
    length: int, chunk: int, job_id: str, compute: float, approximate: bool
) -> None:
    vec = np.random.default_rng(length).standard_normal(length)
    raw = list(
        message_chunk_bytes(
            vec, job_id=job_id, iteration=9, worker_id=2, row=4, chunk_bytes=chunk, compute_seconds=compute,
            approximate=approximate,
        )
    )  # fmt: skip
    asm = MessageAssembler(job_id=job_id, iteration=9, worker_id=2, rows=(4,), length=length)
    done = None
    for data in raw:
        received = parse_chunk(data)
        reference = worker_pb2.GradientChunk.FromString(data)
        assert bytes(received.data) == reference.data
        reference.ClearField("data")
        assert received.meta == reference
        done = asm.feed(received) or done
    assert done is not None and asm.complete
    np.testing.assert_array_equal(done.vector, vec)
    assert done.compute_seconds == compute and done.approximate == approximate
    trailer = worker_pb2.GradientChunk.FromString(raw[-1]).trailer
    assert trailer.xxh3 == xxhash.xxh3_64_intdigest(vec.astype("<f8").tobytes())


def test_parse_chunk_accepts_any_field_order_and_keeps_the_last_data() -> None:
    meta = worker_pb2.GradientChunk(job_id="j", iteration=3, worker_id=1, row=5, offset=0)
    meta.header.dtype = common_pb2.DTYPE_FLOAT64
    first = worker_pb2.GradientChunk(data=b"\x00" * 8).SerializeToString()
    second = worker_pb2.GradientChunk(data=np.arange(2.0).tobytes()).SerializeToString()
    received = parse_chunk(first + meta.SerializeToString() + second)  # protobuf merges concatenations
    assert received.meta == meta
    assert bytes(received.data) == np.arange(2.0).tobytes()


@pytest.mark.parametrize(
    "raw",
    [b"\x0a\x05ab", b"\x3a\x10" + b"x" * 3, b"\x80", b"\x0b"],
    ids=["short-string", "short-data", "varint", "group"],
)
def test_parse_chunk_refuses_malformed_bytes(raw: bytes) -> None:
    with pytest.raises((WireError, DecodeError)):
        parse_chunk(raw)


def test_serialize_chunk_passes_bytes_through() -> None:
    (data,) = _bytes_chunks(np.arange(10.0))
    assert serialize_chunk(data) is data
    message = worker_pb2.GradientChunk.FromString(data)
    assert worker_pb2.GradientChunk.FromString(serialize_chunk(message)) == message


def test_a_bad_or_missing_checksum_is_refused_precisely() -> None:
    chunks = _chunks(np.arange(1000.0))
    chunks[-1].trailer.xxh3 ^= 1
    asm = _assembler()
    with pytest.raises(
        WireError, match=r"Row 5 from worker 1, job 'j', iteration 3 failed its XXH3-64 check: the trailer"
    ):
        for c in chunks:
            asm.feed(c)
    chunks[-1].trailer.ClearField("xxh3")  # what a sender from before XXH3-64 looks like (field 5 is gone)
    asm = _assembler()
    with pytest.raises(WireError, match=r"has no XXH3-64 checksum in its trailer \(field xxh3\)"):
        for c in chunks:
            asm.feed(c)


def test_each_row_is_checksummed_from_its_own_first_byte() -> None:
    """The digest streams over a row's chunks and starts afresh with the next row: the second row of one stream is
    checked against its own bytes only."""
    rng = np.random.default_rng(7)
    first, second = rng.standard_normal(1000), rng.standard_normal(1000)
    asm = _assembler()
    done = [asm.feed(c) for c in _chunks(first, row=5) + _chunks(second, row=6)]
    messages = [d for d in done if d is not None]
    assert [m.row for m in messages] == [5, 6] and asm.complete
    np.testing.assert_array_equal(messages[1].vector, second)
    # The second row's trailer carries the digest of its bytes alone, as the library computes it in one call.
    assert (
        _chunks(second, row=6)[-1].trailer.xxh3 == payload_digest(second) == xxhash.xxh3_64_intdigest(second.tobytes())
    )


def test_a_chunk_with_data_is_its_fields_and_a_view_of_the_payload_never_a_copy() -> None:
    vec = np.random.default_rng(3).standard_normal(1000)
    pieces = list(message_chunk_pieces(vec, job_id="j", iteration=1, worker_id=0, row=0, chunk_bytes=3000))
    assert len(pieces) == 3
    for chunk in pieces:
        assert isinstance(chunk, tuple) and len(chunk) == 2
        fields, payload = chunk
        assert isinstance(fields, bytes) and len(fields) < 100
        assert np.shares_memory(np.frombuffer(payload, dtype=np.uint8), vec)
    assert [serialize_chunk(c) for c in pieces] == _bytes_chunks(vec, row=0, iteration=1, worker_id=0, chunk_bytes=3000)
    assert [serialized_size(c) for c in pieces] == [len(serialize_chunk(c)) for c in pieces]


def test_chunk_size_suits_the_message_size() -> None:
    assert chunk_bytes_for(1000) == DEFAULT_CHUNK_BYTES  # one chunk
    assert chunk_bytes_for(8_000_000) == 2_000_000  # about CHUNKS_PER_MESSAGE chunks
    assert chunk_bytes_for(10**9) == MAX_CHUNK_BYTES
    assert len(list(message_chunk_bytes(np.zeros(10**6), job_id="j", iteration=0, worker_id=0, row=0))) == 4
    assert len(list(message_chunk_bytes(np.zeros(1000), job_id="j", iteration=0, worker_id=0, row=0))) == 1


@pytest.mark.parametrize(
    "params",
    [np.arange(5.0), np.zeros(0), np.arange(6.0).reshape(2, 3), np.arange(3, dtype=np.float32), np.arange(20_000.0)],
    ids=["small", "empty", "matrix", "float32", "large"],
)
def test_model_request_bytes_equal_protobufs_serialization(params: np.ndarray) -> None:
    head = worker_pb2.ComputeRequest(job_id="j", iteration=4, worker_id=2, rows=[1, 3])
    got = worker_pb2.ComputeRequest.FromString(head.SerializeToString() + model_request_bytes(params))
    want = worker_pb2.ComputeRequest(job_id="j", iteration=4, worker_id=2, rows=[1, 3], model=tensor_from_array(params))
    assert got == want


def test_message_to_dict_keeps_integers_as_numbers() -> None:
    """protobuf's JSON mapping writes 64-bit ints as strings and Struct numbers as doubles; history
    files and saved specs keep their own types, and ParseDict reads them back unchanged."""
    spec = master_pb2.JobSpec(
        job_id="j", iterations=5, seed=2**40,
        code=common_pb2.CodeSpec(name="cyclic", params=struct_from_dict({"n": 8, "s": 2, "rate": 0.5, "ws": [1, 2]})),
    )  # fmt: skip
    as_dict = message_to_dict(spec)
    assert as_dict["seed"] == 2**40 and as_dict["iterations"] == 5
    assert as_dict["code"]["params"] == {"n": 8, "s": 2, "rate": 0.5, "ws": [1, 2]}
    assert isinstance(as_dict["code"]["params"]["n"], int)
    report = master_pb2.IterationReport(iteration=3, timings=[master_pb2.WorkerTiming(worker_id=1, seconds=0.5)])
    row = message_to_dict(report)
    zeros = {"model_seconds": 0.0, "compute_seconds": 0.0, "straggle_seconds": 0.0}
    assert row["iteration"] == 3 and row["timings"] == [{"worker_id": 1, "seconds": 0.5, **zeros}]
    assert ParseDict(row, master_pb2.IterationReport()) == report
    assert ParseDict(as_dict, master_pb2.JobSpec()) == spec


async def test_a_malformed_chunk_on_a_real_stream_is_refused_precisely() -> None:
    """gRPC turns a failing response deserializer into a None item; the assembler names the worker."""

    async def compute(request: bytes, context: object) -> AsyncIterator[bytes]:
        yield b"\x3a\x10abc"  # a data field longer than the message

    handler = grpc.method_handlers_generic_handler(
        "gradcode.v1.Worker", {"Compute": grpc.unary_stream_rpc_method_handler(compute)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            asm = _assembler()
            with pytest.raises(WireError, match=r"from worker 1, job 'j', iteration 3 could not be parsed"):
                async for chunk in compute_stream(channel)(b""):
                    asm.feed(chunk)
    finally:
        await server.stop(None)


def test_a_leafs_magnitude_travels_in_the_trailer_and_must_be_finite_and_non_negative() -> None:
    asm = _assembler()
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0), magnitude=12.5)][-1]
    assert done is not None and done.magnitude == 12.5
    asm = _assembler()
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0))][-1]
    assert done is not None and np.isnan(done.magnitude)  # not sent: the receiver estimates it
    for bad in (-1.0, float("inf"), float("nan")):
        asm = _assembler()
        chunks = _chunks(np.arange(1000.0), magnitude=1.0)
        chunks[-1].trailer.magnitude = bad  # as a broken sender would set it
        with pytest.raises(WireError, match=r"magnitude .* must be a finite number >= 0"):
            for c in chunks:
                asm.feed(c)


# ---- payloads received in place (links) --------------------------------------------------------------------
def test_a_chunks_head_gives_its_fields_and_where_its_payload_starts() -> None:
    vec = np.random.default_rng(4).standard_normal(3000)
    for raw in message_chunk_bytes(vec, job_id="j", iteration=2, worker_id=1, row=0, chunk_bytes=8000):
        parsed = parse_chunk(raw)
        head = chunk_head(memoryview(raw)[:300], len(raw))
        assert head is not None
        meta, offset = head
        assert meta == parsed.meta and raw[offset:] == bytes(parsed.data)
        assert chunk_head(memoryview(raw)[:6], len(raw)) is None  # its fields are not all there yet
        assert chunk_head(memoryview(raw)[:300], len(raw) + 8) is None  # the data would not end the chunk
    status_only = worker_pb2.GradientChunk(job_id="j", request_id=3).SerializeToString()
    assert chunk_head(status_only, len(status_only)) is None


def _placed(asm: MessageAssembler, chunks: list[worker_pb2.GradientChunk]) -> list[ReceivedChunk | None]:
    """Place every chunk first (as a link does while the consumer is behind), receiving its data into the target."""
    out: list[ReceivedChunk | None] = []
    for chunk in chunks:
        meta = worker_pb2.GradientChunk()
        meta.CopyFrom(chunk)
        meta.ClearField("data")
        target = asm.place(meta, len(chunk.data))
        if target is None:
            out.append(None)
            continue
        target[:] = chunk.data
        out.append(ReceivedChunk(meta=meta, data=target, placed=True))
    return out


def test_a_payload_received_in_place_is_checked_as_a_copied_one() -> None:
    vec = np.random.default_rng(5).standard_normal(1000)
    chunks = _chunks(vec, row=5, compute_seconds=0.5)
    copied, placed = _assembler(), _assembler()
    want = [copied.feed(c) for c in chunks][-1]
    received = _placed(placed, chunks)
    assert all(r is not None for r in received)
    got = [placed.feed(r) for r in received][-1]
    assert want is not None and got is not None
    assert np.array_equal(got.vector, vec) and got.norm == want.norm and got.compute_seconds == 0.5
    # A payload that arrived damaged fails the checksum as it would have copied.
    damaged = _assembler()
    received = _placed(damaged, chunks)
    assert received[1] is not None
    received[1].data[3] ^= 0xFF
    with pytest.raises(WireError, match="failed its XXH3-64 check"):
        for r in received:
            damaged.feed(r)


def test_a_chunk_that_fails_its_checks_is_not_placed_and_feed_says_why() -> None:
    vec = np.random.default_rng(6).standard_normal(1000)
    stale = _chunks(vec, row=5, iteration=2)
    asm = _assembler()
    assert _placed(asm, stale[:1]) == [None]
    with pytest.raises(WireError, match="stale or future iteration 2"):
        asm.feed(stale[0])
    # Chunks are placed in their order only: one that skips ahead is not.
    chunks = _chunks(vec, row=5)
    asm = _assembler()
    first, skipped = _placed(asm, [chunks[0], chunks[2]])
    assert first is not None and skipped is None
    asm.feed(first)
    with pytest.raises(WireError, match="at offset 200, expected 100"):
        asm.feed(chunks[2])
    # The next row's first chunk waits until the current row is complete.
    asm = _assembler()
    first = _placed(asm, chunks[:1])
    assert first[0] is not None and _placed(asm, _chunks(vec, row=6)[:1]) == [None]


def test_a_senders_account_of_its_time_travels_in_its_trailer_and_bad_seconds_are_refused() -> None:
    vec = np.arange(1000, dtype=np.float64)
    account = {"model_seconds": 0.5, "compute_seconds": 0.25, "straggle_seconds": 0.125}
    receiver = _assembler()
    done = [receiver.feed(c) for c in _chunks(vec, **account)][-1]
    assert done is not None
    assert (done.model_seconds, done.compute_seconds, done.straggle_seconds) == (0.5, 0.25, 0.125)
    for field in account:
        for seconds in (math.nan, -1.0, math.inf):
            asm = _assembler()
            with pytest.raises(WireError, match=f"reports its {field} {seconds!r}, which must be a finite number"):
                for chunk in _chunks(vec, **{**account, field: seconds}):
                    asm.feed(chunk)


def test_a_parents_descendants_travel_in_its_trailer_and_bad_seconds_are_refused() -> None:
    vec = np.arange(1000, dtype=np.float64)
    receiver = _assembler(subtree=frozenset({4, 7, 9}))
    timings = ((4, Timing(0.25, 0.01, 0.125, 0.0625)), (7, Timing(0.5)))
    done = [receiver.feed(c) for c in _chunks(vec, subtree=Subtree(timings=timings, late=(9,)))]
    assert done[-1] is not None
    assert done[-1].subtree.timings == timings and done[-1].subtree.late == (9,)
    for field in ("seconds", "model_seconds", "compute_seconds", "straggle_seconds"):
        for seconds in (math.nan, -1.0, math.inf):
            asm = _assembler(subtree=frozenset({4}))
            bad = Timing(0.25)._replace(**{field: seconds})
            with pytest.raises(WireError, match=f"child's {field} {seconds!r}"):
                for chunk in _chunks(vec, subtree=Subtree(timings=((4, bad),))):
                    asm.feed(chunk)


@pytest.mark.parametrize(
    "claim",
    [
        Subtree(lost=(3,)),
        Subtree(singled_out=(3,)),
        Subtree(quarantined=(3,)),
        Subtree(timings=((3, Timing(0.1)),)),
        Subtree(late=(3,)),
        Subtree(singled_out=(4,), quarantined=(4, 3)),
    ],
    ids=["lost", "singled_out", "quarantined", "timings", "late", "one_of_two"],
)
@pytest.mark.parametrize("below", [frozenset(), frozenset({4, 5})], ids=["leaf", "parent"])
def test_a_trailer_that_names_a_node_outside_its_senders_subtree_is_refused(
    claim: Subtree, below: frozenset[int]
) -> None:
    """A lying node (a flat job's worker, or a tree parent speaking of another's subtree) cannot have an honest
    worker reloaded, named a suspect or quarantined: its message is refused, naming the nodes it may speak of."""
    asm = _assembler(subtree=below)
    with pytest.raises(
        WireError, match=r"names workers \[3(, 4)?\] in its trailer.*may speak only of the workers below"
    ):
        for chunk in _chunks(np.arange(1000.0), subtree=claim):
            asm.feed(chunk)


def test_a_trailer_naming_only_its_own_subtree_is_accepted() -> None:
    asm = _assembler(subtree=frozenset({4, 5}))
    claim = Subtree(lost=(5,), singled_out=(4,), quarantined=(4,), timings=((5, Timing(0.1)),), late=(4,))
    done = [asm.feed(c) for c in _chunks(np.arange(1000.0), subtree=claim)][-1]
    assert done is not None and done.subtree == claim


def _library_mapping(message: Message) -> Any:
    """What message_to_dict promises, from protobuf's own JSON mapping: ``MessageToDict`` (every field, proto
    names), then 64-bit integers back to numbers and integral Struct numbers to ints: the reference its plan of
    converters is held to."""
    as_dict = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _own_numbers(message, as_dict)


def _own_numbers(message: Message, as_dict: Any) -> Any:
    def integral(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [integral(x) for x in v]
        return {k: integral(x) for k, x in v.items()} if isinstance(v, dict) else v

    if isinstance(message, struct_pb2.Struct):
        return integral(as_dict)
    for field in message.DESCRIPTOR.fields:
        if field.name not in as_dict:
            continue
        value = getattr(message, field.name)
        if field.type in _INT64:
            as_dict[field.name] = [int(v) for v in value] if field.is_repeated else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                as_dict[field.name] = [_own_numbers(m, d) for m, d in zip(value, as_dict[field.name], strict=True)]
            else:
                as_dict[field.name] = _own_numbers(value, as_dict[field.name])
    return as_dict


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}  # fmt: skip
_DOUBLES = (0.25, math.nan, math.inf, -math.inf, 2.0, -0.0)


def _scalar(field: FieldDescriptor, variant: int) -> Any:
    kind = field.type
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return _DOUBLES[variant % len(_DOUBLES)]
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return 99 if variant % 3 == 2 else numbers[-1 - variant % len(numbers)]  # 99: a number it does not know
    if kind == FieldDescriptor.TYPE_BOOL:
        return variant % 2 == 0
    if kind == FieldDescriptor.TYPE_STRING:
        return f"é {variant}"
    if kind == FieldDescriptor.TYPE_BYTES:
        return bytes([0, 255, variant % 256]) + b" ab"
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return 2**63 + 5 + variant
    if kind in _INT64:
        return -(2**40) - variant
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return 7 + variant
    return -7 - variant


def _filled(message: Message, variant: int, depth: int = 0) -> Message:
    """Every field of ``message`` set (one member of each oneof), nested messages to depth 3, values by ``variant``:
    NaN and infinities, an enum number the schema does not name, 64-bit extremes, bytes, maps, Structs."""
    for i, field in enumerate(message.DESCRIPTOR.fields):
        oneof = field.containing_oneof
        if oneof is not None and oneof.fields[variant % len(oneof.fields)] is not field:
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            target = getattr(message, field.name)
            for k in ("a", "b"):
                if value_field.message_type is None:
                    target[k] = _scalar(value_field, variant + i)
                else:
                    _filled(target[k], variant, depth + 1)
        elif entry is not None and entry.full_name == "google.protobuf.Struct":
            getattr(message, field.name).update({"n": 8, "rate": 0.5, "ws": [1, 2.5], "on": True, "name": "x"})
        elif entry is not None:
            if field.is_repeated:
                for _ in range(2 if depth < 3 else 0):
                    _filled(getattr(message, field.name).add(), variant + 1, depth + 1)
            elif depth < 3:
                _filled(getattr(message, field.name), variant + i, depth + 1)
            else:
                getattr(message, field.name).SetInParent()
        elif field.is_repeated:
            getattr(message, field.name).extend([_scalar(field, variant + i), _scalar(field, variant + i + 1)])
        else:
            setattr(message, field.name, _scalar(field, variant + i))
    return message


_EVERY_MESSAGE = [
    cls
    for module in (common_pb2, master_pb2, worker_pb2)
    for name in module.DESCRIPTOR.message_types_by_name
    for cls in [getattr(module, name)]
]


@pytest.mark.parametrize("variant", [0, 1, 2, 3])
@pytest.mark.parametrize("cls", _EVERY_MESSAGE, ids=lambda cls: cls.DESCRIPTOR.name)
def test_message_to_dict_is_protobufs_json_mapping_with_numbers_kept(cls: Any, variant: int) -> None:
    """Every message of the wire contract, empty and with every field set (NaN, infinities, -0.0, unknown enum
    numbers, 64-bit extremes, bytes, maps, Structs, nested and repeated messages): the plan of converters gives what
    protobuf's ``MessageToDict`` gives (64-bit integers and integral Struct numbers as numbers), and ParseDict reads
    it back to the same message."""
    for message in (cls(), _filled(cls(), variant)):
        got = message_to_dict(message)
        assert got == _library_mapping(message)
        assert json.loads(json.dumps(got)) == got or _has_nan_or_negative_zero(got)
        back = ParseDict(got, cls())
        assert back.SerializeToString(deterministic=True) == message.SerializeToString(deterministic=True)


def _has_nan_or_negative_zero(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_nan_or_negative_zero(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan_or_negative_zero(v) for v in value)
    return isinstance(value, float) and (math.isnan(value) or (value == 0 and math.copysign(1, value) < 0))


def test_the_relay_digest_is_blake3_of_the_models_little_endian_float64_bytes() -> None:
    """The wire contract a peer of another implementation must match (RelayedModel.digest): BLAKE3, 32 bytes, of the
    parameters as little-endian float64, whatever dtype or byte order they were held in. The empty model gives the
    BLAKE3 specification's test vector for empty input."""
    assert model_digest(np.empty(0)).hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    params = np.array([1.0, -0.5, 3.25e-300, np.pi])
    digest = model_digest(params)
    assert len(digest) == 32
    assert digest == model_digest(params.astype(">f8"))
    held32 = params.astype(np.float32)
    assert model_digest(held32) == model_digest(held32.astype(np.float64)) != digest  # its float64 values, rounded
    assert digest == model_digest(np.asfortranarray(params)) != model_digest(params[::-1])
    changed = params.copy()
    changed[3] = np.nextafter(changed[3], 0.0)  # one bit of one parameter
    assert model_digest(changed) != digest
