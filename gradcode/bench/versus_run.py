"""One measured job for :mod:`gradcode.bench.versus`, run by path (``python -P versus_run.py JOB``) with the side's
checkout first on ``PYTHONPATH``.

It uses only what every gradcode it compares has had (``LocalCluster``, ``GradcodeClient.run`` with a per-report
callback, ``build_job_spec``), and counts CPU and periods itself, so an older commit is measured as it was, not
through this checkout's helpers. Prints one JSON line: the master's, the workers' and the busiest worker's CPU
seconds per iteration over the job after its first ``skip`` iterations (``/proc``), each report's seconds since the
job started (the comparison takes the periods from them), the 1-minute load before, and the checkout the code came
from (what the comparison checks it asked for).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(job: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    import gradcode
    from gradcode.client.launch import LocalCluster
    from gradcode.client.sdk import GradcodeClient, build_job_spec
    from gradcode.v1 import master_pb2

    n, skip, iterations = job["n"], job["skip"], job["iterations"]

    tree: dict[str, Any] = {key: job[key] for key in ("code_params", "model_delivery") if key in job}  # n: its size

    def spec(count: int) -> Any:
        return build_job_spec(
            scheme=job["scheme"], s=job["s"], iterations=count, seed=job["seed"], model=job["model"],
            dataset=job["dataset"], num_samples=job["num_samples"], num_features=job["num_features"],
            learning_rate=job["learning_rate"], **(tree or {"n": n}),
        )  # fmt: skip

    with LocalCluster(n, run_dir=run_dir, master_args=job.get("master_args", ())) as cluster:
        if cluster.master is None:
            raise RuntimeError("the local cluster started no master")
        pids = [cluster.master.process.pid, *(w.process.pid for w in cluster.workers)]
        async with GradcodeClient(cluster.master_address) as client:
            await client.wait_ready(job["timeout"])
            deadline = time.monotonic() + job["timeout"]
            while sum(w.state == master_pb2.WORKER_STATE_UP for w in await client.list_workers()) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {n} workers registered within {job['timeout']} s")
                await asyncio.sleep(0.05)
            await client.run(spec(job["warmup"]))
            load = float(Path("/proc/loadavg").read_text().split()[0])
            steady: list[float] = []

            def sample(report: Any) -> None:
                if report.iteration == skip:
                    steady.extend(_cpu_seconds(pid) for pid in pids)

            _, reports = await client.run(spec(iterations), sample)
            used = [_cpu_seconds(pid) - before for pid, before in zip(pids, steady, strict=True)]
    counted = len(reports) - skip
    return {
        "cpu_master_s": used[0] / counted,
        "cpu_workers_s": sum(used[1:]) / counted,
        "cpu_busiest_worker_s": max(used[1:]) / counted,
        "elapsed_s": [r.elapsed_seconds for r in reports],
        "load": load,
        "checkout": str(Path(gradcode.__file__).resolve().parents[1]),
    }


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    print(json.dumps(asyncio.run(_measure(job, Path(job["run_dir"])))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
