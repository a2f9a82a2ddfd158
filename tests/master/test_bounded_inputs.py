"""Every input a client sends the master is bounded (issue 25): the free-form fields of a JobSpec, and a checkpoint
sent to ResumeJob, checked from its headers before anything is decompressed. Against a real MasterNode on loopback;
each refusal is INVALID_ARGUMENT saying the limit, and the master keeps serving."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2

from gradcode.common.training.datafile import error_reason
from gradcode.master import limits
from gradcode.master.checkpoint import Checkpoint, CheckpointError
from gradcode.master.optimizer import make_optimizer
from gradcode.master.spec import plan_job
from gradcode.v1 import master_pb2
from tests.master.test_master_node import TIMEOUT, job_spec, running_master


def _big_struct(nbytes: int) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update({"notes": "x" * nbytes})
    return struct


def _with(change: Callable[[master_pb2.JobSpec], Any]) -> master_pb2.JobSpec:
    spec = job_spec("uncoded", {"n": 2}, job_id="bounded")
    change(spec)
    return spec


FREE_FORM_REFUSALS = [
    ("30 MB extra", _with(lambda s: s.extra.CopyFrom(_big_struct(30 << 20))), "JobSpec.extra has 314", "65536 bytes"),
    (
        "2 MB code.params",
        _with(lambda s: s.code.params.update({"note": "x" * (2 << 20)})),
        "JobSpec.code.params has",
        f"{limits.MAX_PARAMS_BYTES} bytes",
    ),
    (
        "2 MB straggler.params",
        _with(lambda s: s.straggler.params.update({"note": "x" * (2 << 20)})),
        "JobSpec.straggler.params has",
        f"{limits.MAX_PARAMS_BYTES} bytes",
    ),
    ("long code name", _with(lambda s: setattr(s.code, "name", "c" * 10_000)), "JobSpec.code.name has 10000", "128"),
    ("long model kind", _with(lambda s: setattr(s.model, "kind", "k" * 129)), "JobSpec.model.kind has 129", "128"),
    (
        "long dataset name",
        _with(lambda s: setattr(s.dataset, "name", "d" * 1000)),
        "JobSpec.dataset.name has 1000",
        "128",
    ),
    ("long optimizer", _with(lambda s: setattr(s.optimizer, "kind", "o" * 500)), "JobSpec.optimizer.kind has", "128"),
    ("long straggler", _with(lambda s: setattr(s.straggler, "model", "s" * 500)), "JobSpec.straggler.model has", "128"),
    ("long integrity", _with(lambda s: setattr(s, "integrity", "i" * 500)), "JobSpec.integrity has 500", "128"),
    ("long backup", _with(lambda s: setattr(s, "backup_priority", "b" * 500)), "JobSpec.backup_priority has", "128"),
    ("long surplus", _with(lambda s: setattr(s, "surplus", "h" * 500)), "JobSpec.surplus has 500", "128"),
    ("long path", _with(lambda s: setattr(s.dataset, "path", "p/" * 5000)), "JobSpec.dataset.path has 10000", "4096"),
    (
        "many options",
        _with(lambda s: s.dataset.options.update({f"k{i}": "v" for i in range(1000)})),
        "JobSpec.dataset.options has 1000 entries",
        "at most 64",
    ),
    (
        "long option",
        _with(lambda s: s.dataset.options.update({"labels": "y" * 100_000})),
        "JobSpec.dataset.options['labels'] has a key of 6 and a value of 100000",
        "4096",
    ),
]


@pytest.mark.parametrize(
    ("case", "spec", "what", "limit"), FREE_FORM_REFUSALS, ids=[case[0] for case in FREE_FORM_REFUSALS]
)
def test_plan_job_refuses_each_oversized_free_form_field(
    case: str, spec: master_pb2.JobSpec, what: str, limit: str
) -> None:
    """plan_job (CreateJob, ResumeJob and a restarted master's resumptions all plan through it)."""
    with pytest.raises(ValueError) as refused:
        plan_job(spec)
    assert what in str(refused.value) and limit in str(refused.value), str(refused.value)


def test_free_form_fields_within_their_limits_are_kept() -> None:
    spec = _with(lambda s: s.extra.CopyFrom(_big_struct(limits.MAX_EXTRA_BYTES - 100)))
    assert plan_job(spec).spec.extra == spec.extra


async def test_create_job_refuses_every_oversized_field_with_its_limit_and_keeps_serving() -> None:
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        for case, spec, what, limit in FREE_FORM_REFUSALS:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await master.stub.CreateJob(spec)
            details = refused.value.details() or ""
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, details)
            assert what in details and limit in details, (case, details)
            assert len(details) < 400, (case, len(details))  # the field's content is never echoed
        assert not master.node.servicer.jobs  # none was kept
        info, _ = await master.run(job_spec("uncoded", {"n": 2}, job_id="after"))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message


def _checkpoint_with(member: str, shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """A real checkpoint whose ``member`` is replaced by one whose .npy header declares ``shape`` of ``dtype``,
    followed by a mebibyte of zeros: deflated, the whole file stays small however much the header declares."""
    spec = job_spec("uncoded", {"n": 2}, job_id="bomb", iterations=9)
    real = Checkpoint(spec, 1, make_optimizer("gd", np.zeros(650), learning_rate=0.5), None).to_bytes()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(real)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in source.namelist():
            if name != f"{member}.npy":
                archive.writestr(name, source.read(name))
        archive.writestr(f"{member}.npy", header.getvalue() + bytes(1 << 20))
    return out.getvalue()


CHECKPOINT_BOMBS = [
    ("1.6 GB parameters", "optimizer.params", (200_000_000,), "<f8", "'optimizer.params' of 1600000000 bytes"),
    ("1 GB spec", "spec", (1 << 30,), "|u1", "'spec' of 1073741824 bytes"),
    ("4 GB header", "header", (1000,), "<U1000000", "'header' of 4000000000 bytes"),
    ("an array of no checkpoint", "payload", (10,), "<f8", "array 'payload' that no gradcode checkpoint has"),
]


@pytest.mark.parametrize(
    ("case", "member", "shape", "dtype", "what"), CHECKPOINT_BOMBS, ids=[case[0] for case in CHECKPOINT_BOMBS]
)
def test_a_checkpoint_is_checked_from_its_headers_before_anything_is_decompressed(
    case: str, member: str, shape: tuple[int, ...], dtype: str, what: str
) -> None:
    bomb = _checkpoint_with(member, shape, dtype)
    assert len(bomb) < 2 << 20
    with pytest.raises(CheckpointError) as refused:
        Checkpoint.from_bytes(bomb, source="The checkpoint sent")
    assert what in str(refused.value), str(refused.value)


async def test_resume_job_refuses_a_checkpoint_bomb_from_its_headers_and_keeps_serving() -> None:
    """The issue's 1.55 MB checkpoint made the master decompress (RSS +1.5 GB) before refusing it."""
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        for case, member, shape, dtype, what in CHECKPOINT_BOMBS:
            request = master_pb2.ResumeJobRequest(checkpoint=_checkpoint_with(member, shape, dtype))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await master.stub.ResumeJob(request)
            details = refused.value.details() or ""
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, details)
            assert details.startswith("The checkpoint sent") and what in details, (case, details)
        forged = job_spec("uncoded", {"n": 2}, job_id="forged", iterations=9)
        forgeries = [({"weight": float("nan")}, "JobSpec.extra.weight is nan"), ({"n": "x" * (1 << 20)}, "extra has")]
        for extra, what in forgeries:
            forged.extra.Clear()
            forged.extra.update(extra)  # a forged spec is refused as CreateJob refuses it
            data = Checkpoint(forged, 1, make_optimizer("gd", np.zeros(650), learning_rate=0.5), None).to_bytes()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await master.stub.ResumeJob(master_pb2.ResumeJobRequest(checkpoint=data))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert what in (refused.value.details() or ""), refused.value.details()
        assert not master.node.servicer.jobs
        info, _ = await master.run(job_spec("uncoded", {"n": 2}, job_id="after"))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message


def test_a_dataset_or_plugin_os_error_is_told_without_its_server_path() -> None:
    secret = "/srv/gradcode/private/data.npz"
    reason = error_reason(FileNotFoundError(2, "No such file or directory", secret))
    assert reason == "FileNotFoundError: No such file or directory" and secret not in reason
    assert error_reason(ValueError("needs 3 classes")) == "needs 3 classes"
