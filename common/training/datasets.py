"""Dataset plugins: data that stays on the workers, each worker loading its own partitions.

A job with ``DatasetSpec.worker_local`` names a dataset — a built-in (``file``, ``digits``,
``gaussian_mixture``, ``linear``) or a plugin installed under the entry-point group
``gradcode.datasets`` (:func:`gradcode.common.training.plugins.load_dataset_plugin`): nothing is imported from a
name the network sends unless it is installed here. A plugin is any object with an ``open`` method::

    [project.entry-points."gradcode.datasets"]
    my_data = "my_package.data:plugin"      # plugin.open(source) -> gradcode.common.training.data.DataTable

that returns a :class:`~gradcode.common.training.data.DataTable`: the number of rows and features, every row's
label and selected rows. ``source`` (:class:`DataSource`) carries the job's path, options and seed, and
resolves paths inside this process's data directory with the same rules as the master's
(:func:`DataSource.resolve`).

Both sides split the rows with the same seeded functions as the master-streamed path
(:func:`~gradcode.common.training.data.split_rows`, then :func:`~gradcode.common.training.data.partition_indices`), so
the same seeds give the same partitions and the same gradients. The master (:func:`describe`) reads
only the labels (their count gives the mean, their values the task and classes) and the held-out
rows; a worker (:func:`load_partitions`) reads only its partitions' rows — from a memory-mapped
``.npy`` or a Parquet file nothing else is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from gradcode.common.exceptions import JobSpecError
from gradcode.common.training.data import (
    DATASET_NAMES,
    Dataset,
    DataTable,
    FloatArray,
    IndexArray,
    check_data,
    check_num_features,
    generate,
    infer_task,
    open_data_file,
    partition_indices,
    signed_labels,
    split_rows,
)
from gradcode.common.training.datafile import MAX_DATA_FILE_BYTES, data_file
from gradcode.common.training.plugins import PluginError, load_dataset_plugin

__all__ = ["DataSource", "DatasetPlugin", "LocalDescription", "dataset_plugin", "describe", "load_partitions"]

FILE_OPTIONS = ("labels", "label")
"""Options of the ``file`` dataset: ``labels``, the labels' ``.npy`` beside a ``.npy`` of features;
``label``, a Parquet file's label column (default: its last)."""


@dataclass(frozen=True)
class DataSource:
    """What a job names (its dataset, path, options, sizes and seed) and where this process may read files."""

    name: str
    path: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    num_samples: int | None = None
    num_features: int | None = None
    seed: int = 0
    data_dir: Path | None = None
    """This process's --data-dir (None: it reads no file)."""
    max_file_bytes: int = MAX_DATA_FILE_BYTES
    where: str = "worker"
    """``"master"`` or ``"worker"``, for the errors."""

    def resolve(self, path: str, what: str = "Dataset path") -> Path:
        """``path`` inside the data directory (no ``..``/symbolic link out, regular files only, size capped)."""
        return data_file(path, self.data_dir, max_bytes=self.max_file_bytes, where=self.where, what=what)


class DatasetPlugin(Protocol):
    """What a ``gradcode.datasets`` entry point names: ``open(source)`` returns the dataset's rows as a DataTable."""

    def open(self, source: DataSource) -> DataTable: ...


class _FilePlugin:
    """``file``: a .npz, .csv, .npy (memory-mapped; option ``labels``) or .parquet (option ``label``) file."""

    def open(self, source: DataSource) -> DataTable:
        unknown = sorted(set(source.options) - set(FILE_OPTIONS))
        if unknown:
            raise JobSpecError(f"Dataset 'file' takes options {list(FILE_OPTIONS)}, not {unknown}.")
        file = source.resolve(source.path)
        labels = source.options.get("labels")
        table = open_data_file(
            file,
            labels_path=None if labels is None else source.resolve(labels, what="Labels file"),
            label_column=source.options.get("label"),
        )
        table.keep = source.num_samples
        check_num_features(source.path, table.num_features, source.num_features)
        return table


class _GeneratedTable(DataTable):
    def __init__(self, name: str, source: DataSource) -> None:
        g = generate(name, num_samples=source.num_samples, num_features=source.num_features, seed=source.seed)
        self._X, self._y, self.file = g.X, g.y, Path(name)
        self.num_rows, self.num_features = int(g.X.shape[0]), int(g.X.shape[1])
        self.model_kind, self.num_classes, self.keep = g.model_kind, g.num_classes, g.keep

    def labels(self) -> FloatArray:
        return self._y

    def rows(self, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
        return np.ascontiguousarray(self._X[rows]), np.ascontiguousarray(self._y[rows])


@dataclass(frozen=True)
class _GeneratorPlugin:
    """A built-in dataset every worker generates from the seed (it draws every row, then keeps its own)."""

    name: str

    def open(self, source: DataSource) -> DataTable:
        if source.path or source.options:
            raise ValueError(f"Dataset {self.name!r} is generated from the seed; it takes no path or options.")
        return _GeneratedTable(self.name, source)


_BUILTIN: dict[str, DatasetPlugin] = {
    "file": _FilePlugin(),
    **{name: _GeneratorPlugin(name) for name in DATASET_NAMES if name != "file"},
}


def dataset_plugin(name: str) -> DatasetPlugin:
    """The built-in dataset or installed plugin ``name``; PluginError (a ValueError) lists the valid names."""
    builtin = _BUILTIN.get(name)
    if builtin is not None:
        return builtin
    plugin = load_dataset_plugin(name, builtin=tuple(_BUILTIN))
    if not callable(getattr(plugin, "open", None)):
        raise PluginError(f"Dataset plugin {name!r} has no open(source) method; it must be a DatasetPlugin.")
    return plugin  # type: ignore[no-any-return]


def _open(source: DataSource) -> DataTable:
    table = dataset_plugin(source.name).open(source)
    if not isinstance(table, DataTable):
        raise PluginError(
            f"Dataset plugin {source.name!r} returned a {type(table).__name__}, not a "
            "gradcode.common.training.data.DataTable."
        )
    rows, features = getattr(table, "num_rows", None), getattr(table, "num_features", None)
    if not (
        isinstance(rows, (int, np.integer)) and rows >= 2 and isinstance(features, (int, np.integer)) and features >= 1
    ):
        raise ValueError(
            f"Dataset {source.name!r} has {rows} rows of {features} features; a dataset needs at least 2 rows and "
            "1 feature."
        )
    return table


def _checked_rows(table: DataTable, source: DataSource, rows: IndexArray) -> tuple[FloatArray, FloatArray]:
    """``table.rows(rows)`` as float64, checked: one row of ``num_features`` features and one label per index."""
    X, y = table.rows(rows)
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    want = (len(rows), table.num_features)
    if X.shape != want or y.shape != (len(rows),):
        raise ValueError(
            f"Dataset {source.name!r} returned features of shape {X.shape} and labels of shape {y.shape} for "
            f"{len(rows)} rows; expected {want} and ({len(rows)},)."
        )
    check_data(X, y, table.file)
    return X, y


@dataclass(frozen=True)
class LocalDescription:
    """What the master learns of worker-local data, and what it tells the workers so they read the same rows."""

    dataset: Dataset
    """Held-out rows and training labels only (``features_on_workers``)."""
    num_rows: int
    """Rows of the whole dataset: a worker whose copy has another count is refused."""
    signed_labels: bool
    """Labels are -1/+1 and train as 0/1."""


def describe(source: DataSource, *, test_fraction: float) -> LocalDescription:
    """The master's view of worker-local data: its shape, task, training labels and held-out rows.

    Reads every label (their count is the mean's denominator, their values the task and classes) and
    the held-out rows, never the training features. ValueError says what is wrong.
    """
    table = _open(source)
    train, test = split_rows(
        table.num_rows, seed=source.seed, test_fraction=test_fraction, num_samples=table.keep, name=source.name
    )
    labels = np.asarray(table.labels(), dtype=np.float64)
    if labels.shape != (table.num_rows,):
        raise ValueError(
            f"Dataset {source.name!r} returned labels of shape {labels.shape}; expected ({table.num_rows},)."
        )
    check_data(np.empty((0, table.num_features)), labels, table.file)
    signed = table.model_kind is None and signed_labels(labels)
    if table.model_kind is None:
        kind, labels, num_classes = infer_task(labels, None, table.file)
    else:
        kind, num_classes = table.model_kind, table.num_classes
    X_test, y_test = _checked_rows(table, source, test)
    if signed:
        y_test = (y_test > 0).astype(np.float64)
    dataset = Dataset(
        name=source.path or source.name,
        X_train=np.empty((0, table.num_features)),
        y_train=np.ascontiguousarray(labels[train]),
        X_test=X_test,
        y_test=y_test,
        num_classes=num_classes,
        model_kind=kind,
        features_on_workers=True,
    )
    return LocalDescription(dataset=dataset, num_rows=table.num_rows, signed_labels=signed)


def load_partitions(
    source: DataSource,
    *,
    test_fraction: float,
    partition_seed: int,
    weights: Sequence[float],
    wanted: Sequence[int],
    num_rows: int,
    num_features: int,
    signed: bool,
    check_bytes: Callable[[dict[int, int]], None] | None = None,
) -> dict[int, tuple[FloatArray, FloatArray]]:
    """A worker's own partitions ``wanted``: features and labels of exactly the rows the master would send.

    ``num_rows``/``num_features`` are what the master found (a worker's copy that differs is refused);
    ``check_bytes`` sees every wanted partition's sample count before anything is read (the worker's
    memory budget). ValueError says what is wrong.
    """
    table = _open(source)
    if (table.num_rows, table.num_features) != (num_rows, num_features):
        raise ValueError(
            f"Dataset {source.name!r} {source.path!r} here has {table.num_rows} rows x {table.num_features} features, "
            f"but the master's has {num_rows} x {num_features}; every worker must read the same data."
        )
    train, _ = split_rows(
        table.num_rows, seed=source.seed, test_fraction=test_fraction, num_samples=table.keep, name=source.name
    )
    parts = partition_indices(len(train), weights, seed=partition_seed)
    bad = [j for j in wanted if not 0 <= j < len(parts)]
    if bad:
        raise ValueError(f"Partition(s) {bad} do not exist; the job has {len(parts)} partitions.")
    if check_bytes is not None:
        check_bytes({j: len(parts[j]) for j in wanted})
    out: dict[int, tuple[FloatArray, FloatArray]] = {}
    for j in wanted:
        X, y = _checked_rows(table, source, train[parts[j]])
        if signed:
            y = (y > 0).astype(np.float64)
        out[j] = (X, y)
    return out
