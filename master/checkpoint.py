"""Durable jobs: a job's checkpoint, written atomically to the master's state directory.

A :class:`Checkpoint` holds everything a job needs to go on exactly where it was: the normalised
spec (the code, partitions, dataset and straggler model are rebuilt from it, all seeded), the
iteration committed last, the optimizer's state (parameters, Nesterov's look-ahead point and step
count) and the :class:`~gradcode.common.codes.base.Observation` the next assignment of a dynamic code
uses. The master keeps no other random state: every draw is a pure function of the spec's seeds.

The file is ``<state_dir>/<job_id>.ckpt.npz``: numpy arrays (no pickles) plus a JSON header. It is
written to a temporary file in the same directory (``.<job_id>.<random>.tmp``), fsynced, renamed over
the old one and the directory fsynced, so a crash at any moment leaves either the old checkpoint or the
new one, whole. A master killed mid-write leaves its temporary file behind; the next master on that
state directory removes it at start (:func:`remove_interrupted_writes`).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradcode.common.codes.base import Observation
from gradcode.common.exceptions import GradcodeError
from gradcode.common.training.data import npz_declared_arrays
from gradcode.common.transport.wire import tensor_from_array
from gradcode.master.limits import MAX_MODEL_BYTES, MAX_SPEC_BYTES, MAX_WORKERS
from gradcode.master.optimizer import Optimizer, make_optimizer
from gradcode.v1 import master_pb2

__all__ = [
    "CHECKPOINT_SUFFIX",
    "FORMAT",
    "Checkpoint",
    "CheckpointError",
    "check_declared_sizes",
    "checkpoint_path",
    "remove_interrupted_writes",
    "saved_checkpoints",
]

CHECKPOINT_SUFFIX = ".ckpt.npz"
_TEMP_PREFIX, _TEMP_SUFFIX = ".", ".tmp"
"""A checkpoint being written is ``<state_dir>/.<job_id>.<random>.tmp`` until it is renamed into place."""
FORMAT = "gradcode-checkpoint-1"
"""The header's ``format``; a file with another format is refused."""
_RESUMABLE = ("running", "cancelled", "failed")


class CheckpointError(GradcodeError, ValueError):
    """A checkpoint that cannot be read or resumed; the message says why."""


@dataclass(frozen=True)
class Checkpoint:
    """One job's state after ``iteration`` committed iterations."""

    spec: master_pb2.JobSpec
    iteration: int
    optimizer: Optimizer
    observation: Observation | None
    state: str = "running"
    """``running`` while the job goes on (or when the master stopped under it), else its final state
    (``succeeded``, ``failed``, ``cancelled``); a restarted master resumes only ``running`` ones."""

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def model_reply(self) -> master_pb2.ModelReply:
        """GetModel's answer for the job as it stands here."""
        return master_pb2.ModelReply(
            job_id=self.job_id,
            iteration=self.iteration,
            parameters=tensor_from_array(self.optimizer.params),
            model=self.spec.model,
        )

    @property
    def resumable(self) -> bool:
        """Whether ``gradcode resume`` may go on from here (a succeeded job has nothing left to do)."""
        return self.state in _RESUMABLE and self.iteration < self.spec.iterations

    # ---- bytes -------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        opt = self.optimizer
        header = {
            "format": FORMAT,
            "job_id": self.job_id,
            "iteration": self.iteration,
            "state": self.state,
            "optimizer": {
                "kind": opt.kind,
                "steps": opt.steps,
                "learning_rate": opt.learning_rate,
                "momentum": float(getattr(opt, "momentum", 0.0)),
            },
            "observation": None if self.observation is None else {"straggling": list(self.observation.straggling)},
        }
        arrays: dict[str, np.ndarray[Any, Any]] = {f"optimizer.{k}": v for k, v in opt.state_arrays().items()}
        if self.observation is not None:
            arrays["observation.speed"] = np.asarray(self.observation.speed, dtype=np.float64)
        buffer = io.BytesIO()
        arrays["header"] = np.array(json.dumps(header))
        arrays["spec"] = np.frombuffer(self.spec.SerializeToString(), dtype=np.uint8)
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub types allow_pickle only
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "checkpoint") -> Checkpoint:
        """Parse a checkpoint file's contents; CheckpointError says what is wrong with it.

        Its arrays are checked from their headers first (:func:`check_declared_sizes`): nothing is decompressed
        before the sizes it declares are known to fit a job's limits."""
        check_declared_sizes(data, source=source)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                header = json.loads(str(npz["header"]))
                if not isinstance(header, dict) or header.get("format") != FORMAT:
                    found = header.get("format") if isinstance(header, dict) else header
                    raise CheckpointError(f"{source} has format {found!r}; this master reads {FORMAT!r}.")
                spec = master_pb2.JobSpec.FromString(npz["spec"].tobytes())
                arrays = {k.removeprefix("optimizer."): npz[k] for k in npz.files if k.startswith("optimizer.")}
                speed = npz["observation.speed"] if "observation.speed" in npz.files else None
                opt_header = header["optimizer"]
                optimizer = make_optimizer(
                    str(opt_header["kind"]),
                    arrays["params"],
                    learning_rate=float(opt_header["learning_rate"]),
                    momentum=float(opt_header["momentum"]),
                )
                optimizer.restore_state(arrays, steps=int(opt_header["steps"]))
                observed = header["observation"]
                observation = (
                    None
                    if observed is None
                    else Observation(
                        straggling=tuple(bool(v) for v in observed["straggling"]),
                        speed=tuple(float(v) for v in (speed if speed is not None else ())),
                    )
                )
                return cls(
                    spec=spec,
                    iteration=int(header["iteration"]),
                    optimizer=optimizer,
                    observation=observation,
                    state=str(header["state"]),
                )
        except CheckpointError:
            raise
        except Exception as exc:  # a truncated or foreign file: say which and why
            why = f"{type(exc).__name__}: {exc}"
            raise CheckpointError(f"{source} is not a readable gradcode checkpoint: {why}") from None

    # ---- files -------------------------------------------------------------------------------------
    def save(self, state_dir: Path) -> Path:
        """Write atomically to ``<state_dir>/<job_id>.ckpt.npz`` (temp file, fsync, rename, fsync dir)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        final = checkpoint_path(state_dir, self.job_id)
        data = self.to_bytes()
        fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f"{_TEMP_PREFIX}{self.job_id}.", suffix=_TEMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return final

    @classmethod
    def load(cls, path: Path, *, source: str | None = None) -> Checkpoint:
        """Read ``path``; ``source`` names it in the errors (default: its path, for the master's own log; a
        client is told a ``source`` that names no server path)."""
        source = source or f"Checkpoint {str(path)!r}"
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{source} cannot be read: {exc.strerror or type(exc).__name__}.") from None
        return cls.from_bytes(data, source=source)


MAX_HEADER_BYTES = 1 << 20
"""Declared bytes of a checkpoint's JSON header (as numpy's unicode array: 4 bytes a character); a real one holds
a few hundred characters and the straggling flags of at most MAX_WORKERS workers."""
MAX_OPTIMIZER_ARRAYS = 4
"""``optimizer.*`` arrays a checkpoint may hold (gd keeps one, Nesterov two)."""


def _array_limits(name: str) -> int | None:
    """The most bytes a checkpoint's array ``name`` may declare (None: no checkpoint holds such an array)."""
    if name == "header":
        return MAX_HEADER_BYTES
    if name == "spec":
        return MAX_SPEC_BYTES
    if name == "observation.speed":
        return MAX_WORKERS * 8
    if name.startswith("optimizer."):
        return MAX_MODEL_BYTES
    return None


def check_declared_sizes(data: bytes, *, source: str = "checkpoint") -> None:
    """Refuse a checkpoint whose arrays' headers declare more than a job may hold, before any is decompressed.

    The data-file path's header check (:func:`gradcode.common.training.data.npz_declared_arrays`) read on the
    checkpoint:
    a member no checkpoint has, or one declaring more than its limit (the spec :data:`MAX_SPEC_BYTES`, each
    optimizer array :data:`MAX_MODEL_BYTES`, the header :data:`MAX_HEADER_BYTES`, the observation
    ``MAX_WORKERS`` speeds), is a CheckpointError saying so: a few compressed megabytes cannot expand into
    gigabytes of the master's memory.
    """
    try:
        declared = npz_declared_arrays(io.BytesIO(data), max_arrays=3 + MAX_OPTIMIZER_ARRAYS)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{source} is not a readable gradcode checkpoint: {exc}") from None
    for name, array in declared.items():
        limit = _array_limits(name)
        if limit is None:
            raise CheckpointError(f"{source} holds an array {name[:64]!r} that no gradcode checkpoint has.")
        if array.nbytes > limit:
            raise CheckpointError(
                f"{source} declares its array {name!r} of {array.nbytes} bytes; a checkpoint's {name!r} may have at "
                f"most {limit} bytes (checked from its headers, before decompressing)."
            )


def checkpoint_path(state_dir: Path, job_id: str) -> Path:
    return Path(state_dir) / f"{job_id}{CHECKPOINT_SUFFIX}"


def saved_checkpoints(state_dir: Path) -> list[Path]:
    """The checkpoint files in ``state_dir``, by name (none when it does not exist yet)."""
    if not Path(state_dir).is_dir():
        return []
    return sorted(Path(state_dir).glob(f"*{CHECKPOINT_SUFFIX}"))


def remove_interrupted_writes(state_dir: Path) -> list[Path]:
    """Remove the temporary files of checkpoint writes a killed master never finished; returns them.

    Only a master starting on ``state_dir`` calls this: no write of its own is under way yet, and two masters
    never share a state directory.
    """
    if not Path(state_dir).is_dir():
        return []
    removed = []
    for path in sorted(Path(state_dir).glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}")):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
