"""The master's once-per-iteration model serialization yields exactly the ComputeRequest a worker expects."""

import numpy as np

from gradcode.common.wire import array_from_tensor, tensor_from_array
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
