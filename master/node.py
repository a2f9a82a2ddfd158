"""MasterNode: the master's gRPC server, worker pool and jobs, with a run()/shutdown()/async-with lifecycle.

The lifecycle is :class:`gradcode.common.transport.serving.ServiceNode`'s: on shutdown health goes NOT_SERVING, running
jobs are cancelled (their watchers' streams end), in-flight calls get ``grace`` seconds, then the
worker channels close. ``async with MasterNode(...) as node`` serves until the block ends;
``node.address`` is the bound ``host:port``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import grpc

from gradcode.common.ops.metrics import MASTER_EVENT_LOOP_LAG
from gradcode.common.transport.security import Security
from gradcode.common.transport.serving import ServiceNode, format_address
from gradcode.common.transport.shared_memory import DEFAULT_ROOT, remove_abandoned
from gradcode.master.job import DEFAULT_CHECKPOINT_EVERY
from gradcode.master.limits import MAX_DATA_FILE_BYTES, MAX_FEATURES
from gradcode.master.pool import MAX_WORKERS, WorkerPool
from gradcode.master.service import MAX_FINISHED_JOBS, MasterServicer
from gradcode.v1 import master_pb2, master_pb2_grpc

__all__ = ["MASTER_SERVICE_NAME", "MasterNode"]

log = logging.getLogger(__name__)

MASTER_SERVICE_NAME: str = master_pb2.DESCRIPTOR.services_by_name["Master"].full_name
"""``gradcode.v1.Master``: the name health checks and reflection use."""


class MasterNode(ServiceNode):
    """The master process's server.

    Keyword options: ``workers`` (fixed addresses), ``run_dir`` (job histories), ``data_dir`` (the only
    directory ``file`` datasets may be read from; None refuses them), ``grace``, ``max_finished_jobs``,
    ``security`` (TLS and tokens, :class:`gradcode.common.transport.security.Security`; default plaintext and open)
    ``max_workers`` (the pool's bound), ``state_dir`` (job checkpoints; None keeps none),
    ``checkpoint_every``, ``shared_memory`` (the root of the jobs' shared-memory directories; None: none),
    ``links`` (ask workers for links, :mod:`gradcode.common.transport.link`) and ``machine_id`` (the master's, default
    :func:`gradcode.common.transport.machine.default_machine_id`: only workers of this machine id, or of none, are
    offered
    shared memory). Started on a state directory, the node resumes the jobs that were running.

    Its background tasks are :attr:`tasks`: the pool's monitors (a crash shuts the master down: it would go on
    not watching its workers) and channel closes, each job's task and its metrics watcher (a crash of one is
    logged: a job ends every failure of its own in a final state). A job's own tasks are the job's
    (:attr:`gradcode.master.job.JobRunner.tasks`).
    """

    service_name = MASTER_SERVICE_NAME
    event_loop_lag = MASTER_EVENT_LOOP_LAG

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        workers: Sequence[str] = (),
        run_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        grace: float = 5.0,
        max_finished_jobs: int = MAX_FINISHED_JOBS,
        security: Security | None = None,
        max_workers: int = MAX_WORKERS,
        max_data_file_bytes: int = MAX_DATA_FILE_BYTES,
        max_features: int = MAX_FEATURES,
        state_dir: str | Path | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        shared_memory: str | Path | None = DEFAULT_ROOT,
        links: bool = True,
        machine_id: str | None = None,
    ) -> None:
        super().__init__(host, port, grace=grace, security=security)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.pool = WorkerPool(
            workers, security=self.security, max_workers=max_workers, links=links, machine_id=machine_id,
            tasks=self.tasks,
        )  # fmt: skip
        self.servicer = MasterServicer(
            self.pool, run_dir=self.run_dir, data_dir=self.data_dir, max_finished_jobs=max_finished_jobs,
            max_data_file_bytes=max_data_file_bytes, max_features=max_features,
            state_dir=None if state_dir is None else Path(state_dir), checkpoint_every=checkpoint_every,
            shared_memory=None if shared_memory is None else Path(shared_memory), tasks=self.tasks,
        )  # fmt: skip

    def _register(self, server: grpc.aio.Server) -> None:
        master_pb2_grpc.add_MasterServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]

    async def _on_started(self) -> None:
        self.pool.start_monitor()
        root = self.servicer.shared_memory
        if root is not None:
            removed = remove_abandoned(root)
            if removed:
                log.info("removed %d shared-memory directories of killed masters: %s", len(removed),
                         ", ".join(str(p) for p in removed))  # fmt: skip
        log.info(
            "master serving on %s (%s) with %d listed workers",
            self.address, self.security.describe(), len(self.pool.workers),
        )  # fmt: skip
        resumed = await self.servicer.resume_saved()
        if resumed:
            log.info("resumed %d job(s) from %s: %s", len(resumed), self.servicer.state_dir, ", ".join(resumed))

    async def _before_stop(self) -> None:
        await self.servicer.close()  # cancel running jobs; their watchers' streams end

    async def _after_stop(self) -> None:
        await self.pool.close()

    def __repr__(self) -> str:
        where = self.address if self._handle is not None else format_address(self.host, self.port)
        return f"<MasterNode({where}, workers={len(self.pool.workers)})>"
