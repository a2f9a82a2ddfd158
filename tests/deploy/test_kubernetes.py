"""deploy/kubernetes, checked offline: every object validates against the Kubernetes schemas that
kubernetes-validate ships (strict: an unknown or misspelled field fails), the objects fit together
(probes, ports, Services, annotations, security), and each container's command and environment are
accepted by the real ``gradcode master`` / ``gradcode worker`` argument parsers."""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gradcode.client import healthcheck
from gradcode.common.transport.security import add_security_arguments
from gradcode.master import __main__ as master_main
from gradcode.master.node import MASTER_SERVICE_NAME
from gradcode.worker import __main__ as worker_main
from gradcode.worker.node import WORKER_SERVICE_NAME

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
"""Oldest Kubernetes the manifests target (native gRPC probes are GA since 1.27)."""

SECRET = "gradcode-settings"
"""The optional Secret every security setting can come from."""


def _security_variables(role: str) -> set[str]:
    """The GRADCODE_* variables of the security flags a ``role`` reads (from the flags' own help)."""
    parser = argparse.ArgumentParser()
    add_security_arguments(parser, role=role)
    return set(re.findall(r"\[(GRADCODE_\w+?)(?:=1)?\]", parser.format_help()))


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _resources() -> dict[str, dict[str, Any]]:
    """Every object kustomization.yaml applies, by ``Kind/name``."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    objects = {}
    for name in kustomization["resources"]:
        for doc in _documents(name):
            objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def _container(statefulset: dict[str, Any]) -> dict[str, Any]:
    return _pod_container(statefulset["spec"]["template"])


def _pod_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return container


def _port(container: dict[str, Any], name: str) -> int:
    return next(int(p["containerPort"]) for p in container["ports"] if p["name"] == name)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def _expand(container: dict[str, Any], pod: dict[str, str]) -> dict[str, str]:
    """The container's environment as Kubernetes sets it for ``pod`` (the downward-API fields), with
    no optional Secret present; ``$(VAR)`` refers to a variable defined earlier in the list."""
    field_values = {"metadata.name": pod["name"], "metadata.namespace": pod["namespace"]}
    env: dict[str, str] = {}
    for entry in container["env"]:
        source = entry.get("valueFrom")
        if source is None:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), entry["value"])
        elif "fieldRef" in source:
            env[entry["name"]] = field_values[source["fieldRef"]["fieldPath"]]
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            assert ref["containerName"] == container["name"], ref
            section, resource = ref["resource"].split(".")
            amount = _bytes(container["resources"][section][resource]) / _bytes(ref.get("divisor", "1"))
            env[entry["name"]] = str(math.ceil(amount))  # Kubernetes rounds up to a whole divisor
        else:
            assert source["secretKeyRef"]["optional"] is True, entry  # a cluster without the Secret still starts
    return env


def _bytes(quantity: str) -> float:
    """A Kubernetes memory quantity (``4Gi``, ``512Mi``, ``1``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * factor
    return float(quantity)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    examples = {p.name for p in DEPLOY.glob("*.example.yaml")}
    manifests = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"} - examples
    assert examples == {"secrets.example.yaml", "client-job.example.yaml"}  # applied by hand, not by kustomize
    assert set(kustomization["resources"]) == manifests


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifests_validate_against_the_kubernetes_schemas(name: str) -> None:
    for doc in _documents(name):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The schemas are really applied offline: a misspelled field and a wrongly typed one both fail."""
    statefulset = _resources()["StatefulSet/gradcode-worker"]
    misspelled = copy.deepcopy(statefulset)
    _container(misspelled)["readinesProbe"] = _container(misspelled).pop("readinessProbe")
    wrong_type = copy.deepcopy(statefulset)
    _container(wrong_type)["readinessProbe"]["periodSeconds"] = "often"
    for broken in (misspelled, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_workers_have_stable_names_behind_a_headless_service() -> None:
    objects = _resources()
    workers = objects["StatefulSet/gradcode-worker"]
    service = objects[f"Service/{workers['spec']['serviceName']}"]
    assert service["spec"]["clusterIP"] == "None"
    labels = workers["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert workers["spec"]["selector"]["matchLabels"].items() <= labels.items()
    env = _env(_container(workers))
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    advertise = env["GRADCODE_ADVERTISE"]["value"]
    assert advertise.startswith(f"$(POD_NAME).{service['metadata']['name']}.$(POD_NAMESPACE).svc:")
    assert advertise.endswith(f":{_port(_container(workers), 'grpc')}")
    master_service = objects["Service/gradcode-master"]
    master_host, master_port = env["GRADCODE_MASTER"]["value"].rsplit(":", 1)
    assert master_host == master_service["metadata"]["name"]
    assert int(master_port) in {p["port"] for p in master_service["spec"]["ports"]}


def test_master_keeps_its_state_on_a_volume_claim() -> None:
    master = _resources()["StatefulSet/gradcode-master"]
    assert master["spec"]["replicas"] == 1
    (claim,) = master["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in _container(master)["volumeMounts"]}
    state_mount = mounts[claim["metadata"]["name"]]
    env = _env(_container(master))
    for setting in ("GRADCODE_RUN_DIR", "GRADCODE_STATE_DIR"):
        assert env[setting]["value"].startswith(state_mount + "/")


@pytest.mark.parametrize(
    ("statefulset", "service_name"),
    [("gradcode-master", MASTER_SERVICE_NAME), ("gradcode-worker", WORKER_SERVICE_NAME)],
)
def test_containers_are_probed_limited_scraped_and_unprivileged(statefulset: str, service_name: str) -> None:
    pod = _resources()[f"StatefulSet/{statefulset}"]["spec"]["template"]
    container = _pod_container(pod)
    grpc_port, metrics_port = _port(container, "grpc"), _port(container, "metrics")
    env = _env(container)
    assert env["GRADCODE_LISTEN"]["value"] == f"0.0.0.0:{grpc_port}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # Exec probes with the project's health client, which presents the pod's certificate under mutual TLS
        # (a native grpc: probe cannot); its arguments must parse, and it must answer within the probe's timeout.
        command = container[probe]["exec"]["command"]
        assert command[:3] == ["python", "-m", "gradcode.client.healthcheck"], command
        probe_args = healthcheck.build_parser().parse_args(command[3:])
        assert probe_args.address == f"127.0.0.1:{grpc_port}"
        assert probe_args.timeout < container[probe]["timeoutSeconds"]
        assert probe_args.service == (service_name if probe == "readinessProbe" else "")  # ready for jobs
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == env["GRADCODE_METRICS_PORT"]["value"] == str(metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    dockerfile_user = re.search(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert dockerfile_user is not None and int(dockerfile_user.group(1)) == security["runAsUser"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["data"]["mountPath"] == env["GRADCODE_DATA_DIR"]["value"] and mounts["data"]["readOnly"] is True
    secret_backed = {name for name, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})}
    assert {env[name]["valueFrom"]["secretKeyRef"]["name"] for name in secret_backed} == {SECRET}
    role = statefulset.removeprefix("gradcode-")
    # Every security setting the service, or its probe (a client in the same pod), reads can come from the Secret,
    # but GRADCODE_INSECURE: the manifests set it in plain sight (plaintext on the cluster network until the Secret
    # exists, behind the NetworkPolicy), so that a reader sees what turns the default's refusal off.
    wanted = _security_variables(role) | (_security_variables("client") - {"GRADCODE_TOKEN"})
    assert secret_backed == wanted - {"GRADCODE_INSECURE"}, role
    assert env["GRADCODE_INSECURE"]["value"] == "1"


@pytest.mark.parametrize(("statefulset", "main"), [("gradcode-master", master_main), ("gradcode-worker", worker_main)])
def test_commands_and_environment_are_accepted_by_the_real_parsers(
    statefulset: str, main: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    container = _container(_resources()[f"StatefulSet/{statefulset}"])
    command = container["command"]
    assert command[:2] == ["gradcode", statefulset.removeprefix("gradcode-")]
    help_text = main.build_parser().format_help()
    known = set(re.findall(r"\[(GRADCODE_\w+?)(?:=1)?\]", help_text))
    settings = {name for name in _env(container) if name.startswith("GRADCODE_")}
    unknown = settings - known
    assert not unknown, f"{statefulset} sets {sorted(unknown)}, which `{' '.join(command[:2])}` does not read"

    env = _expand(container, {"name": f"{statefulset}-0", "namespace": "fleet"})
    assert env["GRADCODE_DATA_DIR"] == "/data"
    env["GRADCODE_DATA_DIR"] = str(tmp_path)  # the mounted volume: a directory in the pod
    for name in [n for n in os.environ if n.startswith("GRADCODE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = main.parse_arguments([*command[2:], *container.get("args", [])])  # exits 2 on a refused value
    assert (args.host, args.port) == ("0.0.0.0", _port(container, "grpc"))
    assert args.metrics_port == _port(container, "metrics")
    assert args.log_format == "json"
    if statefulset == "gradcode-worker":
        assert args.advertise == "gradcode-worker-0.gradcode-workers.fleet.svc:50051"
        assert args.master == "gradcode-master:50050"
        assert args.name == "gradcode-worker-0"
        # A job larger than the container's memory is refused (RESOURCE_EXHAUSTED), not OOM-killed.
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert args.memory_budget == _bytes(requests["memory"]) / 2**30
        assert args.memory_budget * 2**30 <= _bytes(limits["memory"]) - 2**30  # room for the interpreter
    else:
        assert args.run_dir == "/var/lib/gradcode/runs"


def test_everything_runs_in_its_own_namespace_with_a_pinned_image() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    namespace = _resources()[f"Namespace/{kustomization['namespace']}"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    (image,) = kustomization["images"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert image["newTag"] == version  # never `latest` with IfNotPresent: a node would keep a stale one
    example = (DEPLOY / "secrets.example.yaml").read_text()
    assert f"*.gradcode-workers.{kustomization['namespace']}.svc" in example  # the certificate names to make
    assert "--host 127.0.0.1" in example  # what the exec probes dial


def test_network_policies_let_through_what_the_services_use() -> None:
    objects = _resources()
    policies = {name: o for name, o in objects.items() if name.startswith("NetworkPolicy/")}
    for statefulset, needed in (
        ("gradcode-master", {"grpc", "metrics"}),
        ("gradcode-worker", {"grpc", "link", "metrics"}),
    ):
        pod = objects[f"StatefulSet/{statefulset}"]["spec"]["template"]
        (policy,) = [
            p
            for p in policies.values()
            if p["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ]
        opened = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
        named = {port["name"] for port in _pod_container(pod)["ports"]}
        assert opened == needed and opened <= named, statefulset
        (metrics_rule,) = [
            rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        ]
        assert "from" not in metrics_rule  # Prometheus may live in any namespace


def test_the_client_job_runs_a_job_the_cli_accepts_with_the_services_security(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradcode.client.__main__ import _spec_from_args, build_parser

    (job,) = _documents("client-job.example.yaml")
    container = _pod_container(job["spec"]["template"])
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert container["image"] == f"gradcode:{kustomization['images'][0]['newTag']}"
    assert container["command"][:2] == ["gradcode", "run"]
    env = _expand(container, {"name": "gradcode-run-x", "namespace": "gradcode"})
    for name in [n for n in os.environ if n.startswith("GRADCODE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(container["command"][1:])
    assert args.master == "gradcode-master:50050" and _spec_from_args(args).code.name == "binary"
    secret_backed = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert secret_backed == _security_variables("client")
    labels = job["spec"]["template"]["metadata"]["labels"]
    master_policy = _resources()["NetworkPolicy/gradcode-master"]
    (grpc_rule,) = [r for r in master_policy["spec"]["ingress"] if "from" in r]
    assert all(not peer["podSelector"].get("matchLabels", {}).items() - labels.items() for peer in grpc_rule["from"])
