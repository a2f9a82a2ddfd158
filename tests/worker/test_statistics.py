"""Coded training statistics: workers append [loss, score] to every partial gradient, the receiver decodes
them with the gradient's own coefficients, and the decoded training loss and accuracy equal the centralized
ones at the same parameters."""

from __future__ import annotations

import numpy as np
import pytest

from gradcode.common.codes.base import Array, GradientCode
from gradcode.common.codes.registry import code_class
from gradcode.common.training.models import NUM_STATISTICS, Model, make_model, training_metrics
from gradcode.v1 import common_pb2, worker_pb2
from gradcode.worker.compute import build_job
from tests.worker.conftest import partition_data, row_definition

N, S = 6, 1
SAMPLES_PER_PARTITION = 37
NUM_FEATURES = 9
L2 = 1e-3
RELATIVE = 1e-12


def _dataset(kind: str, k: int, seed: int) -> tuple[Model, dict[int, tuple[Array, Array]]]:
    rng = np.random.default_rng(seed)
    num_classes = 3 if kind == "softmax" else 2
    model = make_model(kind, num_features=NUM_FEATURES, num_classes=num_classes)
    partitions = {}
    for j in range(k):
        X = rng.standard_normal((SAMPLES_PER_PARTITION + j, NUM_FEATURES))
        if kind == "linear":
            y = X @ rng.standard_normal(NUM_FEATURES) + 0.1 * rng.standard_normal(len(X))
        else:
            y = rng.integers(0, num_classes, len(X)).astype(np.float64)
        partitions[j] = (X, y)
    return model, partitions


def _setup(code: GradientCode, worker: int, kind: str, *, statistics: bool) -> worker_pb2.JobSetup:
    return worker_pb2.JobSetup(
        job_id="stats",
        worker_id=worker,
        model=common_pb2.ModelSpec(kind=kind, num_features=NUM_FEATURES, num_classes=3 if kind == "softmax" else 0),
        rows=[row_definition(code, r) for r in code.static_assignment().rows[worker]],
        num_partitions_sent=len(code.partitions_of_worker(worker)),
        append_statistics=statistics,
    )


def _decode_with_stragglers(
    code: GradientCode, model: Model, partitions: dict[int, tuple[Array, Array]], params: Array, stragglers: set[int]
) -> Array:
    """Every non-straggling worker's messages, as its real job computes them, decoded by the code's decoder."""
    assignment = code.static_assignment()
    decoder = code.decoder(assignment)
    messages: dict[int, Array] = {}
    for worker in range(code.n):
        if worker in stragglers:
            continue
        data = [
            c for j in code.partitions_of_worker(worker) for c in partition_data(j, *partitions[j], chunk_bytes=4096)
        ]
        job = build_job(_setup(code, worker, model.kind, statistics=True), data)
        assert job.message_length == model.num_params + NUM_STATISTICS
        computation = job.start(params)
        for row in assignment.rows[worker]:
            messages[row], _ = computation.message(row)
            decoder.add(row)
    assert decoder.decodable
    decoding = decoder.decoding()
    assert decoding.exact
    return decoding.combine(messages)


@pytest.mark.parametrize("scheme", ["cyclic", "fractional", "binary", "reed_solomon"])
@pytest.mark.parametrize("kind", ["logistic", "softmax", "linear"])
def test_decoded_training_loss_equals_centralized_loss(scheme: str, kind: str) -> None:
    code = code_class(scheme).for_stragglers(N, S)
    model, partitions = _dataset(kind, code.k, seed=11)
    X = np.concatenate([partitions[j][0] for j in range(code.k)])
    y = np.concatenate([partitions[j][1] for j in range(code.k)])
    params = 0.3 * np.random.default_rng(5).standard_normal(model.num_params)
    central_loss = model.loss(params, X, y) / len(y) + 0.5 * L2 * float(params @ params)
    central_accuracy = model.accuracy(params, X, y)
    central_gradient = model.gradient(params, X, y)
    for stragglers in ({0}, {N - 1}, set()):
        decoded = _decode_with_stragglers(code, model, partitions, params, stragglers)
        metrics = training_metrics(model, decoded, params, y, l2=L2)
        assert abs(metrics.loss - central_loss) <= RELATIVE * abs(central_loss), (stragglers, metrics.loss)
        assert abs(metrics.accuracy - central_accuracy) <= RELATIVE * max(abs(central_accuracy), 1.0)
        np.testing.assert_allclose(
            metrics.gradient, central_gradient, rtol=0, atol=RELATIVE * 10 * np.abs(central_gradient).max()
        )
        if kind != "linear":  # a count decodes to within rounding of the integer it is
            correct = round(central_accuracy * len(y))
            assert abs(metrics.score_sum - correct) < 1e-6


def test_messages_without_statistics_are_the_gradient_alone() -> None:
    code = code_class("cyclic").for_stragglers(N, S)
    model, partitions = _dataset("logistic", code.k, seed=3)
    data = [c for j in code.partitions_of_worker(0) for c in partition_data(j, *partitions[j], chunk_bytes=4096)]
    plain = build_job(_setup(code, 0, "logistic", statistics=False), data)
    coded = build_job(_setup(code, 0, "logistic", statistics=True), data)
    assert plain.message_length == model.num_params
    params = np.random.default_rng(1).standard_normal(model.num_params)
    row = code.static_assignment().rows[0][0]
    without, _ = plain.start(params).message(row)
    with_stats, _ = coded.start(params).message(row)
    np.testing.assert_array_equal(with_stats[: model.num_params], without)
    partials = {j: model.gradient_and_statistics(params, *partitions[j]) for j in code.support(row)}
    np.testing.assert_allclose(with_stats, code.encode(row, partials), rtol=1e-13)


def test_training_metrics_refuses_a_vector_of_the_wrong_length() -> None:
    model = make_model("logistic", num_features=4)
    with pytest.raises(ValueError, match=r"has shape \(7,\) \(5 gradient entries \+ loss \+ score\), got shape \(5,\)"):
        training_metrics(model, np.zeros(5), np.zeros(5), np.ones(3), l2=0.0)
    with pytest.raises(ValueError, match="non-empty vector of training labels"):
        training_metrics(model, np.zeros(7), np.zeros(5), np.ones(0), l2=0.0)
