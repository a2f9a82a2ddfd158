"""Host-local payloads: the model and the coded messages as files in a shared-memory directory.

When a worker runs on its receiver's host (the local cluster, or several workers on one VM), a
payload that goes through gRPC crosses HTTP/2 framing, loopback TCP and several copies on each side;
through a file on tmpfs (``/dev/shm``) it costs one copy, into the file: the other side reads it there. The Compute
call stays the control path: authentication, cancellation, failure detection and the message header
and trailer (with the payload's XXH3-64 checksum) still travel on it.

1. The receiver creates a private directory (:meth:`SharedDirectory.create`, mode 0700) and offers it in
   ``JobSetup.shared_memory`` only to a worker registered with the receiver's own machine id, or with none
   (:mod:`gradcode.common.transport.machine`: one boot, network namespace and host name), after writing a fresh random
   nonce for that worker into the file ``probe-<worker>`` (:meth:`SharedDirectory.offer`). The offer names the
   directory, never the nonce.
2. The worker reads the nonce there (:func:`accept`: the directory is its own user's, private, and takes a new
   file) and sends it back in ``LoadJobReply.shared_memory_proof``. The receiver uses shared memory with that
   worker only when the nonce comes back (:meth:`SharedDirectory.verdict`): a worker that reads another
   ``/dev/shm`` (another host or container, another mount of it, another user) or lies about its machine id
   cannot give it, and everything goes through gRPC, with the reason in the master's worker list.
3. Each iteration the receiver writes the model into the file ``model``. A ComputeRequest with
   ``shared_model`` (length and XXH3-64) tells an accepting worker to read it there, and to write
   each coded message into its file ``message-<worker>-<row>`` and send a GradientChunk with
   ``shared_payload``, header and trailer and no data. A request with an inline model gets inline
   messages, so a receiver never meets a payload it did not ask for.
4. The files are slots, mapped into each process once (``mmap``) and overwritten in place each
   iteration: no fresh tmpfs pages per iteration and no ``read``/``write`` system calls (on this
   project's VM, 8 MB took 0.3 ms to copy into a mapped slot against 1.8 ms through ``pwrite``). A
   payload costs one memory copy, into its slot: workers compute from the model's file, and receivers
   check and decode each message in its own. The round protocol keeps a slot still from the moment it
   is announced until the round is over: the model changes only between rounds, a receiver asks a
   worker for shared payloads at most once per round (asked again, perhaps as a restarted process, it
   gets the model inline and answers inline), and a worker writes a message only for the newest
   iteration it was asked (a stale computation never overwrites it). The checksums in the request and in
   the trailer would catch a slot changed before it was checked all the same: it is refused, never
   decoded. A worker still computing when the next model is written (a late one) reads parts of both,
   for an iteration no round takes any more.
5. A slot is created at its full size with ``posix_fallocate`` (a full tmpfs fails there, as an
   OSError, not later as SIGBUS on a write into the mapping), and never resized: a process that maps
   a file never sees it shrink. The directory goes when the job ends; mappings end with their owners.
   A master killed before it could remove its directories leaves them behind; the next master on the
   host removes those whose owner (host, process id and start time, in the file ``owner``) is gone
   (:func:`remove_abandoned`).

Any write that fails (a full tmpfs) falls back to the inline form for that payload.
"""

from __future__ import annotations

import hmac
import mmap
import os
import secrets
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.transport.wire import FLOAT64, WireError, payload_digest
from gradcode.v1 import worker_pb2

__all__ = [
    "DEFAULT_ROOT",
    "SharedDirectory",
    "SharedPeer",
    "accept",
    "remove_abandoned",
]

DEFAULT_ROOT = Path("/dev/shm")
"""Where receivers make their directories: tmpfs on Linux (absent elsewhere: no shared memory)."""
PROBE = "probe-{worker}"
"""The file holding the nonce a worker must read back to prove it reads the receiver's directory."""

MODEL = "model"
OWNER = "owner"


def _start_time(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc``); empty if it does not run."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _this_process() -> str:
    """Who owns a directory: host name, process id and that process's start time (process ids are reused)."""
    pid = os.getpid()
    return f"{socket.gethostname()} {pid} {_start_time(pid)}"


def _message_name(worker_id: int, row: int) -> str:
    return f"message-{worker_id}-{row}"


class _Slots:
    """Files of a shared-memory directory mapped into this process, each mapped once, as byte arrays."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._maps: dict[str, np.ndarray[Any, np.dtype[np.uint8]]] = {}

    def get(self, name: str, nbytes: int, *, create: bool) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """File ``name``'s ``nbytes`` bytes, mapped; with ``create``, made at that size if missing (OSError if
        tmpfs is full). WireError if it is missing (without ``create``) or of another size."""
        mapped = self._maps.get(name)
        if mapped is not None and mapped.nbytes == nbytes:
            return mapped
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        try:
            fd = os.open(self.path / name, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            raise WireError(f"Shared payload {name} is not in the shared-memory directory.") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0 and create:
                os.posix_fallocate(fd, 0, nbytes)
                size = nbytes
            if size != nbytes:
                raise WireError(f"Shared payload {name} has {size} bytes; {nbytes} were announced.")
            mapped = np.frombuffer(mmap.mmap(fd, nbytes), dtype=np.uint8)
        finally:
            os.close(fd)
        self._maps[name] = mapped
        return mapped

    def write(self, name: str, data: np.ndarray[Any, Any]) -> None:
        """Copy ``data`` (contiguous) into slot ``name``."""
        raw = data.reshape(-1).view(np.uint8)
        np.copyto(self.get(name, raw.nbytes, create=True), raw)

    def view(self, name: str, dtype: np.dtype[Any], length: int) -> np.ndarray[Any, Any]:
        """Slot ``name`` in place, as ``length`` elements of ``dtype``, read-only (this side never writes into the
        other side's file); WireError if it is missing or of another size."""
        view = self.get(name, length * dtype.itemsize, create=False).view(dtype)
        view.flags.writeable = False
        return view

    def close(self) -> None:
        """Drop every mapping (unmapped once no array refers to it)."""
        self._maps.clear()


class SharedDirectory:
    """A receiver's shared-memory directory for one job: offered to workers, written and read per iteration."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._slots = _Slots(path)
        self._nonces: dict[int, str] = {}
        """The nonce last offered to each worker, by the worker id its JobSetup names."""

    @classmethod
    def create(cls, root: Path = DEFAULT_ROOT) -> SharedDirectory | None:
        """A new private directory under ``root``; None when ``root`` is missing or not writable."""
        if not root.is_dir():
            return None
        try:
            path = Path(tempfile.mkdtemp(prefix="gradcode-", dir=root))  # mode 0700
        except OSError:
            return None
        try:
            (path / OWNER).write_text(_this_process())
        except OSError:  # a full tmpfs: no shared memory for this job
            shutil.rmtree(path, ignore_errors=True)
            return None
        return cls(path)

    def offer(self, worker_id: int) -> worker_pb2.SharedMemoryOffer | None:
        """The offer for worker ``worker_id``'s LoadJob, after writing a fresh nonce into its probe file (which only
        a process that reads this directory can send back); None when that write fails (a full tmpfs)."""
        nonce = secrets.token_hex(16)
        probe = self.path / PROBE.format(worker=worker_id)
        staged = probe.with_name(f".{probe.name}-{nonce[:8]}")
        try:
            staged.write_text(nonce)
            staged.replace(probe)  # atomically: a reader never sees half a nonce
        except OSError:
            staged.unlink(missing_ok=True)
            self._nonces.pop(worker_id, None)
            return None
        self._nonces[worker_id] = nonce
        return worker_pb2.SharedMemoryOffer(directory=str(self.path))

    def verdict(self, worker_id: int, proof: str) -> str:
        """Why worker ``worker_id`` may not use this directory, given the ``proof`` its LoadJob reply carries; empty
        when the proof is the nonce last offered to it (it reads this directory: shared memory is proven). The nonce is
        spent: the next LoadJob gets a new one."""
        nonce = self._nonces.pop(worker_id, None)
        (self.path / PROBE.format(worker=worker_id)).unlink(missing_ok=True)  # one proof per nonce
        if nonce is None:
            return "no shared-memory offer was made"
        if not proof:
            return "shared memory not shared: the worker cannot read the master's directory"
        if not hmac.compare_digest(proof.encode(), nonce.encode()):
            return "shared memory not shared: nonce mismatch"
        return ""

    def write_model(self, params: np.ndarray[Any, Any]) -> worker_pb2.SharedModel:
        """Write this round's parameters (float64) once for every accepting worker; OSError if that fails.

        Call it between rounds only: the workers of a round read it."""
        data = np.ascontiguousarray(params, dtype=FLOAT64)
        self._slots.write(MODEL, data)
        return worker_pb2.SharedModel(length=data.size, xxh3=payload_digest(data))

    def message(self, worker_id: int, row: int, dtype: np.dtype[Any], length: int) -> np.ndarray[Any, Any]:
        """A worker's message in place (a read-only view of its slot, of the announced dtype and length); WireError
        if it is missing or of another size.

        Not copied: a worker writes a slot only for the newest iteration it was asked, and a receiver asks it for
        shared payloads at most once per round, so the slot stays as the receiver checked it until the receiver
        asks that worker for a later iteration, which it does only once this round, its decode included, is
        over."""
        return self._slots.view(_message_name(worker_id, row), dtype, length)

    def close(self) -> None:
        """Remove the directory and everything in it."""
        self._slots.close()
        shutil.rmtree(self.path, ignore_errors=True)


class SharedPeer:
    """A worker's side of a receiver's directory it accepted (:func:`accept`): reads models, writes messages."""

    def __init__(self, path: Path, proof: str = "") -> None:
        self.path = path
        self.proof = proof
        """The nonce this worker read from its probe file, sent back in ``LoadJobReply.shared_memory_proof``."""
        self._slots = _Slots(path)

    def read_model(self, shared: worker_pb2.SharedModel) -> np.ndarray[Any, Any]:
        """The parameters the receiver wrote, in place (a read-only view of the file), checked against ``shared``'s
        length and XXH3-64 (a call that comes after the receiver moved on to the next round finds another model
        and is refused).

        Not copied: the receiver writes the next model only once the round that sent this one has ended. A
        computation still running then (a late worker) may read parts of both models, but its message is for an
        iteration the receiver has left, and a round takes only its own iteration's chunks."""
        if not shared.HasField("xxh3"):
            raise WireError(
                "The shared model has no XXH3-64 checksum (field xxh3): the receiver is from before XXH3-64 replaced "
                "CRC-32C; run the same gradcode version on both sides."
            )
        params = self._slots.view(MODEL, FLOAT64, int(shared.length))
        digest = payload_digest(params)
        if digest != shared.xxh3:
            raise WireError(
                f"The shared model failed its XXH3-64 check: the request says {shared.xxh3:#018x}, the file gives "
                f"{digest:#018x} (the receiver has moved on to a later round)."
            )
        return params

    def write_message(self, worker_id: int, row: int, data: np.ndarray[Any, Any]) -> None:
        """Copy one coded message's payload (little-endian, contiguous) into its slot; OSError if that fails."""
        self._slots.write(_message_name(worker_id, row), data)

    def close(self) -> None:
        self._slots.close()


def remove_abandoned(root: Path = DEFAULT_ROOT) -> list[Path]:
    """Remove the job directories under ``root`` that a killed master left behind: this user's, made on this
    host, whose owner process no longer runs (or is another process under a reused id). Returns them.

    A directory without a readable owner, or made on another host (a tmpfs shared between containers),
    is left alone.
    """
    removed: list[Path] = []
    host = socket.gethostname()
    for path in root.glob("gradcode-*"):
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owner_host, pid, started = (path / OWNER).read_text().split()
            if owner_host != host or _start_time(int(pid)) == started:
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def accept(offer: worker_pb2.SharedMemoryOffer, worker_id: int) -> SharedPeer | None:
    """The worker's side of a receiver's offer: the directory, with the nonce read from its probe file for
    ``worker_id`` (:attr:`SharedPeer.proof`, for the receiver to check), if this process can use it (it is this
    user's, private, and takes a new file); else None.

    Reading a directory at the offered path proves nothing by itself (another host's ``/dev/shm`` may hold one of
    that name): only the receiver, comparing the proof with the nonce it wrote, knows it is its own."""
    if not offer.directory:
        return None
    directory = Path(offer.directory)
    try:
        info = directory.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        proof = (directory / PROBE.format(worker=worker_id)).read_text()
        check = directory / f".accept-{secrets.token_hex(8)}"
        check.touch(exist_ok=False)
        check.unlink()
    except (OSError, UnicodeDecodeError):
        return None
    return SharedPeer(directory, proof)
