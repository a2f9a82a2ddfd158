"""plan_job: every malformed or refused spec gets a precise JobSpecError; LoadJob carries exactly what rows need."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from common.codes.registry import available_codes
from common.wire import array_from_tensor, struct_from_dict
from master.job import (
    DEFAULT_ITERATION_DEADLINE_SECONDS,
    JobPlan,
    JobRunner,
    JobSpecError,
    plan_job,
)
from master.pool import WorkerPool
from protos.gradcode.v1 import common_pb2, master_pb2


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
            r"Dataset 'file' refused: .*exist",
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


def loaded(plan: JobPlan, worker: int) -> tuple[Any, dict[int, tuple[np.ndarray, np.ndarray]]]:
    runner = JobRunner(plan, WorkerPool())
    chunks = list(runner._load_chunks(worker))
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
        setup, arrays = loaded(plan, w)
        rows = plan.code.static_assignment().rows[w]
        assert [r.row for r in setup.rows] == list(rows)
        needed = sorted({j for r in rows for j in plan.code.support(r)})
        assert sorted(arrays) == needed == sorted(plan.code.partitions_of_worker(w))
        assert setup.num_partitions_sent == len(needed)
        for r in setup.rows:
            np.testing.assert_array_equal(r.coefficients_real, plan.code.coefficients(r.row))
        for j, (X, y) in arrays.items():
            np.testing.assert_array_equal(X, plan.dataset.X_train[plan.partitions[j]])
            np.testing.assert_array_equal(y, plan.dataset.y_train[plan.partitions[j]])


async def test_dynamic_codes_send_every_candidate_row() -> None:
    plan = plan_job(spec("dynamic_clustered", {"n": 6, "clusters": 2, "load": 2, "clusters_per_worker": 2}))
    code: Any = plan.code
    for w in range(code.n):
        setup, arrays = loaded(plan, w)
        assert set(code.candidate_rows(w)) <= {r.row for r in setup.rows}
        assert sorted(arrays) == sorted(code.partitions_of_worker(w))


async def test_model_reply_carries_the_parameters() -> None:
    plan = plan_job(spec())
    reply = JobRunner(plan, WorkerPool()).model_reply()
    params = array_from_tensor(reply.parameters)
    assert params.shape == (plan.model.num_params,) and not params.any()
    assert reply.model.kind == "softmax"
