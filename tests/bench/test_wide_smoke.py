"""Smoke test of ``python -m gradcode.bench.wide --quick``: a real cluster and bare worker processes run every
job on every system. No timing is asserted; only that every figure is there with its load, that the floors are
floors of the same work (the bare processes compute the same gradients: the arithmetic of one iteration is
checked against the model), and that the target is built from the measured transfer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradcode.bench import wide
from gradcode.bench.floor import BarePool
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import make_model
from gradcode.master.optimizer import make_optimizer, mean_gradient


@pytest.mark.e2e
def test_quick_run_measures_every_job_on_every_system(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert wide.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "Target at n = 4" in capsys.readouterr().out
    result = json.loads((tmp_path / "wide.json").read_text())
    assert [row["name"] for row in result["rows"]] == ["1 worker", "uncoded", "cyclic"]
    for row in result["rows"]:
        for system in wide.SYSTEMS:
            figure = row[system]
            assert figure["period_s"] > 0 and len(figure["loads"]) == result["rounds"] == 1
        # /proc counts CPU in 10 ms ticks: in a quick run the bare workers of a small job may use less than one
        # tick in all (seen in CI), so theirs is only required to be measured; gradcode's master always uses some.
        assert row["gradcode"]["cpu_master_s"] > 0 and 0 <= row["bare"]["cpu_workers_s"] < row["bare"]["period_s"] * 8
    assert result["one_transfer_s"] == result["rows"][0]["bare"]["overhead_s"]
    assert result["target_s"] == pytest.approx(wide.TARGET_S + result["one_transfer_s"])
    assert (tmp_path / "wide.png").stat().st_size > 0


@pytest.mark.parametrize("name", ["uncoded", "cyclic"])
def test_the_bare_pool_steps_as_exact_gradient_descent_would(name: str) -> None:
    """Three bare iterations of the job leave the model where three steps with the centralized gradient do."""
    config = next(c for c in wide.configurations(3) if c.name == name)
    job = config.job
    data = load_dataset(job.dataset, num_samples=job.num_samples, num_features=job.num_features, seed=job.seed)
    model = make_model(data.model_kind, num_features=data.num_features, num_classes=data.num_classes)
    optimizer = make_optimizer("nesterov", model.init_params(), learning_rate=job.learning_rate)
    for _ in range(3):
        summed = model.gradient(optimizer.point, data.X_train, data.y_train)
        optimizer.step(mean_gradient(summed, optimizer.point, num_samples=data.num_train, l2=job.l2))
    with BarePool(job) as pool:
        for measure in (pool.run, pool.arithmetic):
            measure(3, 0)
            assert pool.optimizer is not None
            np.testing.assert_allclose(pool.optimizer.point, optimizer.point, rtol=1e-9, atol=1e-12)
