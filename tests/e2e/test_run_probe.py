"""``gradcode run --probe K`` against real processes: a short uncoded probe on the cluster's workers, the planner's
recommendation from its reports, then the job with that configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcode.client.__main__ import main
from tests.e2e.conftest import start_cluster

pytestmark = pytest.mark.e2e

NUM_WORKERS = 4


def test_a_probe_that_sees_a_slow_worker_runs_a_code_that_does_not_wait_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Worker 0 sleeps 0.3 s in every iteration (the job's straggler law, which the planner takes out of the fit
    # and simulates as it is): uncoded waits for it every time, a code tolerating one straggler never does.
    with start_cluster(NUM_WORKERS, tmp_path / "cluster") as cluster:
        argv = [
            "run", "--master", cluster.master_address, "--scheme", "fractional", "--n", str(NUM_WORKERS), "--s", "1",
            "--iterations", "4", "--verify", "--straggler", "fixed", "--straggler-param", "delay_seconds=0.3",
            "--straggler-param", "workers=[0]", "--out", str(tmp_path / "run"),
        ]  # fmt: skip
        assert main([*argv, "--probe", "8"]) == 0
        out = capsys.readouterr().out
        assert "plan from a 8-iteration probe:" in out
        spec = json.loads((tmp_path / "run" / "spec.json").read_text())
        assert spec["code"]["name"] != "uncoded"
        history = json.loads((tmp_path / "run" / "history.json").read_text())
        assert len(history) == 4 and all(r["exact"] for r in history)
        assert max(r["wall_seconds"] for r in history) < 0.3  # the slow worker is never waited for

        # refusals, before anything runs
        assert main([*argv, "--probe", "3"]) == 1
        assert "--probe must be at least 8 iterations (the first 2 are warm-up), not 3." in capsys.readouterr().err
        assert main([*argv, "--probe", "8", "--plan", str(tmp_path / "run" / "history.json")]) == 1
        assert "Give --plan HISTORY or --probe ITERATIONS, not both." in capsys.readouterr().err
