"""Data files inside a data directory, and how their errors are told: one set of rules for the master and the workers.

A ``file`` dataset (on the master, streamed to the workers) and worker-local data (each worker reads
its own partitions) must resolve inside the reading process's ``--data-dir``: no ``..`` or symbolic
link leads out (``/proc/self/...`` links included: they resolve to where they point), only regular
files are read (no FIFO or device, which could block or never end), a NUL in the path is refused, and
a file may hold at most ``max_bytes``. Loading errors are reported from a fixed list of reasons
(:func:`file_error`), never with text quoted from the file.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from gradcode.common.exceptions import JobSpecError

__all__ = ["DATA_DIR_ENV", "DATA_FILE_SUFFIXES", "MAX_DATA_FILE_BYTES", "data_file", "error_reason", "file_error"]

DATA_DIR_ENV = "GRADCODE_DATA_DIR"
MAX_DATA_FILE_BYTES = 2 << 30
"""Default largest data file on disk (2 GiB; ``--max-data-file-bytes`` of the master and of a worker): it
holds any dataset within the master's size cap as a float64 ``.npz``, and a CSV of it (2-3x larger) mostly."""
DATA_FILE_SUFFIXES = (".npz", ".csv", ".npy", ".parquet")
"""The file formats a data directory may serve (see :func:`gradcode.common.training.data.load_dataset`)."""


def data_file(
    path: str,
    data_dir: str | Path | None,
    *,
    max_bytes: int = MAX_DATA_FILE_BYTES,
    where: str = "master",
    what: str = "Dataset path",
    suffixes: tuple[str, ...] = DATA_FILE_SUFFIXES,
) -> Path:
    """The regular file ``path`` names inside ``data_dir``, of at most ``max_bytes``; JobSpecError otherwise.

    ``where`` names the process in the errors (``"master"`` or ``"worker"``), ``what`` the path's role
    (``"Dataset path"``, ``"Labels file"``), ``suffixes`` the accepted file types.
    """
    if data_dir is None:
        raise JobSpecError(
            f"Dataset 'file' is disabled on this {where}: start it with --data-dir DIR (or the environment variable "
            f"{DATA_DIR_ENV}=DIR) to allow {'/'.join(suffixes)} files from DIR, then give dataset.path relative to DIR."
        )
    kinds = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
    if not path:
        raise JobSpecError(f"{what} is empty: give a {kinds} file in the {where}'s data directory.")
    if "\0" in path:
        raise JobSpecError(f"{what} {path[:64]!r} contains a NUL character; give a plain relative path.")
    try:
        root = Path(data_dir).resolve(strict=True)
        file = (root / path).resolve()
    except (OSError, ValueError, RuntimeError):
        raise JobSpecError(f"{what} {path[:64]!r} cannot be resolved in the {where}'s data directory.") from None
    if not file.is_relative_to(root):
        raise JobSpecError(
            f"{what} {path[:64]!r} is outside the {where}'s data directory; give a path inside it (relative to it; "
            "'..' and symbolic links may not lead out)."
        )
    if file.suffix.lower() not in suffixes:
        raise JobSpecError(f"{what} {path[:64]!r} must name a {kinds} file.")
    try:
        info = os.stat(file)
    except OSError:
        raise JobSpecError(f"{what} {path[:64]!r} is not a file in the {where}'s data directory.") from None
    if not stat.S_ISREG(info.st_mode):
        raise JobSpecError(
            f"{what} {path[:64]!r} is not a regular file in the {where}'s data directory (FIFOs, devices and "
            "directories are refused)."
        )
    if info.st_size > max_bytes:
        raise JobSpecError(
            f"Dataset file {path[:64]!r} has {info.st_size} bytes; this {where} loads at most {max_bytes} bytes "
            f"({max_bytes / 2**20:.0f} MiB; its --max-data-file-bytes)."
        )
    return file


_FILE_ERRORS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), text)
    for p, text in (
        (r"line (\d+): non-numeric value", "line {0} holds a non-numeric value"),
        (r"line (\d+): (\d+) columns, expected (\d+)", "line {0} has {1} columns, expected {2}"),
        (r"needs at least one feature and a label", "each line needs at least one feature and the label (last)"),
        (r"holds no data rows", "it holds no data rows"),
        (r"has (\d+) samples; at least 2", "it has {0} samples; at least 2 are needed"),
        (r"NaN or infinite", "it contains NaN or infinite values"),
        (
            r"declares arrays of (\d+) MiB as float64; a data file may hold at most (\d+) MiB",
            "its arrays would take {0} MiB; a data file may hold at most {1} MiB (checked from the .npz headers, "
            "before decompressing)",
        ),
        (r"not a readable \.npz archive", "it is not a readable .npz archive"),
        (r"single \.npy array", "it is a single .npy array, not an .npz archive with arrays 'X' and 'y'"),
        (r"must contain arrays 'X' and 'y'", "it must contain arrays 'X' and 'y'"),
        (r"cannot read 'X'/'y'", "its arrays 'X'/'y' cannot be read (object arrays are refused)"),
        (r"must be numeric", "its arrays 'X' and 'y' must be numeric"),
        (r"'X' must be 2-D", "its array 'X' must be 2-D (samples, features)"),
        (r"'y' must have shape", "its array 'y' must hold one label per row of 'X'"),
        (r"'y' must be 1-D", "its array 'y' must hold one label per row of 'X'"),
        (r"not a readable \.npy array", "it is not a readable .npy array (object arrays are refused)"),
        (r"name the labels' \.npy too", "a .npy of features needs the labels' .npy too (option 'labels')"),
        (r"not a readable \.parquet file", "it is not a readable .parquet file"),
        (r"has no label column", "it has no such label column (option 'label'; default: the last column)"),
        (r"needs pyarrow", "reading .parquet files needs pyarrow: pip install 'gradcode[parquet]'"),
        (
            r"here has (\d+) rows x (\d+) features, but the master's has (\d+) x (\d+)",
            "here it has {0} rows x {1} features, but the master's has {2} x {3}; every worker must read the same data",
        ),
        (r"has (\d+) features; 'num_features'", "it has {0} features; leave dataset.num_features 0 or give that"),
        (r"'num_samples' must be at most (\d+)", "dataset.num_samples must be at most {0} (the file's rows)"),
        (r"too few to keep any for training", "too few samples are left for training"),
        (r"needs integer class labels", "a classification model needs integer class labels (or -1/+1)"),
        (r"'logistic' needs two classes, the labels have (\d+)", "'logistic' needs two classes, the labels have {0}"),
    )
]


def file_error(exc: Exception) -> str:
    """What is wrong with a data file, from a fixed list of reasons: never text quoted from the file."""
    text = str(exc)
    for pattern, reason in _FILE_ERRORS:
        match = pattern.search(text)
        if match:
            return reason.format(*match.groups())
    if isinstance(exc, OSError):
        return "it cannot be read"
    return "it is not a .npz archive with numeric arrays 'X' and 'y', nor a numeric .csv with the label last"


def error_reason(exc: BaseException) -> str:
    """A dataset's (or plugin's) error for a client, without the server path an OSError carries in its text: its
    ``strerror`` (``No such file or directory``) instead of ``[Errno 2] No such file or directory: '/srv/...'``."""
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or 'it cannot be read'}"
    return str(exc)
