"""MasterNode: the master's gRPC server, worker pool and jobs, with a run()/shutdown()/async-with lifecycle.

``run()`` serves until :meth:`MasterNode.shutdown` is called and returns only once everything has
stopped: health goes NOT_SERVING, running jobs are cancelled (their watchers' streams end), in-flight
calls get ``grace`` seconds, then the worker channels close. ``async with MasterNode(...) as node``
starts it in the background and stops it on exit; ``node.address`` is the bound ``host:port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import grpc

from common.serving import ServingHandle, format_address, start_server
from master.pool import WorkerPool
from master.service import MAX_FINISHED_JOBS, MasterServicer
from protos.gradcode.v1 import master_pb2_grpc

__all__ = ["MASTER_SERVICE_NAME", "MasterNode"]

log = logging.getLogger(__name__)

MASTER_SERVICE_NAME = "gradcode.v1.Master"


class MasterNode:
    """The master process's server.

    Keyword options: ``workers`` (fixed addresses), ``run_dir`` (job histories), ``data_dir`` (the only
    directory ``file`` datasets may be read from; None refuses them), ``grace``, ``max_finished_jobs``.
    """

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
    ) -> None:
        self.host = host
        self.port = port
        self.grace = grace
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.pool = WorkerPool(workers)
        self.servicer = MasterServicer(
            self.pool, run_dir=self.run_dir, data_dir=self.data_dir, max_finished_jobs=max_finished_jobs
        )
        self._handle: ServingHandle | None = None
        self._started = asyncio.Event()
        self._shutdown_requested = asyncio.Event()
        self._shutdown_complete = asyncio.Event()
        self._run_task: asyncio.Task[None] | None = None
        self._entered = False

    # ---- state -------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` with the bound port; only valid once started."""
        if self._handle is None:
            raise RuntimeError("The master is not serving yet.")
        return self._handle.address

    @property
    def is_running(self) -> bool:
        return self._handle is not None and not self._shutdown_complete.is_set()

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown_complete.is_set()

    async def wait_started(self) -> None:
        """Wait until the server accepts calls (or startup failed; then :meth:`run` raises)."""
        await self._started.wait()

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until :meth:`shutdown`; return only after everything has stopped."""
        if self._entered:
            raise RuntimeError("MasterNode.run() was already called; create a new node to serve again.")
        self._entered = True
        try:
            self._handle = await start_server(
                self.host,
                self.port,
                registrars=[self._register],
                service_names=[MASTER_SERVICE_NAME],
            )
            self.pool.start_monitor()
            log.info("master serving on %s with %d listed workers", self.address, len(self.pool.workers))
            self._started.set()
            await self._shutdown_requested.wait()
        finally:
            self._started.set()
            await self._stop()

    def _register(self, server: grpc.aio.Server) -> None:
        master_pb2_grpc.add_MasterServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]

    async def _stop(self) -> None:
        try:
            if self._handle is not None:
                await self._handle.set_serving(False)
            await self.servicer.close()
            if self._handle is not None:
                await self._handle.stop(self.grace)
            await self.pool.close()
        finally:
            self._shutdown_complete.set()

    async def shutdown(self) -> None:
        """Request a graceful stop and wait for it; idempotent and safe before start."""
        self._shutdown_requested.set()
        if not self._entered:
            self._shutdown_complete.set()
            return
        await self._shutdown_complete.wait()

    async def __aenter__(self) -> MasterNode:
        self._run_task = asyncio.get_running_loop().create_task(self.run(), name="master-node")
        await self.wait_started()
        if self._run_task.done():
            self._run_task.result()  # startup failed: re-raise its error
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()
        if self._run_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._run_task

    def __repr__(self) -> str:
        where = self.address if self._handle is not None else format_address(self.host, self.port)
        return f"<MasterNode({where}, workers={len(self.pool.workers)})>"
