"""plan_job: every malformed or refused spec gets a precise JobSpecError; LoadJob carries exactly what rows need."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradcode.common.codes.registry import available_codes
from gradcode.common.sim.stragglers import Pareto, make_delay_model
from gradcode.common.transport.wire import array_from_tensor, struct_from_dict
from gradcode.master import limits
from gradcode.master.job import JobRunner
from gradcode.master.pool import WorkerPool
from gradcode.master.spec import DEFAULT_ITERATION_DEADLINE_SECONDS, JobPlan, JobSpecError, plan_job
from gradcode.v1 import common_pb2, master_pb2


def spec(code: str = "cyclic", params: dict[str, Any] | None = None, **fields: Any) -> master_pb2.JobSpec:
    base = master_pb2.JobSpec(
        code=common_pb2.CodeSpec(
            name=code, params=struct_from_dict(params if params is not None else {"n": 6, "s": 2})
        ),
        dataset=master_pb2.DatasetSpec(name="digits", num_samples=300),
        optimizer=master_pb2.OptimizerSpec(kind="gd", learning_rate=0.5),
        iterations=5,
    )
    for key, value in fields.items():
        field = getattr(base, key)
        if hasattr(field, "CopyFrom") and not isinstance(value, (int, float, str, bytes)):
            field.CopyFrom(value)
        elif isinstance(value, list):
            field.extend(value)
        else:
            setattr(base, key, value)
    return base


def test_a_valid_spec_gets_its_defaults_filled_in() -> None:
    plan = plan_job(spec())
    assert plan.job_id.startswith("job-")
    assert plan.spec.model.kind == "softmax"
    assert (plan.spec.model.num_features, plan.spec.model.num_classes) == (64, 10)
    assert plan.spec.iteration_deadline_seconds == DEFAULT_ITERATION_DEADLINE_SECONDS
    assert plan.spec.message_dtype == common_pb2.DTYPE_FLOAT64
    assert plan.code.n == 6 and plan.code.s == 2
    sizes = [len(p) for p in plan.partitions]
    assert sum(sizes) == plan.dataset.num_train and len(sizes) == plan.code.k
    assert len(np.unique(np.concatenate(plan.partitions))) == plan.dataset.num_train


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (spec("nope"), r"Unknown gradient code 'nope'; available schemes: .*cyclic"),
        (spec(""), r"JobSpec.code.name is empty; available schemes: "),
        (
            spec("fractional", {"n": 6, "s": 3}),
            r"Invalid parameters for gradient code 'fractional': Argument 's' must satisfy \(s \+ 1\) \| n",
        ),
        (spec("cyclic", {"n": 6, "s": 2, "foo": 1}), r"does not take parameter\(s\) \['foo'\]; it accepts \['n', 's'"),
        (spec("cyclic", {"n": 6}), r"Invalid parameters for gradient code 'cyclic': .*missing"),
        (spec("cyclic", {"n": 6, "s": 2, "max_decode_error": 1e-30}), r"decodes with relative error .* > max_decode"),
        (spec("coded_reduce", {"n": 2, "s": 1, "L": 2, "seed": -1}), r"Invalid parameters .*'seed' must be"),
        (spec(dataset=master_pb2.DatasetSpec(name="mnist")), r"Unknown dataset 'mnist'; valid names are \['digits'"),
        (
            spec(dataset=master_pb2.DatasetSpec(name="file", path="/does/not/exist.npz")),
            r"Dataset 'file' is disabled on this master: start it with --data-dir DIR \(or the environment variable "
            r"GRADCODE_DATA_DIR=DIR\)",
        ),
        (spec(model=common_pb2.ModelSpec(kind="svm")), r"Unknown model kind 'svm'; valid kinds are \['linear'"),
        (spec(model=common_pb2.ModelSpec(kind="logistic")), r"Model refused: .*'num_classes' must be 2"),
        (spec(model=common_pb2.ModelSpec(num_features=10)), r"num_features is 10 but dataset 'digits' has 64"),
        (spec(model=common_pb2.ModelSpec(num_classes=3)), r"num_classes is 3 but dataset 'digits' has 10 classes"),
        (spec(model=common_pb2.ModelSpec(l2=-1.0)), r"JobSpec.model.l2 must be a finite number >= 0"),
        (
            spec(
                dataset=master_pb2.DatasetSpec(name="linear", num_samples=200),
                model=common_pb2.ModelSpec(kind="softmax"),
            ),
            r"Model 'softmax' needs class labels but dataset 'linear' is a regression set",
        ),
        (spec(optimizer=master_pb2.OptimizerSpec(kind="adam")), r"Unknown optimizer 'adam'"),
        (spec(optimizer=master_pb2.OptimizerSpec(kind="gd")), r"learning_rate' must be a finite number > 0"),
        (spec(iterations=0), r"JobSpec.iterations must be in \[1, "),
        (spec(target_accuracy=1.5), r"target_accuracy must be a finite number in \[0, 1\]"),
        (spec(iteration_deadline_seconds=-1.0), r"iteration_deadline_seconds must be a finite number >= 0"),
        (spec(job_id="../etc/passwd"), r"job_id '../etc/passwd' is invalid"),
        (spec(worker_ids=[0, 1, 2]), r"worker_ids must list 6 distinct worker ids"),
        (spec(worker_ids=[0, 1, 2, 3, 4, 4]), r"worker_ids must list 6 distinct worker ids"),
        (spec(straggler=common_pb2.StragglerSpec(model="slow")), r"Unknown straggler model 'slow'; valid models"),
        (
            spec(straggler=common_pb2.StragglerSpec(model="fixed", params=struct_from_dict({"delay": 1}))),
            r"Straggler model 'fixed' refused: Unknown parameter\(s\) \['delay'\]",
        ),
        (spec(message_dtype=common_pb2.DTYPE_COMPLEX128), r"not valid for a real code; use DTYPE_FLOAT64"),
        (spec(message_dtype=common_pb2.DTYPE_INT64), r"DTYPE_INT64 is not valid for a real code"),
        (spec("uncoded", {"n": 400}), r"Cannot split the 240 training samples into 400 partitions"),
    ],
)
def test_refusals_name_the_problem(bad: master_pb2.JobSpec, match: str) -> None:
    with pytest.raises(JobSpecError, match=match):
        plan_job(bad, known_worker_ids=list(range(6)))


def test_unknown_worker_ids_list_the_known_ones() -> None:
    with pytest.raises(JobSpecError, match=r"unknown worker id\(s\) \[7\]; known worker ids are \[0, 1, 2, 3, 4, 5\]"):
        plan_job(spec(worker_ids=[0, 1, 2, 3, 4, 7]), known_worker_ids=list(range(6)))


def test_every_registered_scheme_name_is_listed_for_an_unknown_one() -> None:
    with pytest.raises(JobSpecError) as info:
        plan_job(spec("nope"))
    for name in available_codes():
        assert name in str(info.value)


async def loaded(
    plan: JobPlan, worker: int, runner: JobRunner | None = None
) -> tuple[Any, dict[int, tuple[np.ndarray, np.ndarray]]]:
    runner = runner or JobRunner(plan, WorkerPool())
    chunks = [chunk async for chunk in runner.loader.load_stream(worker)]
    setup = chunks[0].setup
    data: dict[int, tuple[bytearray, bytearray]] = {}
    for chunk in chunks[1:]:
        d = chunk.data
        features, labels = data.setdefault(d.partition, (bytearray(), bytearray()))
        assert d.features_offset == len(features) and d.labels_offset == len(labels)
        features += d.features
        labels += d.labels
    arrays = {
        p: (np.frombuffer(bytes(f), "<f8").reshape(-1, plan.dataset.num_features), np.frombuffer(bytes(y), "<f8"))
        for p, (f, y) in data.items()
    }
    return setup, arrays


@pytest.mark.parametrize(
    ("code", "params"),
    [("cyclic", {"n": 6, "s": 2}), ("fractional", {"n": 6, "s": 2}), ("binary", {"n": 5, "s": 1})],
)
async def test_each_worker_receives_exactly_the_partitions_its_rows_need(code: str, params: dict[str, Any]) -> None:
    plan = plan_job(spec(code, params))
    for w in range(plan.code.n):
        setup, arrays = await loaded(plan, w)
        rows = plan.code.static_assignment().rows[w]
        assert [r.row for r in setup.rows] == list(rows)
        needed = sorted({j for r in rows for j in plan.code.support(r)})
        assert sorted(arrays) == needed == sorted(plan.code.partitions_of_worker(w))
        assert setup.num_partitions_sent == len(needed)
        assert setup.iterations == plan.spec.iterations == 5  # the worker refuses iterations beyond it
        for r in setup.rows:
            np.testing.assert_array_equal(r.coefficients_real, plan.code.coefficients(r.row))
        for j, (X, y) in arrays.items():
            np.testing.assert_array_equal(X, plan.dataset.X_train[plan.partitions[j]])
            np.testing.assert_array_equal(y, plan.dataset.y_train[plan.partitions[j]])


async def test_each_partition_is_serialised_once_however_many_workers_hold_it() -> None:
    plan = plan_job(spec("cyclic", {"n": 6, "s": 2}))  # every partition is held by s + 1 = 3 workers
    runner = JobRunner(plan, WorkerPool())
    first = await asyncio.gather(*(loaded(plan, w, runner) for w in range(plan.code.n)))
    again, _ = await loaded(plan, 0, runner), await loaded(plan, 3, runner)  # reloads (a restarted worker)
    assert runner.loader.partition_bytes.serialisations == plan.code.k
    assert again[1].keys() == first[0][1].keys()
    features, labels = await runner.loader.partition_bytes.get(0)
    assert features is (await runner.loader.partition_bytes.get(0))[0]  # the cached bytes, not a copy
    assert features == plan.dataset.X_train[plan.partitions[0]].astype("<f8").tobytes()
    assert labels == plan.dataset.y_train[plan.partitions[0]].astype("<f8").tobytes()


async def test_dynamic_codes_send_every_candidate_row() -> None:
    plan = plan_job(spec("dynamic_clustered", {"n": 6, "clusters": 2, "load": 2, "clusters_per_worker": 2}))
    code: Any = plan.code
    for w in range(code.n):
        setup, arrays = await loaded(plan, w)
        assert set(code.candidate_rows(w)) <= {r.row for r in setup.rows}
        assert sorted(arrays) == sorted(code.partitions_of_worker(w))


async def test_model_reply_carries_the_parameters() -> None:
    plan = plan_job(spec())
    reply = JobRunner(plan, WorkerPool()).model_reply()
    params = array_from_tensor(reply.parameters)
    assert params.shape == (plan.model.num_params,) and not params.any()
    assert reply.model.kind == "softmax"


# ---- size caps: refused before anything is built --------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            spec("binary", {"n": 10**6, "s": 1}),
            r"'binary' with these parameters needs 1e\+06 workers; a job may use at most 1024",
        ),
        (
            spec("binary_heterogeneous", {"n1": 2000, "n2": 2000, "s": 1, "speed1": 1, "speed2": 2}),
            r"needs 4000 workers",
        ),
        (
            spec("coded_reduce", {"n": 32, "s": 1, "L": 3}),
            r"'coded_reduce' with these parameters needs 3.382e\+04 workers",
        ),
        (
            spec("partial_stragglers", {"n": 6, "s": 2, "alpha": 1 + 1e-10}),
            r"cuts the data into 1.8e\+11 partitions; a job may use at most 65536 \(use a larger alpha\)",
        ),
        (
            spec(dataset=master_pb2.DatasetSpec(name="linear", num_samples=10**11)),
            r"dataset.num_samples is 100000000000; a job may use at most 10000000",
        ),
        (
            spec(dataset=master_pb2.DatasetSpec(name="linear", num_features=10**6)),
            r"dataset.num_features is 1000000; this master allows at most 100000 \(its --max-features\)",
        ),
        (
            spec(dataset=master_pb2.DatasetSpec(name="gaussian_mixture", num_samples=10**7, num_features=1000)),
            r"10000000 samples x 1000 features needs 76294 MiB; a job may use at most 1024 MiB",
        ),
        (
            spec(dataset=master_pb2.DatasetSpec(name="gaussian_mixture", num_features=100_000)),
            r"'gaussian_mixture' of 2000 samples x 100000 features needs 1526 MiB",  # the default sample count
        ),
    ],
)
def test_oversized_specs_are_refused_quickly_before_anything_is_built(bad: master_pb2.JobSpec, match: str) -> None:
    started = time.perf_counter()
    with pytest.raises(JobSpecError, match=match):
        plan_job(bad)
    assert time.perf_counter() - started < 5  # refused from the numbers, not after trying to allocate


def test_a_model_larger_than_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_MODEL_BYTES", 4096)  # digits softmax has 650 parameters = 5200 bytes
    with pytest.raises(JobSpecError, match=r"Model 'softmax' over 64 features has 650 parameters .* at most 512 "):
        plan_job(spec())


# ---- straggler models are evaluated for every worker of the job -----------------------------------
def test_a_straggler_model_that_refuses_some_worker_of_the_job_refuses_the_job() -> None:
    fixed = common_pb2.StragglerSpec(
        model="fixed", params=struct_from_dict({"delay_seconds": 0.1, "workers": [0], "num_workers": 4})
    )
    with pytest.raises(
        JobSpecError,
        match=r"Straggler model 'fixed' refused for worker 4 of this job's 8 workers \(ids 0..7\): "
        r"Argument 'worker_id' must be in \[0, 4\)",
    ):
        plan_job(spec("fractional", {"n": 8, "s": 1}, straggler=fixed))
    fixed.params.update({"num_workers": 8})
    assert plan_job(spec("fractional", {"n": 8, "s": 1}, straggler=fixed)).code.n == 8


def test_a_pareto_model_with_a_tiny_shape_is_capped_not_an_overflow() -> None:
    pareto = common_pb2.StragglerSpec(model="pareto", params=struct_from_dict({"shape": 1e-300, "scale": 0.001}))
    plan = plan_job(spec(straggler=pareto))
    delays = make_delay_model("pareto", {"shape": 1e-300, "scale": 0.001}, 0)
    assert all(delays.delay(w, t) == Pareto.MAX_DRAW_SECONDS for w in range(plan.code.n) for t in range(3))


# ---- file datasets: only inside the data directory, and no file content in errors ---------------------
def write_csv(path: Path, rows: int = 40, bad_value: str | None = None) -> None:
    lines = [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(rows)]
    if bad_value is not None:
        lines[5] = f"1,{bad_value},0"
    path.write_text("\n".join(lines) + "\n")


def file_spec(path: str) -> master_pb2.JobSpec:
    return spec("uncoded", {"n": 2}, dataset=master_pb2.DatasetSpec(name="file", path=path))


def test_a_file_dataset_inside_the_data_dir_is_planned(tmp_path: Path) -> None:
    write_csv(tmp_path / "ok.csv")
    (tmp_path / "sub").mkdir()
    write_csv(tmp_path / "sub" / "nested.csv")
    for path in ("ok.csv", "sub/nested.csv", "sub/../ok.csv", str(tmp_path / "ok.csv")):
        plan = plan_job(file_spec(path), data_dir=tmp_path)
        assert plan.dataset.num_train + len(plan.dataset.y_test) == 40 and plan.spec.model.kind == "logistic"


def test_a_file_dataset_outside_the_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir, outside = tmp_path / "data", tmp_path / "private"
    data_dir.mkdir()
    outside.mkdir()
    write_csv(outside / "secret.csv")
    (data_dir / "link.csv").symlink_to(outside / "secret.csv")
    for path in ("../private/secret.csv", str(outside / "secret.csv"), "link.csv"):
        with pytest.raises(JobSpecError, match=r"is outside the master's data directory"):
            plan_job(file_spec(path), data_dir=data_dir)
    with pytest.raises(JobSpecError, match=r"'missing.csv' is not a file in the master's data directory"):
        plan_job(file_spec("missing.csv"), data_dir=data_dir)
    with pytest.raises(JobSpecError, match=r"must name a .npz, .csv, .npy or .parquet file"):
        plan_job(file_spec("notes.txt"), data_dir=data_dir)
    with pytest.raises(JobSpecError, match=r"Dataset 'file' is disabled on this master"):
        plan_job(file_spec("ok.csv"))


def test_file_errors_never_echo_the_files_content(tmp_path: Path) -> None:
    write_csv(tmp_path / "bad.csv", bad_value="TOPSECRET-42")
    np.savez(tmp_path / "keys.npz", SECRET_KEY=np.zeros(3))
    (tmp_path / "ragged.csv").write_text("1,2,0\n1,2,3,0\n")
    cases = {
        "bad.csv": "line 6 holds a non-numeric value",
        "keys.npz": "it must contain arrays 'X' and 'y'",
        "ragged.csv": "line 2 has 4 columns, expected 3",
    }
    for path, reason in cases.items():
        with pytest.raises(JobSpecError) as info:
            plan_job(file_spec(path), data_dir=tmp_path)
        message = str(info.value)
        assert message == f"Dataset 'file' {path!r} refused: {reason}.", message
        assert "SECRET" not in message and str(tmp_path) not in message


def test_a_data_file_larger_than_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """The cap is the master's --max-data-file-bytes option (plan_job's max_data_file_bytes)."""
    write_csv(tmp_path / "big.csv", rows=100)
    size = (tmp_path / "big.csv").stat().st_size
    with pytest.raises(JobSpecError, match=r"Dataset file 'big.csv' has \d+ bytes; this master loads at most 100 "):
        plan_job(file_spec("big.csv"), data_dir=tmp_path, max_data_file_bytes=100)
    assert plan_job(file_spec("big.csv"), data_dir=tmp_path, max_data_file_bytes=size).dataset.num_train > 0


def test_the_feature_cap_is_the_masters_to_set() -> None:
    """MAX_FEATURES is only the default: a master with a higher --max-features plans a wider generated dataset,
    one with a lower cap refuses a dataset wider than it, built-in or generated, and says which option it is."""
    wide = spec(dataset=master_pb2.DatasetSpec(name="linear", num_samples=24, num_features=150_000))
    wide.model.kind = "linear"
    with pytest.raises(JobSpecError, match=r"num_features is 150000; this master allows at most 100000"):
        plan_job(wide)
    plan = plan_job(wide, max_features=200_000)
    assert plan.dataset.num_features == 150_000 and plan.model.num_params == 150_001
    with pytest.raises(JobSpecError, match=r"at most 50 features \(the master's --max-features\)"):
        plan_job(spec(), max_features=50)  # digits: 64 features
