"""deploy/: the Kubernetes manifests pass the Kubernetes schemas, and the HAProxy configuration
they carry is deploy/haproxy/memspine.cfg, valid for the installed haproxy with their values."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
CFG = REPO / "deploy" / "haproxy" / "memspine.cfg"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def test_every_manifest_passes_the_kubernetes_schemas_strictly() -> None:
    docs = _documents()
    kinds = {d["kind"] for _, d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "Deployment", "Secret"} <= kinds
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_a_broken_manifest_is_caught() -> None:
    """The checker does check: a StatefulSet without a selector, an unknown field."""
    broken = _one("StatefulSet", "memspine")
    broken = {**broken, "spec": {k: v for k, v in broken["spec"].items() if k != "selector"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
    odd = {**_one("Service", "memspine"), "spce": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(odd, kubernetes_validate.latest_version(), strict=True)


def test_the_configmap_carries_the_haproxy_configuration_unchanged() -> None:
    assert _one("ConfigMap", "memspine-haproxy")["data"]["memspine.cfg"] == CFG.read_text()


def test_the_proxy_backends_are_the_statefulset_pods() -> None:
    nodes = _one("StatefulSet", "memspine")
    pods = [f"memspine-{i}" for i in range(nodes["spec"]["replicas"])]
    env = {e["name"]: e for e in _container(nodes, "memspine")["env"]}
    assert env["MEMSPINE_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["MEMSPINE_CONTROL_URL"]["valueFrom"]["secretKeyRef"]["name"] == "memspine-control"
    proxy = _one("Deployment", "memspine-haproxy")
    haproxy_env = {e["name"]: e.get("value") for e in _container(proxy, "haproxy")["env"]}
    names = [haproxy_env[f"NODE_{i + 1}_NAME"] for i in range(len(pods))]
    assert names == pods
    service = nodes["spec"]["serviceName"]
    for i, pod in enumerate(pods):
        assert haproxy_env[f"NODE_{i + 1}_ADDR"] == f"{pod}.{service}:7781"
    used = set(re.findall(r"\$\{([A-Z0-9_]+)\}", CFG.read_text()))
    assert used <= set(haproxy_env), used - set(haproxy_env)
    secret = _one("Secret", "memspine-control")["stringData"]
    assert secret["MEMSPINE_CONTROL_URL"].startswith("postgresql://")


def test_the_haproxy_configuration_is_valid_for_the_installed_haproxy(tmp_path: Path) -> None:
    installed = subprocess.run(
        [str(REPO / "scripts" / "install-debian-packages"), "haproxy"],
        capture_output=True,
        text=True,
    )
    if installed.returncode != 0 or shutil.which("haproxy") is None:
        pytest.skip(f"no haproxy to check the configuration with: {installed.stderr.strip()}")
    proxy = _one("Deployment", "memspine-haproxy")
    env = {e["name"]: e["value"] for e in _container(proxy, "haproxy")["env"]}
    (tmp_path / "routes.map").touch()
    env.update(
        {
            "ROUTES_MAP": str(tmp_path / "routes.map"),
            "RUNTIME_SOCKET": str(tmp_path / "runtime.sock"),
        }
    )
    done = subprocess.run(
        ["haproxy", "-c", "-f", str(CFG)], env={"PATH": "/usr/sbin:/usr/bin:/bin", **env},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The pods' names do not resolve here: those servers start disabled, nothing else is wrong.
    problems = [
        line
        for line in done.stderr.splitlines()
        if "[WARNING]" in line or "[ALERT]" in line
        if "could not resolve address" not in line
    ]
    assert problems == []
