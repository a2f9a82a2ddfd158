"""worker.compute without gRPC: job assembly and validation, coded messages, caching, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from gradcode.common.codes import make_code
from gradcode.common.codes.numerics import RowProfile, bound_combination, unit_roundoff
from gradcode.v1 import common_pb2, worker_pb2
from gradcode.worker.compute import ComputeCancelledError, JobBuilder, JobSetupError, RowSpec, build_job
from gradcode.worker.runtime import JobRuntime, _stepwise_message
from gradcode.worker.straggling import StragglerEmulation
from tests.worker.conftest import (
    TOLERANCE,
    data_for,
    expected_message,
    job_setup,
    make_partitions,
    partition_data,
    random_params,
    softmax_model,
)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        pytest.param("cyclic", {"n": 4, "s": 1}, id="cyclic"),
        pytest.param("fractional", {"n": 4, "s": 1}, id="fractional"),
        pytest.param("reed_solomon", {"n": 4, "k": 4, "w": 2}, id="reed_solomon-complex"),
    ],
)
def test_messages_equal_directly_coded_gradient(name: str, params: dict[str, int]) -> None:
    code = make_code(name, **params)
    partitions = make_partitions(code.k)
    theta = random_params()
    for worker in range(code.n):
        job = build_job(job_setup(code, worker), data_for(code, worker, partitions))
        rows = job.check_rows(code.static_assignment().rows[worker])
        computation = job.start(theta)
        for row in rows:
            want = expected_message(code, row, theta, partitions)
            got, seconds = computation.message(row)
            assert got.dtype == (np.complex128 if code.is_complex else np.float64)
            np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE * np.abs(want).max())
            assert seconds >= 0


def test_float32_messages_when_asked() -> None:
    code = make_code("cyclic", n=3, s=1)
    partitions = make_partitions(code.k)
    job = build_job(job_setup(code, 0, message_dtype=common_pb2.DTYPE_FLOAT32), data_for(code, 0, partitions))
    message, _ = job.start(random_params()).message(0)
    assert message.dtype == np.float32
    np.testing.assert_allclose(message, expected_message(code, 0, random_params(), partitions), rtol=1e-5, atol=1e-4)


def test_float32_refused_for_complex_rows() -> None:
    code = make_code("reed_solomon", n=4, k=4, w=2)
    with pytest.raises(JobSetupError, match=r"complex coefficients.*DTYPE_FLOAT32"):
        JobBuilder(job_setup(code, 0, message_dtype=common_pb2.DTYPE_FLOAT32))


def _two_rows_sharing_a_partition() -> worker_pb2.JobSetup:
    setup = job_setup(make_code("uncoded", n=1), 0)
    del setup.rows[:]
    setup.rows.add(row=0, partitions=[0, 1], coefficients_real=[1.0, 2.0])
    setup.rows.add(row=1, partitions=[1, 2], coefficients_real=[-1.0, 0.5])
    setup.num_partitions_sent = 3
    return setup


def test_each_partition_computed_once_per_iteration() -> None:
    partitions = make_partitions(3)
    data = [c for j in range(3) for c in partition_data(j, *partitions[j])]
    job = build_job(_two_rows_sharing_a_partition(), data)
    seen: list[int] = []
    computation = job.start(random_params(), on_partition=seen.append)
    m0, _ = computation.message(0)
    m1, _ = computation.message(1)
    assert sorted(seen) == [0, 1, 2]  # partition 1 is shared by both rows, computed once
    assert job.stats.partitions_computed == 3
    from tests.worker.conftest import softmax_model

    g = {j: softmax_model().gradient(random_params(), *partitions[j]) for j in range(3)}
    np.testing.assert_allclose(m0, g[0] + 2 * g[1], rtol=1e-12)
    np.testing.assert_allclose(m1, -g[1] + 0.5 * g[2], rtol=1e-12)


def test_cancellation_stops_between_partitions() -> None:
    partitions = make_partitions(3)
    data = [c for j in range(3) for c in partition_data(j, *partitions[j])]
    job = build_job(_two_rows_sharing_a_partition(), data)
    flag = threading.Event()
    computed: list[int] = []

    def on_partition(j: int) -> None:
        computed.append(j)
        flag.set()  # the receiver gives up right after the first partial gradient

    computation = job.start(random_params(), cancelled=flag, on_partition=on_partition)
    with pytest.raises(ComputeCancelledError):
        computation.message(0)
    assert computed == [0]
    assert job.stats.iterations_cancelled == 1
    # A fresh computation (the next iteration) is unaffected.
    fresh = job.start(random_params(), cancelled=threading.Event())
    assert fresh.message(0)[0].shape == fresh.message(1)[0].shape == (job.num_params,)


async def test_a_message_on_the_loop_serves_it_between_partitions_and_stops_at_a_cancellation() -> None:
    """The event loop runs between the partial gradients of a message computed on it (a cancellation that arrives
    then is seen), and the message is the one the thread would have computed."""
    partitions = make_partitions(3)
    data = [c for j in range(3) for c in partition_data(j, *partitions[j])]
    job = build_job(_two_rows_sharing_a_partition(), data)
    theta = random_params()
    turns = 0

    async def other_call() -> None:  # anything else the worker's loop serves
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    served = asyncio.create_task(other_call())
    try:
        turns_at: list[int] = []
        computation = job.start(theta, on_partition=lambda j: turns_at.append(turns))
        vector, seconds = await _stepwise_message(computation, 0)
        assert turns_at[1] > turns_at[0] and seconds > 0
        threaded, _ = job.start(theta).message(0)
        np.testing.assert_array_equal(vector, threaded)

        flag = threading.Event()
        computed: list[int] = []
        cancelled = job.start(theta, cancelled=flag, on_partition=computed.append)
        asyncio.get_running_loop().call_soon(flag.set)  # the receiver's cancellation, handled by the loop
        with pytest.raises(ComputeCancelledError):
            await _stepwise_message(cancelled, 0)
        assert computed == [0]
    finally:
        served.cancel()


async def test_while_the_loop_computes_one_jobs_message_another_jobs_goes_to_a_thread_beside_it() -> None:
    """Two jobs with short partitions asked at once: the first computes on the loop, the second, which starts at
    the first's yield, in a thread beside it (two jobs' gradients run side by side where there are cores)."""
    partitions = make_partitions(3)
    data = [c for j in range(3) for c in partition_data(j, *partitions[j])]
    no_delay = StragglerEmulation(common_pb2.StragglerSpec())
    runtimes = [JobRuntime(build_job(_two_rows_sharing_a_partition(), data), no_delay) for _ in range(2)]
    loop_thread = threading.get_ident()
    on_loop: dict[int, set[bool]] = {0: set(), 1: set()}

    def observer(index: int) -> Callable[[int], None]:
        def seen(partition: int) -> None:
            on_loop[index].add(threading.get_ident() == loop_thread)
            time.sleep(0.005)

        return seen

    theta = random_params()
    for runtime in runtimes:
        runtime.message_seconds = runtime.partition_seconds = 0.006  # as after a message of short partitions
    computations = [r.job.start(theta, on_partition=observer(i)) for i, r in enumerate(runtimes)]
    both = await asyncio.gather(*(r._message(c, 0) for r, c in zip(runtimes, computations, strict=True)))
    assert on_loop == {0: {True}, 1: {False}}
    threaded, _ = runtimes[0].job.start(theta).message(0)
    for vector, _ in both:
        np.testing.assert_array_equal(vector, threaded)


def test_rejects_bad_params_and_rows() -> None:
    code = make_code("cyclic", n=3, s=1)
    job = build_job(job_setup(code, 1), data_for(code, 1, make_partitions(3)))
    with pytest.raises(ValueError, match=r"has 5 parameters.*expects 21"):
        job.start(np.zeros(5))
    with pytest.raises(ValueError, match=r"must be float64"):
        job.start(np.zeros(21, dtype=np.float32))
    with pytest.raises(ValueError, match=r"Row\(s\) \[0\] were not given to worker 1.*it has rows \[1\]"):
        job.check_rows([0])
    with pytest.raises(ValueError, match=r"name a row twice"):
        job.check_rows([1, 1])
    with pytest.raises(ValueError, match=r"No rows requested"):
        job.check_rows([])


def test_row_spec_validation() -> None:
    with pytest.raises(JobSetupError, match="2 partitions but 1 real coefficients"):
        RowSpec.from_wire(worker_pb2.RowDefinition(row=0, partitions=[0, 1], coefficients_real=[1.0]))
    with pytest.raises(JobSetupError, match="1 imaginary coefficients"):
        RowSpec.from_wire(
            worker_pb2.RowDefinition(row=0, partitions=[0, 1], coefficients_real=[1, 1], coefficients_imag=[1])
        )
    with pytest.raises(JobSetupError, match="lists a partition twice"):
        RowSpec.from_wire(worker_pb2.RowDefinition(row=0, partitions=[1, 1], coefficients_real=[1, 1]))
    spec = RowSpec.from_wire(
        worker_pb2.RowDefinition(row=3, partitions=[0, 1], coefficients_real=[1, 2], coefficients_imag=[0, 1])
    )
    assert spec.is_complex and spec.coefficients.tolist() == [1 + 0j, 2 + 1j]


def test_setup_validation_messages() -> None:
    code = make_code("cyclic", n=3, s=1)
    bad = job_setup(code, 0)
    bad.model.kind = "forest"
    with pytest.raises(JobSetupError, match=r"model is invalid: Unknown model kind 'forest'"):
        JobBuilder(bad)
    bad = job_setup(code, 0)
    bad.num_partitions_sent = 5
    with pytest.raises(JobSetupError, match=r"announces 5 partitions, but its rows need exactly 2: \[0, 1\]"):
        JobBuilder(bad)
    bad = job_setup(code, 0, job_id="")
    with pytest.raises(JobSetupError, match="job_id is empty"):
        JobBuilder(bad)
    bad = job_setup(code, 0)
    bad.message_dtype = common_pb2.DTYPE_INT64
    with pytest.raises(JobSetupError, match="DTYPE_INT64 is not a message type"):
        JobBuilder(bad)


def test_data_validation_messages() -> None:
    code = make_code("cyclic", n=3, s=1)  # worker 0 needs partitions 0 and 1
    partitions = make_partitions(3)
    builder = JobBuilder(job_setup(code, 0))
    with pytest.raises(JobSetupError, match=r"partition 2, which no row of this worker needs; it needs \[0, 1\]"):
        builder.add(partition_data(2, *partitions[2])[0])

    chunks = partition_data(0, *partitions[0])
    builder.add(chunks[0])
    with pytest.raises(JobSetupError, match="byte offset 512, expected 256"):
        builder.add(chunks[2])  # skipped chunk 1
    wrong_size = worker_pb2.PartitionData()
    wrong_size.CopyFrom(chunks[1])
    wrong_size.num_samples = 99
    with pytest.raises(JobSetupError, match="num_samples=99, an earlier one 20"):
        builder.add(wrong_size)

    overflow = JobBuilder(job_setup(code, 0))
    short = partition_data(0, partitions[0][0][:2], partitions[0][1][:2])[0]  # declares 2 samples, sends more
    short.features = partitions[0][0].tobytes()[:256]
    with pytest.raises(JobSetupError, match="features overflow, 256 bytes received but 96 expected"):
        overflow.add(short)

    incomplete = JobBuilder(job_setup(code, 0))
    for c in partition_data(0, *partitions[0]):
        incomplete.add(c)
    with pytest.raises(JobSetupError, match=r"No data arrived for partition\(s\) \[1\]"):
        incomplete.finish()
    incomplete.add(partition_data(1, *partitions[1])[0])
    with pytest.raises(JobSetupError, match="Partition 1 is incomplete: 256 of 960 feature bytes"):
        incomplete.finish()

    capped = JobBuilder(job_setup(code, 0), max_bytes=1500)
    capped.add(partition_data(0, *partitions[0])[0])  # 20 samples x (6 + 1) x 8 = 1120 bytes: fits
    with pytest.raises(JobSetupError, match="to 2240 bytes, over this worker's limit of 1500 bytes"):
        capped.add(partition_data(1, *partitions[1])[0])


def test_bad_labels_refused_at_load() -> None:
    code = make_code("cyclic", n=3, s=1)
    partitions = make_partitions(3)
    X, y = partitions[0]
    y = y.copy()
    y[0] = 7  # softmax over 3 classes
    builder = JobBuilder(job_setup(code, 0))
    for c in [*partition_data(0, X, y), *partition_data(1, *partitions[1])]:
        builder.add(c)
    with pytest.raises(JobSetupError, match=r"Partition 0: y must hold integer class labels in \[0, 3\)"):
        builder.finish()
    nan = JobBuilder(job_setup(code, 0))
    X = X.copy()
    X[1, 1] = np.nan
    for c in [*partition_data(0, X, partitions[0][1]), *partition_data(1, *partitions[1])]:
        nan.add(c)
    with pytest.raises(JobSetupError, match="Partition 0 holds NaN or infinite values"):
        nan.finish()


def test_every_row_sends_its_magnitude_and_only_a_row_of_several_partitions_its_own_rounding() -> None:
    """|b| ||g|| of a one-partition row is its message's norm, and a flat receiver certifies the same bound without
    it; the worker still sends it (issue 24: in a tree the receiver's row stands for several partitions, so a
    missing magnitude there cannot be told from a missing value, and is not certified). A row of several
    partitions also certifies its own rounding (``rounding``, sent as ``decode_error``); one partition leaves
    that to the receiver (0)."""
    theta = random_params()
    for code in (make_code("uncoded", n=3), make_code("cyclic", n=3, s=1)):
        partitions = make_partitions(code.k)
        job = build_job(job_setup(code, 0), data_for(code, 0, partitions))
        computation = job.start(theta)
        for row in job.check_rows(code.static_assignment().rows[0]):
            message, _ = computation.message(row)
            magnitude = computation.magnitude(row)
            assert np.isfinite(magnitude)
            if len(code.support(row)) > 1:
                assert computation.rounding(row, magnitude) > 0
                continue
            assert computation.rounding(row, magnitude) == 0.0
            norm = float(np.linalg.norm(message[: job.num_params]))
            assert magnitude == pytest.approx(float(abs(code.coefficients(row)[0])) * norm, rel=1e-12)
            weights = np.ones(1)
            profile = RowProfile.of(weights, np.asarray(code.B)[[row]])
            u = unit_roundoff(np.float64)
            without = bound_combination(profile, [norm], u=u, magnitudes=[np.nan]).certificate(norm)
            with_it = bound_combination(profile, [norm], u=u, magnitudes=[magnitude]).certificate(norm)
            assert without.bound == pytest.approx(with_it.bound, rel=1e-12)


@pytest.mark.parametrize("with_statistics", [False, True])
def test_each_message_reports_the_sum_of_its_partials_norms_weighted_by_the_coefficients(with_statistics: bool) -> None:
    """``magnitude(row)`` = sum_j |b_j| ||g_j|| over the gradient elements (not the appended statistics):
    what the receiver's certificate needs to be a bound when partial gradients cancel."""
    code = make_code("reed_solomon", n=4, k=4, w=2)  # complex coefficients: |b_j| is the modulus
    partitions = make_partitions(code.k)
    theta = random_params()
    model = softmax_model()
    assert code.is_complex
    for worker in range(code.n):
        setup = job_setup(code, worker)
        setup.append_statistics = with_statistics
        job = build_job(setup, data_for(code, worker, partitions))
        computation = job.start(theta)
        for row in job.check_rows(code.static_assignment().rows[worker]):
            computation.message(row)
            partials = [np.linalg.norm(model.gradient(theta, *partitions[j])) for j in code.support(row)]
            want = float(np.abs(code.coefficients(row)) @ partials)
            assert computation.magnitude(row) == pytest.approx(want, rel=1e-12)
