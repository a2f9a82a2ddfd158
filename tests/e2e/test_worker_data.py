"""Worker-local data with real processes: workers load their own partitions, the master sends only references.

A master and four workers as processes on loopback, all with the same ``--data-dir`` (through
``GRADCODE_DATA_DIR``, as a shared file system or a copy on every machine would give them). The
master's Prometheus endpoint counts the LoadJob bytes it sends (``gradcode_load_bytes_sent``): with
worker-local data they are the setups alone, the same for a dataset 100 times larger.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.client.launch import LocalCluster
from gradcode.client.sdk import GradcodeClient, build_job_spec
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import make_model
from gradcode.master.optimizer import make_optimizer, mean_gradient
from gradcode.v1 import common_pb2, master_pb2, worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import Cluster, master_stub, run_job
from tests.e2e.test_metrics import _scrape
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

NUM_WORKERS, ITERATIONS, LEARNING_RATE, L2 = 4, 8, 0.5, 1e-4
TREE, TREE_WORKERS = {"n": 2, "s": 1, "L": 2}, 6
SMALL, LARGE, FEATURES = 600, 60_000, 8
LOAD_BYTES = ("gradcode_load_bytes_sent_total", ())


def write_npy(data_dir: Path, stem: str, rows: int) -> None:
    rng = np.random.default_rng(rows)
    X = rng.standard_normal((rows, FEATURES))
    np.save(data_dir / f"{stem}_X.npy", X)
    np.save(data_dir / f"{stem}_y.npy", (X @ rng.standard_normal(FEATURES) > 0).astype(np.float64))


@contextlib.contextmanager
def _cluster(run_dir: Path, workers: int) -> Iterator[tuple[Cluster, Path, int]]:
    """A master (its metrics on a port of its own) and ``workers`` workers sharing a data directory with the small
    and the large file."""
    data_dir = run_dir / "data"
    data_dir.mkdir()
    write_npy(data_dir, "small", SMALL)
    write_npy(data_dir, "large", LARGE)
    port = free_port()
    env = {"GRADCODE_DATA_DIR": str(data_dir)}
    with LocalCluster(workers, run_dir=run_dir, env=env, master_args=["--metrics-port", str(port)]) as local:
        c = Cluster(local)
        c.wait_all_up()
        yield c, data_dir, port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path, int]]:
    with _cluster(tmp_path_factory.mktemp("worker_data"), NUM_WORKERS) as running:
        yield running


def spec(stem: str, *, worker_data: bool, verify: bool = False, tree: bool = False) -> master_pb2.JobSpec:
    """The job on ``stem``'s file: cyclic over the four workers, or (``tree``) a CodedReduce tree of six."""
    code: dict[str, Any] = (
        {"scheme": "coded_reduce", "code_params": TREE} if tree else {"scheme": "cyclic", "n": NUM_WORKERS, "s": 1}
    )
    return build_job_spec(
        **code, model="logistic", dataset="file", dataset_path=f"{stem}_X.npy",
        dataset_options={"labels": f"{stem}_y.npy"}, worker_data=worker_data, optimizer="nesterov",
        learning_rate=LEARNING_RATE, l2=L2, iterations=ITERATIONS, verify=verify, seed=3,
    )  # fmt: skip


def centralized(data_dir: Path, stem: str) -> np.ndarray[Any, Any]:
    """The same model, optimizer, split and steps on one machine, from the whole file: the reference run."""
    data = load_dataset(
        "file", path=data_dir / f"{stem}_X.npy", labels_path=data_dir / f"{stem}_y.npy", seed=3, test_fraction=0.2
    )
    model = make_model("logistic", num_features=FEATURES, num_classes=2)
    optimizer = make_optimizer("nesterov", model.init_params(), learning_rate=LEARNING_RATE)
    for _ in range(ITERATIONS):
        point = optimizer.point
        summed = model.gradient(point, data.X_train, data.y_train)
        optimizer.step(mean_gradient(summed, point, num_samples=data.num_train, l2=L2))
    return optimizer.params


async def run_and_count(
    c: Cluster, port: int, job: master_pb2.JobSpec
) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], np.ndarray[Any, Any], float]:
    """Run ``job`` to the end; its final parameters and the LoadJob bytes the master sent for it."""
    before = _scrape(port)[LOAD_BYTES]
    info, reports = await run_job(c.master_address, job)
    sent = _scrape(port)[LOAD_BYTES] - before
    async with GradcodeClient(c.master_address) as client:
        params = await client.get_model(info.job_id)
    return info, reports, np.array(params), sent


async def test_worker_local_gradients_are_exact_and_the_master_sends_no_data(
    cluster: tuple[Cluster, Path, int],
) -> None:
    c, data_dir, port = cluster
    reference = centralized(data_dir, "small")
    streamed_info, streamed, streamed_params, streamed_bytes = await run_and_count(
        c, port, spec("small", worker_data=False, verify=True)
    )
    local_info, local, local_params, local_bytes = await run_and_count(c, port, spec("small", worker_data=True))
    for info in (streamed_info, local_info):
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(r.exact and r.verify_error <= 1e-9 for r in streamed)  # the streamed path, checked on the master
    assert all(r.exact for r in local) and len(local) == ITERATIONS
    # Same seeds, same partitions, same gradients: the same trajectory, and the centralized run's.
    np.testing.assert_allclose(local_params, streamed_params, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(local_params, reference, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose([r.loss for r in local], [r.loss for r in streamed], rtol=1e-11)
    assert [r.train_accuracy for r in local] == [r.train_accuracy for r in streamed]
    assert local[-1].test_accuracy == streamed[-1].test_accuracy > 0.8
    data_bytes = SMALL * (FEATURES + 1) * 8
    assert streamed_bytes > 1.5 * 0.8 * data_bytes  # every training partition to s + 1 = 2 workers
    assert local_bytes < 2_000 * NUM_WORKERS, local_bytes


async def test_load_job_bytes_do_not_depend_on_the_dataset_size(cluster: tuple[Cluster, Path, int]) -> None:
    c, _, port = cluster
    sent = {}
    for stem in ("small", "large"):
        info, reports, _, sent[stem] = await run_and_count(c, port, spec(stem, worker_data=True))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert all(r.exact for r in reports)
    # 100x the rows, the same LoadJob bytes: per worker, only the row count's varint and the file names differ.
    assert LARGE == 100 * SMALL and abs(sent["large"] - sent["small"]) <= 4 * NUM_WORKERS, sent


async def test_bad_worker_local_inputs_are_invalid_argument_with_the_reason(cluster: tuple[Cluster, Path, int]) -> None:
    c, data_dir, _ = cluster
    missing = spec("small", worker_data=True)
    missing.dataset.name = "imagenet"
    outside = spec("small", worker_data=True)
    outside.dataset.path = "../../etc/passwd.npy"
    wrong = spec("small", worker_data=True)
    wrong.dataset.options["labels"] = "large_y.npy"  # 60000 labels for 600 rows
    cases = {
        "missing plugin": (missing, "Unknown dataset 'imagenet'; valid datasets here are ['file', 'digits'"),
        "outside": (outside, "Dataset path '../../etc/passwd.npy' is outside the master's data directory"),
        "wrong shape": (
            wrong,
            "Dataset 'file' 'small_X.npy' refused: its array 'y' must hold one label per row of 'X'",
        ),
    }
    async with master_stub(c.master_address) as stub:
        for name, (job, message) in cases.items():
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateJob(job, timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert message in (refused.value.details() or ""), (name, refused.value.details())

    # A worker checks for itself: its own --data-dir, and that its copy is the master's.
    def setup(**local: Any) -> worker_pb2.LoadJobChunk:
        base = {"dataset": "file", "path": "small_X.npy", "options": {"labels": "small_y.npy"}, "dataset_seed": 3,
                "test_fraction": 0.2, "partition_weights": [1.0], "num_rows": SMALL}  # fmt: skip
        return worker_pb2.LoadJobChunk(
            setup=worker_pb2.JobSetup(
                job_id="bad-local", model=common_pb2.ModelSpec(kind="logistic", num_features=FEATURES, num_classes=2),
                rows=[worker_pb2.RowDefinition(row=0, partitions=[0], coefficients_real=[1.0])],
                message_dtype=common_pb2.DTYPE_FLOAT64, local_data=worker_pb2.LocalData(**{**base, **local}),
            )
        )  # fmt: skip

    worker_cases = {
        "outside": (setup(path="/proc/self/environ"), "Dataset path '/proc/self/environ' is outside the worker's data"),
        "other copy": (
            setup(num_rows=SMALL + 1),
            f"here it has {SMALL} rows x {FEATURES} features, but the master's has",
        ),
        "plugin": (setup(dataset="imagenet"), "Unknown dataset 'imagenet'; valid datasets here are"),
        "with data": (
            worker_pb2.LoadJobChunk(data=worker_pb2.PartitionData(partition=0)),
            "carries data for partition 0 before any setup",
        ),
    }
    async with grpc.aio.insecure_channel(c.addresses[0]) as channel:
        worker: Any = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        for name, (chunk, message) in worker_cases.items():
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await worker.LoadJob(iter([chunk]), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert message in (refused.value.details() or ""), (name, refused.value.details())
    # The master's pool still has every worker (nothing above came from it).
    assert len(c.list_workers()) == NUM_WORKERS and data_dir.is_dir()


async def test_a_tree_with_worker_local_data_is_exact_and_its_setup_sends_no_data(tmp_path: Path) -> None:
    """A CodedReduce tree (n = 2, s = 1, L = 2: two parents of two leaves each, six workers) on worker-local data:
    every parent and leaf loads its own partitions, the master's LoadJob bytes are the setups alone (the streamed
    tree sends every partition to s + 1 nodes), and the trajectory is the streamed one's, which verify mode checks
    against the master's own gradient each iteration."""
    with _cluster(tmp_path, TREE_WORKERS) as (c, _, port):
        streamed_info, streamed, streamed_params, streamed_bytes = await run_and_count(
            c, port, spec("small", worker_data=False, verify=True, tree=True)
        )
        local_info, local, local_params, local_bytes = await run_and_count(
            c, port, spec("large", worker_data=True, tree=True)
        )
        small_info, small, small_params, _ = await run_and_count(c, port, spec("small", worker_data=True, tree=True))
        for info in (streamed_info, local_info, small_info):
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert all(r.exact and r.verify_error <= 1e-9 for r in streamed) and len(streamed) == ITERATIONS
        assert all(r.exact for r in (*local, *small)) and len(local) == len(small) == ITERATIONS
        np.testing.assert_allclose(small_params, streamed_params, rtol=1e-11, atol=1e-13)
        assert streamed_bytes > 0.8 * SMALL * (FEATURES + 1) * 8  # the training rows, through the master
        assert local_bytes < 2_000 * TREE_WORKERS, local_bytes  # 100x the rows of the small file: setups only
        assert np.all(np.isfinite(local_params))
