"""Durable jobs in one process: the checkpoint file, resuming on a master restart and by ResumeJob,
initial parameters, and job ids that are never reused for another job's history."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.codes.base import Observation
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import make_model
from gradcode.common.transport.wire import array_from_tensor, tensor_from_array
from gradcode.master.checkpoint import Checkpoint, CheckpointError, checkpoint_path, saved_checkpoints
from gradcode.master.optimizer import make_optimizer
from gradcode.v1 import master_pb2
from tests.helpers import fixed_delay
from tests.master.test_master_node import EXACT, SAMPLES, TIMEOUT, centralized_gd, job_spec, running_master


def _nesterov_after(steps: int) -> Any:
    opt = make_optimizer("nesterov", np.linspace(-1, 1, 5), learning_rate=0.1)
    for i in range(steps):
        opt.step(np.sin(np.arange(5.0) + i))
    return opt


def test_checkpoint_round_trip_restores_optimizer_momentum_and_observation() -> None:
    opt = _nesterov_after(3)
    observation = Observation(straggling=(False, True, False), speed=(2.0, 0.0, 1.5))
    spec = job_spec("uncoded", {"n": 3}, job_id="round-trip", iterations=9)
    back = Checkpoint.from_bytes(Checkpoint(spec, 3, opt, observation).to_bytes())
    assert (back.job_id, back.iteration, back.state, back.spec) == ("round-trip", 3, "running", spec)
    assert back.observation == observation
    assert back.optimizer.steps == 3
    for name, array in opt.state_arrays().items():
        np.testing.assert_array_equal(back.optimizer.state_arrays()[name], array)
    for i in range(3, 6):  # the momentum schedule and look-ahead go on exactly as without the checkpoint
        opt.step(np.cos(np.arange(5.0) * i))
        back.optimizer.step(np.cos(np.arange(5.0) * i))
    np.testing.assert_array_equal(back.optimizer.params, opt.params)
    assert Checkpoint.from_bytes(Checkpoint(spec, 0, opt, None).to_bytes()).observation is None


def test_checkpoint_save_replaces_the_file_whole_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    spec = job_spec("uncoded", {"n": 2}, job_id="atomic")
    for steps in (1, 2):
        path = Checkpoint(spec, steps, _nesterov_after(steps), None).save(tmp_path / "state")
    assert path == checkpoint_path(tmp_path / "state", "atomic")
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["atomic.ckpt.npz"]
    assert saved_checkpoints(tmp_path / "state") == [path]
    assert Checkpoint.load(path).iteration == 2


async def test_a_starting_master_removes_the_temporary_files_of_interrupted_checkpoint_writes(tmp_path: Path) -> None:
    """A master SIGKILLed while writing a checkpoint leaves ``.<job_id>.<random>.tmp``; the next one removes it and
    nothing else (the checkpoints, and files that are not its temporaries, stay)."""
    state = tmp_path / "state"
    kept = Checkpoint(job_spec("uncoded", {"n": 2}, job_id="kept"), 2, _nesterov_after(2), None, state="cancelled")
    kept.save(state)
    interrupted = state / ".killed.k2x8_9q.tmp"
    interrupted.write_bytes(kept.to_bytes()[:1000])  # what a write cut short leaves
    other = state / "notes.tmp"
    other.write_text("not a checkpoint temporary")
    async with asyncio.timeout(TIMEOUT), running_master(0, state_dir=state):
        assert sorted(p.name for p in state.iterdir()) == ["kept.ckpt.npz", "notes.tmp"]


def test_unreadable_checkpoints_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a readable gradcode checkpoint"):
        Checkpoint.from_bytes(b"not an npz file")
    with pytest.raises(CheckpointError, match="cannot be read: No such file"):
        Checkpoint.load(tmp_path / "missing.ckpt.npz")
    good = Checkpoint(job_spec("uncoded", {"n": 2}, job_id="x"), 1, _nesterov_after(1), None).to_bytes()
    with pytest.raises(CheckpointError, match="not a readable"):
        Checkpoint.from_bytes(good[: len(good) // 2])  # cut short
    opt = make_optimizer("gd", np.zeros(3), learning_rate=0.1)
    with pytest.raises(ValueError, match="needs arrays"):
        opt.restore_state({"params": np.zeros(3), "lookahead": np.zeros(3)}, steps=1)
    with pytest.raises(ValueError, match="finite"):
        opt.restore_state({"params": np.full(3, np.nan)}, steps=1)


async def _follow(master: Any, job_id: str) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport]]:
    """Watch a job the master already holds to its end."""
    reports = [r async for r in master.stub.WatchJob(master_pb2.WatchJobRequest(job_id=job_id))]
    return await master.stub.GetJob(master_pb2.GetJobRequest(job_id=job_id)), reports


async def _final_checkpoint(path: Path) -> Checkpoint:
    """The job's last checkpoint: written right after its final report, so wait for it."""
    while not path.exists() or (checkpoint := Checkpoint.load(path)).state == "running":
        await asyncio.sleep(0.02)
    return checkpoint


async def _until(master: Any, job_id: str, iterations: int) -> None:
    while (await master.stub.GetJob(master_pb2.GetJobRequest(job_id=job_id))).iterations_done < iterations:
        await asyncio.sleep(0.02)


async def test_a_master_stopped_mid_job_leaves_it_resumable_and_the_next_master_finishes_it(tmp_path: Path) -> None:
    options = {"state_dir": tmp_path / "state", "run_dir": tmp_path / "runs", "checkpoint_every": 2}
    spec = job_spec("uncoded", {"n": 2}, iterations=12, job_id="survivor", straggler=fixed_delay(0.05))
    async with asyncio.timeout(TIMEOUT):
        async with running_master(2, **options) as master:
            await master.stub.CreateJob(spec)
            await _until(master, "survivor", 3)
        stopped = Checkpoint.load(checkpoint_path(tmp_path / "state", "survivor"))
        assert stopped.state == "running" and 3 <= stopped.iteration < 12  # the shutdown suspended it
        async with running_master(2, **options) as master:  # resumes it by itself
            info, reports = await _follow(master, "survivor")
            final = await _final_checkpoint(checkpoint_path(tmp_path / "state", "survivor"))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == list(range(1, 13))
    assert (final.state, final.iteration) == ("succeeded", 12)
    np.testing.assert_allclose(final.optimizer.params, centralized_gd(12), rtol=0, atol=EXACT)


async def test_job_ids_are_never_reused_for_another_history(tmp_path: Path) -> None:
    options = {"state_dir": tmp_path / "state", "run_dir": tmp_path / "runs"}
    async with asyncio.timeout(TIMEOUT):
        async with running_master(2, **options) as master:
            info, _ = await master.run(job_spec("uncoded", {"n": 2}, job_id="once"))
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED
        async with running_master(2, run_dir=tmp_path / "runs") as master:  # a new master, same run directory
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await master.stub.CreateJob(job_spec("uncoded", {"n": 2}, job_id="once"))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "the master's run directory holds its history" in (refused.value.details() or "")
    assert "gradcode resume once" in (refused.value.details() or "")


async def test_error_texts_name_no_server_path(tmp_path: Path) -> None:
    """A client learns what is wrong, never where the master keeps its files: ALREADY_EXISTS from a history or a
    checkpoint on disk, NOT_FOUND of an evicted job, an unreadable checkpoint in the state directory."""
    options: dict[str, Any] = {"state_dir": tmp_path / "state", "run_dir": tmp_path / "runs"}
    texts: list[tuple[grpc.StatusCode, str]] = []

    async def refused(call: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        texts.append((caught.value.code(), caught.value.details() or ""))

    async with asyncio.timeout(TIMEOUT):
        async with running_master(2, max_finished_jobs=0, **options) as master:
            await master.stub.CreateJob(job_spec("uncoded", {"n": 2}, job_id="once"))
            assert (await _final_checkpoint(checkpoint_path(tmp_path / "state", "once"))).state == "succeeded"
            while "once" not in master.node.servicer.evicted:
                await asyncio.sleep(0.02)
            await refused(master.stub.GetJob(master_pb2.GetJobRequest(job_id="once")))  # evicted
            checkpoint_path(tmp_path / "state", "torn").write_bytes(b"PK\x03\x04 cut short")
            await refused(master.stub.ResumeJob(master_pb2.ResumeJobRequest(job_id="torn")))
        async with running_master(2, run_dir=tmp_path / "runs") as master:  # the history alone
            await refused(master.stub.CreateJob(job_spec("uncoded", {"n": 2}, job_id="once")))
        async with running_master(2, state_dir=tmp_path / "state") as master:  # the checkpoint alone
            await refused(master.stub.CreateJob(job_spec("uncoded", {"n": 2}, job_id="once")))
    assert [code for code, _ in texts] == [
        grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.ALREADY_EXISTS,
    ]  # fmt: skip
    assert "evicted" in texts[0][1] and "not a readable gradcode checkpoint" in texts[1][1]
    assert "run directory holds its history" in texts[2][1] and "state directory holds its checkpoint" in texts[3][1]
    for _, text in texts:
        assert str(tmp_path) not in text and "/" not in text.replace("gradcode resume", ""), text


async def test_resume_job_refusals_say_why(tmp_path: Path) -> None:
    async def refused(master: Any, request: master_pb2.ResumeJobRequest) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await master.stub.ResumeJob(request)
        return caught.value.code(), caught.value.details() or ""

    async with asyncio.timeout(TIMEOUT):
        async with running_master(2) as master:  # no state directory
            code, text = await refused(master, master_pb2.ResumeJobRequest(job_id="j"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "--state-dir" in text
            code, text = await refused(master, master_pb2.ResumeJobRequest(checkpoint=b"garbage"))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a readable gradcode checkpoint" in text
        async with running_master(2, state_dir=tmp_path / "state", run_dir=tmp_path / "runs") as master:
            code, text = await refused(master, master_pb2.ResumeJobRequest(job_id="nope"))
            assert code == grpc.StatusCode.NOT_FOUND and "No checkpoint of job" in text
            info, _ = await master.run(job_spec("uncoded", {"n": 2}, job_id="done"))
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED
            await _final_checkpoint(checkpoint_path(tmp_path / "state", "done"))
            code, text = await refused(master, master_pb2.ResumeJobRequest(job_id="done"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "succeeded after 3 of 3 iterations" in text
            data = checkpoint_path(tmp_path / "state", "done").read_bytes()
            code, text = await refused(master, master_pb2.ResumeJobRequest(job_id="other", checkpoint=data))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "is of job 'done', not 'other'" in text


async def test_a_cancelled_job_resumes_on_another_master_from_its_checkpoint_file(tmp_path: Path) -> None:
    spec = job_spec("uncoded", {"n": 2}, iterations=10, job_id="moved", straggler=fixed_delay(0.05))
    async with asyncio.timeout(TIMEOUT):
        async with running_master(2, state_dir=tmp_path / "a", checkpoint_every=3) as first:
            await first.stub.CreateJob(spec)
            await _until(first, "moved", 2)
            await first.stub.CancelJob(master_pb2.CancelJobRequest(job_id="moved"))
            await _final_checkpoint(checkpoint_path(tmp_path / "a", "moved"))
        data = checkpoint_path(tmp_path / "a", "moved").read_bytes()
        cancelled = Checkpoint.from_bytes(data)
        assert cancelled.state == "cancelled" and 2 <= cancelled.iteration < 10
        async with running_master(2) as second:  # keeps no checkpoints itself
            resumed = await second.stub.ResumeJob(master_pb2.ResumeJobRequest(checkpoint=data))
            assert resumed.job_id == "moved" and resumed.iterations_done == cancelled.iteration
            info, reports = await _follow(second, "moved")
            model = await second.stub.GetModel(master_pb2.GetModelRequest(job_id="moved"))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and info.iterations_done == 10
    assert [r.iteration for r in reports] == list(range(cancelled.iteration + 1, 11))  # no history here before
    np.testing.assert_allclose(array_from_tensor(model.parameters), centralized_gd(10), rtol=0, atol=EXACT)


async def test_a_job_starts_from_given_initial_parameters() -> None:
    data = load_dataset("digits", num_samples=SAMPLES, seed=0, test_fraction=0.2)
    model = make_model("softmax", num_features=data.num_features, num_classes=data.num_classes)
    start = np.random.default_rng(3).normal(size=model.num_params) * 0.01
    expected = start - 0.5 * model.gradient(start, data.X_train, data.y_train) / data.num_train
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        spec = job_spec("uncoded", {"n": 2}, iterations=1, initial_parameters=tensor_from_array(start))
        info, _ = await master.run(spec)
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        model_reply = await master.stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await master.stub.CreateJob(job_spec("uncoded", {"n": 2}, initial_parameters=tensor_from_array(start[:5])))
    np.testing.assert_allclose(array_from_tensor(model_reply.parameters), expected, rtol=0, atol=EXACT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"flat vector of the model's {model.num_params} parameters" in (refused.value.details() or "")
