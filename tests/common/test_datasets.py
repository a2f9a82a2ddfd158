"""Worker-local data: each file format and built-in generator, read by a worker exactly as the master streams it.

A worker-local job (``DatasetSpec.worker_local``) is planned on the master from the labels and held-out
rows only; each worker's :class:`~gradcode.worker.compute.JobBuilder` then loads its own partitions
from its data directory. Every test here compares a worker's partitions with the master-streamed
plan's, bit for bit (same seeds, same partitions, same gradients), and checks what the master sends:
the setup alone, whose size does not depend on the dataset's.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradcode.common.exceptions import JobSetupError, JobSpecError
from gradcode.common.training.data import load_dataset, open_data_file
from gradcode.common.training.datasets import DataSource, dataset_plugin, describe, load_partitions
from gradcode.common.training.plugins import DATASET_ENTRY_POINT_GROUP, PluginError, _discover
from gradcode.common.transport.wire import struct_from_dict
from gradcode.master.loading import WorkerLoader
from gradcode.master.pool import WorkerPool
from gradcode.master.spec import JobPlan, plan_job
from gradcode.v1 import common_pb2, master_pb2, worker_pb2
from gradcode.worker.compute import JobBuilder, JobTooLargeError

ROWS, FEATURES = 300, 5
CODE = ("cyclic", {"n": 4, "s": 1})


def arrays(rows: int = ROWS, features: int = FEATURES, *, seed: int = 3) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, features))
    y = (X @ rng.standard_normal(features) > 0).astype(np.float64)
    return X, y


def write(
    data_dir: Path, fmt: str, X: np.ndarray[Any, Any], y: np.ndarray[Any, Any], stem: str = "d"
) -> tuple[str, dict[str, str]]:
    """Write ``X``, ``y`` as ``fmt`` into ``data_dir``; return (path, options) for a DatasetSpec."""
    if fmt == "npz":
        np.savez(data_dir / f"{stem}.npz", X=X, y=y)
        return f"{stem}.npz", {}
    if fmt == "csv":
        np.savetxt(data_dir / f"{stem}.csv", np.column_stack([X, y]), delimiter=",", fmt="%.17g")
        return f"{stem}.csv", {}
    if fmt == "npy":
        np.save(data_dir / f"{stem}_X.npy", X)
        np.save(data_dir / f"{stem}_y.npy", y)
        return f"{stem}_X.npy", {"labels": f"{stem}_y.npy"}
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {f"f{j}": X[:, j] for j in range(X.shape[1])}
    pq.write_table(pa.table({"target": y, **columns}), data_dir / f"{stem}.parquet", row_group_size=64)
    return f"{stem}.parquet", {"label": "target"}


def spec(
    name: str, path: str = "", options: dict[str, str] | None = None, *, local: bool, **dataset: Any
) -> master_pb2.JobSpec:
    return master_pb2.JobSpec(
        code=common_pb2.CodeSpec(name=CODE[0], params=struct_from_dict(CODE[1])),
        dataset=master_pb2.DatasetSpec(
            name=name, path=path, options=options or {}, worker_local=local, seed=11, **dataset
        ),
        optimizer=master_pb2.OptimizerSpec(kind="gd", learning_rate=0.1),
        iterations=3,
        seed=5,
    )


def worker_job(plan: JobPlan, w: int, data_dir: Path | None, **builder: Any) -> Any:
    """Worker ``w`` of a planned worker-local job, built as a worker does from its LoadJob setup."""
    setup = WorkerLoader(plan, WorkerPool()).job_setup(w)
    assert setup.HasField("local_data") and setup.num_partitions_sent == 0
    return JobBuilder(setup, data_dir=data_dir, **builder).finish()


def assert_same_partitions(streamed: JobPlan, local: JobPlan, data_dir: Path) -> None:
    """Every worker's own partitions are exactly the rows (in order) the master would have streamed it."""
    assert local.dataset.features_on_workers and local.dataset.X_train.shape == (0, streamed.dataset.num_features)
    assert local.dataset.num_train == streamed.dataset.num_train
    np.testing.assert_array_equal(local.dataset.y_train, streamed.dataset.y_train)
    np.testing.assert_array_equal(local.dataset.X_test, streamed.dataset.X_test)
    np.testing.assert_array_equal(local.dataset.y_test, streamed.dataset.y_test)
    assert local.spec.model == streamed.spec.model
    params = streamed.model.init_params() + 0.1
    for w in range(local.code.n):
        job = worker_job(local, w, data_dir)
        for j, (X, y) in job.partitions.items():
            idx = streamed.partitions[j]
            np.testing.assert_array_equal(X, streamed.dataset.X_train[idx])
            np.testing.assert_array_equal(y, streamed.dataset.y_train[idx])
            np.testing.assert_array_equal(
                job.model.gradient(params, X, y),
                streamed.model.gradient(params, streamed.dataset.X_train[idx], streamed.dataset.y_train[idx]),
            )


@pytest.mark.parametrize("fmt", ["npz", "csv", "npy", "parquet"])
def test_each_file_format_gives_the_workers_exactly_the_streamed_partitions(tmp_path: Path, fmt: str) -> None:
    X, y = arrays()
    path, options = write(tmp_path, fmt, X, y)
    streamed = plan_job(spec("file", path, options, local=False), data_dir=tmp_path)
    local = plan_job(spec("file", path, options, local=True), data_dir=tmp_path)
    assert streamed.dataset.num_train + len(streamed.dataset.y_test) == ROWS
    assert_same_partitions(streamed, local, tmp_path)


def test_signed_labels_train_as_zero_one_on_the_workers_too(tmp_path: Path) -> None:
    X, y = arrays()
    path, options = write(tmp_path, "npy", X, 2 * y - 1)  # -1/+1 labels
    streamed = plan_job(spec("file", path, options, local=False), data_dir=tmp_path)
    local = plan_job(spec("file", path, options, local=True), data_dir=tmp_path)
    assert local.local is not None and local.local.signed_labels and local.spec.model.kind == "logistic"
    assert_same_partitions(streamed, local, tmp_path)


@pytest.mark.parametrize("name", ["gaussian_mixture", "linear", "digits"])
def test_built_in_generators_give_the_workers_exactly_the_streamed_partitions(name: str) -> None:
    sizes = {} if name == "digits" else {"num_samples": 400, "num_features": 7}
    streamed = plan_job(spec(name, local=False, **sizes))
    local = plan_job(spec(name, local=True, **sizes))
    assert_same_partitions(streamed, local, Path("."))


def test_a_npy_dataset_is_memory_mapped_and_only_the_asked_rows_are_read(tmp_path: Path) -> None:
    X, y = arrays(rows=50_000, features=20)
    path, options = write(tmp_path, "npy", X, y)
    table = open_data_file(tmp_path / path, labels_path=tmp_path / options["labels"])
    assert isinstance(table._X, np.memmap) and isinstance(table._y, np.memmap)  # nothing read at open
    rows = np.array([49_999, 3, 17])
    got_X, got_y = table.rows(rows)
    np.testing.assert_array_equal(got_X, X[rows])
    np.testing.assert_array_equal(got_y, y[rows])
    assert got_X.dtype == np.float64 and not isinstance(got_X, np.memmap)


def test_parquet_reads_the_named_label_column_or_the_last(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y = arrays(rows=20, features=3)
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "label": y}), tmp_path / "last.parquet")
    table = open_data_file(tmp_path / "last.parquet")
    assert (table.num_rows, table.num_features) == (20, 3)
    np.testing.assert_array_equal(table.labels(), y)
    got_X, _ = table.rows(np.array([4, 1]))
    np.testing.assert_array_equal(got_X, X[[4, 1]])
    with pytest.raises(ValueError, match=r"has no label column 'nope'; its columns are \['a', 'b', 'c', 'label'\]"):
        open_data_file(tmp_path / "last.parquet", label_column="nope")
    pq.write_table(pa.table({"a": X[:, 0], "name": ["x"] * 20, "label": y}), tmp_path / "text.parquet")
    with pytest.raises(ValueError, match=r"must be numeric; columns \['name'\] are not"):
        open_data_file(tmp_path / "text.parquet")


def load_streams(plan: JobPlan) -> tuple[list[worker_pb2.LoadJobChunk], int]:
    """Every worker's LoadJob chunks, and the bytes the loader counted sending them."""
    loader = WorkerLoader(plan, WorkerPool())

    async def drain() -> list[worker_pb2.LoadJobChunk]:
        return [chunk for w in range(plan.code.n) async for chunk in loader.load_stream(w)]

    return asyncio.run(drain()), loader.bytes_sent


def test_the_master_sends_the_same_setup_bytes_whatever_the_dataset_size(tmp_path: Path) -> None:
    sizes = {}
    for stem, rows in (("small", 200), ("large", 20_000)):
        X, y = arrays(rows=rows)
        path, options = write(tmp_path, "npy", X, y, stem=stem)
        chunks, sizes[stem] = load_streams(plan_job(spec("file", path, options, local=True), data_dir=tmp_path))
        assert len(chunks) == CODE[1]["n"] and all(c.HasField("setup") for c in chunks)
        assert sizes[stem] == sum(c.ByteSize() for c in chunks)
    assert abs(sizes["large"] - sizes["small"]) <= 4 * 4, sizes  # per setup: the row count's varint, the names


def test_a_streamed_job_counts_its_data_bytes(tmp_path: Path) -> None:
    X, y = arrays()
    path, options = write(tmp_path, "npy", X, y)
    _, sent = load_streams(plan_job(spec("file", path, options, local=False), data_dir=tmp_path))
    assert sent > 2 * 0.8 * (X.nbytes + y.nbytes)  # cyclic n=4, s=1: every training partition goes to two workers


# ---- bad inputs -----------------------------------------------------------------------------------------
def test_an_unknown_dataset_is_refused_listing_the_available_ones() -> None:
    with pytest.raises(
        JobSpecError,
        match=re.escape(
            "Unknown dataset 'imagenet'; valid datasets here are ['file', 'digits', 'gaussian_mixture', 'linear']"
        ),
    ):
        plan_job(spec("imagenet", local=True))
    with pytest.raises(PluginError, match=r"Unknown dataset 'x.y'"):
        dataset_plugin("x.y")


def test_paths_outside_the_data_dir_are_refused_on_the_master_and_on_the_worker(tmp_path: Path) -> None:
    data_dir, outside = tmp_path / "data", tmp_path / "private"
    data_dir.mkdir()
    outside.mkdir()
    X, y = arrays()
    write(outside, "npy", X, y)
    (data_dir / "link_X.npy").symlink_to(outside / "d_X.npy")
    write(data_dir, "npy", X, y)
    cases = [
        ("../private/d_X.npy", {"labels": "d_y.npy"}, "Dataset path '../private/d_X.npy' is outside"),
        ("link_X.npy", {"labels": "d_y.npy"}, "Dataset path 'link_X.npy' is outside"),
        ("d_X.npy", {"labels": "../private/d_y.npy"}, "Labels file '../private/d_y.npy' is outside"),
        ("d_X.npy", {"labels": "/proc/self/environ"}, "Labels file '/proc/self/environ' is outside"),
        ("d\0X.npy", {"labels": "d_y.npy"}, "contains a NUL character"),
    ]
    for path, options, message in cases:
        with pytest.raises(
            JobSpecError, match=re.escape(message + ("" if "NUL" in message else " the master's data directory"))
        ):
            plan_job(spec("file", path, options, local=True), data_dir=data_dir)
        source = DataSource(name="file", path=path, options=options, data_dir=data_dir)
        with pytest.raises(JobSpecError, match=re.escape(message)):
            load_partitions(source, test_fraction=0.2, partition_seed=0, weights=[1.0], wanted=[0], num_rows=ROWS,
                            num_features=FEATURES, signed=False)  # fmt: skip
    with pytest.raises(JobSpecError, match=r"Dataset 'file' is disabled on this worker: start it with --data-dir"):
        load_partitions(DataSource(name="file", path="d_X.npy", options={"labels": "d_y.npy"}), test_fraction=0.2,
                        partition_seed=0, weights=[1.0], wanted=[0], num_rows=ROWS, num_features=FEATURES,
                        signed=False)  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_unopened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.npy")
    np.save(tmp_path / "y.npy", np.zeros(3))
    with pytest.raises(JobSpecError, match=r"'pipe.npy' is not a regular file in the master's data directory"):
        plan_job(spec("file", "pipe.npy", {"labels": "y.npy"}, local=True), data_dir=tmp_path)


def test_wrong_shapes_are_refused_with_what_was_expected(tmp_path: Path) -> None:
    X, y = arrays()
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "y_short.npy", y[:-1])
    np.save(tmp_path / "y_2d.npy", y.reshape(-1, 1))
    np.save(tmp_path / "X_1d.npy", y)
    np.save(tmp_path / "objects.npy", np.array([object()] * 3), allow_pickle=True)
    cases = {
        ("X.npy", "y_short.npy"): "its array 'y' must hold one label per row of 'X'",
        ("X.npy", "y_2d.npy"): "its array 'y' must hold one label per row of 'X'",
        ("X_1d.npy", "y_short.npy"): "its array 'X' must be 2-D (samples, features)",
        ("objects.npy", "y_short.npy"): "it is not a readable .npy array (object arrays are refused)",
    }
    for (features, labels), reason in cases.items():
        with pytest.raises(JobSpecError, match=re.escape(f"Dataset 'file' {features!r} refused: {reason}")):
            plan_job(spec("file", features, {"labels": labels}, local=True), data_dir=tmp_path)
    with pytest.raises(
        JobSpecError, match=r"refused: a .npy of features needs the labels' .npy too \(option 'labels'\)"
    ):
        plan_job(spec("file", "X.npy", local=True), data_dir=tmp_path)
    with pytest.raises(JobSpecError, match=r"refused: it has 5 features; leave dataset.num_features 0 or give that"):
        plan_job(spec("file", "X.npy", {"labels": "y.npy"}, local=True, num_features=4), data_dir=tmp_path)
    with pytest.raises(JobSpecError, match=r"takes options \['labels', 'label'\], not \['sep'\]"):
        plan_job(spec("file", "X.npy", {"labels": "y_short.npy", "sep": ";"}, local=True), data_dir=tmp_path)


def test_a_worker_whose_copy_differs_from_the_masters_is_refused(tmp_path: Path) -> None:
    master_dir, worker_dir = tmp_path / "master", tmp_path / "worker"
    master_dir.mkdir()
    worker_dir.mkdir()
    X, y = arrays()
    path, options = write(master_dir, "npy", X, y)
    write(worker_dir, "npy", X[:-10], y[:-10])
    plan = plan_job(spec("file", path, options, local=True), data_dir=master_dir)
    with pytest.raises(JobSetupError, match=re.escape(
        f"Dataset 'file' 'd_X.npy' refused on this worker: here it has {ROWS - 10} rows x {FEATURES} features, but the "
        f"master's has {ROWS} x {FEATURES}; every worker must read the same data."
    )):  # fmt: skip
        worker_job(plan, 0, worker_dir)


def test_a_worker_local_job_is_held_to_the_workers_byte_cap_before_reading(tmp_path: Path) -> None:
    X, y = arrays()
    path, options = write(tmp_path, "npy", X, y)
    plan = plan_job(spec("file", path, options, local=True), data_dir=tmp_path)
    with pytest.raises(JobTooLargeError, match=r"over this worker's limit of 1000 bytes"):
        worker_job(plan, 0, tmp_path, max_bytes=1000)


def test_a_worker_local_setup_takes_no_partition_data(tmp_path: Path) -> None:
    X, y = arrays()
    path, options = write(tmp_path, "npy", X, y)
    setup = WorkerLoader(plan_job(spec("file", path, options, local=True), data_dir=tmp_path), WorkerPool()).job_setup(
        0
    )
    builder = JobBuilder(setup, data_dir=tmp_path)
    with pytest.raises(JobSetupError, match=r"this job's data is worker-local \(JobSetup.local_data\)"):
        builder.add(worker_pb2.PartitionData(partition=0, num_samples=1))
    setup.num_partitions_sent = 2
    with pytest.raises(JobSetupError, match=r"has local_data but announces 2 partitions sent"):
        JobBuilder(setup, data_dir=tmp_path)


def test_verify_and_an_empty_held_out_set_are_refused_for_worker_local_data() -> None:
    verify = spec("gaussian_mixture", local=True)
    verify.verify = True
    with pytest.raises(JobSpecError, match=r"JobSpec.verify .* with dataset.worker_local it stays on the workers"):
        plan_job(verify)
    with pytest.raises(JobSpecError, match=r"keeps no held-out rows .* raise dataset.test_fraction"):
        plan_job(spec("gaussian_mixture", local=True, num_samples=10, test_fraction=0.01))


# ---- dataset plugins ------------------------------------------------------------------------------------
PLUGIN_MODULE = """
import numpy as np
from gradcode.common.training.data import DataTable


class Ramp(DataTable):
    def __init__(self, source, bad_shape=False):
        self.file, self.num_rows, self.num_features, self.bad_shape = source.path, 40, 2, bad_shape
        self.scale = float(source.options.get("scale", "1"))

    def labels(self):
        return (np.arange(self.num_rows) % 2).astype(float)

    def rows(self, rows):
        X = np.column_stack([rows * self.scale, np.ones(len(rows))])
        return (X[:, :1] if self.bad_shape else X), self.labels()[rows]


class Plugin:
    def open(self, source):
        return Ramp(source)


class BadShape:
    def open(self, source):
        return Ramp(source, bad_shape=True)


plugin = Plugin()
bad_shape = BadShape()
not_a_plugin = 42
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution 'installed' on sys.path declaring three ``gradcode.datasets`` entry points."""
    (tmp_path / "fake_gradcode_datasets.py").write_text(PLUGIN_MODULE)
    info = tmp_path / "fake_gradcode_datasets-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gradcode-datasets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{DATASET_ENTRY_POINT_GROUP}]\nramp = fake_gradcode_datasets:plugin\n"
        "ramp_bad = fake_gradcode_datasets:bad_shape\nramp_nothing = fake_gradcode_datasets:not_a_plugin\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("fake_gradcode_datasets", None)


def test_an_installed_dataset_plugin_loads_partitions_on_the_worker(installed: Path) -> None:
    assert {"ramp", "ramp_bad"} <= set(_discover(DATASET_ENTRY_POINT_GROUP))
    plan = plan_job(spec("ramp", options={"scale": "0.5"}, local=True))
    assert plan.local is not None and plan.local.num_rows == 40 and plan.spec.model.kind == "logistic"
    job = worker_job(plan, 1, None)
    for j, (X, _) in job.partitions.items():
        assert np.all(X[:, 1] == 1) and np.all(X[:, 0] % 0.5 == 0), j
    with pytest.raises(JobSpecError, match=r"Unknown dataset 'ramp2'; valid datasets here are \[.*'ramp'"):
        plan_job(spec("ramp2", local=True))


def test_a_plugin_that_returns_wrong_shapes_or_is_no_plugin_is_refused(installed: Path) -> None:
    with pytest.raises(JobSpecError, match=re.escape(
        "Dataset 'ramp_bad' (worker_local) refused: Dataset 'ramp_bad' returned features of shape"
    )):  # fmt: skip
        plan_job(spec("ramp_bad", local=True))
    with pytest.raises(JobSpecError, match=r"Dataset plugin 'ramp_nothing' has no open\(source\) method"):
        plan_job(spec("ramp_nothing", local=True))


def test_describe_reads_labels_and_held_out_rows_only(tmp_path: Path) -> None:
    X, y = arrays()
    path, options = write(tmp_path, "npy", X, y)
    local = describe(
        DataSource(name="file", path=path, options=options, data_dir=tmp_path, seed=11), test_fraction=0.25
    )
    reference = load_dataset(
        "file", path=tmp_path / path, labels_path=tmp_path / options["labels"], seed=11, test_fraction=0.25
    )
    assert local.num_rows == ROWS and local.dataset.X_train.size == 0
    np.testing.assert_array_equal(local.dataset.X_test, reference.X_test)
    np.testing.assert_array_equal(local.dataset.y_train, reference.y_train)
