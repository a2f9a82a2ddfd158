"""Whom a round expects to decode from (common.gather.primaries.Primaries), and the job option that turns backups
off."""

from __future__ import annotations

import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.base import Assignment
from gradcode.common.gather.primaries import START_SLACK_SECONDS, Primaries
from gradcode.master.pool import PoolWorker
from gradcode.master.rounds import sharing_a_machine
from gradcode.master.spec import (
    DEFAULT_BACKUP_PRIORITY,
    DEFAULT_MODEL_DELIVERY,
    DEFAULT_SURPLUS,
    MODEL_DELIVERIES,
    SURPLUS_MODES,
    JobSpecError,
    plan_job,
)
from tests.master.test_job_spec import spec


def test_the_first_round_expects_the_earliest_decoding_set_and_keeps_it_while_its_members_answer() -> None:
    code = make_code("binary", n=6, s=1)
    primaries = Primaries(code)
    first = primaries.choose(code.static_assignment(), range(6))
    assert first == {0, 2, 4}
    primaries.answered([0, 2, 4], 0.04)
    assert primaries.choose(code.static_assignment(), range(6)) is first


def test_a_primary_that_missed_the_round_becomes_a_backup() -> None:
    code = make_code("fractional", n=6, s=1)  # replica groups {0, 3}, {1, 4}, {2, 5}
    primaries = Primaries(code)
    assert primaries.choose(code.static_assignment(), range(6)) == {0, 1, 2}
    primaries.answered([1, 2, 3], 0.04)  # 0 was late; its replica 3 answered instead
    assert primaries.choose(code.static_assignment(), range(6)) == {1, 2, 3}
    primaries.answered([1, 2, 3], 0.04)
    assert primaries.choose(code.static_assignment(), range(6)) == {1, 2, 3}, "worker 0 stays a backup"


def test_only_askable_workers_are_expected_and_too_few_to_decode_are_all_expected() -> None:
    code = make_code("binary", n=6, s=1)
    primaries = Primaries(code)
    assert primaries.choose(code.static_assignment(), [1, 2, 3, 4, 5]) == {1, 2, 4}  # runs that tile the data
    assert primaries.choose(code.static_assignment(), [1, 3]) == {1, 3}, "not decodable: ask all alike"


def test_a_decoding_set_of_n_minus_s_workers_expects_everyone_unless_the_backups_hold() -> None:
    """Cyclic: any n - s workers decode, so its decoding sets are n - s: no backups, unless they hold their messages
    (they start on time and save the link s messages); the same for a tree's first layer. A set chosen for held
    backups is not reused for pushed ones."""
    code = make_code("cyclic", n=6, s=1)
    assignment = code.static_assignment()
    assert code.decoding_set(assignment, range(6)) == (0, 1, 2, 3, 4)
    primaries = Primaries(code)
    assert primaries.choose(assignment, range(6)) == set(range(6))
    assert primaries.choose(assignment, range(6), held=True) == {0, 1, 2, 3, 4}
    primaries.answered(range(6), 0.01)
    assert primaries.choose(assignment, range(6)) == set(range(6))
    tree = make_code("coded_reduce", n=4, s=1, L=2)
    assert Primaries(tree).choose(tree.static_assignment(), range(4), held=True) == {0, 1, 2}
    assert Primaries(tree).choose(tree.static_assignment(), range(4)) == set(range(4))


def test_a_new_assignment_gets_its_own_set() -> None:
    code = make_code("uncoded", n=3)
    primaries = Primaries(code)
    assert primaries.choose(code.static_assignment(), range(3)) == {0, 1, 2}
    primaries.answered([0, 1, 2], 0.04)
    two_rows = Assignment(((0,), (1, 2), ()))
    assert primaries.choose(two_rows, [0, 1]) == {0, 1}


def test_job_spec_backup_priority_defaults_to_low_and_is_validated() -> None:
    assert plan_job(spec()).backup_priority == DEFAULT_BACKUP_PRIORITY == "low"
    assert plan_job(spec(backup_priority="normal")).backup_priority == "normal"
    with pytest.raises(JobSpecError, match=r"JobSpec.backup_priority 'idle' is not a backup priority; valid ones are"):
        plan_job(spec(backup_priority="idle"))


def test_job_spec_surplus_defaults_to_auto_and_is_validated() -> None:
    assert plan_job(spec()).surplus == DEFAULT_SURPLUS == "auto"
    for mode in SURPLUS_MODES:
        assert plan_job(spec(surplus=mode)).surplus == mode
    refused = (
        r"JobSpec.surplus 'pull' is not a surplus mode; valid ones are \['push', 'hold', 'auto'\] \(empty: the default"
    )
    with pytest.raises(JobSpecError, match=refused):
        plan_job(spec(surplus="pull"))
    with pytest.raises(ValueError, match=r"JobSpec\.surplus"):  # a JobSpecError is a ValueError
        plan_job(spec(surplus="HOLD"))


def test_backups_are_deferred_only_on_a_machine_that_runs_another_worker_of_the_job() -> None:
    machines = ["m1", "m2", "m1", "", "", "m3", "m1"]  # "": unknown, a machine of its own
    workers = [PoolWorker(worker_id=10 + i, address=f"h:{i + 1}", machine_id=m) for i, m in enumerate(machines)]
    assert sharing_a_machine(workers) == {0, 2, 6}
    assert sharing_a_machine(workers[:2]) == set()


def test_the_hedge_is_twice_the_median_of_the_recent_gathers_and_a_second_before_any() -> None:
    primaries = Primaries(make_code("binary", n=6, s=1))
    assert primaries.hedge() == Primaries.FIRST_HEDGE_SECONDS
    for seconds in (0.04, 0.05, 9.0, 0.03, 0.045):  # one hung round does not move it far
        primaries.answered([0, 2, 4], seconds)
    assert primaries.hedge() == 2 * 0.045
    for _ in range(Primaries.HEDGE_HISTORY):
        primaries.answered([0, 2, 4], 0.5)
    assert primaries.hedge() == 1.0  # only the recent rounds count


def test_the_start_slack_is_the_median_spread_of_the_recent_rounds_where_every_expected_worker_began() -> None:
    """Before any spread, and while spreads are tiny, the fixed slack; then the median of the recent rounds' spreads
    (one long spread does not move it far); rounds where an expected worker never began teach nothing."""
    primaries = Primaries(make_code("fractional", n=6, s=1))
    assert primaries.start_slack() == START_SLACK_SECONDS
    primaries.answered([0, 2, 4], 0.1, start_spread=0.0005)
    assert primaries.start_slack() == START_SLACK_SECONDS
    for spread in (0.02, 0.03, 0.2, 0.04):
        primaries.answered([0, 2, 4], 0.1, start_spread=spread)
    assert primaries.start_slack() == 0.03
    for _ in range(10):
        primaries.answered([0, 2, 5], 0.2)  # a straggler covered: no spread
    assert primaries.start_slack() == 0.03
    for _ in range(Primaries.HEDGE_HISTORY):
        primaries.answered([0, 2, 4], 0.1, start_spread=0.01)
    assert primaries.start_slack() == 0.01  # only the recent rounds count


def test_job_spec_model_delivery_defaults_to_direct_and_is_validated() -> None:
    assert plan_job(spec()).model_delivery == DEFAULT_MODEL_DELIVERY == "direct"
    for mode in MODEL_DELIVERIES:
        assert plan_job(spec(model_delivery=mode)).model_delivery == mode
    refused = (
        r"JobSpec.model_delivery 'broadcast' is not a model delivery; valid ones are \['direct', 'relay', 'auto'\] "
        r"\(empty: the default, 'direct'\)"
    )
    with pytest.raises(ValueError, match=refused):  # a JobSpecError is a ValueError
        plan_job(spec(model_delivery="broadcast"))
    with pytest.raises(JobSpecError, match=r"JobSpec\.model_delivery 'Relay' is not"):
        plan_job(spec(model_delivery="Relay"))


def test_a_tree_code_may_relay_its_model_among_the_parents_of_its_first_layer() -> None:
    tree = {"n": 2, "s": 1, "L": 2}
    for mode in MODEL_DELIVERIES:
        assert plan_job(spec("coded_reduce", tree, model_delivery=mode)).model_delivery == mode
