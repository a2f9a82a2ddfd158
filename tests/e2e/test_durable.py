"""Durable jobs with real processes: SIGKILL the master mid-job, restart it on the same state directory.

The job resumes from its last checkpoint (losing at most ``--checkpoint-every`` iterations), the workers
re-register with the new master and are loaded again, and the final parameters equal those of an
uninterrupted run of the same spec to 1e-12. The code is a fractional repetition code (every message
is a plain sum of partition gradients) and the straggler model delays every worker by the same fixed
amount, so the two runs step with the same gradients whichever worker answers first. With a join
secret, the restarted master issues every worker a new call token as it re-registers, and loads the
resumed job with them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradcode.client.launch import LocalCluster, service_env
from gradcode.client.sdk import GradcodeClient
from gradcode.master.checkpoint import Checkpoint, checkpoint_path
from gradcode.v1 import master_pb2
from tests.e2e.conftest import START_TIMEOUT, job_spec
from tests.helpers import fixed_delay

pytestmark = pytest.mark.e2e

CHECKPOINT_EVERY = 4
ITERATIONS = 40
KILL_AFTER = 2 * CHECKPOINT_EVERY + 1
"""Iteration whose report triggers the SIGKILL (a checkpoint exists by then)."""
RESUME_TIMEOUT = 180.0
JOIN = "durable-join-secret-0123456789abcdef"


def _spec(job_id: str) -> master_pb2.JobSpec:
    return job_spec(
        "fractional", {"n": 4, "s": 1}, iterations=ITERATIONS, job_id=job_id,
        optimizer=master_pb2.OptimizerSpec(kind="nesterov", learning_rate=0.3),  # momentum state must survive
        straggler=fixed_delay(0.05),  # every worker, every iteration: the job lasts long enough to be killed
        wait_for_workers_seconds=60,
    )  # fmt: skip


async def _run_until(client: GradcodeClient, job_id: str, iteration: int) -> int:
    """Follow the job until a report of ``iteration`` or later arrives; returns that report's iteration."""
    async for report in client.watch(job_id):
        if report.iteration >= iteration:
            return int(report.iteration)
    raise AssertionError(f"job {job_id} ended before iteration {iteration}")


async def _finish(address: str, job_id: str) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport], np.ndarray]:
    async with GradcodeClient(address) as client:
        await client.wait_ready(START_TIMEOUT)
        reports = [r async for r in client.watch(job_id)]
        return await client.get_job(job_id), reports, await client.get_model(job_id)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "call-tokens"])
def test_master_killed_mid_job_resumes_from_its_checkpoint_with_identical_parameters(
    tmp_path: Path, secure: bool
) -> None:
    state_dir = tmp_path / "state"
    master_args = ["--state-dir", str(state_dir), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    env = {"GRADCODE_JOIN_SECRET": JOIN} if secure else None  # no client token: the client needs none
    with LocalCluster(4, run_dir=tmp_path / "runs", master_args=master_args, env=env) as cluster:

        async def reference_and_kill() -> tuple[np.ndarray, int]:
            async with GradcodeClient(cluster.master_address) as client:
                await client.wait_ready(START_TIMEOUT)
                info, _ = await client.run(_spec("reference"))
                assert info.iterations_done == ITERATIONS
                reference = await client.get_model("reference")
                await client.create_job(_spec("durable"))
                seen = await _run_until(client, "durable", KILL_AFTER)
                cluster.master.kill()  # type: ignore[union-attr]  # SIGKILL: no shutdown, no final checkpoint
                return reference, seen

        reference, seen = asyncio.run(reference_and_kill())
        saved = Checkpoint.load(checkpoint_path(state_dir, "durable"))
        assert saved.state == "running"
        assert KILL_AFTER - CHECKPOINT_EVERY <= saved.iteration < ITERATIONS
        assert saved.iteration % CHECKPOINT_EVERY == 0, "only periodic checkpoints exist before the kill"
        assert seen >= KILL_AFTER

        cluster.restart_master(START_TIMEOUT)
        finished = _finish(cluster.master_address, "durable")
        info, reports, params = asyncio.run(asyncio.wait_for(finished, RESUME_TIMEOUT))

        # The job that had finished before the kill is held as it was: listed, its history and model read back.
        async def listed() -> list[tuple[str, int]]:
            async with GradcodeClient(cluster.master_address) as client:
                return [(job.job_id, int(job.state)) for job in (await client.list_jobs()).jobs]

        assert ("reference", master_pb2.JOB_STATE_SUCCEEDED) in asyncio.run(listed())
        before, before_reports, before_params = asyncio.run(
            asyncio.wait_for(_finish(cluster.master_address, "reference"), RESUME_TIMEOUT)
        )
        assert (before.state, before.iterations_done) == (master_pb2.JOB_STATE_SUCCEEDED, ITERATIONS), before.message
        assert [r.iteration for r in before_reports] == list(range(1, ITERATIONS + 1))
        np.testing.assert_array_equal(before_params, reference)

        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert info.iterations_done == ITERATIONS
        assert [r.iteration for r in reports] == list(range(1, ITERATIONS + 1))
        np.testing.assert_allclose(params, reference, rtol=0, atol=1e-12)
        # one history per job id: the reports after the checkpoint were dropped and computed again
        lines = (tmp_path / "runs" / "durable.jsonl").read_text().splitlines()
        assert [json.loads(line)["iteration"] for line in lines] == list(range(1, ITERATIONS + 1))
        log = (tmp_path / "runs" / "logs" / "master-restart-1.log").read_text()
        assert f"resumed job durable after iteration {saved.iteration}" in log
        final = Checkpoint.load(checkpoint_path(state_dir, "durable"))
        deadline = time.monotonic() + START_TIMEOUT
        while final.state == "running" and time.monotonic() < deadline:  # written right after the last report
            time.sleep(0.05)
            final = Checkpoint.load(checkpoint_path(state_dir, "durable"))
        assert (final.state, final.iteration) == ("succeeded", ITERATIONS)
        np.testing.assert_array_equal(final.optimizer.params, params)


def _gradcode(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gradcode", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=RESUME_TIMEOUT, env=service_env())


def test_gradcode_resume_goes_on_with_a_cancelled_job_from_its_checkpoint_file_on_another_master(
    tmp_path: Path,
) -> None:
    """`gradcode resume --checkpoint FILE` on a master that never saw the job; `gradcode run
    --initial-parameters` starts a job from the resumed job's model."""
    state_dir = tmp_path / "state"
    master_args = ["--state-dir", str(state_dir), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    with LocalCluster(4, run_dir=tmp_path / "a", master_args=master_args) as first:

        async def start_and_cancel() -> None:
            async with GradcodeClient(first.master_address) as client:
                await client.create_job(_spec("moving"))
                await _run_until(client, "moving", CHECKPOINT_EVERY + 1)
                await client.cancel("moving")

        asyncio.run(start_and_cancel())
    checkpoint = checkpoint_path(state_dir, "moving")
    cancelled = Checkpoint.load(checkpoint)
    assert cancelled.state == "cancelled" and cancelled.iteration < ITERATIONS

    with LocalCluster(4, run_dir=tmp_path / "b") as second:
        second.master.wait_ready(START_TIMEOUT)  # type: ignore[union-attr]
        resumed = _gradcode("resume", "--checkpoint", str(checkpoint), "--master", second.master_address)
        assert resumed.returncode == 0, resumed.stderr
        assert f"job moving resumed after iteration {cancelled.iteration}" in resumed.stdout
        assert "JOB_STATE_SUCCEEDED" in resumed.stdout
        model = tmp_path / "model.npy"
        saved = _gradcode("model", "moving", "--out", str(model), "--master", second.master_address)
        assert saved.returncode == 0, saved.stderr
        again = _gradcode(
            "run", "--master", second.master_address, "--scheme", "fractional", "--n", "4", "--s", "1",
            "--iterations", "1", "--initial-parameters", str(model), "--out", str(tmp_path / "again"),
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        refused = _gradcode("resume", "moving", "--master", second.master_address)
    assert refused.returncode != 0
    assert "keeps no checkpoints" in refused.stderr
