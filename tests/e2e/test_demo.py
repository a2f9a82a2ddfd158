"""The README's main job, `python -m gradcode.client demo`, run as a user would (smaller, same code path)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradcode.client.launch import service_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_demo_trains_exactly_and_beats_waiting_for_all(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    argv = [sys.executable, "-m", "gradcode", "demo", "--n", "4", "--s", "1", "--iterations", "12"]
    done = subprocess.run(
        [*argv, "--delay", "0.2", "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=service_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exact gradients, worst verified error" in done.stdout
    ratio_line = next(line for line in done.stdout.splitlines() if line.startswith("Waiting for all workers"))
    assert float(ratio_line.split("cost ")[1].split("x")[0]) > 1.0, done.stdout  # speed itself: the benchmarks
    history = json.loads((out / "history.json").read_text())
    assert len(history) == 12
    assert all(r["exact"] and r["verify_error"] <= 1e-9 for r in history)
    assert (out / "history.csv").read_text().count("\n") == 13
    assert (out / "history.png").stat().st_size > 0
