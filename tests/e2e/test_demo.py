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


def test_demo_writes_everything_under_out_relative_to_the_users_directory(tmp_path: Path) -> None:
    """The master child once ran in the package folder: `--out ../x` split the output between two places,
    and in the image (a read-only package folder, non-root) it died with PermissionError."""
    here = tmp_path / "here"
    here.mkdir()
    argv = [sys.executable, "-m", "gradcode", "demo", "--n", "2", "--s", "1", "--iterations", "4", "--delay", "0.05"]
    done = subprocess.run(
        [*argv, "--out", "../x"], capture_output=True, text=True, timeout=180, cwd=here, env=service_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "x"
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["master.log", "worker-0.log", "worker-1.log"]
    assert len(list(out.glob("job-*.jsonl"))) == 2  # the master's records of both jobs, beside the client's files
    assert (out / "history.json").is_file() and (out / "workers.png").is_file()
    assert not any(here.iterdir())  # nothing in the working directory itself
    assert f"Saved {out / 'history.json'}" in done.stdout  # the absolute path, not ../x
