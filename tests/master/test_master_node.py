"""The master as a real gRPC server in this process, with real workers (WorkerNode) or a test worker on loopback.

Covers what needs a running job: the exactness flag of tree-parent messages, verify mode, a cancel
that must leave GetModel consistent, eviction of finished jobs, file datasets behind --data-dir, and
RESOURCE_EXHAUSTED for a master out of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gradcode.common.gather.round import Round
from gradcode.common.training.data import load_dataset
from gradcode.common.training.models import Model, make_model
from gradcode.common.transport.security import hello_proof, new_process_secret
from gradcode.common.transport.serving import ServingHandle, start_server
from gradcode.common.transport.wire import MessageAssembler, array_from_tensor, message_chunks, struct_from_dict
from gradcode.master import reporting, service
from gradcode.master.node import MasterNode
from gradcode.master.spec import JobPlan
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc, worker_pb2, worker_pb2_grpc
from gradcode.worker.node import WorkerNode
from tests.helpers import fixed_delay

TIMEOUT = 60.0
SAMPLES = 200
EXACT = 1e-9


def job_spec(code: str, params: dict[str, Any], **fields: Any) -> master_pb2.JobSpec:
    """Softmax regression on 200 digits with plain gradient descent, unless ``fields`` say otherwise."""
    values: dict[str, Any] = {
        "code": common_pb2.CodeSpec(name=code, params=struct_from_dict(params)),
        "dataset": master_pb2.DatasetSpec(name="digits", num_samples=SAMPLES),
        "optimizer": master_pb2.OptimizerSpec(kind="gd", learning_rate=0.5),
        "iterations": 3,
        "wait_for_workers_seconds": 10.0,
        **fields,
    }
    return master_pb2.JobSpec(**values)


@dataclass
class Master:
    node: MasterNode
    stub: master_pb2_grpc.MasterStub

    async def wait_workers(self, count: int) -> list[int]:
        """Wait until ``count`` workers are UP; their pool ids."""
        while True:
            workers = (await self.stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
            up = [w.worker_id for w in workers if w.state == master_pb2.WORKER_STATE_UP]
            if len(up) >= count:
                return up
            await asyncio.sleep(0.02)

    async def run(self, spec: master_pb2.JobSpec) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport]]:
        info = await self.stub.CreateJob(spec)
        reports = [r async for r in self.stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        return await self.stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id)), reports


@contextlib.asynccontextmanager
async def running_master(num_workers: int = 0, **options: Any) -> AsyncIterator[Master]:
    """A MasterNode on port 0 with ``num_workers`` real WorkerNodes registered; everything stopped on exit."""
    async with contextlib.AsyncExitStack() as stack:
        node = await stack.enter_async_context(MasterNode(grace=0.5, **options))
        for i in range(num_workers):
            worker = WorkerNode(master_address=node.address, name=f"w{i}", grace=0.5)
            await stack.enter_async_context(worker)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(node.address))
        master = Master(node, master_pb2_grpc.MasterStub(channel))  # type: ignore[no-untyped-call]
        await master.wait_workers(num_workers)
        yield master


def centralized_gd(steps: int, learning_rate: float = 0.5) -> np.ndarray[Any, Any]:
    """What ``steps`` exact gradient-descent steps on the job's training set give."""
    data = load_dataset("digits", num_samples=SAMPLES, seed=0, test_fraction=0.2)
    model = make_model("softmax", num_features=data.num_features, num_classes=data.num_classes)
    params = model.init_params()
    for _ in range(steps):
        params = params - learning_rate * model.gradient(params, data.X_train, data.y_train) / data.num_train
    return params


# ---- a test worker that sends the true coded gradient, flagged approximate or scaled ----------------
class TrueGradientWorker(worker_pb2_grpc.WorkerServicer):
    """Computes its rows' coded gradients exactly, then scales them by ``scale`` and marks them ``approximate``
    (as a tree parent that decoded its children only approximately would)."""

    def __init__(self, *, approximate: bool, scale: float = 1.0) -> None:
        self.approximate = approximate
        self.scale = scale
        self.process_secret = new_process_secret()
        self.setup = worker_pb2.JobSetup()
        self.model: Model | None = None
        self.data: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}

    async def LoadJob(self, request_iterator: AsyncIterator[worker_pb2.LoadJobChunk], context: Any) -> Any:  # noqa: N802
        raw: dict[int, tuple[bytearray, bytearray]] = {}
        async for chunk in request_iterator:
            if chunk.HasField("setup"):
                self.setup = chunk.setup
            else:
                features, labels = raw.setdefault(chunk.data.partition, (bytearray(), bytearray()))
                features += chunk.data.features
                labels += chunk.data.labels
        spec = self.setup.model
        self.model = make_model(spec.kind, num_features=spec.num_features, num_classes=spec.num_classes)
        self.data = {
            j: (np.frombuffer(bytes(f), "<f8").reshape(-1, spec.num_features), np.frombuffer(bytes(y), "<f8"))
            for j, (f, y) in raw.items()
        }
        return worker_pb2.LoadJobReply(job_id=self.setup.job_id, worker_id=self.setup.worker_id)

    async def Compute(self, request: worker_pb2.ComputeRequest, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        assert self.model is not None
        params = array_from_tensor(request.model)
        for row in self.setup.rows:
            if row.row not in request.rows:
                continue
            partial = self.model.gradient_and_statistics if self.setup.append_statistics else self.model.gradient
            vector = sum(
                c * partial(params, *self.data[j]) for j, c in zip(row.partitions, row.coefficients_real, strict=True)
            )
            for chunk in message_chunks(
                self.scale * np.asarray(vector), job_id=request.job_id, iteration=request.iteration,
                worker_id=request.worker_id, row=row.row, approximate=self.approximate,
            ):  # fmt: skip
                yield chunk

    async def EndJob(self, request: worker_pb2.EndJobRequest, context: Any) -> Any:  # noqa: N802
        return worker_pb2.EndJobReply()

    async def Hello(self, request: worker_pb2.HelloRequest, context: Any) -> Any:  # noqa: N802 - admission check
        return worker_pb2.HelloReply(proof=hello_proof(self.process_secret, request.nonce))


@contextlib.asynccontextmanager
async def serving(servicer: worker_pb2_grpc.WorkerServicer) -> AsyncIterator[ServingHandle]:
    handle = await start_server(
        "127.0.0.1", 0,
        registrars=[lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)],  # type: ignore[no-untyped-call]
        service_names=["gradcode.v1.Worker"],
    )  # fmt: skip
    try:
        yield handle
    finally:
        await handle.stop(0)


@pytest.mark.parametrize(
    ("approximate", "scale", "outcome"),
    [
        (True, 1.0, "approximate and right"),
        (True, 1.0 + 1e-6, "approximate and off by 1e-6: reported, not refused"),
        (False, 1.0 + 1e-6, "claimed exact but off by 1e-6: refused"),
    ],
)
async def test_messages_a_parent_decoded_approximately_make_the_iteration_inexact(
    approximate: bool,
    scale: float,
    outcome: str,
) -> None:
    worker = TrueGradientWorker(approximate=approximate, scale=scale)
    async with asyncio.timeout(TIMEOUT), running_master() as master, serving(worker) as handle:
        request = master_pb2.RegisterWorkerRequest(address=handle.address, process_secret=worker.process_secret)
        reply = await master.stub.RegisterWorker(request)
        spec = job_spec("uncoded", {"n": 1}, worker_ids=[reply.worker_id], verify=True)
        info, reports = await master.run(spec)
        assert master.node.pool.get(reply.worker_id).caller.serves_sessions is False  # type: ignore[union-attr]  # it has only Compute: it got calls
    if approximate:
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert len(reports) == 3 and not any(r.exact for r in reports)  # the decode itself was exact
        for r in reports:
            assert (r.verify_error <= EXACT) if scale == 1.0 else (0.5e-6 < r.verify_error < 2e-6), r.verify_error
    else:
        assert info.state == master_pb2.JOB_STATE_FAILED
        assert "differs from the centralized one by relative error" in info.message
        assert "refusing to step with a wrong gradient" in info.message and info.iterations_done == 0


# ---- reports: off the critical path, in order ------------------------------------------------------------
async def test_a_report_is_published_once_the_next_round_has_asked_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The history file and the watchers wait for nothing and nobody waits for them: iteration t's report is
    written once round t + 1 has asked its workers (the last iteration's at once), and reports stay in order."""
    events: list[tuple[str, int]] = []
    gather, append = Round.gather, reporting.History.append

    def asking(self: Round, *args: Any, **kwargs: Any) -> Any:
        events.append(("ask", self.iteration))  # the round's requests go out at the start of its gather
        return gather(self, *args, **kwargs)

    def publishing(self: reporting.History, report: master_pb2.IterationReport) -> None:
        events.append(("publish", report.iteration))
        append(self, report)

    monkeypatch.setattr(Round, "gather", asking)
    monkeypatch.setattr(reporting.History, "append", publishing)
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        ids = await master.wait_workers(2)
        info, reports = await master.run(job_spec("uncoded", {"n": 2}, worker_ids=ids, iterations=5))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert [r.iteration for r in reports] == [1, 2, 3, 4, 5]
    assert [t for kind, t in events if kind == "publish"] == [1, 2, 3, 4, 5]
    for t in range(1, 5):
        assert events.index(("ask", t + 1)) < events.index(("publish", t)), events
    assert events[-1] == ("publish", 5)


# ---- cancel: GetModel never runs ahead of its iteration number ------------------------------------
async def test_a_cancel_while_an_evaluation_runs_leaves_the_model_at_the_iteration_it_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The optimizer step and iterations_done are committed together: a cancel in between cannot split them,
    and every committed iteration is reported, the ones waiting behind a running evaluation included."""
    entered = threading.Event()
    original = reporting.evaluate
    calls = itertools.count(1)

    def slow_evaluate(plan: JobPlan, params: np.ndarray[Any, Any]) -> reporting.Evaluation:
        if next(calls) == 3 and not entered.is_set():  # hold iteration 3's evaluation (in its thread)
            entered.set()
            time.sleep(0.5)
        return original(plan, params)

    monkeypatch.setattr(reporting, "evaluate", slow_evaluate)
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        ids = await master.wait_workers(2)
        spec = job_spec("uncoded", {"n": 2}, iterations=200, worker_ids=ids, evaluate_every=1)
        info = await master.stub.CreateJob(spec)
        while not entered.is_set():
            await asyncio.sleep(0.005)
        cancelled = await master.stub.CancelJob(master_pb2.CancelJobRequest(job_id=info.job_id))
        model = await master.stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
        reports = [r async for r in master.stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
    assert cancelled.state == master_pb2.JOB_STATE_CANCELLED, cancelled.message
    assert model.iteration == cancelled.iterations_done >= 2
    np.testing.assert_allclose(array_from_tensor(model.parameters), centralized_gd(model.iteration), rtol=1e-9)
    assert [r.iteration for r in reports] == list(range(1, model.iteration + 1))  # every committed one reported


async def test_the_report_of_an_iteration_follows_its_commit_and_the_last_one_ends_the_job() -> None:
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        ids = await master.wait_workers(2)
        info, reports = await master.run(job_spec("uncoded", {"n": 2}, iterations=4, worker_ids=ids, verify=True))
        model = await master.stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and info.iterations_done == 4, info.message
    assert [r.iteration for r in reports] == [1, 2, 3, 4]
    assert [r.state for r in reports] == [master_pb2.JOB_STATE_RUNNING] * 3 + [master_pb2.JOB_STATE_SUCCEEDED]
    assert all(np.isfinite(r.loss) and 0 <= r.train_accuracy <= 1 for r in reports)
    assert all(r.exact and 0 <= r.verify_error <= EXACT for r in reports)
    assert [r.loss for r in reports] == sorted((r.loss for r in reports), reverse=True)
    np.testing.assert_allclose(array_from_tensor(model.parameters), centralized_gd(4), rtol=1e-9)


@pytest.mark.parametrize("evaluate_every", [1, 3])
async def test_a_target_accuracy_stops_at_the_evaluated_iteration_that_reached_it(evaluate_every: int) -> None:
    """Evaluations run beside training: iterations computed after the one that reached the target are
    dropped, and the job ends with that iteration's model and count."""
    async with asyncio.timeout(TIMEOUT), running_master(2) as master:
        ids = await master.wait_workers(2)
        spec = job_spec(
            "uncoded", {"n": 2}, iterations=100, worker_ids=ids, target_accuracy=0.5, evaluate_every=evaluate_every
        )
        info, reports = await master.run(spec)
        model = await master.stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED and "reached target accuracy 0.5" in info.message
    last = reports[-1]
    assert last.iteration % evaluate_every == 0
    evaluated = [r for r in reports if r.iteration % evaluate_every == 0]
    assert all(np.isnan(r.test_accuracy) for r in reports if r.iteration % evaluate_every)
    assert last.test_accuracy >= 0.5 and all(r.test_accuracy < 0.5 for r in evaluated[:-1])
    assert info.iterations_done == model.iteration == last.iteration == len(reports) < 100
    np.testing.assert_allclose(array_from_tensor(model.parameters), centralized_gd(last.iteration), rtol=1e-9)


# ---- training metrics come from the decode ------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "params"),
    [("cyclic", {"n": 3, "s": 1}), ("fractional", {"n": 4, "s": 1}), ("binary", {"n": 4, "s": 1})],
)
async def test_reported_training_loss_and_accuracy_are_the_centralized_ones(code: str, params: dict[str, int]) -> None:
    """Report t's loss and training accuracy are decoded from the workers' coded statistics at the point
    iteration t's gradient was evaluated at (here, plain GD: the parameters after t - 1 steps); they equal
    the centralized ones to 1e-12, and nothing on the master touched the training set to get them."""
    data = load_dataset("digits", num_samples=SAMPLES, seed=0, test_fraction=0.2)
    model = make_model("softmax", num_features=data.num_features, num_classes=data.num_classes)
    async with asyncio.timeout(TIMEOUT), running_master(params["n"]) as master:
        ids = await master.wait_workers(params["n"])
        info, reports = await master.run(job_spec(code, params, iterations=4, worker_ids=ids[: params["n"]]))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    for r in reports:
        point = centralized_gd(r.iteration - 1)
        central = model.loss(point, data.X_train, data.y_train) / data.num_train
        assert abs(r.loss - central) <= 1e-12 * central, (r.iteration, r.loss, central)
        assert r.train_accuracy == model.accuracy(point, data.X_train, data.y_train)


# ---- eviction of finished jobs --------------------------------------------------------------------
async def test_finished_jobs_beyond_the_bound_are_evicted_and_say_so(tmp_path: Path) -> None:
    async with asyncio.timeout(TIMEOUT), running_master(2, run_dir=tmp_path, max_finished_jobs=2) as master:
        ids = await master.wait_workers(2)
        for name in ("first", "second", "third"):
            info, _ = await master.run(job_spec("uncoded", {"n": 2}, iterations=1, worker_ids=ids, job_id=name))
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert sorted(master.node.servicer.jobs) == ["second", "third"]
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await master.stub.GetJob(master_pb2.GetJobRequest(job_id="first"))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        details = error.value.details() or ""
        assert "Job 'first' finished and was evicted" in details and "keeps only the 2 most recently" in details
        assert "its history is in the master's run directory" in details and str(tmp_path) not in details
        assert (tmp_path / "first.jsonl").read_text().count("\n") == 1  # the history stays on disk
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await master.stub.CreateJob(job_spec("uncoded", {"n": 2}, job_id="first"))
        assert error.value.code() == grpc.StatusCode.ALREADY_EXISTS
        third = await master.stub.GetJob(master_pb2.GetJobRequest(job_id="third"))
        assert third.state == master_pb2.JOB_STATE_SUCCEEDED


async def test_a_finished_job_keeps_nothing_of_its_training_data(tmp_path: Path) -> None:
    """The master keeps up to max_finished_jobs finished jobs for GetJob, GetModel and WatchJob, but not their
    datasets: at p = 10^6 each held 400 MB, and a master that had run about 35 such jobs was killed out of memory
    (the loader's partition cache kept the dataset after the job had dropped it). The job still answers."""
    async with asyncio.timeout(TIMEOUT), running_master(2, run_dir=tmp_path) as master:
        ids = await master.wait_workers(2)
        info = await master.stub.CreateJob(job_spec("fractional", {"n": 2, "s": 1}, iterations=2, worker_ids=ids))
        plan = master.node.servicer.jobs[info.job_id].plan
        arrays = [weakref.ref(a) for a in (plan.dataset.X_train, plan.dataset.y_train, plan.dataset.X_test)]
        partition = weakref.ref(plan.partitions[0])
        del plan
        reports = [r async for r in master.stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        assert len(reports) == 2
        await master.node.servicer.jobs[info.job_id].wait()  # its last report is out before its cleanup ends
        gc.collect()
        assert [ref() is None for ref in arrays] == [True, True, True] and partition() is None
        job = await master.stub.GetJob(master_pb2.GetJobRequest(job_id=info.job_id))
        assert job.state == master_pb2.JOB_STATE_SUCCEEDED and job.iterations_done == 2
        model = await master.stub.GetModel(master_pb2.GetModelRequest(job_id=info.job_id))
        np.testing.assert_allclose(array_from_tensor(model.parameters), centralized_gd(2), rtol=1e-9)
        again = [r async for r in master.stub.WatchJob(master_pb2.WatchJobRequest(job_id=info.job_id))]
        assert [r.iteration for r in again] == [1, 2]


# ---- file datasets and memory -----------------------------------------------------------------------
async def test_a_file_dataset_is_read_from_the_data_dir_only(tmp_path: Path) -> None:
    data = load_dataset("digits", num_samples=60, seed=1, test_fraction=0.0)
    table = np.column_stack([data.X_train, data.y_train])
    (tmp_path / "digits.csv").write_text("\n".join(",".join(f"{v:g}" for v in row) for row in table))
    file_spec = job_spec("uncoded", {"n": 2}, dataset=master_pb2.DatasetSpec(name="file", path="digits.csv"))
    async with asyncio.timeout(TIMEOUT), running_master(2, data_dir=tmp_path) as master:
        file_spec.worker_ids.extend(await master.wait_workers(2))
        info, reports = await master.run(file_spec)
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert info.spec.model.num_classes == 10 and len(reports) == 3
    async with asyncio.timeout(TIMEOUT), running_master(0) as master:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await master.stub.CreateJob(file_spec)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Dataset 'file' is disabled on this master: start it with --data-dir" in (error.value.details() or "")


async def test_a_job_whose_worker_local_data_a_worker_cannot_load_fails_with_the_workers_reason(
    tmp_path: Path,
) -> None:
    """The master has the file, the workers have no --data-dir: the job fails at once, naming why; the workers
    stay UP (they are healthy, they just cannot serve this job) and run the next job."""
    np.save(tmp_path / "X.npy", np.arange(40.0).reshape(20, 2))
    np.save(tmp_path / "y.npy", np.arange(20.0) % 2)
    dataset = master_pb2.DatasetSpec(name="file", path="X.npy", options={"labels": "y.npy"}, worker_local=True)
    async with asyncio.timeout(TIMEOUT), running_master(2, data_dir=tmp_path) as master:
        ids = await master.wait_workers(2)
        info, _ = await master.run(job_spec("uncoded", {"n": 2}, dataset=dataset, worker_ids=ids))
        assert info.state == master_pb2.JOB_STATE_FAILED
        assert f"Worker(s) {sorted(ids)} cannot load this job's worker-local data" in info.message, info.message
        assert "Dataset 'file' is disabled on this worker: start it with --data-dir" in info.message
        workers = (await master.stub.ListWorkers(master_pb2.ListWorkersRequest())).workers
        assert all(w.state == master_pb2.WORKER_STATE_UP for w in workers)
        generated = master_pb2.DatasetSpec(name="gaussian_mixture", num_samples=200, worker_local=True)
        info, reports = await master.run(job_spec("uncoded", {"n": 2}, dataset=generated, worker_ids=ids))
        assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        assert all(r.exact for r in reports)


async def test_running_out_of_memory_while_planning_is_resource_exhausted(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(service, "plan_job", no_memory)  # a spec that slips past the caps on a small machine
    async with asyncio.timeout(TIMEOUT), running_master(0) as master:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await master.stub.CreateJob(job_spec("uncoded", {"n": 1}))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "ran out of memory while planning this job" in (error.value.details() or "")
        assert not (await master.stub.ListWorkers(master_pb2.ListWorkersRequest())).workers  # still serving


async def test_over_links_the_master_receives_large_messages_straight_into_them_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without shared memory, a wide model's messages (800 KB: larger than a link's staging buffer) are received
    where the round's assemblers place them, and every iteration verifies exact."""
    placed: list[bool] = []
    place = MessageAssembler.place

    def counting(self: MessageAssembler, meta: Any, nbytes: int) -> memoryview | None:
        target = place(self, meta, nbytes)
        placed.append(target is not None)
        return target

    monkeypatch.setattr(MessageAssembler, "place", counting)
    async with asyncio.timeout(TIMEOUT), running_master(3, shared_memory=None) as master:
        ids = await master.wait_workers(3)
        spec = job_spec(
            "cyclic", {"n": 3, "s": 1}, iterations=12, worker_ids=ids, verify=True,
            dataset=master_pb2.DatasetSpec(name="linear", num_samples=30, num_features=99_999),
            optimizer=master_pb2.OptimizerSpec(kind="gd", learning_rate=1e-6),
            model=common_pb2.ModelSpec(kind="linear"),
        )  # fmt: skip
        info, reports = await master.run(spec)
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
    assert all(r.exact and 0 <= r.verify_error <= EXACT for r in reports)
    assert placed.count(True) >= 10, placed  # once the links are up (a few ms in), every message is placed


async def test_a_rounds_requests_go_to_the_workers_it_expects_before_its_backups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large models leave a process one at a time (:mod:`~gradcode.common.transport.egress`), so the order the master
    asks in is the order the models arrive in: the set a round expects to decode from first, its backups after."""
    from gradcode.common.transport.session import Caller

    asked: list[tuple[int, int, bool]] = []
    compute = Caller.compute

    def recording(self: Caller, head: worker_pb2.ComputeRequest, body: bytes = b"") -> Any:
        asked.append((int(head.iteration), int(head.worker_id), bool(head.backup)))
        return compute(self, head, body)

    monkeypatch.setattr(Caller, "compute", recording)
    async with asyncio.timeout(TIMEOUT), running_master(6) as master:
        straggler = fixed_delay(0.3, workers=[0])  # worker 0 misses the rounds: a backup from the second on
        info, _ = await master.run(job_spec("fractional", {"n": 6, "s": 1}, iterations=4, straggler=straggler))
    assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.error
    for t in range(2, 5):
        first_asks = [(worker, backup) for iteration, worker, backup in asked if iteration == t][:6]
        assert (0, True) in first_asks, f"worker 0 was expected in iteration {t}: {asked}"
        backups = [backup for _, backup in first_asks]
        assert backups == sorted(backups), f"iteration {t} asked a backup before an expected worker: {first_asks}"
