"""The MPI allreduce baseline of ``gradcode bench training``: one rank of a data-parallel loop on Open MPI.

    mpirun -n N python -m gradcode.bench.mpi_allreduce DATA_DIR WORKLOAD_JSON

Started once per benchmark by :class:`gradcode.bench.training.MpiPool`. Rank 0 reads one command per line on
its standard input (a JSON object: straggler model, parameters, seed, iterations; ``null`` to stop), every rank
runs it, and rank 0 writes one JSON line with the result on its standard output, behind :data:`RESULT_MARK`.

Each iteration every rank sleeps its straggler delay, computes the partial gradient of its partition with the
same model code as gradcode's workers (:meth:`~gradcode.common.training.models.Model.gradient_and_statistics`), sums it
with ``MPI_Iallreduce`` and applies the same Nesterov step (:mod:`gradcode.master.optimizer`), exactly as the
gloo baseline does. Blocking Open MPI calls busy-poll, which on an oversubscribed host (more ranks than cores,
as here) takes the cores the ranks that still compute need; so every wait — for the sum, for the next command —
polls a nonblocking request with :data:`POLL_SECONDS` sleeps in between: the politest MPI a user would run
on shared cores.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["COMMAND_BYTES", "IDLE_POLL_SECONDS", "POLL_SECONDS", "RESULT_MARK", "main"]

POLL_SECONDS = 50e-6
"""Sleep between two tests of a pending MPI request inside a run: short against a gradient (milliseconds), long
enough that a waiting rank leaves its core to the ranks still computing."""
IDLE_POLL_SECONDS = 20e-3
"""The same while the ranks wait for the next command: between runs latency does not count, and six ranks testing
every 50 µs would take CPU from the gradcode runs interleaved with them."""
COMMAND_BYTES = 4096
"""Size of the buffer rank 0 broadcasts a command in (JSON, zero-padded)."""
RESULT_MARK = "GRADCODE-MPI-RESULT "
"""Prefix of rank 0's result line on standard output (mpirun may interleave other lines)."""


def _wait(request: Any, poll: float = POLL_SECONDS) -> None:
    """Complete ``request`` without spinning: test it, sleep ``poll`` seconds, test again."""
    while not request.Test():
        time.sleep(poll)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - runs under mpirun
    args = sys.argv[1:] if argv is None else argv
    data_dir, workload = Path(args[0]), json.loads(args[1])
    from gradcode.common.transport.serving import BLAS_THREAD_VARIABLES

    for var in BLAS_THREAD_VARIABLES:
        os.environ[var] = "1"
    from mpi4py import MPI

    from gradcode.common.sim.stragglers import make_delay_model
    from gradcode.common.training.models import make_model, training_metrics
    from gradcode.master.optimizer import make_optimizer, mean_gradient

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    X_all = np.load(data_dir / "X_train.npy", mmap_mode="r")
    y_all = np.load(data_dir / "y_train.npy")
    index = np.load(data_dir / f"partition_{rank}.npy")
    X, y = np.ascontiguousarray(X_all[index]), np.ascontiguousarray(y_all[index])
    model = make_model(workload["model"], num_features=workload["num_features"])
    skip = int(workload["skip_iterations"])
    buffer = np.zeros(COMMAND_BYTES, dtype=np.uint8)
    while True:
        if rank == 0:
            line = sys.stdin.readline()
            encoded = (line.strip() or "null").encode()
            buffer[:] = 0
            buffer[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        _wait(comm.Ibcast(buffer, root=0), IDLE_POLL_SECONDS)
        command = json.loads(bytes(buffer).rstrip(b"\0").decode())
        if command is None:
            return
        delays = make_delay_model(command["model"], command["params"], command["seed"])
        optimizer = make_optimizer("nesterov", model.init_params(), learning_rate=workload["learning_rate"])
        _wait(comm.Ibarrier())
        started = time.perf_counter()
        elapsed: list[float] = []
        losses: list[float] = []
        gradient_cpu: list[float] = []
        for t in range(1, command["iterations"] + 1):
            time.sleep(max(0.0, delays.delay(rank, t)))
            point = optimizer.point
            cpu = time.thread_time()
            local = model.gradient_and_statistics(point, X, y)
            if t > skip:
                gradient_cpu.append(time.thread_time() - cpu)
            total = np.empty_like(local)
            _wait(comm.Iallreduce(local, total, op=MPI.SUM))
            metrics = training_metrics(model, total, point, y_all, l2=workload["l2"])
            optimizer.step(mean_gradient(metrics.gradient, point, num_samples=len(y_all), l2=workload["l2"]))
            if rank == 0:
                elapsed.append(time.perf_counter() - started)
                losses.append(metrics.loss)
        every_rank = comm.gather(gradient_cpu, root=0)  # once per run, after the timed loop
        if every_rank is not None:  # rank 0
            cpu_s = [seconds for times in every_rank for seconds in times]
            result = {"elapsed_s": elapsed, "loss": losses, "gradient_cpu_s": cpu_s, "world": world}
            print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
