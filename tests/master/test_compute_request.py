"""The master's once-per-iteration model serialization yields exactly the ComputeRequest a worker expects."""

from pathlib import Path

import numpy as np

from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.common.transport.wire import array_from_tensor, tensor_from_array
from gradcode.master.rounds import _ModelRequest
from gradcode.v1 import worker_pb2


def test_per_worker_fields_prepended_to_shared_model_bytes_parse_to_the_whole_request() -> None:
    params = np.random.default_rng(0).standard_normal(1000)
    model_bytes = worker_pb2.ComputeRequest(model=tensor_from_array(params)).SerializeToString()
    head = worker_pb2.ComputeRequest(job_id="job", iteration=7, worker_id=3, rows=[3, 11])
    got = worker_pb2.ComputeRequest.FromString(head.SerializeToString() + model_bytes)
    whole = worker_pb2.ComputeRequest(
        job_id="job", iteration=7, worker_id=3, rows=[3, 11], model=tensor_from_array(params)
    )
    assert got == whole
    np.testing.assert_array_equal(array_from_tensor(got.model), params)


def test_a_worker_is_asked_for_shared_payloads_once_per_round(tmp_path: Path) -> None:
    """The round checks and decodes shared messages in their slots: a worker asked again in the same round
    (perhaps restarted, so it cannot know) gets the model inline and so answers inline, never rewriting a slot."""
    shared = SharedDirectory.create(tmp_path)
    assert shared is not None
    params = np.random.default_rng(0).standard_normal(100)
    model = _ModelRequest(7, params, shared)
    first, in_shared = model.fields(2, shared=True)
    assert in_shared and worker_pb2.ComputeRequest.FromString(first).HasField("shared_model")
    assert model.fields(3, shared=True) == (first, True)  # another worker: the same model file
    again, in_shared = model.fields(2, shared=True)
    assert not in_shared
    np.testing.assert_array_equal(array_from_tensor(worker_pb2.ComputeRequest.FromString(again).model), params)
    assert model.fields(4, shared=False)[1] is False
    shared.close()
