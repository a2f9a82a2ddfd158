"""The round's online gather loop over in-process streams (the gRPC path is covered end to end)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from gradcode.common.codes import make_code
from gradcode.common.round import Round, Source
from gradcode.common.wire import message_chunks
from gradcode.v1 import worker_pb2


class _FakeStream:
    """Yields one worker's chunks after a delay; records whether it was cancelled."""

    def __init__(self, chunks: list[worker_pb2.GradientChunk], delay: float, fail: bool = False) -> None:
        self.chunks, self.delay, self.fail, self.cancelled = chunks, delay, fail, False

    def __aiter__(self) -> AsyncIterator[worker_pb2.GradientChunk]:
        return self._run()

    async def _run(self) -> AsyncIterator[worker_pb2.GradientChunk]:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ConnectionError("worker died")
        for c in self.chunks:
            yield c

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_decodes_from_fastest_and_cancels_the_rest() -> None:
    code = make_code("ignore_stragglers", n=4, s=1)  # counting decoder: any 3 of 4
    g = np.random.default_rng(1).standard_normal((4, 50))
    delays = [0.0, 0.01, 5.0, 0.02]
    streams = [
        _FakeStream(list(message_chunks(g[w], job_id="j", iteration=0, worker_id=w, row=w)), delays[w], fail=w == 1)
        for w in range(4)
    ]
    sources = [Source(w, (w,), lambda w=w: streams[w]) for w in range(4)]  # type: ignore[misc]
    result = Round(code.decoder(), job_id="j", iteration=0, length=50)
    await result.gather(sources, timeout=2.0)
    assert result.decoding is None and result.failed.keys() == {1}  # worker 2 never came in time
    assert result.timed_out

    streams = [
        _FakeStream(list(message_chunks(g[w], job_id="j", iteration=0, worker_id=w, row=w)), delays[w])
        for w in range(4)
    ]
    sources = [Source(w, (w,), lambda w=w: streams[w]) for w in range(4)]  # type: ignore[misc]
    result = Round(code.decoder(), job_id="j", iteration=0, length=50)
    async with asyncio.timeout(2.0):
        await result.gather(sources, timeout=10.0)
    assert result.decoding is not None
    assert result.used_workers == [0, 1, 3]
    assert result.late == [2]
    assert not streams[2].cancelled  # not before the caller's own synchronous work (decode, step) ...
    await asyncio.sleep(0)
    assert streams[2].cancelled  # ... but before anything else runs
    np.testing.assert_allclose(result.combine(), g[[0, 1, 3]].sum(axis=0) * 4 / 3)


async def test_a_second_gather_keeps_what_arrived_and_failures_are_typed() -> None:
    """The master's retry: the round keeps the messages and timings of its first gather; a failure that
    is not a gRPC status says which exception it was, and a worker that delivers later is no longer failed."""
    code = make_code("ignore_stragglers", n=4, s=1)  # any 3 of 4
    g = np.random.default_rng(2).standard_normal((4, 50))

    def stream(w: int, fail: bool = False) -> _FakeStream:
        return _FakeStream(list(message_chunks(g[w], job_id="j", iteration=0, worker_id=w, row=w)), 0.0, fail=fail)

    round_ = Round(code.decoder(), job_id="j", iteration=0, length=50)
    first = {0: stream(0), 1: stream(1, fail=True)}
    failures = await round_.gather([Source(w, (w,), lambda w=w: first[w]) for w in first])  # type: ignore[misc]
    assert not round_.decodable and set(round_.finished) == {0} and set(failures) == set(round_.failed) == {1}
    failure = round_.failed[1]
    assert (
        failure.status is None and failure.error == "ConnectionError" and str(failure) == "ConnectionError: worker died"
    )
    second = {1: stream(1), 2: stream(2)}
    await round_.gather([Source(w, (w,), lambda w=w: second[w]) for w in second])  # type: ignore[misc]
    assert round_.decodable and set(round_.finished) == {0, 1, 2} and not round_.failed
    decoded = round_.decode()
    assert not decoded.exact  # ignore_stragglers rescales the survivors: an approximate scheme
    assert decoded.used_workers == [0, 1, 2] and decoded.decode_seconds >= 0
    np.testing.assert_allclose(decoded.vector, g[[0, 1, 2]].sum(axis=0) * 4 / 3)
    np.testing.assert_array_equal(round_.combine(), decoded.vector)  # decoding never changes the round


async def test_float32_messages_are_exact_only_where_the_survivors_certify_the_float32_tolerance() -> None:
    """Cyclic (n=6, s=2) is exact by construction from any 4 rows, but rows {1, 2, 4, 5} decode with
    weights summing to ~300 in absolute value: at float32 precision their bound exceeds the tolerance,
    so that decode must say it is not exact, while a well-conditioned set of survivors is exact."""
    code = make_code("cyclic", n=6, s=2)
    g = np.random.default_rng(7).standard_normal((6, 400))
    total = g.sum(axis=0)
    float32 = (np.dtype("<f4"),)
    for slow, expect_exact in (((0, 3), False), ((2, 4), True)):
        streams = [
            _FakeStream(
                list(
                    message_chunks(
                        code.encode(w, {j: g[j] for j in code.support(w)}).astype(np.float32),
                        job_id="j",
                        iteration=0,
                        worker_id=w,
                        row=w,
                    )
                ),
                5.0 if w in slow else 0.0,
            )
            for w in range(6)
        ]
        sources = [Source(w, (w,), lambda stream=stream: stream) for w, stream in enumerate(streams)]  # type: ignore[misc]
        result = Round(code.decoder(), job_id="j", iteration=0, length=400, dtypes=float32)
        await asyncio.wait_for(result.gather(sources, timeout=10.0), 4.0)
        decoded = result.decode()
        assert decoded.used_workers == sorted(set(range(6)) - set(slow))
        error = float(np.linalg.norm(decoded.vector - total) / np.linalg.norm(total))
        assert error <= decoded.error_bound  # the certificate covers the float32 rounding either way
        assert decoded.exact is expect_exact, (slow, decoded.error_bound)
        assert (decoded.error_bound <= result.tolerance) is expect_exact


async def test_a_refusal_that_arrived_with_the_decodable_message_is_still_reported() -> None:
    """Worker 3's failure is queued behind the message that makes the round decodable: it is a failure (a
    restarted worker's NOT_FOUND is how the master learns to reload it), not a late worker."""
    code = make_code("ignore_stragglers", n=4, s=1)  # any 3 of 4
    g = np.random.default_rng(3).standard_normal((4, 50))
    streams = [
        _FakeStream(list(message_chunks(g[w], job_id="j", iteration=0, worker_id=w, row=w)), 0.0, fail=w == 3)
        for w in range(4)
    ]
    round_ = Round(code.decoder(), job_id="j", iteration=0, length=50)
    failures = await round_.gather([Source(w, (w,), lambda w=w: streams[w]) for w in range(4)])  # type: ignore[misc]
    assert round_.decodable and round_.used_workers == [0, 1, 2]
    assert set(failures) == set(round_.failed) == {3} and round_.late == []
    assert str(round_.failed[3]) == "ConnectionError: worker died"
