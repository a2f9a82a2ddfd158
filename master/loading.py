"""Putting a job on its workers: which pool workers run it, and LoadJob for each of them.

:class:`WorkerLoader` picks the pool workers for the job's worker indices (``worker_ids``, or the
first ``n`` UP ones, waiting up to ``wait_for_workers_seconds`` for them to register), and loads every
worker with exactly the partitions its rows need (streamed in chunks; each partition is serialised
once per job, in a thread: :class:`PartitionBytes`). A worker of a flat code gets every row it can be
asked for (:meth:`~gradcode.common.codes.base.GradientCode.rows_for_worker`); a node of a code with a
topology gets its one row and, when it has children, its parent role (the child code, the children's
ids, addresses and call tokens in slot order, and how long to wait for them). A parent holding a
child's old call token (the child restarted and was issued a new one) is reloaded
(:meth:`WorkerLoader.drop_stale_parents`).

Worker ids in reports are the pool's ids (as in ListWorkers); on the wire to the workers a job uses
the code's worker index ``0..N-1`` (the index the code's rows and the straggler model refer to).

With worker-local data (``DatasetSpec.worker_local``) a LoadJob is the setup alone: it carries the
dataset reference and the partitioning (:class:`~gradcode.v1.worker_pb2.LocalData`), and each worker
loads its own partitions, so what the master sends does not grow with the data
(:attr:`WorkerLoader.bytes_sent`, and the ``gradcode_load_bytes_sent`` metric).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np

from gradcode.common.codes.topology import descendants
from gradcode.common.exceptions import JobFailedError
from gradcode.common.ops import metrics
from gradcode.common.tasks import TaskOwner
from gradcode.common.training.data import Dataset
from gradcode.common.transport.security import job_token, relay_token
from gradcode.common.transport.serving import return_freed_memory
from gradcode.common.transport.shared_memory import SharedDirectory
from gradcode.common.transport.wire import code_spec, partition_chunks, row_definition
from gradcode.master.pool import PoolWorker, WorkerPool
from gradcode.master.spec import JobPlan
from gradcode.v1 import worker_pb2

__all__ = [
    "END_JOB_TIMEOUT_SECONDS",
    "JOB_REFUSALS",
    "LOAD_STALL_SECONDS",
    "REFUSED_RETRY_SECONDS",
    "SHARED_MEMORY",
    "PartitionBytes",
    "WorkerLoader",
    "stream_while_moving",
]

Chunk = TypeVar("Chunk")
Reply = TypeVar("Reply")

log = logging.getLogger(__name__)

LOAD_STALL_SECONDS = 120.0
"""A LoadJob fails when none of its chunks went out for this long, or its worker has not answered this long after the
last one (:func:`stream_while_moving`). Not a deadline for the whole call: 24 workers loading 192 MB each share a
200 Mbit/s master link for three minutes, every stream moving; a fixed 120 s marked the 13 still loading DOWN."""
END_JOB_TIMEOUT_SECONDS = 2.0
JOB_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED})
"""A worker's LoadJob refusals about the job, not about the worker: they never mark it DOWN for other jobs."""
REFUSED_RETRY_SECONDS = 1.0
"""How long a worker that refused a job for lack of room (RESOURCE_EXHAUSTED) is left before it is asked again."""
SHARED_MEMORY = "shared memory"
"""A worker's transport (``WorkerInfo.transport``) once it proved it reads the job's shared-memory directory."""


class PartitionBytes:
    """Each data partition's features and labels as little-endian float64 bytes, for LoadJob.

    A partition is serialised once per job (however many workers hold it, and however often a
    restarted worker is reloaded), in a thread so the event loop keeps serving; concurrent requests
    for the same partition share one serialisation. :meth:`clear` frees the bytes and the samples when the job ends.
    The serialisations are tasks of ``tasks`` (the job's owner; by default one of their own); one that fails
    only logs there, since each LoadJob that awaits it gets its error.
    """

    def __init__(
        self, dataset: Dataset, partitions: list[np.ndarray[Any, Any]], *, tasks: TaskOwner | None = None
    ) -> None:
        self.tasks = TaskOwner("partition serialisations") if tasks is None else tasks
        self._dataset = dataset
        self._partitions = partitions
        self._cache: dict[int, asyncio.Task[tuple[bytes, bytes]]] = {}
        self.serialisations = 0
        """How many partitions have been serialised (each at most once)."""

    async def get(self, j: int) -> tuple[bytes, bytes]:
        """Partition ``j``'s (features, labels) bytes."""
        task = self._cache.get(j)
        if task is None:
            task = self.tasks.spawn(asyncio.to_thread(self._serialise, j), name=f"partition-{j}", fatal=False)
            self._cache[j] = task
        return await asyncio.shield(task)  # a cancelled LoadJob must not cancel the shared serialisation

    def _serialise(self, j: int) -> tuple[bytes, bytes]:
        if not self._partitions:
            raise RuntimeError(f"partition {j} was asked for after the job ended and its samples were freed")
        idx = self._partitions[j]
        self.serialisations += 1
        features = np.ascontiguousarray(self._dataset.X_train[idx], dtype="<f8").tobytes()
        labels = np.ascontiguousarray(self._dataset.y_train[idx], dtype="<f8").tobytes()
        return features, labels

    def clear(self) -> None:
        """Free the serialised bytes and the job's samples: the job has ended (a finished job the master keeps
        for GetJob and WatchJob must not keep its dataset: at p = 10^6 that is 400 MB a job)."""
        self._cache.clear()
        self._dataset = self._dataset.without_samples()
        self._partitions = []


class WorkerLoader:
    """The pool worker behind each of the job's worker indices, and loading the job onto them."""

    def __init__(
        self, plan: JobPlan, pool: WorkerPool, *, shared: SharedDirectory | None = None, tasks: TaskOwner | None = None
    ) -> None:
        self.plan = plan
        self.pool = pool
        self.shared = shared
        """The job's shared-memory directory, offered to the workers whose messages come to the master
        (:mod:`gradcode.common.transport.shared_memory`); None: every payload goes through gRPC."""
        self.shared_workers: set[int] = set()
        """Worker indices whose last LoadJob proved they read the job's shared-memory directory."""
        self.transports: dict[int, str] = {}
        """Why the last LoadJob made no shared-memory offer to a worker index ("network (<why>)"), or empty when it
        made one."""
        self.workers: list[PoolWorker] = []
        """The pool worker behind each worker index (set by :meth:`select`)."""
        self.partition_bytes = PartitionBytes(plan.dataset, plan.partitions, tasks=tasks)
        self._given: dict[int, dict[int, str]] = {}
        """The call tokens each parent was last loaded with, by parent and child worker index."""
        self.bytes_sent = 0
        """Serialized bytes of every LoadJob chunk sent for this job (all workers, reloads included)."""
        self.refusals: dict[int, str] = {}
        """The job a worker refused (INVALID_ARGUMENT: worker-local data not there, another copy, no such plugin;
        more data than its per-job cap), by worker index: the worker is healthy, it just cannot serve this job."""
        self._retry_at: dict[int, float] = {}
        """When a worker that refused the job for lack of room (RESOURCE_EXHAUSTED) may be asked again."""

    @property
    def job_id(self) -> str:
        return self.plan.job_id

    async def select(self) -> None:
        """Choose :attr:`workers`, the pool workers for the job's worker indices."""
        self.workers = await self._choose()

    async def _choose(self) -> list[PoolWorker]:
        """The pool workers for the job's worker indices, waiting up to ``wait_for_workers_seconds``."""
        spec, n = self.plan.spec, self.plan.num_workers
        deadline = time.monotonic() + spec.wait_for_workers_seconds
        while True:
            if spec.worker_ids:
                chosen = [self.pool.get(i) for i in spec.worker_ids]
                if all(w.is_up for w in chosen):
                    return chosen
            else:
                up = self.pool.up()
                if len(up) >= n:
                    return up[:n]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.pool.wait_changed(min(remaining, 0.5))
        if spec.worker_ids:
            return [self.pool.get(i) for i in spec.worker_ids]  # go on; DOWN ones count as failed
        known = sorted(self.pool.workers, key=lambda w: (not w.is_up, w.worker_id))
        if len(known) >= n:
            return known[:n]
        raise JobFailedError(
            f"Gradient code {self.plan.code!r} needs {n} workers but only {len(known)} registered "
            f"(ids {[w.worker_id for w in known]}) within wait_for_workers_seconds = "
            f"{spec.wait_for_workers_seconds:g}; start more workers or choose a smaller n."
        )

    def job_setup(self, w: int) -> worker_pb2.JobSetup:
        """Worker ``w``'s JobSetup: its rows (and, for a parent in the code's topology, its children)."""
        plan, code, topology = self.plan, self.plan.code, self.plan.topology
        setup = worker_pb2.JobSetup(
            job_id=plan.job_id,
            worker_id=w,
            model=plan.spec.model,
            straggler=plan.spec.straggler,
            message_dtype=plan.message_dtype,  # type: ignore[arg-type]
            append_statistics=True,  # the master learns loss and accuracy from the decode, not from the data
            iterations=plan.spec.iterations,  # the worker refuses iterations beyond it
        )
        if topology is None:
            setup.rows.extend(row_definition(r, code.support(r), code.coefficients(r)) for r in code.rows_for_worker(w))
        else:
            node = topology.row(w)
            setup.rows.append(row_definition(node.row, node.partitions, node.coefficients))
            children = topology.children(w)
            if children:
                setup.parent.CopyFrom(
                    worker_pb2.ParentRole(
                        child_code=code_spec(topology.child_code.name, topology.child_code.params),
                        children=[
                            worker_pb2.ChildSpec(
                                worker_id=c,
                                address=self.workers[c].address,
                                call_token=self.child_bearer(c),
                                descendants=sorted(descendants(topology, c)),
                            )
                            for c in children
                        ],
                        wait_seconds=topology.wait_seconds(w, plan.spec.iteration_deadline_seconds),
                        no_links=not self.workers[w].links,  # the master's --link reaches the whole tree
                        integrity=plan.integrity,
                    )
                )
        if setup.HasField("parent"):
            self.transports[w] = "network (a tree parent: it forwards its children's messages inline)"
        elif topology is not None and w >= code.n:
            self.transports[w] = "network (its messages go to its tree parent)"
        else:  # a leaf whose messages come to the master
            self._offer_shared_memory(w, setup)
        if plan.local is None:
            setup.num_partitions_sent = len({j for row in setup.rows for j in row.partitions})
        else:
            setup.local_data.CopyFrom(self._local_data())
        return setup

    def _offer_shared_memory(self, w: int, setup: worker_pb2.JobSetup) -> None:
        """Offer worker ``w`` the job's shared-memory directory (with a fresh nonce for it to read back) unless it
        registered another machine id than the master's (a worker with none, such as a ``--workers`` address, is
        offered it: only its proof decides); else record why its payloads go through the network."""
        if self.shared is None:
            reason = "shared memory off"
        elif (machine := self.workers[w].machine_id) and machine != self.pool.machine_id:
            reason = "another machine: its machine id is not the master's"
        elif (offer := self.shared.offer(w)) is None:
            reason = "the master could not write its nonce"
        else:
            setup.shared_memory.CopyFrom(offer)
            self.transports[w] = ""
            return
        self.transports[w] = f"network ({reason})"

    def _local_data(self) -> worker_pb2.LocalData:
        """Where a worker finds its own partitions: the dataset reference and the job's partitioning."""
        plan, local = self.plan, self.plan.local
        assert local is not None
        ds = plan.spec.dataset
        return worker_pb2.LocalData(
            dataset=ds.name, path=ds.path, options=dict(ds.options), num_samples=ds.num_samples,
            num_features=ds.num_features, dataset_seed=ds.seed, test_fraction=ds.test_fraction,
            partition_seed=plan.spec.seed, partition_weights=[float(w) for w in plan.code.partition_weights],
            num_rows=local.num_rows, signed_labels=local.signed_labels,
        )  # fmt: skip

    async def load_stream(self, w: int) -> AsyncIterator[worker_pb2.LoadJobChunk]:
        """Worker ``w``'s LoadJob stream: its setup, then (unless the data is worker-local) the data of every
        partition its rows need."""
        setup = self.job_setup(w)
        if setup.HasField("parent"):
            self._given[w] = {c.worker_id: c.call_token for c in setup.parent.children}
        first = worker_pb2.LoadJobChunk(setup=setup)
        self._count(first)
        yield first
        if self.plan.local is not None:
            return
        for j in sorted({j for row in setup.rows for j in row.partitions}):
            features, labels = await self.partition_bytes.get(j)
            for chunk in partition_chunks(j, len(self.plan.partitions[j]), features, labels):
                self._count(chunk)
                yield chunk

    def _count(self, chunk: worker_pb2.LoadJobChunk) -> None:
        size = chunk.ByteSize()
        self.bytes_sent += size
        metrics.LOAD_BYTES_SENT.inc(size)

    async def load(self, w: int) -> bool:
        """LoadJob worker ``w``; False when it failed (the job goes on).

        A refusal about this job alone (:data:`JOB_REFUSALS`) leaves the worker UP for every other job: one it
        cannot serve (INVALID_ARGUMENT) fails this job at set-up (:meth:`load_all`), one that may pass later
        (RESOURCE_EXHAUSTED: the worker's memory or job count is taken by other jobs) is retried after
        :data:`REFUSED_RETRY_SECONDS` (:meth:`may_load`). Any other failure (the worker unreachable, timed out,
        restarted) marks it DOWN.
        """
        worker = self.workers[w]
        if not worker.is_up:
            return False
        self.shared_workers.discard(w)
        worker.loading += 1  # not idle: the pool's idle probe leaves it to this call
        try:
            reply = await stream_while_moving(worker.stub.LoadJob, self.load_stream(w), LOAD_STALL_SECONDS)
        except TimeoutError:
            self.pool.mark_down(
                worker,
                f"LoadJob for job {self.job_id!r}: nothing moved for {LOAD_STALL_SECONDS:g} s (the worker took no "
                "chunk, or did not answer after the last)",
            )
            return False
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the job itself is cancelled
            # The call, not the job: the worker's channel was closed under it (it went DOWN, or registered again
            # and got a new channel). grpc.aio raises CancelledError for that; the job must not read it as its own.
            log.warning("%s: LoadJob for job %r ended with its channel; it is loaded again later", worker.describe(),
                        self.job_id)  # fmt: skip
            return False
        except grpc.aio.AioRpcError as exc:
            why = f"LoadJob for job {self.job_id!r}: {exc.code().name}: {exc.details()}"
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                self.refusals[w] = exc.details() or ""
            elif exc.code() in JOB_REFUSALS:
                log.info("%s refused %s; retrying in %g s", worker.describe(), why, REFUSED_RETRY_SECONDS)
                self._retry_at[w] = time.monotonic() + REFUSED_RETRY_SECONDS
            else:
                self.pool.mark_down(worker, why)
            return False
        finally:
            worker.loading -= 1
        self._retry_at.pop(w, None)
        worker.transport = self._transport(w, reply.shared_memory_proof)
        if worker.transport == SHARED_MEMORY:
            self.shared_workers.add(w)
        worker.jobs.add(self.job_id)
        self.pool.mark_seen(worker)
        return True

    def _transport(self, w: int, proof: str) -> str:
        """How worker ``w`` moves this job's payloads after a LoadJob answered with ``proof``: :data:`SHARED_MEMORY`
        only when the proof is the nonce its offer wrote, else "network (<why>)"."""
        recorded = self.transports.get(w, "")
        if recorded or self.shared is None:  # no offer was made, for the reason recorded
            return recorded or "network (shared memory off)"
        reason = self.shared.verdict(w, proof)
        if reason:
            log.warning("%s: payloads of job %r go through the network: %s", self.workers[w].describe(), self.job_id,
                        reason)  # fmt: skip
            return f"network ({reason})"
        return SHARED_MEMORY

    def child_bearer(self, c: int) -> str:
        """What a parent presents to child ``c`` in this job: a job token derived from the child's call token (it
        opens that job's Computes only, and dies with the job), or "" for a child without one."""
        token = self.workers[c].call_token
        return job_token(token, self.job_id) if token else ""

    def relay_peer(self, p: int) -> tuple[str, str]:
        """Where a worker of this job fetches the model from worker ``p`` (``ComputeRequest.relayed_model``): its
        address, and a relay token derived from its call token (it opens that job's FetchModel only), or "" for a
        worker without one."""
        worker = self.workers[p]
        return worker.address, relay_token(worker.call_token, self.job_id) if worker.call_token else ""

    def may_load(self, w: int) -> bool:
        """Worker ``w`` may be asked to load the job now: it did not refuse the job, nor just refuse it for lack of
        room."""
        return w not in self.refusals and time.monotonic() >= self._retry_at.get(w, 0.0)

    def drop_stale_parents(self) -> list[int]:
        """Parents holding the job with a child's old call token: marked as lacking the job, so they are reloaded.

        A child that restarted was issued a new call token when it registered again, and refuses the
        old one its parent still presents.
        """
        stale = [
            p for p, given in self._given.items()
            if self.workers[p].has_job(self.job_id)
            and any(self.child_bearer(c) != token for c, token in given.items())
        ]  # fmt: skip
        for p in stale:
            self.workers[p].jobs.discard(self.job_id)
        return stale

    async def load_all(self) -> None:
        """Load every worker that is UP and does not hold the job yet.

        JobFailedError when a worker refused the job (INVALID_ARGUMENT: its worker-local data, or its size):
        every worker needs it, so the job fails at once with the worker's reason instead of running short of
        workers.
        """
        await asyncio.gather(
            *(
                self.load(w)
                for w in range(self.plan.num_workers)
                if self.workers[w].is_up and not self.workers[w].has_job(self.job_id)
            )
        )
        if self.refusals:
            w, reason = min(self.refusals.items())
            ids = sorted(self.workers[i].worker_id for i in self.refusals)
            first = self.workers[w].worker_id
            what = "this job's worker-local data" if self.plan.local is not None else "this job"
            raise JobFailedError(f"Worker(s) {ids} cannot load {what}; worker {first}: {reason}")

    async def end(self) -> None:
        """EndJob on every worker that holds the job (best effort), and free the training data (the partition
        bytes, and the plan's samples: a finished job the master keeps answers GetJob and WatchJob without them) and
        the shared-memory directory."""
        self.partition_bytes.clear()
        self.plan = dataclasses.replace(self.plan, dataset=self.plan.dataset.without_samples(), partitions=[])
        if self.shared is not None:
            self.shared.close()
        return_freed_memory()  # the data and the job's buffers, kept for reuse until now

        async def end(worker: PoolWorker) -> None:
            worker.jobs.discard(self.job_id)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await worker.stub.EndJob(worker_pb2.EndJobRequest(job_id=self.job_id), timeout=END_JOB_TIMEOUT_SECONDS)

        holders = [w for w in self.workers if w.is_up and w.has_job(self.job_id)]
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.gather(*(end(w) for w in holders), return_exceptions=True))


async def stream_while_moving(
    call: Callable[[AsyncIterator[Chunk]], Awaitable[Reply]], chunks: AsyncIterator[Chunk], stall: float
) -> Reply:
    """``call(chunks)``'s answer (a client-streaming gRPC call); TimeoutError, the call cancelled, once ``stall``
    seconds pass with no chunk taken or, after the last, no answer. The deadline follows the stream's progress, not
    its size: a large load through a busy link keeps moving, a worker that stops reading (or answering) does not.
    gRPC takes the next chunk once the one before is written, so a taken chunk is one that went out."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(stall) as deadline:

        async def moving() -> AsyncIterator[Chunk]:
            async for chunk in chunks:
                deadline.reschedule(loop.time() + stall)
                yield chunk
            deadline.reschedule(loop.time() + stall)

        return await call(moving())
