"""The job simulator: hand-computable timelines, the codes' own decoders, the live delay models, trees, speed."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Observation
from gradcode.common.codes.coded_reduce import simulate_coded_reduce_latency
from gradcode.common.sim.simulate import Costs, IterationOutcome, _Delivery, broadcast_spread, simulate
from gradcode.common.sim.stragglers import DelayModel, FixedDelay, ShiftedExponential
from gradcode.common.transport.egress import LARGE_FRAME_BYTES


def test_uncoded_waits_for_every_worker_and_the_master_link_serialises_them() -> None:
    # 4 workers, each a quarter of the data; 1-byte messages over a 1 B/s master link, free worker links.
    costs = Costs(compute_seconds=1.0, message_bytes=1.0, master_bandwidth=1.0, broadcast=False)
    result = simulate(make_code("uncoded", n=4), costs, 3)
    assert result.seconds.tolist() == [0.25 + 4.0] * 3  # all ready at 0.25, then one second each
    assert result.master_bytes.tolist() == [4.0] * 3
    # the model down: four concurrent transfers share the link, all hold it at 4 s
    down = simulate(make_code("uncoded", n=4), Costs(compute_seconds=1.0, message_bytes=1.0, master_bandwidth=1.0), 1)
    assert down.seconds.tolist() == [4.0 + 0.25 + 4.0]
    assert down.master_bytes.tolist() == [8.0]


def test_per_message_overhead_and_decode_time_add_at_the_receiver() -> None:
    costs = Costs(compute_seconds=1.0, message_overhead=0.5, decode_seconds=0.125)
    assert simulate(make_code("uncoded", n=4), costs, 1).seconds.tolist() == [0.25 + 4 * 0.5 + 0.125]


def test_a_tolerated_straggler_costs_nothing_an_untolerated_one_costs_its_delay() -> None:
    costs = Costs(compute_seconds=1.0)
    delays = FixedDelay(10.0, workers=[2])
    fractional = simulate(make_code("fractional", n=4, s=1), costs, 2, delays)
    assert fractional.seconds.tolist() == [0.5, 0.5]  # load (s + 1) / n = 1/2, worker 2's partner answers
    assert all(2 in o.late for o in fractional.outcomes)
    uncoded = simulate(make_code("uncoded", n=4), costs, 2, delays)
    assert uncoded.seconds.tolist() == [10.25, 10.25]


def test_the_delays_are_the_live_models_draws_for_the_same_worker_and_iteration() -> None:
    model = FixedDelay(5.0, random_worker=True, num_workers=6, count=1, seed=7)
    result = simulate(make_code("fractional", n=6, s=1), Costs(compute_seconds=1.0), 20, model, first_iteration=3)
    for outcome in result.outcomes:
        (straggler,) = model.stragglers(outcome.iteration)
        assert straggler in outcome.late  # its group partner decoded in its place
        assert outcome.seconds == pytest.approx(2 / 6)
    assert [o.iteration for o in result.outcomes] == list(range(3, 23))


def test_the_decode_moment_is_the_codes_own_online_decoder_on_arrival_order() -> None:
    code = make_code("binary", n=8, s=2)
    delays = ShiftedExponential(0.0, 1.0, seed=3)
    result = simulate(code, Costs(), 30, delays)
    assignment = code.static_assignment()
    for outcome in result.outcomes:
        order = sorted(range(8), key=lambda w: delays.delay(w, outcome.iteration))
        decoder = code.decoder(assignment)
        first = next(i for i, w in enumerate(order) if any(decoder.add(r) for r in assignment.rows[w]))
        assert outcome.seconds == delays.delay(order[first], outcome.iteration)
        assert code.decodes(outcome.used, assignment)


def test_a_dynamic_code_gets_the_observation_of_the_previous_outcome() -> None:
    code = make_code("dynamic_clustered", n=12, clusters=4, load=2, clusters_per_worker=2)
    seen: list[IterationOutcome | None] = []

    def observe(iteration: int, last: IterationOutcome | None) -> Observation | None:
        seen.append(last)
        return None if last is None else Observation(straggling=tuple(w in last.late for w in range(12)))

    static = code.static_assignment()
    cluster_zero = sorted(static.owner[row] for row in range(code.cluster_size))[:2]  # load 2: tolerates one
    result = simulate(code, Costs(compute_seconds=1.0), 5, FixedDelay(1.0, workers=cluster_zero), observe=observe)
    assert seen[0] is None and seen[1:] == result.outcomes[:-1]
    # Algorithm 1 moves the two fixed stragglers of static cluster 0 apart from the second iteration on
    assert result.seconds[0] > result.seconds[-1] == pytest.approx(2 / 12)


def test_a_tree_matches_the_independent_monte_carlo_of_theorem_2s_model() -> None:
    """CodedReduce n = 3, s = 1, L = 2 in Theorem 2's model: our parents decode with the CompAlloc decoder, the
    Monte Carlo of coded_reduce.py counts n - s arrivals; the means agree (any n - s rows decode, fewer never)."""
    n, s, depth, d, a, mu, t_c = 3, 1, 2, 120.0, 0.01, 1.0, 0.05
    code = make_code("coded_reduce", n=n, s=s, L=depth)
    load = 1.0 / sum((n / (s + 1)) ** level for level in (1, 2))
    costs = Costs(compute_seconds=a * d, message_overhead=t_c, broadcast=False)
    delays = ShiftedExponential(0.0, mu, scale=load * d, seed=1)
    simulated = simulate(code, costs, 2000, delays).seconds.mean()
    reference = simulate_coded_reduce_latency(n, depth, s, d=d, a=a, mu=mu, t_c=t_c, iterations=20_000).mean()
    assert simulated == pytest.approx(reference, rel=0.04)


def test_costs_refuse_what_is_not_a_cost_and_round_trip_through_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compute_seconds"):
        Costs(compute_seconds=-1.0)
    with pytest.raises(ValueError, match="master_bandwidth"):
        Costs(master_bandwidth=0.0)
    with pytest.raises(ValueError, match="worker_speed"):
        Costs(worker_speed=(1.0, 0.0))
    with pytest.raises(ValueError, match=r"Unknown cost field\(s\) \['compute'\]"):
        Costs.from_mapping({"compute": 1.0})
    costs = Costs(compute_seconds=0.5, message_bytes=8e5, master_bandwidth=1e9, worker_speed=(1.0, 2.0))
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs.to_dict()))
    assert Costs.from_json(path) == costs
    with pytest.raises(ValueError, match="iterations"):
        simulate(make_code("uncoded", n=2), costs, 0)


def test_a_slower_host_computes_its_share_slower() -> None:
    costs = Costs(compute_seconds=1.0, worker_speed=(1.0, 1.0, 1.0, 0.5))
    assert simulate(make_code("uncoded", n=4), costs, 1).seconds.tolist() == [0.5]


def test_two_thousand_workers_simulate_in_seconds() -> None:
    """With the round's primaries (found again whenever a member is late): 0.1-0.6 s for the three iterations here;
    before decoding_set solved by the span, uncoded took 4 s and clustered 52 s per iteration."""
    costs = Costs(compute_seconds=1.0, message_bytes=8e5, worker_bandwidth=1.25e8, master_bandwidth=1.25e9)
    for code in (
        make_code("binary", n=2000, s=99),
        make_code("uncoded", n=2000),
        make_code("clustered", n=2000, clusters=200, load=3),
    ):
        for options in ({}, {"surplus": "hold", "model_delivery": "relay"}):
            started = time.perf_counter()
            result = simulate(code, costs, 3, ShiftedExponential(0.01, 10.0), **options)
            assert time.perf_counter() - started < 10.0, (code, options)
            assert np.all(np.isfinite(result.seconds)) and not math.isnan(result.summary()["median_seconds"])


def test_the_primaries_cross_the_masters_link_before_backups_ready_at_the_same_moment() -> None:
    code = make_code("binary", n=12, s=1)
    costs = Costs(message_bytes=1.0, master_bandwidth=1.0, broadcast=False)
    found = code.decoding_set(code.static_assignment(), list(range(12)))
    assert found is not None and len(found) < 11
    with_primaries = simulate(code, costs, 2)
    assert with_primaries.seconds.tolist() == [float(len(found))] * 2  # one second per message, the set first
    assert with_primaries.master_bytes.tolist() == [float(len(found))] * 2
    alike = simulate(code, costs, 2, primaries=False)
    assert alike.seconds[0] > len(found)  # fed in link (index) order, a complete class arrives later


def test_a_tree_parent_spends_its_own_decode_time_once_per_iteration() -> None:
    code = make_code("coded_reduce", n=3, s=1, L=2)
    base = Costs(compute_seconds=1.0)
    plain = simulate(code, base, 1).seconds[0]
    slow_parents = simulate(code, Costs(compute_seconds=1.0, parent_decode_seconds=0.5), 1).seconds[0]
    assert slow_parents == pytest.approx(plain + 0.5)
    with pytest.raises(ValueError, match="parent_decode_seconds"):
        Costs(parent_decode_seconds=-1.0)


def test_models_sent_at_once_end_together_on_a_fair_link_and_in_turns_on_a_queue() -> None:
    """Two 1-byte models over a 1 B/s master link, messages back the same way: shared fairly both models are in at
    2 s and the messages through at 3 and 4; in turns (spread 1) the first model is in at 1 s, its message through
    at 2 while the second model goes out, the second through at 3; half way the first is in at 1.5."""
    code = make_code("uncoded", n=2)
    seconds = [
        simulate(code, Costs(message_bytes=1.0, master_bandwidth=1.0, broadcast_spread=spread), 1).seconds[0]
        for spread in (0.0, 1.0, 0.5)
    ]
    assert seconds == [4.0, 3.0, 3.5]
    for wrong in (-0.1, 1.5, math.nan, True):
        with pytest.raises(ValueError, match="broadcast_spread"):
            Costs(broadcast_spread=wrong)


def test_the_spread_is_measured_back_from_the_transfers_ends() -> None:
    for spread in (0.0, 0.3, 1.0):
        ends = [2.0 * (1 - spread + spread * k / 8) for k in range(1, 9)]
        assert broadcast_spread(ends) == pytest.approx(spread)
    assert broadcast_spread([1.0, 2.0, 100.0]) == 1.0  # past one after another: clipped
    for wrong in ([1.0], [0.0, 0.0], [1.0, math.inf]):
        with pytest.raises(ValueError, match=r"(?i)transfer"):
            broadcast_spread(wrong)


# Fractional n = 4, s = 1: workers {0, 2} and {1, 3} hold the same partitions; the round expects {0, 1}. Each computes
# its half of the data in 1 s; 1-byte messages through a 1 B/s master link; no model down.
_HALVES = Costs(compute_seconds=2.0, message_bytes=1.0, master_bandwidth=1.0, broadcast=False)


def test_a_held_backup_is_pulled_for_an_expected_worker_that_has_not_begun_and_saves_the_link_a_message() -> None:
    """Expected worker 1 is delayed 10 s before it begins. Pushed, both backups' messages (ready at 1 s) follow 0's:
    through at 2, 3, 4, decodable with 3's at 4 s. Held, 3 is pulled once the other expected worker began
    (start_overdue: 3 ms later), the only backup that completes 0's: through at 2 and 3."""
    code = make_code("fractional", n=4, s=1)
    delays = FixedDelay(10.0, workers=[1])
    pushed = simulate(code, _HALVES, 2, delays)
    held = simulate(code, _HALVES, 2, delays, surplus="hold")
    assert pushed.seconds.tolist() == [4.0, 3.0] and pushed.master_bytes.tolist() == [3.0, 2.0]
    assert held.seconds.tolist() == [3.0, 3.0] and held.master_bytes.tolist() == [2.0, 2.0]
    # (the second round expects {0, 3}, who answered the first, as the master's Primaries would)
    assert simulate(code, _HALVES, 1, surplus="hold").master_bytes.tolist() == [2.0]  # on time: none pulled
    with pytest.raises(ValueError, match="'surplus' must be one of push, hold"):
        simulate(code, _HALVES, 1, surplus="auto")


def test_a_late_start_every_round_is_learnt_and_stops_pulling_held_backups_after_the_first() -> None:
    """Fractional n = 6, s = 1, the round expecting {0, 1, 2}: expected worker 2 begins 60 ms after the others in
    every round (as a model relayed to it arrives later) and 1 computes at half speed. The first round knows no
    better than the fixed slack: 5 is pulled for 2 and its message crosses ahead of 2's and 1's (four messages,
    4.67 s). From then on 60 ms is the learnt slack (Primaries.start_slack, as the master's): 2 is not late, three
    messages, 3.67 s."""
    code = make_code("fractional", n=6, s=1)
    slow_one = dataclasses.replace(_HALVES, worker_speed=(1.0, 0.5, 1.0, 1.0, 1.0, 1.0))
    late_start = FixedDelay(0.06, workers=[2])
    held = simulate(code, slow_one, 3, late_start, surplus="hold")
    assert held.master_bytes.tolist() == [4.0, 3.0, 3.0]
    assert held.seconds.tolist() == pytest.approx([4 + 2 / 3, 3 + 2 / 3, 3 + 2 / 3])
    assert [o.used for o in held.outcomes] == [(0, 1, 5), (0, 1, 2), (0, 1, 2)]


def test_a_held_backup_is_pulled_at_twice_the_time_to_the_last_expected_worker_that_finished() -> None:
    """Expected worker 1 began but computes at a quarter speed (ready at 4 s). Pushed, the backups' messages follow
    0's (through at 2 s): decodable with 3's at 4 s, three messages. Held, nothing says 2 is late until twice 0's
    2 s: 3 is pulled at 4 s, and 1's own message, expected, crosses first at 5 s: two messages."""
    code = make_code("fractional", n=4, s=1)
    slow = dataclasses.replace(_HALVES, worker_speed=(1.0, 0.25, 1.0, 1.0))
    pushed = simulate(code, slow, 1)
    held = simulate(code, slow, 1, surplus="hold")
    assert (pushed.seconds.tolist(), pushed.master_bytes.tolist()) == ([4.0], [3.0])
    assert (held.seconds.tolist(), held.master_bytes.tolist()) == ([5.0], [2.0])


class _SlowHost(DelayModel):
    """Worker 1 takes 10 s longer, all of it computing (a slow host, as the planner's fitted excess): it has begun."""

    name = "slow-host"

    def _delay(self, worker_id: int, iteration: int) -> float:
        return 10.0 if worker_id == 1 else 0.0

    def _mean(self) -> float:
        return 2.5

    def parts(self, worker_id: int, iteration: int) -> tuple[float, float]:
        return 0.0, self.delay(worker_id, iteration)


def test_a_delay_spent_computing_is_covered_by_the_pull_rule_not_by_the_start_rule() -> None:
    """The same 10 s on expected worker 1: slept before it begins, 3 is pulled at once (3 s, as above); spent
    computing, 1 has begun, so 3 is pulled only at twice 0's 2 s, through at 5 s. Pushed, both end at 4 s."""
    code = make_code("fractional", n=4, s=1)
    asleep = simulate(code, _HALVES, 1, FixedDelay(10.0, workers=[1]), surplus="hold")
    computing = simulate(code, _HALVES, 1, _SlowHost(), surplus="hold")
    assert (asleep.seconds.tolist(), computing.seconds.tolist()) == ([3.0], [5.0])
    assert computing.master_bytes.tolist() == [2.0]
    assert simulate(code, _HALVES, 1, _SlowHost()).seconds.tolist() == [4.0]


def test_a_trees_held_surplus_node_crosses_the_masters_link_only_when_pulled() -> None:
    """CodedReduce n = 3, s = 1, L = 2: the master expects 2 of its 3 first-layer nodes. Held, on time, it receives
    2 messages a round (pushed, the third is through before the decode at the tie's end of the queue too, but the
    straggling case tells them apart): with first-layer node 0 delayed 10 s, the held surplus node is pulled and the
    round ends long before the delay."""
    code = make_code("coded_reduce", n=3, s=1, L=2)
    costs = Costs(compute_seconds=1.0, message_bytes=1.0, master_bandwidth=1.0, broadcast=False)
    held = simulate(code, costs, 3, surplus="hold")
    assert held.master_bytes.tolist() == [2.0] * 3
    late = simulate(code, costs, 3, FixedDelay(10.0, workers=[0]), surplus="hold")
    assert late.master_bytes.tolist() == [2.0] * 3 and late.seconds.max() < 10.0


def test_a_relayed_model_crosses_the_masters_link_once_and_reaches_the_others_in_hops() -> None:
    """Uncoded n = 6, 1-byte models, a 10 B/s master link and 1 B/s worker links. Direct: every worker holds the
    model at 1 s (its own link), messages through by 2.5 s. Relayed: the seed at 1 s; its three fetchers share its
    link, holding it at 4 s; the last two fetch from worker 1 at 6 s; their messages through at 7 and 7.1 s. A hop
    that costs 0.25 s besides its bytes adds it per hop. The master sends one model instead of six."""
    code = make_code("uncoded", n=6)
    costs = Costs(message_bytes=1.0, master_bandwidth=10.0, worker_bandwidth=1.0)
    direct = simulate(code, costs, 1)
    relayed = simulate(code, costs, 1, model_delivery="relay")
    slow_hops = simulate(code, dataclasses.replace(costs, relay_hop_seconds=0.25), 1, model_delivery="relay")
    assert direct.seconds.tolist() == [pytest.approx(2.5)] and direct.master_bytes.tolist() == [12.0]
    assert relayed.seconds.tolist() == [pytest.approx(7.1)] and relayed.master_bytes.tolist() == [7.0]
    assert slow_hops.seconds.tolist() == [pytest.approx(7.6)]
    with pytest.raises(ValueError, match="'model_delivery' must be one of direct, relay"):
        simulate(code, costs, 1, model_delivery="auto")
    with pytest.raises(ValueError, match="relay_hop_seconds"):
        Costs(relay_hop_seconds=-1.0)


def test_a_trees_first_layer_relays_the_model() -> None:
    code = make_code("coded_reduce", n=3, s=1, L=2)
    costs = Costs(compute_seconds=1.0, message_bytes=1.0, master_bandwidth=1.0, worker_bandwidth=10.0)
    direct = simulate(code, costs, 2, surplus="hold")
    relayed = simulate(code, costs, 2, surplus="hold", model_delivery="relay")
    assert relayed.master_bytes.tolist() == [1.0 + 2.0] * 2 and direct.master_bytes.tolist() == [3.0 + 2.0] * 2
    assert relayed.seconds[0] < direct.seconds[0]  # the master's link carries one model, not three


def test_models_sent_in_turn_reach_the_expected_workers_first_and_a_rounds_unsent_models_delay_the_next() -> None:
    """gradcode's links send large models one at a time (``broadcast_spread`` 1), the expected workers' first; a
    round that decodes before its backups' models have left hands the rest of its sends to the next round."""
    code = make_code("fractional", n=4, s=1)
    costs = Costs(message_bytes=1.0, master_bandwidth=1.0, broadcast_spread=1.0)  # a model or a message: 1 s
    # the expected pair's models are in at 1 and 2 s and their messages through at 2 and 3 s, while the backups'
    # models leave until 4 s: every round after the first starts its sends 1 s late
    assert simulate(code, costs, 4, surplus="hold").seconds.tolist() == [3.0, 4.0, 4.0, 4.0]
    # shared fairly, the four models end together at 4 s and nothing is left for the next round
    fair = dataclasses.replace(costs, broadcast_spread=0.0)
    assert simulate(code, fair, 4, surplus="hold").seconds.tolist() == [6.0] * 4
    delivery = _Delivery("direct", costs, 1.0)
    assert delivery.holds([0, 1, 2, 3], first={1, 3}) == {1: 1.0, 3: 2.0, 0: 3.0, 2: 4.0}
    delivery.answered([1, 3], 2.5)
    assert delivery.holds([0, 1, 2, 3], first={0, 2}) == {0: 2.5, 2: 3.5, 1: 4.5, 3: 5.5}
    delivery.answered([0, 2], 6.0)  # everything left before the round ended
    assert delivery.holds([0, 1], first={0}) == {0: 1.0, 1: 2.0}


def test_unless_told_otherwise_models_go_down_as_gradcodes_links_send_them() -> None:
    """A model of LARGE_FRAME_BYTES or more waits for its turn on a link (spread 1); a smaller one shares it (0): the
    timelines of the test above, [3, 4, 4, 4] s in turn and 6 s a round shared."""
    code = make_code("fractional", n=4, s=1)
    large = float(LARGE_FRAME_BYTES)
    for size, links, timeline in ((large, 1.0, [3.0, 4.0, 4.0, 4.0]), (large - 1.0, 0.0, [6.0] * 4)):
        default = Costs(message_bytes=size, master_bandwidth=size)  # a model or a message: 1 s on the master's link
        assert default.down_spread == links and default.broadcast_spread is None
        for told in (0.0, 0.5, 1.0):
            assert dataclasses.replace(default, broadcast_spread=told).down_spread == told
        assert simulate(code, default, 4, surplus="hold").seconds.tolist() == timeline


def test_relayed_fetches_end_as_their_own_spread_says() -> None:
    """A peer serves its fetchers at once over gRPC, not in turn: ``relay_spread``, apart from the links'."""
    costs = Costs(message_bytes=1.0, master_bandwidth=1.0, worker_bandwidth=1.0, broadcast_spread=1.0, relay_spread=0.0)
    # the seed (0) has the model at 1 s; 1, 2 and 3 fetch it from the seed
    assert _Delivery("relay", costs, 1.0).holds([0, 1, 2, 3]) == {0: 1.0, 1: 4.0, 2: 4.0, 3: 4.0}
    in_turn = _Delivery("relay", dataclasses.replace(costs, relay_spread=None), 1.0)  # None: as the broadcasts
    assert in_turn.holds([0, 1, 2, 3]) == {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
    for wrong in (-0.1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="relay_spread"):
            Costs(relay_spread=wrong)  # type: ignore[arg-type]
