"""The Containerfile and deploy/k8s agree with the code: the build stage's import check names
modules that exist, the manifests' probes ask routes the server answers without a key, and their
volume is the image's data directory (make test-image builds and runs the image itself)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.servers import REPO, InProcessServer

CONTAINERFILE = (REPO / "Containerfile").read_text()


def _image_env() -> dict[str, str]:
    """The runtime stage's ENV, name to value."""
    block = re.search(r"^ENV PATH=.*?(?=^\S)", CONTAINERFILE, re.M | re.S)
    assert block, "the runtime stage's ENV is missing"
    pairs = re.findall(r"(\w+)=(\S+)", block.group(0).replace("\\\n", " "))
    return dict(pairs)


def _imported_modules() -> list[str]:
    """The modules the build stage imports to check itself."""
    found = re.search(r'python -c "import ([\w., ]+)"', CONTAINERFILE)
    assert found, "the Containerfile has no import check"
    return [name.strip() for name in found.group(1).split(",")]


def _containers() -> list[dict[str, Any]]:
    """Every container of deploy/k8s that runs the memspine image."""
    found = []
    for path in sorted((REPO / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            found += [c for c in spec.get("containers", []) if c["image"].startswith("memspine:")]
    return found


def test_the_build_stage_imports_modules_that_exist() -> None:
    modules = _imported_modules()
    assert {"memspine.server", "memspine_admin.cli", "storage.tenants.tenant"} <= set(modules)
    for name in modules:
        importlib.import_module(name)


def test_the_manifests_name_the_version_being_built() -> None:
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version
    assert {c["image"] for c in _containers()} == {f"memspine:{version.group(1)}"}


def test_the_probes_ask_routes_the_server_answers_without_a_key(tmp_path: Path) -> None:
    paths = {
        probe["httpGet"]["path"]
        for container in _containers()
        for name in ("readinessProbe", "livenessProbe", "startupProbe")
        if (probe := container.get(name)) and "httpGet" in probe
    }
    assert paths, "no HTTP probe in deploy/k8s"
    server = InProcessServer(tmp_path / "data").start()
    try:
        for path in paths:
            assert server.request("GET", path).status_code == 200, path
    finally:
        server.stop()


def test_the_volume_is_the_image_data_directory() -> None:
    data_dir = _image_env()["MEMSPINE_DATA_DIR"]
    assert re.search(rf"^VOLUME {re.escape(data_dir)}$", CONTAINERFILE, re.M)
    statefulset = next(c for c in _containers() if c["name"] == "memspine")
    env = {e["name"]: e.get("value") for e in statefulset["env"]}
    assert env.get("MEMSPINE_DATA_DIR", data_dir) == data_dir
    mounts = {m["mountPath"] for m in statefulset["volumeMounts"]}
    assert data_dir in mounts
