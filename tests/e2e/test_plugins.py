"""Model plugins with real processes: a PyTorch network on the digits, two workers SIGKILLed mid-training.

The master and the six workers each build ``digits_mlp`` from gradcode's own ``gradcode.models``
entry point; the job trains it with the cyclic code (n = 6, s = 2) while two workers are killed, and
must land exactly where a centralized run of the same optimizer from the same seed lands.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import available_models, make_model
from gradcode.common.transport.wire import array_from_tensor
from gradcode.master.optimizer import make_optimizer, mean_gradient
from gradcode.master.spec import FLOAT32_TOLERANCE
from gradcode.v1 import common_pb2, master_pb2
from tests.e2e.conftest import Cluster, job_spec, master_stub, run_job
from tests.helpers import fixed_delay

pytestmark = pytest.mark.e2e

EXACT = 1e-9
ITERATIONS, LEARNING_RATE, L2 = 50, 0.5, 1e-4
KILL_AT, KILL_MARGIN, VICTIMS = 3, 5, (1, 4)


def centralized(iterations: int) -> tuple[np.ndarray[Any, Any], float]:
    """The same model, optimizer and data on one machine: the reference run."""
    data = load_dataset("digits", seed=0, test_fraction=0.2)
    model = make_model("digits_mlp", num_features=data.num_features, num_classes=data.num_classes)
    optimizer = make_optimizer("nesterov", model.init_params(), learning_rate=LEARNING_RATE)
    for _ in range(iterations):
        point = optimizer.point
        summed = model.gradient(point, data.X_train, data.y_train)
        optimizer.step(mean_gradient(summed, point, num_samples=data.num_train, l2=L2))
    return optimizer.params, model.accuracy(optimizer.params, data.X_test, data.y_test)


async def test_torch_network_on_digits_survives_two_killed_workers_and_matches_centralized(
    cluster6: Cluster, tmp_path: Path
) -> None:
    cluster6.ensure_all_up()
    killed_at: list[int] = []

    def kill_two(report: master_pb2.IterationReport) -> None:
        if report.iteration == KILL_AT:
            for i in VICTIMS:
                cluster6.kill(i)
            killed_at.append(report.iteration)

    spec = job_spec(
        "cyclic",
        {"n": 6, "s": 2},
        iterations=ITERATIONS,
        worker_ids=cluster6.ids,
        verify=True,
        model=common_pb2.ModelSpec(kind="digits_mlp", l2=L2),
        optimizer=master_pb2.OptimizerSpec(kind="nesterov", learning_rate=LEARNING_RATE),
        straggler=fixed_delay(0.03),  # every worker: keeps the kill well inside the run
    )
    async with asyncio.timeout(240), master_stub(cluster6.master_address) as stub:
        info, reports = await run_job(cluster6.master_address, spec, kill_two)
        model = await stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))

    assert killed_at == [KILL_AT]
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1))
    dead = {cluster6.ids[i] for i in VICTIMS}
    after = [r for r in reports if r.iteration > KILL_AT + KILL_MARGIN]
    assert after and all(dead <= set(r.failed_workers) and not dead & set(r.used_workers) for r in after)
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= EXACT, (r.iteration, r.verify_error)

    params, accuracy = centralized(ITERATIONS)
    np.testing.assert_allclose(array_from_tensor(model.parameters), params, rtol=1e-6, atol=1e-9)
    assert reports[-1].test_accuracy == accuracy
    assert accuracy >= 0.97
    assert model.model.kind == "digits_mlp" and model.model.num_classes == 10

    # gradcode model JOB --out FILE: the parameters, and a state_dict a plain torch module loads.
    out = tmp_path / "digits_mlp.npy"
    argv = [sys.executable, "-m", "gradcode", "model", info.job_id, "--out", str(out)]
    argv += ["--master", cluster6.master_address]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"to {out}, {out.with_suffix('.pt')}" in done.stdout
    np.testing.assert_array_equal(np.load(out), array_from_tensor(model.parameters))
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10)).double()
    net.load_state_dict(torch.load(out.with_suffix(".pt")))
    data = load_dataset("digits", seed=0, test_fraction=0.2)
    with torch.no_grad():
        predicted = net(torch.tensor(data.X_test)).argmax(1).numpy()
    assert np.mean(predicted == data.y_test) == reports[-1].test_accuracy


async def test_float32_model_sends_float32_messages_exact_within_the_float32_tolerance(cluster6: Cluster) -> None:
    """Fractional repetition decodes every survivor set with weights 1, so every float32 decode certifies
    the float32 tolerance whichever workers answer first. (A code whose decode from some survivors is
    ill-conditioned, such as cyclic n=6, s=2 from rows {1, 2, 4, 5}, reports those iterations as not
    exact: tests/common/test_round.py.)"""
    cluster6.ensure_all_up()
    spec = job_spec(
        "fractional",
        {"n": 6, "s": 2},
        iterations=5,
        worker_ids=cluster6.ids,
        verify=True,
        model=common_pb2.ModelSpec(kind="digits_cnn", l2=L2),
        optimizer=master_pb2.OptimizerSpec(kind="nesterov", learning_rate=LEARNING_RATE),
        message_dtype=common_pb2.DTYPE_FLOAT32,
    )
    async with asyncio.timeout(240):
        info, reports = await run_job(cluster6.master_address, spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert info.spec.message_dtype == common_pb2.DTYPE_FLOAT32
    for r in reports:
        assert r.exact and 0 <= r.verify_error <= FLOAT32_TOLERANCE, (r.iteration, r.verify_error)
    assert any(r.verify_error > EXACT for r in reports)  # float32 rounding is visible: the looser bound is needed


async def test_a_job_naming_a_plugin_that_is_not_installed_is_refused_listing_the_available_ones(
    cluster6: Cluster,
) -> None:
    spec = job_spec("cyclic", {"n": 6, "s": 2}, model=common_pb2.ModelSpec(kind="resnet152"))
    async with master_stub(cluster6.master_address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateJob(spec, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    available = available_models()
    assert {"digits_mlp", "digits_cnn"} <= set(available)
    assert f"Unknown model kind 'resnet152'; valid kinds are {available}" in (refused.value.details() or "")
