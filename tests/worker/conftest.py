"""Helpers shared by the worker tests: small seeded data, JobSetups built from a real code, a served worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from gradcode.common.codes.base import Array, GradientCode
from gradcode.common.training.models import Model, make_model
from gradcode.common.transport.serving import ServingHandle, start_server
from gradcode.v1 import common_pb2, worker_pb2
from gradcode.worker.service import WorkerServicer, add_worker_service

NUM_FEATURES = 6
NUM_CLASSES = 3
TOLERANCE = 1e-12
"""Relative tolerance between a worker's message and the directly computed coded gradient."""

Partitions = dict[int, tuple[Array, Array]]


def make_partitions(k: int, samples: int = 20, *, seed: int = 0) -> Partitions:
    """``k`` partitions of softmax data: ``samples`` rows of NUM_FEATURES features, labels in [0, NUM_CLASSES)."""
    rng = np.random.default_rng(seed)
    return {
        j: (rng.standard_normal((samples, NUM_FEATURES)), rng.integers(0, NUM_CLASSES, samples).astype(np.float64))
        for j in range(k)
    }


def softmax_model() -> Model:
    return make_model("softmax", num_features=NUM_FEATURES, num_classes=NUM_CLASSES)


def model_spec() -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(kind="softmax", num_features=NUM_FEATURES, num_classes=NUM_CLASSES)


def row_definition(code: GradientCode, row: int) -> worker_pb2.RowDefinition:
    coefficients = code.coefficients(row)
    definition = worker_pb2.RowDefinition(
        row=row, partitions=list(code.support(row)), coefficients_real=np.real(coefficients).tolist()
    )
    if np.iscomplexobj(coefficients):
        definition.coefficients_imag.extend(np.imag(coefficients).tolist())
    return definition


def job_setup(
    code: GradientCode,
    worker: int,
    *,
    job_id: str = "job",
    worker_id: int | None = None,
    message_dtype: int = common_pb2.DTYPE_FLOAT64,
    straggler: common_pb2.StragglerSpec | None = None,
) -> worker_pb2.JobSetup:
    """The setup the master would send worker ``worker`` of ``code`` (its static rows)."""
    rows = code.static_assignment().rows[worker]
    setup = worker_pb2.JobSetup(
        job_id=job_id,
        worker_id=worker if worker_id is None else worker_id,
        model=model_spec(),
        rows=[row_definition(code, r) for r in rows],
        num_partitions_sent=len(code.partitions_of_worker(worker)),
        message_dtype=message_dtype,  # type: ignore[arg-type]
    )
    if straggler is not None:
        setup.straggler.CopyFrom(straggler)
    return setup


def partition_data(partition: int, X: Array, y: Array, *, chunk_bytes: int = 256) -> list[worker_pb2.PartitionData]:
    """One partition split into chunks of at most ``chunk_bytes`` features and labels bytes each."""
    features, labels = np.ascontiguousarray(X, "<f8").tobytes(), np.ascontiguousarray(y, "<f8").tobytes()
    chunks = []
    for start in range(0, max(len(features), len(labels), 1), chunk_bytes):
        chunks.append(
            worker_pb2.PartitionData(
                partition=partition,
                num_samples=len(y),
                features_offset=min(start, len(features)),
                features=features[start : start + chunk_bytes],
                labels_offset=min(start, len(labels)),
                labels=labels[start : start + chunk_bytes],
            )
        )
    return chunks


def data_for(code: GradientCode, worker: int, partitions: Partitions) -> list[worker_pb2.PartitionData]:
    return [c for j in code.partitions_of_worker(worker) for c in partition_data(j, *partitions[j])]


def load_chunks(setup: worker_pb2.JobSetup, data: list[worker_pb2.PartitionData]) -> list[worker_pb2.LoadJobChunk]:
    return [worker_pb2.LoadJobChunk(setup=setup), *(worker_pb2.LoadJobChunk(data=d) for d in data)]


def expected_message(code: GradientCode, row: int, params: Array, partitions: Partitions) -> Array:
    """The coded gradient computed directly: code.encode over the model's partial gradients."""
    model = softmax_model()
    partials = {j: model.gradient(params, *partitions[j]) for j in code.support(row)}
    return code.encode(row, partials)


def random_params(seed: int = 7) -> Array:
    return np.random.default_rng(seed).standard_normal(softmax_model().num_params)


@dataclass
class ServedWorker:
    address: str
    servicer: WorkerServicer
    handle: ServingHandle


async def serve_worker(servicer: WorkerServicer | None = None) -> ServedWorker:
    servicer = servicer or WorkerServicer()
    handle = await start_server(
        "127.0.0.1", 0,
        registrars=[lambda server: add_worker_service(servicer, server)],
        service_names=[worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name],
    )  # fmt: skip
    return ServedWorker(handle.address, servicer, handle)


async def stop_worker(served: ServedWorker) -> None:
    await served.servicer.close()
    await served.handle.stop(grace=None)


@pytest.fixture
async def served_worker() -> AsyncIterator[ServedWorker]:
    served = await serve_worker()
    try:
        yield served
    finally:
        await stop_worker(served)


@pytest.fixture
def rng() -> Iterator[np.random.Generator]:
    yield np.random.default_rng(12345)
