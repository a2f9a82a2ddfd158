"""Conversions between numpy arrays and the gradcode.v1 wire types, shared by master and worker.

Coded gradients travel as raw little-endian bytes split into chunks (:func:`message_chunks`); the
receiver reassembles and validates them with :class:`MessageAssembler`, which refuses anything that
does not fit the iteration it expects with a :class:`WireError` saying exactly what is wrong.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gradcode.common.codes.base import Array
from gradcode.v1 import common_pb2, worker_pb2

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_CHUNK_BYTES",
    "MAX_MESSAGE_BYTES",
    "CompletedMessage",
    "MessageAssembler",
    "WireError",
    "array_from_tensor",
    "dict_from_struct",
    "dtype_from_wire",
    "dtype_to_wire",
    "message_chunks",
    "message_to_dict",
    "struct_from_dict",
    "tensor_from_array",
]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest single gRPC message accepted (models are sent whole; gradients are chunked)."""
DEFAULT_CHUNK_BYTES = 1 << 20
"""Payload bytes per gradient chunk: large enough to amortise per-message cost, small enough to stream."""
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
"""Options for every gradcode server and channel."""

_DTYPES: dict[int, np.dtype[Any]] = {
    common_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
    common_pb2.DTYPE_COMPLEX128: np.dtype("<c16"),
    common_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    common_pb2.DTYPE_INT64: np.dtype("<i8"),
}


class WireError(ValueError):
    """A message on the wire does not match what the receiver expects."""


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
    if len(tensor.data) != want:
        raise WireError(f"Tensor of shape {shape} and dtype {dtype} needs {want} bytes, got {len(tensor.data)}.")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


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


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict with its own types: every field (defaults included), proto field
    names, 64-bit integers as numbers (protobuf's JSON mapping makes them strings: ``"iteration": "1"``),
    integral numbers inside Structs as ints (``"n": 8``, not ``8.0``), enums by name, NaN as ``"NaN"``.

    For history files and saved specs; ``google.protobuf.json_format.ParseDict`` reads it back.
    """
    from google.protobuf.json_format import MessageToDict

    as_dict = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _typed(message, as_dict)


def _typed(message: Message, as_dict: dict[str, Any]) -> dict[str, Any]:
    if isinstance(message, struct_pb2.Struct):
        return {key: _integral(v) for key, v in as_dict.items()}
    for field in message.DESCRIPTOR.fields:
        if field.name not in as_dict:
            continue
        value = getattr(message, field.name)
        repeated = field.is_repeated
        if field.type in _INT64_TYPES:
            as_dict[field.name] = [int(v) for v in value] if repeated else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if repeated:
                as_dict[field.name] = [_typed(m, d) for m, d in zip(value, as_dict[field.name], strict=True)]
            elif isinstance(as_dict[field.name], dict):
                as_dict[field.name] = _typed(value, as_dict[field.name])
    return as_dict


def message_chunks(
    vector: Array,
    *,
    job_id: str,
    iteration: int,
    worker_id: int,
    row: int,
    compute_seconds: float = 0.0,
    straggle_seconds: float = 0.0,
    approximate: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[worker_pb2.GradientChunk]:
    """Split one coded message into GradientChunks: header on the first, CRC trailer on the last.

    ``approximate`` marks a tree parent's message whose decoded part is not exact.
    """
    v = np.ascontiguousarray(vector)
    wire = dtype_to_wire(v.dtype)
    data = v.astype(_DTYPES[wire], copy=False).view(np.uint8).data
    itemsize = _DTYPES[wire].itemsize
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    total = len(data)
    starts = range(0, total, step) if total else range(1)
    last = starts[-1]
    for start in starts:
        chunk = worker_pb2.GradientChunk(
            job_id=job_id,
            iteration=iteration,
            worker_id=worker_id,
            row=row,
            offset=start // itemsize,
            data=bytes(data[start : start + step]),
        )
        if start == 0:
            chunk.header.dtype = wire  # type: ignore[assignment]
            chunk.header.length = v.size
        if start == last:
            chunk.trailer.crc32 = zlib.crc32(data)
            chunk.trailer.compute_seconds = compute_seconds
            chunk.trailer.straggle_seconds = straggle_seconds
            chunk.trailer.approximate = approximate
        yield chunk


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


class MessageAssembler:
    """Reassembles the chunks of one worker's stream for one (job, iteration), validating everything.

    ``rows`` are the rows this worker was asked for; ``length`` the expected message length; ``dtypes``
    the element types accepted. Raises :class:`WireError` on a chunk for another job or iteration, an
    unknown worker or row, an out-of-order offset, a wrong length or a failed checksum.
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
    ) -> None:
        self.job_id = job_id
        self.iteration = iteration
        self.worker_id = worker_id
        self.rows = rows
        self.length = length
        self.dtypes = dtypes
        self._row: int | None = None
        self._buffer: Array | None = None
        self._filled = 0
        self._done: set[int] = set()

    def feed(self, chunk: worker_pb2.GradientChunk) -> CompletedMessage | None:
        """Add a chunk; return the message it completes, if any."""
        where = f"worker {self.worker_id}, job {self.job_id!r}, iteration {self.iteration}"
        if chunk.job_id != self.job_id:
            raise WireError(f"Chunk for job {chunk.job_id!r} arrived on the stream of {where}.")
        if chunk.iteration != self.iteration:
            raise WireError(f"Chunk for stale or future iteration {chunk.iteration} arrived on the stream of {where}.")
        if chunk.worker_id != self.worker_id:
            raise WireError(f"Chunk claims worker {chunk.worker_id} on the stream of {where}.")
        if chunk.row not in self.rows or chunk.row in self._done:
            raise WireError(f"Row {chunk.row} was not requested (or already complete) from {where}; asked {self.rows}.")
        if self._row is None:
            if not chunk.HasField("header"):
                raise WireError(f"First chunk of row {chunk.row} from {where} has no header.")
            dtype = dtype_from_wire(chunk.header.dtype)
            if dtype not in self.dtypes:
                raise WireError(f"Row {chunk.row} from {where} has dtype {dtype}; expected one of {self.dtypes}.")
            if chunk.header.length != self.length:
                raise WireError(
                    f"Row {chunk.row} from {where} has {chunk.header.length} elements; the gradient has {self.length}."
                )
            self._row = chunk.row
            self._buffer = np.empty(self.length, dtype=dtype)
            self._filled = 0
        elif chunk.row != self._row:
            raise WireError(f"Row {chunk.row} from {where} started before row {self._row} was complete.")
        elif chunk.HasField("header"):
            raise WireError(f"Row {chunk.row} from {where} sent a second header at offset {chunk.offset}.")
        assert self._buffer is not None
        itemsize = self._buffer.dtype.itemsize
        if chunk.offset != self._filled:
            raise WireError(f"Chunk of row {chunk.row} from {where} at offset {chunk.offset}, expected {self._filled}.")
        payload = chunk.data  # each access copies the bytes out of the message: read it once
        if len(payload) % itemsize:
            raise WireError(f"Chunk of row {chunk.row} from {where} is not a whole number of {itemsize}-byte items.")
        count = len(payload) // itemsize
        if self._filled + count > self.length:
            raise WireError(f"Row {chunk.row} from {where} overflows its declared length {self.length}.")
        self._buffer[self._filled : self._filled + count] = np.frombuffer(payload, dtype=self._buffer.dtype)
        self._filled += count
        if not chunk.HasField("trailer"):
            return None
        if self._filled != self.length:
            raise WireError(f"Row {chunk.row} from {where} ended after {self._filled} of {self.length} elements.")
        if zlib.crc32(self._buffer.view(np.uint8).data) != chunk.trailer.crc32:
            raise WireError(f"Row {chunk.row} from {where} failed its CRC32 check.")
        if not np.isfinite(self._buffer).all():
            raise WireError(f"Row {chunk.row} from {where} contains NaN or infinite values.")
        done = CompletedMessage(
            worker_id=self.worker_id,
            row=chunk.row,
            vector=self._buffer,
            compute_seconds=chunk.trailer.compute_seconds,
            straggle_seconds=chunk.trailer.straggle_seconds,
            approximate=chunk.trailer.approximate,
        )
        self._done.add(chunk.row)
        self._row, self._buffer, self._filled = None, None, 0
        return done

    @property
    def complete(self) -> bool:
        return len(self._done) == len(self.rows)
