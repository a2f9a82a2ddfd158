"""Host-local payloads: the model and the coded messages as files in a shared-memory directory.

When a worker runs on its receiver's host (the local cluster, or several workers on one VM), a
payload that goes through gRPC crosses HTTP/2 framing, loopback TCP and several copies on each side;
through a file on tmpfs (``/dev/shm``) it costs one write and one read of memory. The Compute call
stays the control path: authentication, cancellation, failure detection and the message header and
trailer (with the CRC-32C of the payload) still travel on it.

1. The receiver creates a private directory (:meth:`SharedDirectory.create`, mode 0700) with a file
   ``probe`` holding a random token, and offers both in ``JobSetup.shared_memory``.
2. A worker accepts (:func:`accept`) only when that directory is its own user's, private, holds the
   same token and takes a new file: then it shares the receiver's host, user and memory. Another
   host, container or user reads no token and everything goes through gRPC as before.
3. Each iteration the receiver writes the model once (``model-<t>``). A ComputeRequest with
   ``shared_model`` (length and CRC-32C) tells an accepting worker to read it there, and to send each
   coded message as a file ``message-<t>-<worker>-<row>`` plus a GradientChunk with
   ``shared_payload``, header and trailer and no data. A request with an inline model gets inline
   messages, so a receiver never meets a payload it did not ask for.
4. Files are written under a temporary name and renamed into place, so nobody reads half a file. The
   receiver removes each message it reads, and what late workers leave behind as the next round
   starts (:meth:`SharedDirectory.sweep`); the directory goes when the job ends.

Any write that fails (a full tmpfs) falls back to the inline form for that payload.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from gradcode.common.wire import FLOAT64, WireError
from gradcode.v1 import worker_pb2

__all__ = [
    "DEFAULT_ROOT",
    "SharedDirectory",
    "accept",
    "read_model",
    "write_message",
]

DEFAULT_ROOT = Path("/dev/shm")
"""Where receivers make their directories: tmpfs on Linux (absent elsewhere: no shared memory)."""
PROBE = "probe"


def _model_name(iteration: int) -> str:
    return f"model-{iteration}"


def _message_name(iteration: int, worker_id: int, row: int) -> str:
    return f"message-{iteration}-{worker_id}-{row}"


def _iteration_of(name: str) -> int | None:
    """The iteration a payload file (or its temporary) belongs to; None for other files."""
    parts = name.lstrip(".").split("-")
    if len(parts) >= 2 and parts[0] in ("model", "message"):
        digits = parts[1].split(".")[0]
        if digits.isdigit():
            return int(digits)
    return None


def _write_atomically(path: Path, data: Any) -> None:
    """Write ``data`` (bytes or a contiguous array) to ``path`` through a temporary name: all or nothing."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _read_into(path: Path, out: np.ndarray[Any, Any]) -> None:
    """Fill ``out`` with the bytes of ``path``, which must have exactly ``out.nbytes``; WireError otherwise."""
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size != out.nbytes:
                raise WireError(f"Shared payload {path.name} has {size} bytes; {out.nbytes} were announced.")
            read = f.readinto(out.view(np.uint8).data)
    except FileNotFoundError:
        raise WireError(f"Shared payload {path.name} is not in the shared-memory directory.") from None
    if read != out.nbytes:
        raise WireError(f"Shared payload {path.name}: read {read} of its {out.nbytes} bytes.")


class SharedDirectory:
    """A receiver's shared-memory directory for one job: offered to workers, written and read per iteration."""

    def __init__(self, path: Path, token: str) -> None:
        self.path = path
        self.token = token

    @classmethod
    def create(cls, root: Path = DEFAULT_ROOT) -> SharedDirectory | None:
        """A new private directory under ``root`` with its probe; None when ``root`` is missing or not writable."""
        if not root.is_dir():
            return None
        try:
            path = Path(tempfile.mkdtemp(prefix="gradcode-", dir=root))  # mode 0700
        except OSError:
            return None
        token = secrets.token_hex(16)
        (path / PROBE).write_text(token)
        return cls(path, token)

    def offer(self) -> worker_pb2.SharedMemoryOffer:
        return worker_pb2.SharedMemoryOffer(directory=str(self.path), token=self.token)

    def write_model(self, iteration: int, params: np.ndarray[Any, Any]) -> worker_pb2.SharedModel:
        """Write iteration ``iteration``'s parameters (float64) once for every accepting worker; OSError if it fails."""
        data = np.ascontiguousarray(params, dtype=FLOAT64)
        _write_atomically(self.path / _model_name(iteration), data)
        return worker_pb2.SharedModel(length=data.size, crc32c=google_crc32c.value(data))

    def take_message(self, iteration: int, worker_id: int, row: int, out: np.ndarray[Any, Any]) -> None:
        """Read a worker's message into ``out`` (its announced size) and remove the file; WireError if missing
        or of another size."""
        path = self.path / _message_name(iteration, worker_id, row)
        try:
            _read_into(path, out)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

    def sweep(self, before: int) -> None:
        """Remove the payloads of iterations before ``before`` (late workers' messages, old models)."""
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                iteration = _iteration_of(entry.name)
                if iteration is not None and iteration < before:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def close(self) -> None:
        """Remove the directory and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)


def accept(offer: worker_pb2.SharedMemoryOffer) -> Path | None:
    """The worker's check of a receiver's offer: its directory if this process shares the receiver's host,
    user and memory (the directory is this user's, private, holds the offer's token and takes a file),
    else None."""
    if not offer.directory or not offer.token:
        return None
    directory = Path(offer.directory)
    try:
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        if not hmac.compare_digest((directory / PROBE).read_text(), offer.token):
            return None
        check = directory / f".accept-{secrets.token_hex(8)}"
        check.touch(exist_ok=False)
        check.unlink()
    except (OSError, UnicodeDecodeError):
        return None
    return directory


def read_model(directory: Path, iteration: int, shared: worker_pb2.SharedModel) -> np.ndarray[Any, Any]:
    """The parameters the receiver wrote for ``iteration``, checked against ``shared``'s length and CRC-32C."""
    params = np.empty(int(shared.length), dtype=FLOAT64)
    _read_into(directory / _model_name(iteration), params)
    crc = google_crc32c.value(params)
    if crc != shared.crc32c:
        raise WireError(
            f"Shared model of iteration {iteration} failed its CRC32C check: the request says {shared.crc32c:#010x}, "
            f"the file gives {crc:#010x}."
        )
    return params


def write_message(directory: Path, iteration: int, worker_id: int, row: int, data: np.ndarray[Any, Any]) -> None:
    """Write one coded message's payload (little-endian, contiguous) for the receiver; OSError if it fails."""
    _write_atomically(directory / _message_name(iteration, worker_id, row), data)
