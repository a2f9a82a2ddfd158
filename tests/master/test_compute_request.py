"""The master's once-per-iteration model serialization yields exactly the ComputeRequest a worker expects."""

from pathlib import Path

import numpy as np
import pytest

from gradcode.common.gather.delivery import RELAY_MIN_WORKERS, relays
from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.common.transport.wire import array_from_tensor, model_digest, tensor_from_array
from gradcode.master.rounds import RELAY_SUSPEND_ITERATIONS, RelayOrder, _ModelRequest
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


def test_a_relayed_iteration_sends_the_model_inline_to_its_seed_and_a_checked_reference_to_the_others() -> None:
    """Worker j of the relay order fetches from worker (j - 1) // 3; a worker asked again gets the model inline."""
    params = np.random.default_rng(0).standard_normal(100)
    model = _ModelRequest(7, params, None, lambda p: (f"10.0.0.{p}:50051", f"token-of-{p}"))
    order = [5, 0, 4, 1, 3, 2, 6]
    model.relay(order)
    assert array_from_tensor(worker_pb2.ComputeRequest.FromString(model.fields(5, shared=False)[0]).model).size == 100
    peers, hops = {}, {}
    for w in order[1:]:
        body, in_shared = model.fields(w, shared=False)
        relayed = worker_pb2.ComputeRequest.FromString(body).relayed_model
        assert not in_shared and len(body) < 128
        assert (relayed.length, relayed.digest) == (100, model_digest(params))
        peers[w], hops[w] = int(relayed.address.split(".")[-1].split(":")[0]), relayed.hops
        assert relayed.bearer == f"token-of-{peers[w]}"
    assert peers == {0: 5, 4: 5, 1: 5, 3: 0, 2: 0, 6: 0}
    assert hops == {0: 1, 4: 1, 1: 1, 3: 2, 2: 2, 6: 2}, "each waits for the fetches before its own"
    assert model.upstream(0) == [0, 5] and model.upstream(5) == [5]
    assert model.inline(3, 5) == [0]  # 5 (the seed) was inline already
    assert not model.relayed(3) and worker_pb2.ComputeRequest.FromString(model.fields(3, shared=False)[0]).HasField(
        "model"
    )
    assert model.upstream(3) == [3, 0, 5], "the plan is kept for blame"


@pytest.mark.parametrize(
    ("mode", "network", "relayed"),
    [
        ("direct", 12, False),
        ("relay", 1, False),  # nobody to relay to
        ("relay", 2, True),
        ("auto", RELAY_MIN_WORKERS - 1, False),
        ("auto", RELAY_MIN_WORKERS, True),
    ],
)
def test_a_round_relays_only_to_enough_workers_over_the_network(mode: str, network: int, relayed: bool) -> None:
    assert relays(mode, network=network) is relayed
    # a tree's first layer relays when asked, never by "auto" (its seed parent's CPU made it slower)
    assert relays(mode, network=network, tree=True) is (relayed and mode == "relay")


def test_the_relay_order_puts_the_fastest_first_and_blamed_peers_last() -> None:
    order = RelayOrder()
    assert order.order([3, 1, 2], iteration=1) == [1, 2, 3], "no answer times yet: by index"
    order.answered({3: 0.01, 2: 0.02, 0: 0.5})  # 1 did not answer (frozen, or a backup never pulled)
    assert order.order([0, 1, 2, 3], iteration=2) == [3, 2, 0, 1]
    order.blame(3, iteration=2)
    assert order.order([0, 1, 2, 3], iteration=2 + RELAY_SUSPEND_ITERATIONS) == [2, 0, 1, 3]
    assert order.order([0, 1, 2, 3], iteration=3 + RELAY_SUSPEND_ITERATIONS) == [3, 2, 0, 1], "served its time"
