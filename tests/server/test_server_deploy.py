"""The Docker and Kubernetes examples stay consistent with what is tested: the Dockerfile
installs exactly as `make install` does, and the Kubernetes config parses and probes the
routes the server has. (Docker itself cannot run here: the image is never built.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from recserve.config import parse_model_configs

ROOT = Path(__file__).resolve().parents[2]


def _install_steps(text: str) -> list[str]:
    return re.findall(r"pip install -q -e \S*|setup\.py -q build_ext --inplace", text)


def test_dockerfile_installs_like_make_install():
    makefile = (ROOT / "Makefile").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    make_steps = [s.replace("'.[test]'", ".") for s in _install_steps(makefile)]
    assert make_steps == ["pip install -q -e .", "setup.py -q build_ext --inplace"]
    for stage in dockerfile.split("\nFROM ")[1:]:
        assert _install_steps(stage) == make_steps


def test_kubernetes_example_config_and_probes():
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes.yaml").read_text()))
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.json"]
    models = parse_model_configs(config)
    assert [name for name, _ in models] == ["ranker"]
    assert models[0][1].redis_url == "redis://recserve-redis:6379"
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert services == {"recserve", "recserve-redis"}
    server = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "recserve")
    container = server["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
