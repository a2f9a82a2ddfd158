"""Master.ListJobs: the jobs the servicer holds, their states and progress, and the evicted ids."""

from __future__ import annotations

import asyncio

from gradcode.v1 import master_pb2
from tests.helpers import fixed_delay
from tests.master.test_master_node import TIMEOUT, job_spec, running_master


async def test_list_jobs_shows_running_finished_and_evicted_jobs() -> None:
    async with asyncio.timeout(TIMEOUT), running_master(2, max_finished_jobs=1) as master:
        ids = await master.wait_workers(2)
        empty = await master.stub.ListJobs(master_pb2.ListJobsRequest())
        assert list(empty.jobs) == [] and list(empty.evicted_job_ids) == []
        for name in ("first", "second"):
            info, _ = await master.run(job_spec("uncoded", {"n": 2}, iterations=2, worker_ids=ids, job_id=name))
            assert info.state == master_pb2.JOB_STATE_SUCCEEDED, info.message
        # a job that runs until cancelled: every worker 0.5 s slow, many iterations
        slow = job_spec("uncoded", {"n": 2}, iterations=1000, worker_ids=ids, job_id="slow", straggler=fixed_delay(0.5))
        await master.stub.CreateJob(slow)
        while (await master.stub.GetJob(master_pb2.GetJobRequest(job_id="slow"))).iterations_done < 1:
            await asyncio.sleep(0.05)

        listing = await master.stub.ListJobs(master_pb2.ListJobsRequest())
        jobs = {j.job_id: j for j in listing.jobs}
        assert list(jobs) == ["second", "slow"]  # "first" was evicted (the master keeps 1 finished job)
        assert list(listing.evicted_job_ids) == ["first"]
        assert jobs["second"].state == master_pb2.JOB_STATE_SUCCEEDED and jobs["second"].iterations_done == 2
        assert jobs["slow"].state == master_pb2.JOB_STATE_RUNNING and jobs["slow"].iterations_done >= 1
        assert not any(j.HasField("spec") for j in listing.jobs)  # GetJob has the spec

        cancelled = await master.stub.CancelJob(master_pb2.CancelJobRequest(job_id="slow"))
        listing = await master.stub.ListJobs(master_pb2.ListJobsRequest())
        assert [(j.job_id, j.state) for j in listing.jobs] == [("slow", master_pb2.JOB_STATE_CANCELLED)]
        assert list(listing.evicted_job_ids) == ["first", "second"]
        assert cancelled.state == master_pb2.JOB_STATE_CANCELLED
