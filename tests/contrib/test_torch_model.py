"""The PyTorch adapter: per-partition gradients from autograd add up to torch's gradient of the summed loss,
and a gradient decoded from coded messages equals the centralized one.

The reference is computed the ordinary torch way, independently of the adapter: build the same
seeded module, load the parameters with ``vector_to_parameters``, ``loss(reduction="sum").backward()``.
float64: relative error <= 1e-12; float32: <= FLOAT32_TOLERANCE (the master's verify bound for
float32 jobs; see gradcode.contrib.torch_model).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gradcode.common.codes import code_class
from gradcode.common.training.data import Dataset, load_dataset, partition_indices
from gradcode.common.training.models import available_models, make_model
from gradcode.contrib.torch_model import TorchModel
from gradcode.master.spec import FLOAT32_TOLERANCE
from gradcode.v1 import common_pb2, worker_pb2
from gradcode.worker.compute import JobBuilder, JobSetupError, build_job
from tests.worker.conftest import partition_data

FLOAT64_TOLERANCE = 1e-12
TOLERANCE = {np.float64: FLOAT64_TOLERANCE, np.float32: FLOAT32_TOLERANCE}
PLUGINS = ("digits_mlp", "digits_cnn")
SEED = 3


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", seed=0, test_fraction=0.2)


def relative(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def point(model: TorchModel) -> np.ndarray[Any, Any]:
    """A point away from the initial one (so every layer's gradient is non-trivial)."""
    return model.init_params() + 0.05 * np.random.default_rng(SEED).standard_normal(model.num_params)


def torch_reference(name: str, params: np.ndarray[Any, Any], X: np.ndarray[Any, Any], y: np.ndarray[Any, Any],
                    dtype: Any) -> np.ndarray[Any, Any]:  # fmt: skip
    """torch's own gradient of the summed cross-entropy at ``params``, on a copy of the plugin's network."""
    model = make_model(name, num_features=64, num_classes=10, dtype=dtype)
    assert isinstance(model, TorchModel)
    torch_dtype = torch.float64 if dtype is np.float64 else torch.float32
    module = copy.deepcopy(model.module).train()
    torch.nn.utils.vector_to_parameters(torch.tensor(params, dtype=torch_dtype), module.parameters())
    inputs = torch.tensor(X, dtype=torch_dtype).reshape(len(X), *model.input_shape)
    loss = torch.nn.functional.cross_entropy(module(inputs), torch.tensor(y, dtype=torch.long), reduction="sum")
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None for g in grads)
    return torch.nn.utils.parameters_to_vector(grads).detach().double().numpy()  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", PLUGINS)
def test_partition_gradients_add_up_to_torchs_gradient_of_the_summed_loss(
    name: str, dtype: Any, digits: Dataset
) -> None:
    model = make_model(name, num_features=64, num_classes=10, dtype=dtype)
    assert isinstance(model, TorchModel) and model.dtype == np.dtype(dtype)
    params = point(model)
    partitions = partition_indices(digits.num_train, [1.0] * 6, seed=0)
    partials = [model.gradient(params, digits.X_train[idx], digits.y_train[idx]) for idx in partitions]
    assert all(g.dtype == np.float64 and g.shape == (model.num_params,) for g in partials)
    reference = torch_reference(name, params, digits.X_train, digits.y_train, dtype)
    error = relative(np.sum(partials, axis=0), reference)
    assert error <= TOLERANCE[dtype], (name, dtype, error)
    whole = model.gradient(params, digits.X_train, digits.y_train)
    assert relative(whole, reference) <= TOLERANCE[dtype]
    losses = [model.loss(params, digits.X_train[idx], digits.y_train[idx]) for idx in partitions]
    assert sum(losses) == pytest.approx(model.loss(params, digits.X_train, digits.y_train), rel=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("scheme", ["cyclic", "fractional", "binary"])
def test_decoded_gradient_equals_the_centralized_one(scheme: str, dtype: Any, digits: Dataset) -> None:
    """n = 6, s = 2: workers 1 and 4 straggle; the survivors' coded messages decode to the full gradient."""
    code = code_class(scheme).for_stragglers(6, 2)
    model = make_model("digits_cnn", num_features=64, num_classes=10, dtype=dtype)
    params = point(model)  # type: ignore[arg-type]
    partitions = partition_indices(digits.num_train, code.partition_weights, seed=0)
    partials = [model.gradient(params, digits.X_train[idx], digits.y_train[idx]) for idx in partitions]
    assignment = code.static_assignment()
    survivors = [w for w in range(code.n) if w not in (1, 4)]
    rows = assignment.rows_of(survivors)
    decoding = code.decode(rows, assignment)
    wire = np.dtype(dtype)  # the worker's message dtype: the job's, which is the model's
    messages = {
        r: sum(c * partials[j] for j, c in zip(code.support(r), code.coefficients(r), strict=True)).astype(wire)
        for r in decoding.rows
    }
    decoded = np.asarray(decoding.combine(messages), dtype=np.float64)
    central = torch_reference("digits_cnn", params, digits.X_train, digits.y_train, dtype)
    error = relative(decoded, central)
    assert decoding.exact and error <= TOLERANCE[dtype], (scheme, dtype, error)


def test_predictions_statistics_and_accuracy(digits: Dataset) -> None:
    model = make_model("digits_mlp", num_features=64, num_classes=10)
    params = point(model)  # type: ignore[arg-type]
    predicted = model.predict(params, digits.X_test)
    assert predicted.dtype == np.float64 and set(np.unique(predicted)) <= set(range(10))
    stats = model.statistics(params, digits.X_test, digits.y_test)
    assert stats[1] == np.count_nonzero(predicted == digits.y_test)
    assert stats[0] == pytest.approx(model.loss(params, digits.X_test, digits.y_test), rel=1e-15)
    assert model.accuracy(params, digits.X_test, digits.y_test) == stats[1] / len(digits.y_test)


def test_gradient_and_statistics_of_a_model_without_its_own_evaluate_into(digits: Dataset) -> None:
    """The torch adapter implements only ``_evaluate``: the base class copies its gradient into the message
    and appends its loss and correct count, as a worker sends them."""
    model = make_model("digits_mlp", num_features=64, num_classes=10)
    params = point(model)  # type: ignore[arg-type]
    X, y = digits.X_train[:50], digits.y_train[:50]
    stats = model.gradient_and_statistics(params, X, y)
    assert stats.shape == (model.num_params + 2,)
    np.testing.assert_array_equal(stats[: model.num_params], model.gradient(params, X, y))
    np.testing.assert_array_equal(stats[model.num_params :], model.statistics(params, X, y))


def test_the_same_seed_builds_the_same_network_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = make_model("digits_cnn", num_features=64, num_classes=10)
    after = torch.rand(1)
    b = make_model("digits_cnn", num_features=64, num_classes=10)
    np.testing.assert_array_equal(a.init_params(), b.init_params())
    assert torch.equal(before, after)
    assert torch.are_deterministic_algorithms_enabled()


def test_bad_inputs_are_refused_clearly(digits: Dataset) -> None:
    model = make_model("digits_mlp", num_features=64, num_classes=10)
    params = model.init_params()
    with pytest.raises(ValueError, match=r"integer class labels in \[0, 10\)"):
        model.gradient(params, digits.X_test[:3], np.array([0.0, 10.0, 1.0]))
    with pytest.raises(ValueError, match=r"params must be a flat vector of shape \(4810,\)"):
        model.gradient(params[:-1], digits.X_test, digits.y_test)
    with pytest.raises(ValueError, match="digits_cnn takes 8x8 images"):
        make_model("digits_cnn", num_features=63, num_classes=10)
    mean = TorchModel(
        lambda: torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), num_features=4, num_classes=3, device="cpu"
    )
    with pytest.raises(ValueError, match=r"one value per sample, shape \(2,\), got \(\); use reduction='none'"):
        mean.gradient(mean.init_params(), np.ones((2, 4)), np.array([0.0, 2.0]))
    with pytest.raises(ValueError, match=r"input_shape \(2, 3\) must hold exactly num_features=4"):
        TorchModel(lambda: torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(reduction="none"), num_features=4,
                   num_classes=3, input_shape=(2, 3))  # fmt: skip


def test_export_writes_parameters_and_a_state_dict_usable_without_gradcode(tmp_path: Path, digits: Dataset) -> None:
    model = make_model("digits_cnn", num_features=64, num_classes=10)
    assert isinstance(model, TorchModel)
    params = point(model)
    files = model.export(params, tmp_path / "digits.npy")
    assert files == [tmp_path / "digits.npy", tmp_path / "digits.pt"]
    np.testing.assert_array_equal(np.load(files[0]), params)
    module = type(model.module)(*[type(m)(**_config(m)) for m in model.module.children()])
    module.load_state_dict(torch.load(files[1]))
    module = module.double().eval()
    with torch.no_grad():
        logits = module(torch.tensor(digits.X_test).reshape(-1, 1, 8, 8))
    np.testing.assert_array_equal(logits.argmax(1).double().numpy(), model.predict(params, digits.X_test))


def _config(m: torch.nn.Module) -> dict[str, Any]:
    """Constructor arguments that rebuild the digits_cnn layers (a fresh module, as a user outside gradcode would)."""
    if isinstance(m, torch.nn.Conv2d):
        return {"in_channels": m.in_channels, "out_channels": m.out_channels, "kernel_size": m.kernel_size,
                "padding": m.padding}  # fmt: skip
    if isinstance(m, torch.nn.Linear):
        return {"in_features": m.in_features, "out_features": m.out_features}
    if isinstance(m, torch.nn.MaxPool2d):
        return {"kernel_size": m.kernel_size}
    return {}


def test_a_worker_builds_the_plugin_in_the_jobs_message_dtype_and_sends_its_coded_messages(digits: Dataset) -> None:
    """The worker's own path (JobSetup -> WorkerJob -> message): float32 messages make a float32 model."""
    code = code_class("cyclic").for_stragglers(6, 2)
    partitions = partition_indices(digits.num_train, code.partition_weights, seed=0)
    worker = 2
    setup = worker_pb2.JobSetup(
        job_id="torch-job",
        worker_id=worker,
        model=common_pb2.ModelSpec(kind="digits_mlp", num_features=64, num_classes=10),
        message_dtype=common_pb2.DTYPE_FLOAT32,
        num_partitions_sent=len(code.partitions_of_worker(worker)),
    )
    for r in code.static_assignment().rows[worker]:
        setup.rows.add(row=r, partitions=code.support(r), coefficients_real=np.asarray(code.coefficients(r)).tolist())
    data = [
        chunk
        for j in code.partitions_of_worker(worker)
        for chunk in partition_data(j, digits.X_train[partitions[j]], digits.y_train[partitions[j]], chunk_bytes=4096)
    ]
    job = build_job(setup, data)
    assert isinstance(job.model, TorchModel) and job.model.dtype == np.float32
    params = point(job.model)
    (row,) = code.static_assignment().rows[worker]
    message, _ = job.start(params).message(row)
    assert message.dtype == np.dtype("<f4")
    reference = make_model("digits_mlp", num_features=64, num_classes=10, dtype=np.float32)
    expected = sum(
        c * reference.gradient(params, digits.X_train[partitions[j]], digits.y_train[partitions[j]])
        for j, c in zip(code.support(row), code.coefficients(row), strict=True)
    )
    assert relative(message.astype(np.float64), expected) <= FLOAT32_TOLERANCE
    bad = worker_pb2.JobSetup()
    bad.CopyFrom(setup)
    bad.model.kind = "resnet152"
    with pytest.raises(JobSetupError, match=re.escape(f"valid kinds are {available_models()}")):
        JobBuilder(bad)
