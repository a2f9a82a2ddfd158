"""Host-local payloads: the offer and its check, models and messages as files, what is refused and swept."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gradcode.common.transport.shared_memory import SharedDirectory, SharedPeer, accept, remove_abandoned
from gradcode.common.transport.wire import MessageAssembler, WireError, message_chunks
from gradcode.v1 import worker_pb2


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[SharedDirectory]:
    directory = SharedDirectory.create(tmp_path)
    assert directory is not None
    yield directory
    directory.close()


def _offer(shared: SharedDirectory, worker_id: int = 1) -> worker_pb2.SharedMemoryOffer:
    offer = shared.offer(worker_id)
    assert offer is not None
    return offer


def test_a_directory_is_private_and_a_worker_reading_it_proves_so_with_the_nonce(shared: SharedDirectory) -> None:
    assert shared.path.stat().st_mode & 0o777 == 0o700
    offer = _offer(shared)
    assert [f.name for f, _ in offer.ListFields()] == ["directory"]  # the nonce is in the file, never on the wire
    peer = accept(offer, 1)
    assert peer is not None and peer.path == shared.path and len(peer.proof) == 32
    assert shared.verdict(1, peer.proof) == ""  # proven
    assert sorted(p.name for p in shared.path.iterdir()) == ["owner"]  # the probe is spent, the check left nothing


def test_a_worker_that_reads_another_directory_fails_the_proof(shared: SharedDirectory, tmp_path: Path) -> None:
    """Another host's (or container's) /dev/shm may hold a directory of its own at the offered path, with a probe
    of the same name: the worker reads it and sends back a nonce, but not the master's."""
    (tmp_path / "elsewhere").mkdir()
    elsewhere = SharedDirectory.create(tmp_path / "elsewhere")
    assert elsewhere is not None
    _offer(shared)
    foreign = accept(_offer(elsewhere), 1)
    assert foreign is not None and foreign.proof
    assert shared.verdict(1, foreign.proof) == "shared memory not shared: nonce mismatch"
    elsewhere.close()
    # A worker that finds no directory at the path sends no proof at all.
    assert accept(worker_pb2.SharedMemoryOffer(directory=str(tmp_path / "missing")), 1) is None
    _offer(shared)
    assert shared.verdict(1, "") == "shared memory not shared: the worker cannot read the master's directory"
    # A proof is good once: the nonce is spent by its verdict, and every LoadJob gets a fresh one.
    offer = _offer(shared)
    peer = accept(offer, 1)
    assert peer is not None and shared.verdict(1, peer.proof) == ""
    assert shared.verdict(1, peer.proof) == "no shared-memory offer was made"
    again = accept(_offer(shared), 1)
    assert again is not None and again.proof != peer.proof
    assert shared.verdict(1, peer.proof) == "shared memory not shared: nonce mismatch"
    for made_up in ("é" * 32, "0" * 10_000, again.proof[:-1]):  # any string a liar sends is refused, never raised on
        _offer(shared)
        assert shared.verdict(1, made_up) == "shared memory not shared: nonce mismatch"


def test_a_worker_cannot_read_another_workers_nonce_or_an_unsafe_directory(shared: SharedDirectory) -> None:
    offer = _offer(shared, worker_id=1)
    assert accept(offer, 2) is None  # its own probe-2 was never written
    assert accept(worker_pb2.SharedMemoryOffer(), 1) is None
    os.chmod(shared.path, 0o755)  # readable by others: not private, so not trusted with payloads
    assert accept(offer, 1) is None
    os.chmod(shared.path, 0o700)
    assert accept(offer, 1) is not None


def test_no_root_no_directory(tmp_path: Path) -> None:
    assert SharedDirectory.create(tmp_path / "missing") is None


def test_a_model_written_once_is_read_back_bit_for_bit_and_checked(shared: SharedDirectory) -> None:
    peer = accept(_offer(shared), 1)
    assert peer is not None
    params = np.random.default_rng(0).standard_normal(1001)
    reference = shared.write_model(params)
    assert reference.length == 1001
    model = peer.read_model(reference)
    np.testing.assert_array_equal(model, params)
    assert np.shares_memory(model, peer.read_model(reference))  # the file itself, not a copy per call
    with pytest.raises(ValueError, match="read-only"):
        model[0] = 0.0  # the receiver's model: a worker cannot write into it
    wrong_length = worker_pb2.SharedModel(length=1000, xxh3=reference.xxh3)
    with pytest.raises(WireError, match="has 8008 bytes; 8000 were announced"):
        peer.read_model(wrong_length)
    shared.write_model(params + 1)  # the receiver moved on: a late call of the earlier round is refused
    with pytest.raises(WireError, match="failed its XXH3-64 check"):
        peer.read_model(reference)
    np.testing.assert_array_equal(model, params + 1)  # a computation still running sees the next model
    older = worker_pb2.SharedModel(length=1001)  # what a receiver from before XXH3-64 sends (field 2 is gone)
    with pytest.raises(WireError, match=r"has no XXH3-64 checksum \(field xxh3\).*same gradcode version"):
        peer.read_model(older)


def test_a_new_directory_has_no_model_yet(shared: SharedDirectory) -> None:
    peer = accept(_offer(shared), 1)
    assert peer is not None
    with pytest.raises(WireError, match="model is not in the shared-memory directory"):
        peer.read_model(worker_pb2.SharedModel(length=3, xxh3=0))


def _peer(shared: SharedDirectory) -> SharedPeer:
    peer = accept(_offer(shared), 1)
    assert peer is not None
    return peer


def _assembler(shared: SharedDirectory | None, *, dtype: str = "<f8", iteration: int = 3) -> MessageAssembler:
    reader = None if shared is None else functools.partial(shared.message, 1)
    return MessageAssembler(
        job_id="j", iteration=iteration, worker_id=1, rows=(5, 6), length=100, dtypes=(np.dtype(dtype),), shared=reader
    )


def _chunks(vector: np.ndarray, peer: SharedPeer, row: int = 5, iteration: int = 3) -> list[worker_pb2.GradientChunk]:
    def write(payload: np.ndarray) -> bool:
        peer.write_message(1, row, payload)
        return True

    return list(message_chunks(vector, job_id="j", iteration=iteration, worker_id=1, row=row, shared=write))


@pytest.mark.parametrize("dtype", ["<f8", "<f4", "<c16"])
def test_a_shared_message_is_one_chunk_without_data_and_arrives_exactly(shared: SharedDirectory, dtype: str) -> None:
    rng = np.random.default_rng(1)
    vector = rng.standard_normal(100).astype(dtype)
    if dtype == "<c16":
        vector = vector + 1j * rng.standard_normal(100)
    chunks = _chunks(vector, _peer(shared))
    assert len(chunks) == 1
    (chunk,) = chunks
    assert chunk.shared_payload and not chunk.data and chunk.HasField("header") and chunk.HasField("trailer")
    done = _assembler(shared, dtype=dtype).feed(chunk)
    assert done is not None
    np.testing.assert_array_equal(done.vector, vector)
    assert done.norm == pytest.approx(float(np.linalg.norm(vector)))
    assert np.shares_memory(done.vector, shared.message(1, 5, done.vector.dtype, 100))  # checked in its slot
    with pytest.raises(ValueError, match="read-only"):
        done.vector[0] = 0  # the worker's file: the receiver never writes into it


def test_slots_are_overwritten_in_place_and_never_pile_up(shared: SharedDirectory) -> None:
    peer = _peer(shared)
    for t in range(5):
        shared.write_model(np.full(10, float(t)))
        chunks = _chunks(np.full(100, float(t)), peer, iteration=t)
        assert chunks[0].shared_payload
        done = _assembler(shared, iteration=t).feed(chunks[0])
        assert done is not None and (done.vector == t).all()
    assert sorted(p.name for p in shared.path.iterdir()) == ["message-1-5", "model", "owner", "probe-1"]


def test_a_failed_shared_write_sends_the_message_inline(shared: SharedDirectory) -> None:
    vector = np.arange(100.0)
    chunks = list(message_chunks(vector, job_id="j", iteration=3, worker_id=1, row=5, shared=lambda _: False))
    assert not chunks[0].shared_payload and len(chunks[0].data) == vector.nbytes
    done = _assembler(shared).feed(chunks[0])  # a receiver that offered shared memory takes inline messages too
    assert done is not None
    np.testing.assert_array_equal(done.vector, vector)


def test_shared_payloads_are_refused_where_not_asked_for_missing_or_corrupt(shared: SharedDirectory) -> None:
    peer = _peer(shared)
    vector = np.arange(100.0)
    (chunk,) = _chunks(vector, peer)
    with pytest.raises(WireError, match="points to a shared-memory payload, but this stream asked for inline"):
        _assembler(None).feed(chunk)
    mixed = worker_pb2.GradientChunk()
    mixed.CopyFrom(chunk)
    mixed.data = b"\0" * 8
    with pytest.raises(WireError, match="mixes a shared-memory payload with inline data"):
        _assembler(shared).feed(mixed)
    peer.write_message(1, 5, np.arange(100.0) + 1)  # the slot no longer holds what the trailer's checksum says
    with pytest.raises(WireError, match="failed its XXH3-64 check"):
        _assembler(shared).feed(chunk)
    other_row = worker_pb2.GradientChunk()
    other_row.CopyFrom(chunk)
    other_row.row = 6
    with pytest.raises(WireError, match="message-1-6 is not in the shared-memory directory"):
        _assembler(shared).feed(other_row)
    peer.write_message(1, 6, np.arange(99.0))  # a slot is made at its size once and never resized
    with pytest.raises(WireError, match="has 792 bytes; 800 were announced"):
        _assembler(shared).feed(other_row)
    with pytest.raises(WireError, match="has 792 bytes; 800 were announced"):
        peer.write_message(1, 6, np.arange(100.0))


def test_close_removes_the_directory(shared: SharedDirectory) -> None:
    shared.write_model(np.zeros(3))
    shared.close()
    assert not shared.path.exists()


def test_only_the_directories_of_masters_that_are_gone_are_removed(tmp_path: Path) -> None:
    ours = SharedDirectory.create(tmp_path)
    assert ours is not None
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = socket.gethostname()
    start = (ours.path / "owner").read_text().split()[2]
    owners = {
        "killed": f"{host} {finished.pid} 1",  # its process has exited
        "reused": f"{host} {os.getpid()} {int(start) + 1}",  # a process id now held by another process
        "elsewhere": f"another-host {finished.pid} 1",  # a tmpfs shared with another host's container
    }
    for name, owner in owners.items():
        (tmp_path / f"gradcode-{name}").mkdir(mode=0o700)
        (tmp_path / f"gradcode-{name}" / "owner").write_text(owner)
    (tmp_path / "gradcode-unowned").mkdir(mode=0o700)
    removed = remove_abandoned(tmp_path)
    assert sorted(p.name for p in removed) == ["gradcode-killed", "gradcode-reused"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([ours.path.name, "gradcode-elsewhere", "gradcode-unowned"])
    ours.close()
