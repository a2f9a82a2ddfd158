"""The CLI against real masters as an operator meets it: what a refused connection says, what a job waiting for
workers says, output in a log (not a terminal), `watch --tail`, `jobs --json`, `model --out` into a new folder,
the Kubernetes probes against a mutual-TLS master, and a run that outlives a restart of its master."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from gradcode.client.certs import CertificateSet, make_certificates
from gradcode.client.launch import LocalCluster, ServiceProcess, service_env
from gradcode.v1 import master_pb2, master_pb2_grpc
from tests.e2e.conftest import START_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _gradcode(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`gradcode ARGV` as a user runs it in a pipe (standard output and error are not terminals)."""
    return subprocess.run(
        [sys.executable, "-m", "gradcode", *argv], capture_output=True, text=True, timeout=timeout, env=service_env()
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_certificates(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "localhost"])


def _pod_env(certs: CertificateSet) -> dict[str, str]:
    """What a pod reads from the Secret gradcode-settings for mutual TLS (its own node certificate)."""
    return {
        "GRADCODE_TLS_CERT": str(certs.node), "GRADCODE_TLS_KEY": str(certs.node_key),
        "GRADCODE_TLS_CA": str(certs.ca), "GRADCODE_MTLS": "1",
    }  # fmt: skip


@pytest.fixture(scope="module")
def mtls_master(certs: CertificateSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run_dir = tmp_path_factory.mktemp("mtls")
    env = _pod_env(certs)
    argv = [sys.executable, "-m", "gradcode.master", "--listen", "127.0.0.1:0", "--run-dir", str(run_dir)]
    master = ServiceProcess(argv, log_path=run_dir / "master.log", env=service_env(env))
    try:
        yield master.wait_ready(START_TIMEOUT)
    finally:
        master.stop()


def test_a_refused_connection_says_what_to_check(certs: CertificateSet, mtls_master: str) -> None:
    plain = _gradcode("jobs", "--master", mtls_master)
    assert plain.returncode == 1
    assert f"the master at {mtls_master} closed the connection during setup" in plain.stderr
    assert "It probably uses TLS: give the CA that signed its certificate with --tls-ca" in plain.stderr

    without_certificate = _gradcode("jobs", "--master", mtls_master, "--tls-ca", str(certs.ca))
    assert without_certificate.returncode == 1
    assert "If it requires client certificates (GRADCODE_MTLS=1 on the master)" in without_certificate.stderr
    assert "--tls-cert/--tls-key and --mtls" in without_certificate.stderr

    mutual = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client), "--tls-key", str(certs.client_key), "--mtls"]
    assert _gradcode("jobs", "--master", mtls_master, *mutual).returncode == 0

    nobody = _gradcode("jobs", "--master", "127.0.0.1:9")  # the discard port: nothing listens
    assert nobody.returncode == 1
    assert nobody.stderr.startswith("gradcode: nothing answered at 127.0.0.1:9 (")
    assert "Check that a master runs there" in nobody.stderr and "the master answered" not in nobody.stderr


def test_the_kubernetes_probes_pass_against_a_mutual_tls_master(certs: CertificateSet, mtls_master: str) -> None:
    """The manifests' exec probes, run as the kubelet runs them in the master's pod (the Secret's settings in the
    environment): they present the pod's certificate, where a certificate-less check gets "Socket closed"."""
    (master,) = [
        d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "master.yaml").read_text())
        if d["kind"] == "StatefulSet"
    ]  # fmt: skip
    (container,) = master["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        python, *rest = (part.replace("127.0.0.1:50050", mtls_master) for part in container[probe]["exec"]["command"])
        assert python == "python"
        env = service_env(_pod_env(certs))
        for name in ("GRADCODE_TLS_SERVER_NAME", "GRADCODE_TLS", "GRADCODE_TOKEN"):
            env.pop(name, None)
        passed = subprocess.run([sys.executable, *rest], capture_output=True, text=True, timeout=60, env=env)
        assert passed.returncode == 0 and passed.stdout.strip() == "SERVING", (probe, passed.stdout, passed.stderr)
        plain = {k: v for k, v in env.items() if not k.startswith("GRADCODE_")}
        refused = subprocess.run([sys.executable, *rest], capture_output=True, text=True, timeout=60, env=plain)
        assert refused.returncode == 1, probe  # what a native grpc: probe (no client certificate) sees


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(1, run_dir=tmp_path_factory.mktemp("one")) as cluster:
        yield cluster.master_address


def test_a_job_waiting_for_workers_says_so_and_the_wait_is_a_flag(one_worker: str, tmp_path: Path) -> None:
    argv = ["--n", "2", "--s", "1", "--iterations", "2", "--wait-for-workers", "3", "--out", str(tmp_path)]
    done = _gradcode("run", "--master", one_worker, *argv)
    assert done.returncode == 1
    assert "1 worker(s) up at the master, its code needs n = 2; it waits up to 3 s for them" in done.stdout
    assert "(--wait-for-workers sets how long)" in done.stdout
    assert "needs 2 workers but only 1 registered" in done.stderr
    refused_at_once = _gradcode("run", "--master", one_worker, *argv[:-4], "--wait-for-workers", "0")
    assert refused_at_once.returncode == 1 and "needs 2 workers but 1 are up" in refused_at_once.stderr


def test_off_a_terminal_progress_summary_and_id_are_separate_lines(one_worker: str, tmp_path: Path) -> None:
    done = _gradcode(
        "run", "--master", one_worker, "--n", "1", "--s", "0", "--iterations", "20", "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout + done.stderr  # no bar redrawn in a log
    lines = done.stdout.splitlines()
    assert lines[0].startswith("job job-") and len(lines[0].split()) == 2
    assert any(line.startswith("binary: 20 iterations, median") for line in lines)
    progress = [line for line in done.stderr.splitlines() if line.startswith("binary: iteration ")]
    assert [line.split()[2] for line in progress] == [f"{i}/20," for i in range(2, 21, 2)]
    assert f"Saved {tmp_path.resolve() / 'history.json'}" in done.stdout


def test_watch_tails_jobs_lists_as_json_and_model_creates_its_folder(one_worker: str, tmp_path: Path) -> None:
    run = _gradcode("run", "--master", one_worker, "--n", "1", "--s", "0", "--iterations", "30", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.split()[1]

    watch = _gradcode("watch", job_id, "--master", one_worker, "--tail", "3", "--out", str(tmp_path / "w"))
    assert watch.returncode == 0, watch.stderr
    shown = [line.split()[1] for line in watch.stdout.splitlines() if line.startswith("iteration ")]
    assert shown == ["28:", "29:", "30:"]
    assert watch.stdout.splitlines()[0] == f"job {job_id}: SUCCEEDED, 30/30 iterations done"
    assert "test acc nan" not in watch.stdout
    assert len(json.loads((tmp_path / "w" / "history.json").read_text())) == 30  # the whole history is kept
    everything = _gradcode("watch", job_id, "--master", one_worker, "--tail", "-1")
    assert sum(line.startswith("iteration ") for line in everything.stdout.splitlines()) == 30

    listing = _gradcode("jobs", "--master", one_worker, "--json")
    assert listing.returncode == 0, listing.stderr
    jobs = {job["job_id"]: job for job in json.loads(listing.stdout)["jobs"]}
    assert jobs[job_id]["state"] == "JOB_STATE_SUCCEEDED" and jobs[job_id]["iterations_done"] == 30

    target = tmp_path / "new" / "deeper" / "model.npy"
    model = _gradcode("model", job_id, "--master", one_worker, "--out", str(target))
    assert model.returncode == 0, model.stderr
    assert np.load(target).ndim == 1


def test_run_follows_its_job_across_a_master_restart(tmp_path: Path) -> None:
    """SIGTERM stops the master and, with it, the job (resumable from its checkpoint); the restarted master
    resumes it. `gradcode run` once printed JOB_STATE_CANCELLED, saved nothing and exited; now it waits for
    the master and follows the job to its end, with one report per iteration."""
    master_args = ["--state-dir", str(tmp_path / "state"), "--checkpoint-every", "2"]
    with LocalCluster(2, run_dir=tmp_path / "cluster", master_args=master_args) as cluster:
        master = cluster.master_address
        argv = [
            "run", "--master", master, "--n", "2", "--s", "1", "--iterations", "60", "--reconnect", "120",
            "--straggler", "fixed", "--straggler-param", "delay_seconds=0.1", "--out", str(tmp_path / "run"),
        ]  # fmt: skip
        run = subprocess.Popen(
            [sys.executable, "-m", "gradcode", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=service_env(),
        )  # fmt: skip
        try:
            assert run.stdout is not None
            job_id = run.stdout.readline().split()[1]
            deadline = time.monotonic() + START_TIMEOUT
            with grpc.insecure_channel(master) as channel:
                stub = master_pb2_grpc.MasterStub(channel)
                while stub.GetJob(master_pb2.GetJobRequest(job_id=job_id), timeout=10).iterations_done < 5:
                    assert time.monotonic() < deadline, "the job made no progress"
                    time.sleep(0.05)
            cluster.master.stop()  # type: ignore[union-attr]  # SIGTERM: the job stops with the master
            cluster.restart_master(START_TIMEOUT)
            out, err = run.communicate(timeout=240)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 0, out + err
    assert "for the master to come back and resume job" in out, err
    assert "binary: 60 iterations" in out
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [r["iteration"] for r in history] == list(range(1, 61))
