"""NaN/inf anywhere a caller can put a float, over-long ids and bomb-like data files are refused up front."""

from __future__ import annotations

import asyncio
import io
import math
import zipfile
from pathlib import Path

import grpc
import numpy as np
import pytest

from gradcode.common.training.data import MAX_FILE_ARRAY_BYTES, load_dataset
from gradcode.common.transport.wire import struct_from_dict
from gradcode.master.node import MasterNode
from gradcode.master.spec_checks import SpecCheckError, check_spec_numbers
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc


def spec(**fields: object) -> master_pb2.JobSpec:
    s = master_pb2.JobSpec(code=common_pb2.CodeSpec(name="cyclic", params=struct_from_dict({"n": 3, "s": 1})))
    for name, value in fields.items():
        target, _, leaf = name.rpartition(".")
        setattr(s if not target else getattr(s, target), leaf, value)
    return s


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_naming_the_field(bad: float) -> None:
    check_spec_numbers(spec())  # a finite spec passes
    for name in ("optimizer.learning_rate", "iteration_deadline_seconds", "dataset.test_fraction", "model.l2"):
        with pytest.raises(SpecCheckError, match=name.rpartition(".")[2]):
            check_spec_numbers(spec(**{name: bad}))
    s = spec()
    s.code.params.update({"weights": [1.0, bad]})
    with pytest.raises(SpecCheckError, match=r"JobSpec.code.params.weights\[1\]"):
        check_spec_numbers(s)
    s = spec()
    s.extra.update({"nested": {"deep": bad}})
    with pytest.raises(SpecCheckError, match=r"JobSpec\.extra\.nested\.deep"):
        check_spec_numbers(s)


def test_a_long_job_id_is_refused_with_a_short_echo() -> None:
    with pytest.raises(SpecCheckError) as info:
        check_spec_numbers(spec(job_id="j" * 100_000))
    assert len(str(info.value)) < 200 and "100000 characters" in str(info.value)


async def test_the_master_answers_invalid_argument_and_keeps_serving() -> None:
    async with (
        asyncio.timeout(60),
        MasterNode(grace=0.1) as master,
        grpc.aio.insecure_channel(master.address) as channel,
    ):
        stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        s = spec()
        s.code.params.update({"s": math.nan})
        for request, code in (
            (s, grpc.StatusCode.INVALID_ARGUMENT),
            (spec(job_id="x" * 100_000), grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.CreateJob(request)
            assert info.value.code() == code and len(info.value.details() or "") < 300
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetJob(master_pb2.GetJobRequest(job_id="y" * 100_000))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and len(info.value.details() or "") < 300
        assert (await stub.ListWorkers(master_pb2.ListWorkersRequest())).workers == []


def test_a_compressed_npz_is_checked_from_its_headers_before_decompressing(tmp_path: Path) -> None:
    """An .npz whose headers declare more than the cap is refused without inflating a byte of its data."""
    rows = MAX_FILE_ARRAY_BYTES // 8 // 100 + 1
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (rows, 100)})
    bomb = tmp_path / "bomb.npz"  # headers only: reading the data would fail, so a pass means it was never read
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("X.npy", header.getvalue())
        archive.writestr("y.npy", header.getvalue())
    with pytest.raises(ValueError, match=r"declares arrays of .* MiB as float64; a data file may hold at most"):
        load_dataset("file", path=bomb, seed=0, test_fraction=0.2)
    small = tmp_path / "small.npz"
    np.savez_compressed(small, X=np.random.default_rng(0).standard_normal((10, 3)), y=np.arange(10) % 2)
    assert load_dataset("file", path=small, seed=0, test_fraction=0.2).num_features == 3
