"""The ``file`` dataset: a .npz/.csv file inside the master's data directory, and how its errors are told.

A file dataset must resolve inside the master's ``--data-dir`` (no ``..`` or symbolic link leads out);
its loading errors are reported from a fixed list of reasons (:func:`file_error`), never with text
quoted from the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from gradcode.common.exceptions import JobSpecError
from gradcode.master import limits

__all__ = ["DATA_DIR_ENV", "data_file", "file_error"]

DATA_DIR_ENV = "GRADCODE_DATA_DIR"


def data_file(path: str, data_dir: str | Path | None, *, max_bytes: int = limits.MAX_DATA_FILE_BYTES) -> Path:
    """The file a ``file`` dataset names, which must resolve inside ``data_dir`` and hold at most
    ``max_bytes``; JobSpecError otherwise."""
    if data_dir is None:
        raise JobSpecError(
            "Dataset 'file' is disabled on this master: start it with --data-dir DIR (or the environment variable "
            f"{DATA_DIR_ENV}=DIR) to allow .npz/.csv files from DIR, then give dataset.path relative to DIR."
        )
    if not path:
        raise JobSpecError("Dataset 'file' needs dataset.path: a .npz or .csv file in the master's data directory.")
    try:
        root = Path(data_dir).resolve(strict=True)
        file = (root / path).resolve()
    except (OSError, ValueError, RuntimeError):
        raise JobSpecError(f"Dataset path {path!r} cannot be resolved in the master's data directory.") from None
    if not file.is_relative_to(root):
        raise JobSpecError(
            f"Dataset path {path!r} is outside the master's data directory; give a path inside it (relative to it; "
            "'..' and symbolic links may not lead out)."
        )
    if file.suffix.lower() not in (".npz", ".csv"):
        raise JobSpecError(f"Dataset path {path!r} must name a .npz or .csv file.")
    if not file.is_file():
        raise JobSpecError(f"Dataset path {path!r} is not a file in the master's data directory.")
    size = file.stat().st_size
    if size > max_bytes:
        raise JobSpecError(
            f"Dataset file {path!r} has {size} bytes; this master loads at most {max_bytes} bytes "
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
