"""The deployment files agree with the server and with Kubernetes: the manifests validate
against the Kubernetes schema (offline, kubernetes-validate's bundled schemas), their
probes, ports, user and stop timing match the image and the server's drain, and the
image's lock file pins every dependency, the same versions for its cpu and gpu targets.
(`make image-test`, tests/image, builds and runs the image itself.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from recserve.config import parse_model_configs
from recserve.server.settings import GRACE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
# The oldest Kubernetes release still supported upstream when this was written, and the
# newest the validator knows.
KUBERNETES_VERSIONS = ["1.32.0", kubernetes_validate.latest_version()]


def _manifests() -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes.yaml").read_text()) if d]


def _named(kind: str, name: str) -> dict:
    return next(d for d in _manifests() if d["kind"] == kind and d["metadata"]["name"] == name)


def _dockerfile_instruction(name: str) -> str:
    """The last value of a Dockerfile instruction (the default target's)."""
    return re.findall(rf"^{name} (.+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)[-1]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_validate_against_the_schema(version):
    kinds = []
    for doc in _manifests():
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                             "Secret", "Service", "Service", "StatefulSet"]


def test_the_schema_check_rejects_a_mistake():
    deployment = _named("Deployment", "recserve")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["timeoutSecond"] = 3
    with pytest.raises(kubernetes_validate.ValidationError, match="timeoutSecond"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_kubernetes_config_and_routes():
    config = _named("ConfigMap", "recserve-config")["data"]["config.json"]
    models = parse_model_configs(config)
    assert [name for name, _ in models] == ["ranker"]
    assert models[0][1].redis_url == "redis://recserve-redis:6379"
    services = {d["metadata"]["name"] for d in _manifests() if d["kind"] == "Service"}
    assert services == {"recserve", "recserve-redis"}
    pod = _named("Deployment", "recserve")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    exposed = {int(port) for port in _dockerfile_instruction("EXPOSE").split()}
    assert {p["containerPort"] for p in container["ports"]} == exposed


def test_kubernetes_rolling_update_outlasts_the_drain():
    """preStop delay first, then the server's drain, both inside the grace period; a probe
    survives one slow answer; a disruption or scale-down never empties the service."""
    deployment = _named("Deployment", "recserve")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= int(command[1]) + GRACE_SECONDS + 5
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["timeoutSeconds"] >= 2, probe
    assert container["readinessProbe"]["failureThreshold"] > 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = _named("PodDisruptionBudget", "recserve")["spec"]
    assert budget["selector"] == deployment["spec"]["selector"]
    assert 0 < budget["minAvailable"] < deployment["spec"]["replicas"]
    autoscaler = _named("HorizontalPodAutoscaler", "recserve")["spec"]
    assert autoscaler["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "recserve"}
    assert autoscaler["minReplicas"] > budget["minAvailable"]
    assert [m["resource"]["name"] for m in autoscaler["metrics"]] == ["cpu"]


def test_kubernetes_pods_are_locked_down():
    pod = _named("Deployment", "recserve")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (Dockerfile useradd)
    assert "--uid 10001" in (ROOT / "Dockerfile").read_text()
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]}
    assert writable == {"/tmp", "/home/recserve"}
    assert set(container["resources"]["requests"]) >= {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    image = container["image"]
    assert re.fullmatch(r"\S+:(?!latest$)[\w.-]+|\S+@sha256:[0-9a-f]{64}", image), image


def test_kubernetes_redis_keeps_and_never_evicts_rows():
    redis = _named("StatefulSet", "recserve-redis")["spec"]
    container = redis["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--dir") + 1] == "/data"
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]} == {"/data": "data"}
    assert [t["metadata"]["name"] for t in redis["volumeClaimTemplates"]] == ["data"]
    assert "latest" not in container["image"] and ":" in container["image"]


def test_dockerfile_entrypoint_takes_flags_and_stop_timeout_outlasts_the_drain():
    assert _dockerfile_instruction("ENTRYPOINT") == '["recserve", "serve"]'
    assert _dockerfile_instruction("CMD") == '["--config", "/config/config.json"]'
    healthcheck = (ROOT / "Dockerfile").read_text().split("\nHEALTHCHECK ", 1)[1].split("\nSTOPSIGNAL", 1)[0]
    assert "http://127.0.0.1:8080/v2/health/ready" in healthcheck
    documented = re.findall(r"--stop-timeout (\d+)", (ROOT / "Dockerfile").read_text())
    assert documented and all(int(seconds) > GRACE_SECONDS for seconds in documented)
    assert _dockerfile_instruction("USER") == "recserve"


def test_lock_file_pins_every_dependency_the_same_for_cpu_and_gpu():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "deploy" / "constraints.txt").read_text(),
                           re.MULTILINE))
    normalized = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for requirement in [*project["dependencies"], *extras["cpu"], *extras["gpu"]]:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name).lower() in normalized, requirement
    assert normalized["onnxruntime"] == normalized["onnxruntime-gpu"]
