"""Everything about the gradcode.v1 wire types, shared by master and worker: the one home of wire knowledge.

* dtypes: the numpy dtype of every wire ``DType`` (:data:`MESSAGE_DTYPES` for coded messages);
* conversions: tensors, Structs, code specs (:func:`code_spec`) and message rows (:func:`row_definition`);
* framing: a job's partitions travel to a worker in :func:`partition_chunks`; coded gradients as below.

Coded gradients travel as raw little-endian bytes split into chunks; the receiver reassembles and
validates them with :class:`MessageAssembler`, which refuses anything that does not fit the iteration
it expects with a :class:`WireError` saying exactly what is wrong.

The gradient path is built to copy the payload as little as protobuf allows:

* the sender (:func:`message_chunk_pieces`) checksums the vector with XXH3-64 (:func:`payload_digest`)
  where it lies and writes each serialized GradientChunk as the small metadata
  message followed by the ``data`` field spliced in by hand (protobuf concatenation merges
  messages), so protobuf never copies or re-encodes the payload. The chunk stays in two pieces
  (:data:`Serialized`): a link writes them as they are, and :func:`serialize_chunk` joins them for
  gRPC, which sends the bytes as they are;
* the receiver (:func:`parse_chunk`, a gRPC response deserializer) parses only the metadata with
  protobuf and keeps ``data`` as a view into the received bytes; :class:`MessageAssembler` copies it
  once into the message's buffer and checks its checksum and finiteness chunk by chunk as they arrive, so
  little work is left when the last chunk lands. Over a link, a large chunk's payload is received
  straight into the message's buffer instead (:func:`chunk_head`, :meth:`MessageAssembler.place`): the
  kernel's copy is the only one;
* :func:`chunk_bytes_for` picks the chunk size from the message size.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import blake3
import grpc
import numpy as np
import xxhash
from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from gradcode.common.codes.base import Array
from gradcode.common.codes.numerics import all_finite, squared_norm
from gradcode.common.exceptions import WireError
from gradcode.v1 import common_pb2, worker_pb2

__all__ = [
    "CHANNEL_OPTIONS",
    "CHILDREN_LOST_METADATA",
    "COMPLEX128",
    "COMPUTE_METHOD",
    "DEFAULT_CHUNK_BYTES",
    "FLOAT32",
    "FLOAT64",
    "MAX_CHUNK_BYTES",
    "MAX_ITERATIONS",
    "MAX_JOB_ID_CHARS",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_DTYPES",
    "MODEL_DIGEST_BYTES",
    "NO_SUBTREE",
    "SESSION_METHOD",
    "CompletedMessage",
    "MessageAssembler",
    "Placer",
    "ReceivedChunk",
    "Serialized",
    "Subtree",
    "Timing",
    "WireError",
    "array_from_tensor",
    "children_lost_from_metadata",
    "children_lost_metadata",
    "chunk_bytes_for",
    "chunk_head",
    "code_spec",
    "compute_stream",
    "dict_from_struct",
    "dtype_from_wire",
    "dtype_to_wire",
    "float64_parts",
    "message_chunk_bytes",
    "message_chunk_pieces",
    "message_chunks",
    "message_to_dict",
    "model_digest",
    "model_request_bytes",
    "parse_chunk",
    "partition_chunks",
    "payload_digest",
    "row_definition",
    "serialize_chunk",
    "serialized_size",
    "struct_from_dict",
    "tensor_field_bytes",
    "tensor_from_array",
]

MAX_ITERATIONS = 1_000_000
"""Most iterations a job may run (JobSpec.iterations); iteration numbers on the wire never exceed it."""
MAX_JOB_ID_CHARS = 128
"""Longest job id a request may name (the master's own ids are at most 64 characters)."""
"""Most iterations a job may run (JobSpec.iterations); iteration numbers on the wire never exceed it."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest single gRPC message accepted (models are sent whole; gradients are chunked)."""
DEFAULT_CHUNK_BYTES = 1 << 20
"""Smallest payload of a chunk of a multi-chunk message (see :func:`chunk_bytes_for`)."""
MAX_CHUNK_BYTES = 4 << 20
"""Largest chunk payload :func:`chunk_bytes_for` picks."""
CHUNKS_PER_MESSAGE = 4
"""A large message is cut into about this many chunks: enough to overlap the sender's serialization,
the transfer and the receiver's assembly, few enough that per-message costs stay small."""
COMPUTE_METHOD = "/" + worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name + "/Compute"
SESSION_METHOD = "/" + worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name + "/Session"
RECONNECT_BACKOFF_MS = (200, 1000)
"""First and longest wait between a channel's attempts to reach a peer that is down. gRPC's own longest is 120 s:
a worker restarted after half a minute down stayed unreachable to the channels that had tried it for 10 s
and more (a tree parent's to its children too, longer than the parent waits for them)."""
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
]
"""Options for every gradcode server and channel."""

FLOAT64: np.dtype[Any] = np.dtype("<f8")
FLOAT32: np.dtype[Any] = np.dtype("<f4")
COMPLEX128: np.dtype[Any] = np.dtype("<c16")
_DTYPES: dict[int, np.dtype[Any]] = {
    common_pb2.DTYPE_FLOAT64: FLOAT64,
    common_pb2.DTYPE_COMPLEX128: COMPLEX128,
    common_pb2.DTYPE_FLOAT32: FLOAT32,
    common_pb2.DTYPE_INT64: np.dtype("<i8"),
}
MESSAGE_DTYPES: dict[int, np.dtype[Any]] = {
    common_pb2.DTYPE_UNSPECIFIED: FLOAT64,
    common_pb2.DTYPE_FLOAT64: FLOAT64,
    common_pb2.DTYPE_FLOAT32: FLOAT32,
    common_pb2.DTYPE_COMPLEX128: COMPLEX128,
}
"""The dtypes a coded message may have (a JobSetup's ``message_dtype``; unspecified is float64)."""


def dtype_from_wire(code: int) -> np.dtype[Any]:
    try:
        return _DTYPES[code]
    except KeyError:
        valid = ", ".join(common_pb2.DType.Name(c) for c in _DTYPES)
        raise WireError(f"Unsupported dtype {code}; valid: {valid}.") from None


def dtype_to_wire(dtype: np.dtype[Any] | type) -> int:
    dt = np.dtype(dtype).newbyteorder("<")
    for code, candidate in _DTYPES.items():
        if candidate == dt:
            return code
    raise WireError(f"dtype {dt} cannot be sent; use float64, complex128, float32 or int64.")


def tensor_from_array(array: Array) -> common_pb2.Tensor:
    a = np.ascontiguousarray(array)
    wire = dtype_to_wire(a.dtype)
    data = a.astype(_DTYPES[wire], copy=False).tobytes()
    return common_pb2.Tensor(dtype=wire, shape=list(a.shape), data=data)  # type: ignore[arg-type]


def array_from_tensor(tensor: common_pb2.Tensor, *, expected_shape: tuple[int, ...] | None = None) -> Array:
    """Decode a Tensor, checking that its byte length matches its shape (and the expected shape)."""
    dtype = dtype_from_wire(tensor.dtype)
    shape = tuple(int(d) for d in tensor.shape)
    if expected_shape is not None and shape != expected_shape:
        raise WireError(f"Tensor has shape {shape}, expected {expected_shape}.")
    want = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for absurd shapes
    data = tensor.data  # each access copies the field out of protobuf's arena: read it once
    if len(data) != want:
        raise WireError(f"Tensor of shape {shape} and dtype {dtype} needs {want} bytes, got {len(data)}.")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def struct_from_dict(values: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(dict(values))
    return s


def _integral(v: Any) -> Any:
    """Integral floats back to ints, through lists and dicts (Struct stores every number as double)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list):
        return [_integral(x) for x in v]
    if isinstance(v, dict):
        return {key: _integral(x) for key, x in v.items()}
    return v


def dict_from_struct(s: struct_pb2.Struct) -> dict[str, Any]:
    """Struct to dict, turning integral floats back into ints (Struct stores every number as double)."""
    from google.protobuf.json_format import MessageToDict

    return {key: _integral(v) for key, v in MessageToDict(s).items()}


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict with its own types: every field (defaults included), proto field
    names, 64-bit integers as numbers (protobuf's JSON mapping makes them strings: ``"iteration": "1"``),
    integral numbers inside Structs as ints (``"n": 8``, not ``8.0``), enums by name, NaN as ``"NaN"``.

    For history files and saved specs; ``google.protobuf.json_format.ParseDict`` reads it back. Each message type's
    fields are read once into a plan of converters: protobuf's ``MessageToDict`` walks the descriptors again for
    every message (135 µs for one iteration report at n = 16, 2 % of the master's CPU, every iteration). Its JSON
    mapping is kept field for field (``tests/common/test_wire.py`` holds the two equal), and the well-known types
    (Struct, ...) and any message with a 32-bit float field (shortest-repr rounding) are left to it.
    """
    converted = _to_json(message)
    assert isinstance(converted, dict), f"{message.DESCRIPTOR.full_name} does not map to a JSON object"
    return converted


def _to_json(message: Message) -> Any:
    plan = _plan(message.DESCRIPTOR)
    if plan is None:
        return _library_json(message)
    return {
        name: convert(getattr(message, name))
        for name, presence, convert in plan
        if not presence or message.HasField(name)
    }


def _library_json(message: Message) -> Any:
    from google.protobuf.json_format import MessageToDict

    if isinstance(message, struct_pb2.Struct):
        return dict_from_struct(message)
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


_Plan = tuple[tuple[str, bool, Callable[[Any], Any]], ...]


@functools.cache
def _plan(descriptor: Descriptor) -> _Plan | None:
    """Each field's name, whether it is printed only when set (it has presence), and its value's converter; None
    for what :func:`_library_json` converts."""
    fields = descriptor.fields
    if descriptor.full_name.startswith("google.protobuf.") or any(f.type == FieldDescriptor.TYPE_FLOAT for f in fields):
        return None
    return tuple((f.name, f.has_presence and not f.is_repeated, _field_converter(f)) for f in fields)


def _field_converter(field: FieldDescriptor) -> Callable[[Any], Any]:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key_is_bool = entry.fields_by_name["key"].type == FieldDescriptor.TYPE_BOOL
        value = _value_converter(entry.fields_by_name["value"])

        def key(k: Any) -> str:
            return ("true" if k else "false") if key_is_bool else str(k)

        return lambda mapping: {key(k): value(v) for k, v in mapping.items()}
    one = _value_converter(field)
    if field.is_repeated:
        return lambda values: [one(v) for v in values]
    return one


def _value_converter(field: FieldDescriptor) -> Callable[[Any], Any]:
    if field.message_type is not None:
        return _to_json
    if field.enum_type is not None:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda number: names.get(number, number)  # an unknown number stays a number, as in protobuf's
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return _json_double
    if field.type == FieldDescriptor.TYPE_BYTES:
        return lambda data: base64.b64encode(data).decode("ascii")
    return _same  # bool, str and integers (64-bit ones as numbers)


def _json_double(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _same(value: Any) -> Any:
    return value


CHILDREN_LOST_METADATA = "gradcode-children-lost"
"""Trailing-metadata key of a failed tree parent's Compute: its children that lost the job, comma-separated."""


def children_lost_metadata(children: Sequence[int]) -> tuple[tuple[str, str], ...]:
    """The trailing metadata naming a tree parent's lost children (empty when there are none)."""
    return ((CHILDREN_LOST_METADATA, ",".join(str(int(c)) for c in children)),) if children else ()


def children_lost_from_metadata(metadata: Any) -> tuple[int, ...]:
    """The lost children a call's trailing metadata names (none, or ignored when malformed)."""
    for key, value in metadata or ():
        if key == CHILDREN_LOST_METADATA and isinstance(value, str):
            try:
                return tuple(int(c) for c in value.split(",") if c)
            except ValueError:
                return ()
    return ()


def code_spec(name: str, params: Mapping[str, Any]) -> common_pb2.CodeSpec:
    """The wire CodeSpec of a code given by registry name and parameters."""
    return common_pb2.CodeSpec(name=name, params=struct_from_dict(params))


def row_definition(row: int, partitions: Sequence[int], coefficients: Any) -> worker_pb2.RowDefinition:
    """The RowDefinition of message ``row``: ``sum(coefficients[i] * g[partitions[i]])`` (complex: real + imag)."""
    values = np.asarray(coefficients)
    definition = worker_pb2.RowDefinition(
        row=row, partitions=[int(j) for j in partitions], coefficients_real=values.real.tolist()
    )
    if np.iscomplexobj(values):
        definition.coefficients_imag.extend(values.imag.tolist())
    return definition


def partition_chunks(
    partition: int, num_samples: int, features: bytes, labels: bytes, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[worker_pb2.LoadJobChunk]:
    """One partition's float64 feature and label bytes as LoadJob data chunks of at most ``chunk_bytes`` each."""
    step = max(8, chunk_bytes - chunk_bytes % 8)
    count = max(1, -(-len(features) // step), -(-len(labels) // step))
    for i in range(count):
        lo = i * step
        yield worker_pb2.LoadJobChunk(
            data=worker_pb2.PartitionData(
                partition=partition,
                num_samples=num_samples,
                features_offset=min(lo, len(features)),
                features=features[lo : lo + step],
                labels_offset=min(lo, len(labels)),
                labels=labels[lo : lo + step],
            )
        )


def chunk_bytes_for(nbytes: int) -> int:
    """Payload bytes per chunk for a message of ``nbytes``: about :data:`CHUNKS_PER_MESSAGE` chunks,
    each between :data:`DEFAULT_CHUNK_BYTES` and :data:`MAX_CHUNK_BYTES` (a message up to the first is one chunk)."""
    return min(MAX_CHUNK_BYTES, max(DEFAULT_CHUNK_BYTES, -(-nbytes // CHUNKS_PER_MESSAGE)))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_DATA_FIELD = worker_pb2.GradientChunk.DESCRIPTOR.fields_by_name["data"].number
_DATA_TAG = _varint(_DATA_FIELD << 3 | 2)  # wire type 2: length-delimited


Serialized = bytes | tuple[bytes | memoryview, ...]
"""A serialized message, whole or as pieces whose concatenation it is. A link (:mod:`gradcode.common.transport.link`)
writes the pieces as they are, so a large payload is not copied to put a few bytes in front of it; gRPC gets them
joined (:func:`serialize_chunk`). The pieces must not change once handed over (Python 3.12's transports keep
references to them until sent)."""


def serialized_size(message: Serialized) -> int:
    return len(message) if isinstance(message, bytes) else sum(len(piece) for piece in message)


_Timed = TypeVar("_Timed")


class Timing(NamedTuple):
    """One node's answer to one request: ``seconds`` from the request to its last message as its receiver saw them,
    and the node's own account of them from its trailers (the fields of WorkerTiming and ChildTiming): getting its
    model checked (a relayed one: the fetch), computing its messages, and the emulated delay it slept (a leaf
    before computing; a tree parent's computing runs from its start to its decode and covers its delay). A named
    tuple: the master builds one a worker every iteration."""

    seconds: float
    model_seconds: float = 0.0
    compute_seconds: float = 0.0
    straggle_seconds: float = 0.0

    def message(self, kind: Callable[..., _Timed], worker_id: int) -> _Timed:
        """This timing as a ``kind``, WorkerTiming or ChildTiming (the same fields), of ``worker_id``."""
        return kind(
            worker_id=worker_id, seconds=self.seconds, model_seconds=self.model_seconds,
            compute_seconds=self.compute_seconds, straggle_seconds=self.straggle_seconds,
        )  # fmt: skip


def _checked_durations(what: str, **seconds: float) -> None:
    """WireError unless every one of ``seconds`` is a finite number >= 0 (a peer's account of its time)."""
    for name, value in seconds.items():
        if not (math.isfinite(value) and value >= 0):
            raise WireError(f"{what} {name} {value!r}, which must be a finite number >= 0")


@dataclass(frozen=True)
class Subtree:
    """What a tree parent's message says of the nodes below it (job worker indices), in its trailer; a leaf's
    message says nothing (:data:`NO_SUBTREE`)."""

    lost: tuple[int, ...] = ()
    """Its children that answered NOT_FOUND (restarted, lost the job): the master reloads them."""
    singled_out: tuple[int, ...] = ()
    """Its children its consistency checks singled out: its decoded part leaves them out."""
    quarantined: tuple[int, ...] = ()
    """Of those, the ones it quarantined (asks no more in this job)."""
    timings: tuple[tuple[int, Timing], ...] = ()
    """Its descendants that delivered, each with its seconds as its own parent saw them and its own account."""
    late: tuple[int, ...] = ()
    """Its descendants a parent decoded without (late or failed in that parent's round)."""

    def named(self) -> frozenset[int]:
        """Every node this subtree report names."""
        return frozenset((*self.lost, *self.singled_out, *self.quarantined, *(c for c, _ in self.timings), *self.late))

    def write(self, trailer: worker_pb2.MessageTrailer) -> None:
        trailer.children_lost.extend(self.lost)
        trailer.children_singled_out.extend(self.singled_out)
        trailer.children_quarantined.extend(self.quarantined)
        for child, timing in self.timings:
            trailer.children_timings.append(timing.message(worker_pb2.ChildTiming, child))
        trailer.children_late.extend(self.late)

    @classmethod
    def read(cls, trailer: worker_pb2.MessageTrailer) -> Subtree:
        """The trailer's subtree (:data:`NO_SUBTREE` for a leaf's); WireError for a child's seconds that are not
        finite and >= 0."""
        if not (trailer.children_lost or trailer.children_singled_out or trailer.children_quarantined
                or trailer.children_timings or trailer.children_late):  # fmt: skip
            return NO_SUBTREE
        timings = []
        for t in trailer.children_timings:
            timing = Timing(t.seconds, t.model_seconds, t.compute_seconds, t.straggle_seconds)
            _checked_durations("a child's", **timing._asdict())
            timings.append((int(t.worker_id), timing))
        return cls(
            lost=tuple(int(c) for c in trailer.children_lost),
            singled_out=tuple(int(c) for c in trailer.children_singled_out),
            quarantined=tuple(int(c) for c in trailer.children_quarantined),
            timings=tuple(timings),
            late=tuple(int(c) for c in trailer.children_late),
        )


NO_SUBTREE = Subtree()
"""A leaf's message: nothing below it."""


def message_chunk_bytes(vector: Array, **kwargs: Any) -> Iterator[bytes]:
    """:func:`message_chunk_pieces` (same arguments), each chunk joined into bytes."""
    for chunk in message_chunk_pieces(vector, **kwargs):
        yield serialize_chunk(chunk)


def message_chunk_pieces(
    vector: Array,
    *,
    job_id: str,
    iteration: int,
    worker_id: int,
    row: int,
    compute_seconds: float = 0.0,
    straggle_seconds: float = 0.0,
    model_seconds: float = 0.0,
    approximate: bool = False,
    decode_error: float = 0.0,
    subtree: Subtree = NO_SUBTREE,
    chunk_bytes: int | None = None,
    magnitude: float = math.nan,
    shared: Callable[[Array], bool] | None = None,
    request_id: int = 0,
    final: bool = False,
) -> Iterator[Serialized]:
    r"""One coded message as serialized GradientChunks: header on the first, checksummed trailer on the last.

    ``chunk_bytes`` (payload per chunk) defaults to :func:`chunk_bytes_for` the message's size.
    ``model_seconds``, ``compute_seconds`` and ``straggle_seconds`` are the sender's account of its time
    (:class:`Timing`).
    ``approximate`` marks a tree parent's message whose decoded part is not exact; ``decode_error`` is the
    sender's certified absolute error bound on its message (a leaf's rounding of several partitions, a parent's
    decode and own rounding; 0: the receiver bounds it); ``subtree`` what a tree parent says of the nodes below it
    (:class:`Subtree`); ``magnitude`` is the sender's
    $\sum_j |b_j| \|g_j\|$ (NaN: not sent). A chunk with data is two pieces, its fields and a view of the payload
    (never copied here); protobuf serializes only the small fields.

    ``shared`` hands the payload (little-endian, contiguous) to the receiver's shared-memory directory
    (:mod:`gradcode.common.transport.shared_memory`); when it returns True the message is one chunk with
    ``shared_payload`` set and no data, else (the write failed) it travels inline as usual.
    ``request_id`` tags every chunk with the Session request it answers (0: a Compute call); ``final`` (the
    request's last message) also marks its last chunk with the request's OK status, which saves the Session
    a message.
    """
    v = np.ascontiguousarray(vector)
    wire = dtype_to_wire(v.dtype)
    payload = np.ascontiguousarray(v.astype(_DTYPES[wire], copy=False)).reshape(-1)
    digest = payload_digest(payload)
    itemsize = _DTYPES[wire].itemsize
    total = payload.nbytes
    in_file = shared is not None and shared(payload)
    size = chunk_bytes_for(total) if chunk_bytes is None else chunk_bytes
    step = max(itemsize, size - size % itemsize)
    starts = range(0, total, step) if total and not in_file else range(1)
    last = starts[-1]
    view = payload.view(np.uint8).data if total else memoryview(b"")
    for start in starts:
        meta = worker_pb2.GradientChunk(
            job_id=job_id,
            iteration=iteration,
            worker_id=worker_id,
            row=row,
            offset=start // itemsize,
            request_id=request_id,
        )
        if start == 0:
            meta.header.dtype = wire  # type: ignore[assignment]
            meta.header.length = v.size
            meta.shared_payload = in_file
        if start == last:
            meta.trailer.xxh3 = digest
            meta.trailer.compute_seconds = compute_seconds
            meta.trailer.straggle_seconds = straggle_seconds
            meta.trailer.model_seconds = model_seconds
            meta.trailer.approximate = approximate
            meta.trailer.decode_error = decode_error
            subtree.write(meta.trailer)
            if math.isfinite(magnitude):
                meta.trailer.magnitude = magnitude
            if final and request_id:
                meta.status.code = 0  # present, OK: the request's last chunk
        piece = view[start : start + step]
        if len(piece) and not in_file:
            yield b"".join((meta.SerializeToString(), _DATA_TAG, _varint(len(piece)))), piece
        else:
            yield meta.SerializeToString()


def message_chunks(vector: Array, **kwargs: Any) -> Iterator[worker_pb2.GradientChunk]:
    """:func:`message_chunk_bytes` (same arguments) as GradientChunk messages, for code that edits them."""
    for data in message_chunk_bytes(vector, **kwargs):
        yield worker_pb2.GradientChunk.FromString(data)


def serialize_chunk(message: Serialized | Message) -> bytes:
    """Serializer of both ends of Worker.Compute and Worker.Session (the worker's chunks, the master's requests):
    serialized messages pass through untouched, pieces (:data:`Serialized`) are joined."""
    if isinstance(message, bytes):
        return message
    if isinstance(message, tuple):
        return b"".join(message)
    return message.SerializeToString()


@dataclass(frozen=True)
class ReceivedChunk:
    """A received GradientChunk whose ``data`` is a view into the bytes gRPC delivered (never copied).

    ``meta`` holds every other field; :class:`MessageAssembler` reads either form. ``placed``: ``data`` was
    received straight into the message's buffer where :meth:`MessageAssembler.place` said, which admitted it.
    """

    meta: worker_pb2.GradientChunk
    data: memoryview
    placed: bool = False
    nbytes: int = 0
    """The serialized chunk's size as it arrived (what the transport carried, its framing aside)."""


Placer = Callable[[worker_pb2.GradientChunk, int], "memoryview | None"]
"""Where the ``nbytes`` of payload of a chunk with these fields should be received (:meth:`MessageAssembler.place`),
or None to receive it as usual."""


def _read_varint(raw: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise WireError("A GradientChunk is malformed: truncated or overlong varint.")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


SMALL_CHUNK_BYTES = 4096
"""Chunks up to this size are parsed whole by protobuf (the field walk in Python costs ~50 µs a chunk)."""


def _fields(raw: bytes | memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """Each top-level field of a serialized message: ``(start, number, wire type, value start, end)``; the last
    one's end may lie past ``raw`` when it is cut off. WireError on a cut-off varint or an unknown wire type."""
    pos = 0
    while pos < len(raw):
        start = pos
        key, pos = _read_varint(raw, pos)
        field, kind = key >> 3, key & 7
        if kind == 0:
            _, end = _read_varint(raw, pos)
        elif kind == 1:
            end = pos + 8
        elif kind == 5:
            end = pos + 4
        elif kind == 2:
            length, pos = _read_varint(raw, pos)
            end = pos + length
        else:
            raise WireError(f"A GradientChunk is malformed: field {field} has unsupported wire type {kind}.")
        yield start, field, kind, pos, end
        pos = end


def _meta(raw: bytes | memoryview, spans: list[tuple[int, int]]) -> worker_pb2.GradientChunk:
    """The chunk made of these spans of ``raw`` (every field but the data); protobuf's DecodeError if malformed."""
    return worker_pb2.GradientChunk.FromString(b"".join(raw[a:b] for a, b in spans))


def chunk_head(head: bytes | memoryview, size: int) -> tuple[worker_pb2.GradientChunk, int] | None:
    """The fields of a ``size``-byte chunk of which ``head`` is the start, and where its payload begins, when
    ``head`` holds every field and its data field is the last, running to the end (as :func:`message_chunk_pieces`
    writes them); else None, and the chunk is received whole and parsed by :func:`parse_chunk`."""
    spans: list[tuple[int, int]] = []
    try:
        for start, field, kind, value, end in _fields(head):
            if field == _DATA_FIELD and kind == 2:
                if end != size:
                    return None
                try:
                    return _meta(head, spans), value
                except DecodeError:
                    return None
            if end > len(head):
                return None
            spans.append((start, end))
    except WireError:  # cut off by the end of head
        return None
    return None


def parse_chunk(raw: bytes | memoryview) -> ReceivedChunk:
    """Response deserializer of Worker.Compute: protobuf parses the metadata, ``data`` stays a view of ``raw``.

    Walks the top-level fields (a handful per chunk); a repeated ``data`` field keeps the last one,
    as protobuf does. A chunk of at most :data:`SMALL_CHUNK_BYTES` (a shared-memory message's header and
    trailer, a Session status) is parsed by protobuf whole: copying its little data costs less than the walk.
    Raises :class:`WireError` (or protobuf's DecodeError) on malformed input.
    """
    if len(raw) <= SMALL_CHUNK_BYTES:
        meta = worker_pb2.GradientChunk.FromString(raw)  # type: ignore[arg-type]  # upb parses any buffer
        small = meta.data
        if small:
            meta.ClearField("data")
        return ReceivedChunk(meta=meta, data=memoryview(small), nbytes=len(raw))
    size = len(raw)
    data = memoryview(b"")
    spans: list[tuple[int, int]] = []
    for start, field, kind, value, end in _fields(raw):
        if end > size:
            what = "its data field runs" if field == _DATA_FIELD and kind == 2 else "a field runs"
            raise WireError(f"A GradientChunk is malformed: {what} past the end of its {size} bytes.")
        if field == _DATA_FIELD and kind == 2:
            data = memoryview(raw)[value:end]
        else:
            spans.append((start, end))
    return ReceivedChunk(meta=_meta(raw, spans), data=data, nbytes=size)


_TENSOR_DATA_TAG = _varint(common_pb2.Tensor.DESCRIPTOR.fields_by_name["data"].number << 3 | 2)


def payload_digest(data: Array) -> int:
    """XXH3-64 (seed 0) of a payload's bytes (contiguous): the checksum of every coded message (its trailer's
    ``xxh3``, checked chunk by chunk by :class:`MessageAssembler`) and of the model in a shared-memory slot.

    It catches bytes changed on their way (a slot rewritten before it was checked, a corrupted transfer), not a
    peer that chose its bytes: that is what :func:`model_digest` and the integrity checks are for. Not CRC-32C any
    more: on a message just written by another process (cold in this core's caches) CRC-32C read 0.8 MB at about
    11 GB/s here, XXH3 at twice that."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(data).data)


MODEL_DIGEST_BYTES = 32
"""Length of :func:`model_digest`."""


def model_digest(params: Array) -> bytes:
    """BLAKE3 (:data:`MODEL_DIGEST_BYTES`) of a model's little-endian float64 bytes: what a worker told to fetch the
    model from a peer (``ComputeRequest.relayed_model``) checks it against, so a stale or lying peer is caught.
    A cryptographic hash, not a checksum: a peer that chose its bytes could match any checksum. BLAKE3, not the
    standard library's BLAKE2b: 1.5 against 8.7 ms for a p = 10⁶ model here (one thread), and the master hashes
    every relayed model, every worker that fetches one too (a tree parent: 13 % of its CPU with BLAKE2b)."""
    a = np.ascontiguousarray(np.asarray(params, dtype=FLOAT64))
    return blake3.blake3(a.view(np.uint8).data).digest(MODEL_DIGEST_BYTES)


def model_request_bytes(params: Array) -> bytes:
    """``ComputeRequest(model=tensor_from_array(params))`` serialized, copying the parameters once.

    The master serializes this once per iteration and sends each worker its own small fields
    followed by these bytes (protobuf concatenation merges messages); a tree parent the same to its children.
    """
    return tensor_field_bytes(worker_pb2.ComputeRequest, "model", params)


def tensor_field_bytes(message: type[Message], field: str, params: Array) -> bytes:
    """``message(**{field: tensor_from_array(params)})`` serialized, copying the parameters once (``FetchModelReply``'s
    model, ``ComputeRequest``'s: :func:`model_request_bytes`)."""
    a = np.ascontiguousarray(params)
    wire = dtype_to_wire(a.dtype)
    a = np.ascontiguousarray(a.astype(_DTYPES[wire], copy=False)).reshape(-1)
    head = common_pb2.Tensor(dtype=wire, shape=list(np.shape(params))).SerializeToString()  # type: ignore[arg-type]
    data: list[bytes | memoryview] = [_TENSOR_DATA_TAG, _varint(a.nbytes), a.view(np.uint8).data] if a.nbytes else []
    tensor_length = len(head) + sum(len(part) for part in data)
    tag = _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)
    return b"".join([tag, _varint(tensor_length), head, *data])


def float64_parts(message: type[Message], field: str, params: Array, part_bytes: int) -> list[bytes]:
    """``message(**{field: piece})`` serialized for each consecutive piece of at most ``part_bytes`` of ``params``'
    little-endian float64 bytes, in order (a relayed model's ``FetchModelReply.part`` s), copying them once."""
    raw = np.ascontiguousarray(params, dtype="<f8").reshape(-1).view(np.uint8).data
    tag = _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)
    pieces = (raw[start : start + part_bytes] for start in range(0, len(raw), part_bytes))
    return [b"".join((tag, _varint(len(piece)), piece)) for piece in pieces]


def compute_stream(channel: grpc.aio.Channel) -> Any:
    """Worker.Compute on ``channel`` taking a ComputeRequest (or its serialized bytes) and yielding
    :class:`ReceivedChunk` s (:func:`parse_chunk`): what the master and tree parents call."""
    return channel.unary_stream(COMPUTE_METHOD, request_serializer=serialize_chunk, response_deserializer=parse_chunk)


@dataclass(frozen=True)
class CompletedMessage:
    """One fully received and verified coded message."""

    worker_id: int
    row: int
    vector: Array
    compute_seconds: float
    straggle_seconds: float
    approximate: bool = False
    """True when the sender (a tree parent) decoded its children only approximately."""
    model_seconds: float = 0.0
    """The sender's seconds from its request to its model checked (:class:`Timing`)."""
    norm: float = math.nan
    """Euclidean norm of the message's first ``norm_length`` elements (the gradient part), accumulated
    chunk by chunk as it arrived: what the decode's error certificate needs of each message."""
    decode_error: float = 0.0
    """The sender's certified absolute error bound on its message (a leaf summing several partitions: its rounding;
    a tree parent: its children's decode and its own rounding); 0: none sent, the receiver bounds it."""
    subtree: Subtree = NO_SUBTREE
    """What the sender, a tree parent, said of the nodes below it."""
    magnitude: float = math.nan
    r"""The sender's $\sum_j |b_j| \|g_j\|$ (a leaf's, from its trailer; NaN when not sent): makes the
    decode's error certificate rigorous for this message."""


class MessageAssembler:
    """Reassembles the chunks of one worker's stream for one (job, iteration), validating everything.

    ``rows`` are the rows this worker was asked for; ``length`` the expected message length; ``dtypes``
    the element types accepted; ``norm_length`` how many leading elements :attr:`CompletedMessage.norm`
    covers (default: all; a receiver passes the gradient's length, so the appended statistics stay out of
    the certificate). Raises :class:`WireError` on a chunk for another job or iteration, an unknown
    worker or row, an out-of-order offset, a wrong length or a failed checksum.
    """

    def __init__(
        self,
        *,
        job_id: str,
        iteration: int,
        worker_id: int,
        rows: tuple[int, ...],
        length: int,
        dtypes: tuple[np.dtype[Any], ...] = (np.dtype("<f8"),),
        norm_length: int | None = None,
        shared: Callable[[int, np.dtype[Any], int], Array] | None = None,
        subtree: frozenset[int] = frozenset(),
    ) -> None:
        self.job_id = job_id
        self.subtree = subtree
        """The worker indices below this worker in a tree (empty: a leaf, or a flat job): the only nodes its
        trailers may name (:class:`Subtree`); a trailer that names another is refused."""
        self.shared = shared
        """Row ``r``'s shared-memory payload as ``length`` elements of ``dtype``, in place (the receiver asked this
        worker for shared payloads this iteration); None: a chunk with ``shared_payload`` is refused."""
        self.iteration = iteration
        self.worker_id = worker_id
        self.rows = rows
        self.length = length
        self.dtypes = dtypes
        self.norm_length = length if norm_length is None else min(norm_length, length)
        self._where = f"worker {worker_id}, job {job_id!r}, iteration {iteration}"
        """Whose stream this is, as every refusal names it (formatted once, not per chunk)."""
        self._row: int | None = None
        self._squares = 0.0
        self._buffer: Array | None = None
        self._filled = 0
        """Elements of the current row checked (their chunks fed)."""
        self._admitted = 0
        """Elements of the current row whose chunks were admitted (fed, or placed and still to be fed)."""
        self._digest = xxhash.xxh3_64()
        self._done: set[int] = set()

    def feed(self, received: worker_pb2.GradientChunk | ReceivedChunk | None) -> CompletedMessage | None:
        """Add a chunk; return the message it completes, if any.

        ``None`` is what a gRPC stream yields when its response deserializer (:func:`parse_chunk`) failed.
        """
        if received is None:
            raise WireError(
                f"A chunk from {self._where} could not be parsed as a GradientChunk (malformed bytes on the wire)."
            )
        # The payload is copied once, from the received bytes into the message's buffer (or received there
        # directly: placed; or checked where it is, in its shared-memory slot), and checksummed there.
        placed = False
        if isinstance(received, ReceivedChunk):
            chunk, payload, placed = received.meta, received.data, received.placed
        else:
            chunk, payload = received, memoryview(received.data)  # each .data access copies: read it once
        where = self._where
        if placed:  # admitted by place(), in order: it is the next one to check
            assert self._buffer is not None
            start, count = self._filled, len(payload) // self._buffer.itemsize
        else:
            start, count = self._admit(chunk, len(payload))
            assert self._buffer is not None
            if count and not chunk.shared_payload:
                self._buffer[start : start + count] = np.frombuffer(payload, dtype=self._buffer.dtype)
        if count:
            piece = self._buffer[start : start + count]
            self._digest.update(piece.data)
            normed = piece[: max(0, self.norm_length - start)]
            squares = squared_norm(normed)
            if not (all_finite(normed, squares) and all_finite(piece[normed.size :])):
                raise WireError(f"Row {chunk.row} from {where} contains NaN or infinite values.")
            self._squares += squares
        self._filled += count
        if not chunk.HasField("trailer"):
            return None
        if self._filled != self.length:
            raise WireError(f"Row {chunk.row} from {where} ended after {self._filled} of {self.length} elements.")
        if not chunk.trailer.HasField("xxh3"):
            raise WireError(
                f"Row {chunk.row} from {where} has no XXH3-64 checksum in its trailer (field xxh3); a sender "
                "from before XXH3-64 replaced CRC-32C (field 5) is not accepted: run the same gradcode "
                "version on master and workers."
            )
        received_digest = self._digest.intdigest()
        if received_digest != chunk.trailer.xxh3:
            raise WireError(
                f"Row {chunk.row} from {where} failed its XXH3-64 check: the trailer says {chunk.trailer.xxh3:#018x}, "
                f"the bytes received give {received_digest:#018x}."
            )
        magnitude = chunk.trailer.magnitude if chunk.trailer.HasField("magnitude") else math.nan
        if chunk.trailer.HasField("magnitude") and not (math.isfinite(magnitude) and magnitude >= 0):
            raise WireError(
                f"Row {chunk.row} from {where} has magnitude {magnitude!r}; it must be a finite number >= 0."
            )
        trailer = chunk.trailer
        compute, straggle, model = trailer.compute_seconds, trailer.straggle_seconds, trailer.model_seconds
        try:
            if not (0 <= compute < math.inf and 0 <= straggle < math.inf and 0 <= model < math.inf):  # (NaN too)
                _checked_durations("its", compute_seconds=compute, straggle_seconds=straggle, model_seconds=model)
            subtree = Subtree.read(trailer)
        except WireError as exc:
            raise WireError(f"Row {chunk.row} from {where} reports {exc}.") from None
        outside = () if subtree is NO_SUBTREE else sorted(subtree.named() - self.subtree)  # (a leaf's: nothing)
        if outside:
            below = sorted(self.subtree) if self.subtree else "none: it has no children"
            raise WireError(
                f"Row {chunk.row} from {where} names workers {outside} in its trailer (children lost, singled out, "
                f"quarantined, late or timed); it may speak only of the workers below it ({below})."
            )
        done = CompletedMessage(
            worker_id=self.worker_id,
            row=chunk.row,
            vector=self._buffer,
            compute_seconds=compute,
            straggle_seconds=straggle,
            model_seconds=model,
            approximate=chunk.trailer.approximate,
            norm=math.sqrt(self._squares),
            decode_error=chunk.trailer.decode_error,
            subtree=subtree,
            magnitude=magnitude,
        )
        self._done.add(chunk.row)
        self._row, self._buffer, self._filled, self._admitted, self._squares = None, None, 0, 0, 0.0
        return done

    def place(self, chunk: worker_pb2.GradientChunk, nbytes: int) -> memoryview | None:
        """Where the ``nbytes`` of inline payload of a chunk with these fields may be received: its span of the
        message's buffer, once the chunk passed every check :meth:`feed` makes before the payload (it is then
        admitted, and fed later as ``placed``). None for a chunk that does not pass, or that the previous ones
        do not yet let through (it is then received and fed as usual, and :meth:`feed` says what is wrong)."""
        if chunk.shared_payload or not nbytes:
            return None
        try:
            start, count = self._admit(chunk, nbytes)
        except WireError:
            return None
        assert self._buffer is not None
        return self._buffer[start : start + count].view(np.uint8).data

    def _admit(self, chunk: worker_pb2.GradientChunk, nbytes: int) -> tuple[int, int]:
        """Check everything about a chunk but its payload's values; then take it as the next one: the span
        ``(start, count)`` of elements its payload fills. A shared-memory payload is a whole row in one chunk,
        header to trailer, without data; its slot is the row's buffer. Changes nothing when it raises."""
        where = self._where
        if chunk.job_id != self.job_id:
            raise WireError(f"Chunk for job {chunk.job_id!r} arrived on the stream of {where}.")
        if chunk.iteration != self.iteration:
            raise WireError(f"Chunk for stale or future iteration {chunk.iteration} arrived on the stream of {where}.")
        if chunk.worker_id != self.worker_id:
            raise WireError(f"Chunk claims worker {chunk.worker_id} on the stream of {where}.")
        if chunk.row not in self.rows or chunk.row in self._done:
            raise WireError(f"Row {chunk.row} was not requested (or already complete) from {where}; asked {self.rows}.")
        starts_row = self._row is None
        dtype, admitted = self._row_start(chunk) if starts_row else self._row_next(chunk)
        if chunk.offset != admitted:
            raise WireError(f"Chunk of row {chunk.row} from {where} at offset {chunk.offset}, expected {admitted}.")
        slot: Array | None = None
        if chunk.shared_payload:
            slot = self._shared_slot(chunk, nbytes, dtype, starts_row=starts_row)
            count = self.length
        else:
            count = self._inline_count(chunk, nbytes, dtype, admitted)
        if starts_row:
            self._row = chunk.row
            self._buffer = np.empty(self.length, dtype=dtype) if slot is None else slot
            self._filled, self._squares = 0, 0.0
            self._digest.reset()
        self._admitted = admitted + count
        return admitted, count

    def _row_start(self, chunk: worker_pb2.GradientChunk) -> tuple[np.dtype[Any], int]:
        """The dtype of the row ``chunk`` starts (its header's), and 0: the offset it must have."""
        where = self._where
        if not chunk.HasField("header"):
            raise WireError(f"First chunk of row {chunk.row} from {where} has no header.")
        dtype = dtype_from_wire(chunk.header.dtype)
        if dtype not in self.dtypes:
            raise WireError(f"Row {chunk.row} from {where} has dtype {dtype}; expected one of {self.dtypes}.")
        if chunk.header.length != self.length:
            raise WireError(
                f"Row {chunk.row} from {where} has {chunk.header.length} elements; the gradient has {self.length}."
            )
        return dtype, 0

    def _row_next(self, chunk: worker_pb2.GradientChunk) -> tuple[np.dtype[Any], int]:
        """The dtype of the row under way, which ``chunk`` continues, and the offset it must have."""
        where = self._where
        if chunk.row != self._row:
            raise WireError(f"Row {chunk.row} from {where} started before row {self._row} was complete.")
        if chunk.HasField("header"):
            raise WireError(f"Row {chunk.row} from {where} sent a second header at offset {chunk.offset}.")
        assert self._buffer is not None
        return self._buffer.dtype, self._admitted

    def _shared_slot(
        self, chunk: worker_pb2.GradientChunk, nbytes: int, dtype: np.dtype[Any], *, starts_row: bool
    ) -> Array:
        """The shared-memory slot a whole-row chunk points to (header to trailer, no data)."""
        where = self._where
        if self.shared is None:
            raise WireError(
                f"Row {chunk.row} from {where} points to a shared-memory payload, but this stream asked for "
                "inline payloads."
            )
        if nbytes or not starts_row or not chunk.HasField("trailer"):
            raise WireError(
                f"Row {chunk.row} from {where} mixes a shared-memory payload with inline data; a shared payload "
                "is one chunk with header and trailer and no data."
            )
        return self.shared(chunk.row, dtype, self.length)

    def _inline_count(self, chunk: worker_pb2.GradientChunk, nbytes: int, dtype: np.dtype[Any], admitted: int) -> int:
        """The elements an inline payload of ``nbytes`` holds, if they fit the row after ``admitted``."""
        where = self._where
        if nbytes % dtype.itemsize:
            raise WireError(
                f"Chunk of row {chunk.row} from {where} is not a whole number of {dtype.itemsize}-byte items."
            )
        count = nbytes // dtype.itemsize
        if admitted + count > self.length:
            raise WireError(f"Row {chunk.row} from {where} overflows its declared length {self.length}.")
        return count

    @property
    def complete(self) -> bool:
        return len(self._done) == len(self.rows)
