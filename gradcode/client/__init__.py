"""gradcode's client: a Python SDK over the master's control API, a CLI, and a local launcher."""

from gradcode.client.sdk import GradcodeClient, JobFailedError, build_job_spec

__all__ = ["GradcodeClient", "JobFailedError", "build_job_spec"]
