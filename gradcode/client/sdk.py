"""Python SDK for the master's control API (gradcode.v1.Master).

Usage::

    async with GradcodeClient("127.0.0.1:50050") as client:
        info, reports = await client.run(build_job_spec(scheme="cyclic", n=6, s=2, iterations=50),
                                         on_report=lambda r: print(r.iteration, r.loss))
        params = await client.get_model(info.job_id)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableSequence
from types import TracebackType
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from gradcode.common.codes.registry import code_class
from gradcode.common.exceptions import JobFailedError
from gradcode.common.transport.security import Security, security_from_env
from gradcode.common.transport.wire import CHANNEL_OPTIONS, array_from_tensor, struct_from_dict, tensor_from_array
from gradcode.v1 import common_pb2, master_pb2, master_pb2_grpc

__all__ = [
    "GradcodeClient",
    "JobFailedError",
    "ReportCallback",
    "build_job_spec",
    "code_params_for",
    "keep_report",
    "stopped_with_master",
]

RESUMABLE_STOP = "stopped with the master (resumable"
"""How the message of a job its master's shutdown stopped begins (the master keeps its checkpoint and, restarted
on the same state directory, resumes it under the same id). A job without a checkpoint ends for good."""

RESUME_PATIENCE_SECONDS = 300.0
"""How long :meth:`GradcodeClient.follow` waits for a master to come back and resume a job, by default."""


NOT_FOUND_GRACE_SECONDS = 20.0
"""How long a restarted master may answer NOT_FOUND for a job before :meth:`GradcodeClient.follow` believes it."""


def stopped_with_master(info: master_pb2.JobInfo) -> bool:
    """The job ended because its master shut down, and its restarted master will resume it."""
    return info.state == master_pb2.JOB_STATE_CANCELLED and info.message.startswith(RESUMABLE_STOP)


def keep_report(reports: MutableSequence[master_pb2.IterationReport], report: master_pb2.IterationReport) -> None:
    """Append ``report`` to a job's history, first dropping the reports of its iteration and later ones.

    A resumed job goes on from its last checkpoint: it computes again the iterations after it, whose first
    reports the resumed master drops from its history too.
    """
    while reports and reports[-1].iteration >= report.iteration:
        reports.pop()
    reports.append(report)


def code_params_for(scheme: str, n: int, s: int) -> dict[str, Any]:
    """The parameters of ``scheme``'s canonical configuration for ``n`` workers and ``s`` stragglers."""
    return dict(code_class(scheme).for_stragglers(n, s)._params())


def build_job_spec(
    *,
    scheme: str,
    n: int | None = None,
    s: int | None = None,
    code_params: Mapping[str, Any] | None = None,
    model: str = "softmax",
    dataset: str = "digits",
    dataset_path: str = "",
    dataset_options: Mapping[str, str] | None = None,
    worker_data: bool = False,
    num_samples: int = 0,
    num_features: int = 0,
    test_fraction: float = 0.0,
    optimizer: str = "nesterov",
    learning_rate: float = 0.5,
    l2: float = 1e-4,
    iterations: int = 50,
    target_accuracy: float = 0.0,
    deadline_seconds: float = 30.0,
    verify: bool = False,
    straggler: str = "none",
    straggler_params: Mapping[str, Any] | None = None,
    straggler_seed: int = 0,
    seed: int = 0,
    wait_for_workers_seconds: float = 30.0,
    job_id: str = "",
    message_dtype: str = "",
    integrity: str = "",
    backup_priority: str = "",
    initial_parameters: npt.ArrayLike | None = None,
    surplus: str = "",
    model_delivery: str = "",
) -> master_pb2.JobSpec:
    """A JobSpec from plain values; the scheme's parameters come from ``code_params`` or (n, s).

    ``test_fraction`` is the share of the dataset held out for the test accuracy, in [0, 1); 0 lets
    the master use its default. ``message_dtype`` is ``"float64"``, ``"float32"`` (half the bytes; a
    plugin model then computes in float32) or ``"complex128"``; empty lets the master choose (float64,
    complex128 for complex codes). ``integrity`` is the consistency policy (``off``, ``detect``,
    ``locate``; empty: the master's default). ``backup_priority`` is how each round asks the workers outside the
    decoding set it expects (``low``: at low OS priority, ``normal``; empty: the master's default, ``low``).
    ``surplus`` is what those backups do with their messages: ``push`` them at once, ``hold`` them until the round
    pulls them, or ``auto``: hold across the network, push through shared memory (empty: the master's, ``auto``).
    ``model_delivery`` is how each iteration's model reaches the workers of a flat code: ``direct`` to each, ``relay``
    (inline to one, the others fetch it from a peer, checked by its digest) or ``auto`` (relay when a round asks 3 or
    more workers over the network); empty: the master's, ``direct``.
    ``initial_parameters`` (a flat vector of the model's
    size) is where training starts instead of the model's own initial values. ``worker_data`` keeps
    the data on the workers (``DatasetSpec.worker_local``: each loads its own partitions from its
    ``--data-dir``, or generates them); ``dataset_options`` are the dataset's options, e.g.
    ``{"labels": "y.npy"}`` beside a ``.npy`` of features.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1) (0: the master's default), not {test_fraction!r}.")
    wire_dtype: int = common_pb2.DTYPE_UNSPECIFIED
    if message_dtype:
        names = ["float64", "float32", "complex128"]
        if message_dtype not in names:
            raise ValueError(f"message_dtype must be one of {names} (or empty), not {message_dtype!r}.")
        wire_dtype = common_pb2.DType.Value(f"DTYPE_{message_dtype.upper()}")
    if code_params is None:
        if n is None or s is None:
            raise ValueError("Give either code_params or both n and s.")
        code_params = code_params_for(scheme, n, s)
    spec = master_pb2.JobSpec(
        job_id=job_id,
        code=common_pb2.CodeSpec(name=scheme, params=struct_from_dict(code_params)),
        model=common_pb2.ModelSpec(kind=model, l2=l2),
        dataset=master_pb2.DatasetSpec(
            name=dataset,
            path=dataset_path,
            options=dict(dataset_options or {}),
            worker_local=worker_data,
            num_samples=num_samples,
            num_features=num_features,
            seed=seed,
            test_fraction=test_fraction,
        ),
        optimizer=master_pb2.OptimizerSpec(kind=optimizer, learning_rate=learning_rate),
        iterations=iterations,
        target_accuracy=target_accuracy,
        iteration_deadline_seconds=deadline_seconds,
        verify=verify,
        straggler=common_pb2.StragglerSpec(
            model=straggler, params=struct_from_dict(straggler_params or {}), seed=straggler_seed
        ),
        seed=seed,
        wait_for_workers_seconds=wait_for_workers_seconds,
        message_dtype=wire_dtype,  # type: ignore[arg-type]
        integrity=integrity,
        backup_priority=backup_priority,
        surplus=surplus,
        model_delivery=model_delivery,
    )
    if initial_parameters is not None:
        start = np.asarray(initial_parameters, dtype=np.float64)
        if start.ndim != 1:
            raise ValueError(f"initial_parameters must be a flat vector, not an array of shape {start.shape}.")
        spec.initial_parameters.CopyFrom(tensor_from_array(start))
    return spec


ReportCallback = Callable[[master_pb2.IterationReport], Awaitable[None] | None]
"""Called with every iteration report as it arrives; may be a coroutine function."""


class GradcodeClient:
    """An asyncio client of one master. Use as ``async with``, or call :meth:`close`.

    ``security`` (TLS files and the client token) defaults to the GRADCODE_TLS_* and GRADCODE_TOKEN
    environment variables; plaintext without a token when none is set.
    """

    def __init__(self, address: str, *, security: Security | None = None) -> None:
        self.address = address
        self.security = security if security is not None else security_from_env()
        self._channel = self.security.channel(address, bearer=self.security.token, options=CHANNEL_OPTIONS)
        self._stub = master_pb2_grpc.MasterStub(self._channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> GradcodeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the master's channel is connected (raises ``TimeoutError``)."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    async def create_job(self, spec: master_pb2.JobSpec) -> master_pb2.JobInfo:
        info: master_pb2.JobInfo = await self._stub.CreateJob(spec)
        return info

    async def get_job(self, job_id: str) -> master_pb2.JobInfo:
        info: master_pb2.JobInfo = await self._stub.GetJob(master_pb2.GetJobRequest(job_id=job_id))
        return info

    async def watch(self, job_id: str) -> AsyncIterator[master_pb2.IterationReport]:
        """Every iteration report of the job: the history so far, then live ones until it ends."""
        async for report in self._stub.WatchJob(master_pb2.WatchJobRequest(job_id=job_id)):
            yield report

    async def follow(
        self,
        job_id: str,
        *,
        on_wait: Callable[[str], None] | None = None,
        patience: float = RESUME_PATIENCE_SECONDS,
    ) -> AsyncIterator[master_pb2.IterationReport]:
        """Like :meth:`watch`, across restarts of the master: each report once, until the job really ends.

        When the master goes away (the stream breaks, UNAVAILABLE) or stops the job with itself (resumable
        from its checkpoint), wait with back-off, up to ``patience`` seconds, for a master at the same
        address to resume the job, then follow it on. ``on_wait`` hears why it waits. The resumed job
        computes again the iterations after its checkpoint: their new reports come again (with an
        iteration number at or below one already seen; :func:`keep_report` keeps a history right).
        Raises ``TimeoutError`` when no master resumed the job in time; ``patience=0`` waits for nothing
        (the master's going away raises its ``AioRpcError``, a job stopped with it ends the iteration).
        """
        sent: dict[int, bytes] = {}
        while True:
            try:
                async for report in self.watch(job_id):
                    key = report.SerializeToString(deterministic=True)
                    if sent.get(report.iteration) == key:
                        continue  # the replayed history of a job already followed
                    for later in [i for i in sent if i > report.iteration]:
                        del sent[later]
                    sent[report.iteration] = key
                    yield report
                info = await self.get_job(job_id)
                if not stopped_with_master(info) or patience <= 0:
                    return
                why = f"job {job_id} {info.message}"
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or patience <= 0:
                    raise
                why = f"lost the master at {self.address} ({exc.details()})"
            if on_wait is not None:
                on_wait(f"{why}; waiting up to {patience:g} s for the master to come back and resume job {job_id}")
            await self._until_resumed(job_id, patience)

    async def _until_resumed(self, job_id: str, patience: float) -> None:
        """Poll (0.5 s doubling to 5 s) until the master answers for the job and no longer as stopped with it.

        A restarted master serves before it has resumed its saved jobs, so NOT_FOUND is "not yet" for
        :data:`NOT_FOUND_GRACE_SECONDS` after its first answer; after that the master came back without the
        job (no state directory, or the checkpoint was refused) and the NOT_FOUND is raised.
        """
        deadline, delay = time.monotonic() + patience, 0.5
        unknown_since: float | None = None
        while True:
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)
            try:
                if not stopped_with_master(await self.get_job(job_id)):
                    return  # resumed (or ended meanwhile): follow it again
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    unknown_since = time.monotonic() if unknown_since is None else unknown_since
                    if time.monotonic() - unknown_since > NOT_FOUND_GRACE_SECONDS:
                        raise
                elif exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"No master at {self.address} resumed job {job_id} within {patience:g} s.")

    async def get_model(self, job_id: str) -> np.ndarray[Any, Any]:
        reply = await self._stub.GetModel(master_pb2.GetModelRequest(job_id=job_id))
        return np.array(array_from_tensor(reply.parameters))

    async def cancel(self, job_id: str) -> master_pb2.JobInfo:
        info: master_pb2.JobInfo = await self._stub.CancelJob(master_pb2.CancelJobRequest(job_id=job_id))
        return info

    async def list_workers(self) -> list[master_pb2.WorkerInfo]:
        reply = await self._stub.ListWorkers(master_pb2.ListWorkersRequest())
        return list(reply.workers)

    async def list_jobs(self) -> master_pb2.ListJobsReply:
        """The jobs the master holds (without their specs) and the ids of the most recently evicted ones."""
        reply: master_pb2.ListJobsReply = await self._stub.ListJobs(master_pb2.ListJobsRequest())
        return reply

    async def resume(self, job_id: str = "", *, checkpoint: bytes = b"") -> master_pb2.JobInfo:
        """Resume a job from its last checkpoint: the master's own (by ``job_id``), or ``checkpoint``, the
        contents of a checkpoint file (``<state_dir>/<job_id>.ckpt.npz``, e.g. from another master)."""
        request = master_pb2.ResumeJobRequest(job_id=job_id, checkpoint=checkpoint)
        info: master_pb2.JobInfo = await self._stub.ResumeJob(request)
        return info

    async def remove_worker(self, worker_id: int) -> master_pb2.WorkerInfo:
        """Remove a worker from the master's pool (it is DOWN for good; running jobs see it as failed)."""
        info: master_pb2.WorkerInfo = await self._stub.RemoveWorker(master_pb2.RemoveWorkerRequest(worker_id=worker_id))
        return info

    async def run(
        self,
        spec: master_pb2.JobSpec,
        on_report: ReportCallback | None = None,
        *,
        check: bool = True,
        on_created: Callable[[master_pb2.JobInfo], None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        patience: float = 0.0,
    ) -> tuple[master_pb2.JobInfo, list[master_pb2.IterationReport]]:
        """Create a job, follow it to the end, and return its final info and every report.

        ``on_created`` sees the new job's info before the first report (to show its id);
        ``on_report`` sees each report as it arrives (a progress bar, or a test that kills a worker).
        With ``patience`` > 0 the job is followed across restarts of the master (:meth:`follow`: up to
        ``patience`` seconds for each, ``on_wait`` hearing why it waits); by default the master's going
        away ends the call with its ``AioRpcError``.
        With ``check`` (the default) a job that ends FAILED or CANCELLED raises :class:`JobFailedError`
        with the master's message; ``check=False`` returns its info instead.
        """
        job = await self.create_job(spec)
        if on_created is not None:
            on_created(job)
        reports: list[master_pb2.IterationReport] = []
        async for report in self.follow(job.job_id, on_wait=on_wait, patience=patience):
            keep_report(reports, report)
            if on_report is not None:
                result = on_report(report)
                if inspect.isawaitable(result):
                    await result
        info = await self.get_job(job.job_id)
        if check and info.state != master_pb2.JOB_STATE_SUCCEEDED:
            raise JobFailedError(f"job {info.job_id} {master_pb2.JobState.Name(info.state)}: {info.message}")
        return info, reports
