"""Every decode certified, surplus messages checked (issue 10): the round and the master's policy, in process.

The gather runs over in-process streams of real chunks (the gRPC path is covered end to end in
``tests/e2e/test_integrity.py``); messages are formed by the code's own ``encode`` from partial
gradients, and a wrong worker sends well-formed, checksum-valid chunks of wrong values.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from gradcode.client.history import format_summary
from gradcode.common.codes import GradientCode, make_code
from gradcode.common.codes.numerics import contiguous_survivor_sets, relative_error
from gradcode.common.gather.integrity import DEFAULT_INTEGRITY, QUARANTINE_AFTER, IntegrityPolicy
from gradcode.common.gather.round import Round, Source
from gradcode.common.training.models import TrainingMetrics
from gradcode.common.transport.wire import message_chunks
from gradcode.master.reporting import iteration_report
from gradcode.master.spec import JobSpecError, plan_job
from gradcode.v1 import master_pb2
from tests.common.test_round import _FakeStream
from tests.master.test_job_spec import spec

P = 40


def partials(code: GradientCode, seed: int, *, outlier: int | None = None) -> np.ndarray:
    g = np.random.default_rng(seed).standard_normal((code.k, P))
    if outlier is not None:
        g[outlier] *= 1e4
    return g


def sources(
    code: GradientCode,
    g: np.ndarray,
    *,
    iteration: int = 0,
    delays: dict[int, float] | None = None,
    wrong: dict[int, float] | None = None,
    workers: list[int] | None = None,
) -> tuple[list[Source], list[_FakeStream]]:
    """One source per worker (one row each), reporting its magnitude as workers do; ``wrong[w]`` scales worker w's
    message (well-formed, wrong)."""
    delays, wrong = delays or {}, wrong or {}
    streams = []
    for w in range(code.n):
        message = code.encode(w, {j: g[j] for j in code.support(w)}) * wrong.get(w, 1.0)
        magnitude = float(np.abs(code.coefficients(w)) @ np.linalg.norm(g[list(code.support(w))], axis=1))
        chunks = list(message_chunks(message, job_id="j", iteration=iteration, worker_id=w, row=w, magnitude=magnitude))
        streams.append(_FakeStream(chunks, delays.get(w, 0.001 * w)))
    chosen = range(code.n) if workers is None else workers
    return [Source(w, (w,), lambda w=w: streams[w]) for w in chosen], streams  # type: ignore[misc]


# ---- the certificate ---------------------------------------------------------------------------------
async def test_every_decode_carries_a_certificate_that_covers_the_true_error() -> None:
    code = make_code("cyclic", n=6, s=2)
    g = partials(code, 1)
    round_ = Round(code.decoder(), job_id="j", iteration=0, length=P)
    await round_.gather(sources(code, g)[0])
    decoded = round_.decode()
    true = relative_error(decoded.vector, g.sum(axis=0))
    assert true <= decoded.error_bound <= 1e-12 and decoded.exact


async def test_statistics_stay_out_of_the_certificate() -> None:
    """The certificate covers the first ``certified_length`` elements (the gradient), not the appended loss."""
    code = make_code("binary", n=4, s=1)
    g = partials(code, 2)
    g[:, -2:] = 1e12  # huge "statistics" coordinates would otherwise dominate the norms
    full = Round(code.decoder(), job_id="j", iteration=0, length=P)
    await full.gather(sources(code, g)[0])
    gradient_only = Round(code.decoder(), job_id="j", iteration=0, length=P, certified_length=P - 2)
    await gradient_only.gather(sources(code, g)[0])
    a, b = full.decode(), gradient_only.decode()
    assert relative_error(b.vector[: P - 2], g.sum(axis=0)[: P - 2]) <= b.error_bound
    assert b.error_bound != a.error_bound


async def test_reed_solomon_outlier_partition_is_not_reported_exact() -> None:
    """Issue 10 at the report level: RS n=k=128, w=5, one partition 1e4x the others, a contiguous survivor
    set: the decoder calls it exact by construction, the report must not."""
    # Refused by its guard since issue 24; built unguarded to show the certificate still labels it.
    code = make_code("reed_solomon", n=128, k=128, w=5, max_decode_error=math.inf)
    found = False
    for start, outlier in [(s, o) for s in range(0, 128, 16) for o in (0, 64)]:
        g = partials(code, start + outlier, outlier=outlier)
        survivors = contiguous_survivor_sets(code.n, code.n - code.s)[start]
        srcs, _ = sources(code, g, workers=survivors)
        round_ = Round(code.decoder(), job_id="j", iteration=0, length=P, dtypes=(np.dtype("<c16"),))
        await round_.gather(srcs)
        decoded = round_.decode()
        assert round_.decoding is not None and round_.decoding.exact
        true = relative_error(decoded.vector, g.sum(axis=0))
        assert decoded.error_bound >= true
        if true > 1e-9:
            found = True
            report = iteration_report(
                "j", 1, round_, decoded, asked=survivors, pool_ids=list(range(code.n)), wall_seconds=0.0,
                elapsed_seconds=0.0, verify_error=-1.0,
                training=TrainingMetrics(decoded.vector, 0.0, 0.0, math.nan, math.nan),
            )  # fmt: skip
            assert not report.exact and report.error_bound == decoded.error_bound > 1e-9
    assert found, "no survivor set reproduced the reported error above 1e-9"


# ---- the policies ------------------------------------------------------------------------------------
async def gathered(policy: IntegrityPolicy, code: GradientCode, srcs: list[Source], iteration: int = 0) -> Round:
    round_ = Round(code.decoder(), job_id="j", iteration=iteration, length=P)
    enough = policy.wait_rules(round_, code.static_assignment())
    await asyncio.wait_for(round_.gather(srcs, timeout=30.0, strategies=enough), 10)
    await asyncio.sleep(0)  # the late streams are cancelled once the caller yields (Round.gather), not before
    return round_


async def test_off_stops_at_the_first_decodable_set_and_checks_nothing() -> None:
    code = make_code("cyclic", n=6, s=2)
    policy = IntegrityPolicy("off", code)
    round_ = await gathered(policy, code, sources(code, partials(code, 3), wrong={0: 1e3})[0])
    assert len(round_.messages) == 4 and policy.judge(round_, code.static_assignment()) == []
    assert round_.integrity.checks == 0 and round_.decode().exact  # nothing can see the wrong message


async def test_detect_waits_for_one_more_message_and_labels_a_violation() -> None:
    code = make_code("cyclic", n=6, s=2)
    policy = IntegrityPolicy("detect", code)
    srcs, streams = sources(code, partials(code, 4), wrong={1: 1e3}, delays={5: 20.0})
    round_ = await gathered(policy, code, srcs)
    assert sorted(round_.messages) == [0, 1, 2, 3, 4] and streams[5].cancelled  # one more, not all
    assert policy.judge(round_, code.static_assignment()) == []
    assert round_.integrity.checks == 1 and not round_.integrity.trusted
    assert 1 in round_.integrity.suspects and "violation" in round_.integrity.note
    assert not round_.decode().exact


async def test_detect_on_honest_messages_is_consistent_and_exact() -> None:
    code = make_code("cyclic", n=6, s=2)
    policy = IntegrityPolicy("detect", code)
    g = partials(code, 5)
    round_ = await gathered(policy, code, sources(code, g, delays={5: 20.0})[0])
    policy.judge(round_, code.static_assignment())
    assert round_.integrity.checks == 1 and round_.integrity.trusted and round_.integrity.suspects == ()
    decoded = round_.decode()
    assert decoded.exact and relative_error(decoded.vector, g.sum(axis=0)) <= decoded.error_bound


async def test_locate_decodes_around_the_culprit_and_quarantines_a_repeat_offender() -> None:
    """s = 3: three relations, so no pair of other workers explains the violations (two colluders could not
    have framed worker 2); with s = 2 see ``test_locate_quarantines_nobody_when_two_colluders_would_explain_it``."""
    code = make_code("cyclic", n=6, s=3)
    policy = IntegrityPolicy("locate", code)
    for t in range(1, QUARANTINE_AFTER + 1):
        g = partials(code, 10 + t)
        round_ = await gathered(policy, code, sources(code, g, iteration=t, wrong={2: 1.5})[0], iteration=t)
        quarantine = policy.judge(round_, code.static_assignment())
        assert round_.integrity.suspects == (2,) and round_.integrity.trusted, round_.integrity
        decoded = round_.decode()
        assert 2 not in decoded.used_workers and decoded.exact
        assert relative_error(decoded.vector, g.sum(axis=0)) <= decoded.error_bound <= 1e-9
        assert quarantine == ([2] if t == QUARANTINE_AFTER else [])
    assert "iterations [1, 2]" in policy.quarantined[2]


async def test_locate_on_honest_messages_stops_once_every_message_is_checked() -> None:
    code = make_code("cyclic", n=6, s=2)
    policy = IntegrityPolicy("locate", code)
    srcs, streams = sources(code, partials(code, 6), delays={5: 20.0})
    round_ = await gathered(policy, code, srcs)
    policy.judge(round_, code.static_assignment())
    assert len(round_.messages) == 5 and streams[5].cancelled and round_.integrity.trusted


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="valid policies are"):
        IntegrityPolicy("paranoid", make_code("cyclic", n=6, s=2))


def test_job_spec_integrity_defaults_and_is_validated() -> None:
    assert plan_job(spec()).integrity == DEFAULT_INTEGRITY == "off"
    assert plan_job(spec(integrity="locate")).spec.integrity == "locate"
    with pytest.raises(JobSpecError, match=r"JobSpec.integrity .paranoid. is not a consistency policy; valid ones are"):
        plan_job(spec(integrity="paranoid"))


async def test_a_bound_above_the_tolerance_is_not_exact() -> None:
    """What a tree parent forwards as approximate: its round's certified bound over the job's tolerance."""
    code = make_code("cyclic", n=6, s=2)
    round_ = Round(code.decoder(), job_id="j", iteration=0, length=P, tolerance=1e-20)
    await round_.gather(sources(code, partials(code, 8))[0])
    decoded = round_.decode()
    assert round_.decoding is not None and round_.decoding.exact
    assert 1e-20 < decoded.error_bound <= 1e-9 and not decoded.exact


def test_cli_summary_quotes_the_worst_certified_error_and_the_flagged_workers() -> None:
    reports = [
        master_pb2.IterationReport(iteration=1, wall_seconds=0.01, exact=True, error_bound=2e-15, verify_error=-1),
        master_pb2.IterationReport(
            iteration=2, wall_seconds=0.01, exact=False, error_bound=3e-14, verify_error=-1, suspect_workers=[4]
        ),
    ]
    line = format_summary("cyclic", reports)
    assert "APPROXIMATE" in line and "worst certified error 3.0e-14" in line and "flagged workers [4]" in line


async def test_a_tree_parents_certified_error_is_added_to_the_receivers_bound() -> None:
    """A parent passes up the absolute error bound of its message (trailer ``decode_error``); the receiver's
    certificate takes it, with the message's decoding weight, in place of its own bound of that message's
    rounding (issue 24: the sender knows how its message was formed)."""
    code = make_code("cyclic", n=6, s=2)
    g = partials(code, 9)
    plain = Round(code.decoder(), job_id="j", iteration=0, length=P)
    await plain.gather(sources(code, g)[0])
    base = plain.decode()
    assert plain.decoding is not None
    streams = []
    for w in range(code.n):
        message = code.encode(w, {j: g[j] for j in code.support(w)})
        inherited = 1e-6 * float(np.linalg.norm(message)) if w == 0 else 0.0
        magnitude = float(np.abs(code.coefficients(w)) @ np.linalg.norm(g[list(code.support(w))], axis=1))
        chunks = list(
            message_chunks(
                message, job_id="j", iteration=0, worker_id=w, row=w, decode_error=inherited, magnitude=magnitude
            )
        )
        streams.append(_FakeStream(chunks, 0.001 * w))
    parented = Round(code.decoder(), job_id="j", iteration=0, length=P)
    await parented.gather([Source(w, (w,), lambda w=w: streams[w]) for w in range(code.n)])  # type: ignore[misc]
    decoded = parented.decode()
    assert parented.messages[0].decode_error > 0
    weight = abs(parented.decoding.weights[parented.decoding.rows.index(0)]) if parented.decoding else 0.0
    inherited = weight * parented.messages[0].decode_error
    assert inherited <= decoded.absolute_error <= base.absolute_error + inherited
    assert decoded.absolute_error > base.absolute_error
    assert decoded.error_bound > 1e-9 and not decoded.exact
