"""The console's files at /ui (memspine/routes/ui.py) in process: what is served and with which
headers, MEMSPINE_UI=0, and checks on the files themselves that keep customer data inert and the
page offline (no markup built from strings, no inline script or style, nothing from elsewhere)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.config import SettingsError, load_settings
from memspine.routes.ui import ASSETS, load_assets

REPO = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:7781"


def _client(tmp_path: Path, **env: str) -> TestClient[Any]:
    settings = load_settings({"MEMSPINE_DATA_DIR": str(tmp_path / "data"), **env})
    return TestClient(create_app(settings), base_url=BASE)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    with _client(tmp_path) as c:
        yield c


def test_the_page_and_every_file_are_served_with_the_policy(client: TestClient[Any]) -> None:
    page = client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert client.get("/ui/").content == page.content == (ASSETS / "index.html").read_bytes()
    policy = page.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == directives["style-src"] == "'self'"  # no 'unsafe-inline'
    assert directives["frame-ancestors"] == "'none'"
    assert directives["form-action"] == "'none'"  # a key typed into a form never goes in a URL
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    names = [n for n in load_assets() if n != "index.html"]
    assert {"main.js", "console.css", "graph.js", "layout.js"} <= set(names)
    for name in names:
        r = client.get(f"/ui/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"].split(";")[0] == types[Path(name).suffix]
        assert r.headers["content-security-policy"] == policy
        assert r.content == (ASSETS / name).read_bytes()


@pytest.mark.parametrize(
    "path",
    ["/ui/nope.js", "/ui/../memspine/config.py", "/ui/%2e%2e/routes/ui.py", "/ui/routes/ui.py"],
)
def test_nothing_but_the_console_files_is_served(client: TestClient[Any], path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"
    assert "import" not in r.text


def test_memspine_ui_0_turns_the_console_off_and_nothing_else(tmp_path: Path) -> None:
    with _client(tmp_path, MEMSPINE_UI="0") as off:
        for path in ("/ui", "/ui/main.js"):
            r = off.get(path)
            assert (r.status_code, r.json()) == (
                404,
                {"error": "not_found", "detail": "no such route"},
            )
        assert off.get("/health").status_code == 200
        assert off.get("/v1/whoami", headers={"Authorization": "Bearer acme"}).status_code == 200


def test_the_setting_takes_a_flag() -> None:
    assert load_settings({}).ui is True
    assert load_settings({"MEMSPINE_UI": "1"}).ui is True
    assert load_settings({"MEMSPINE_UI": "off"}).ui is False
    with pytest.raises(SettingsError, match="MEMSPINE_UI: expected 1 or 0"):
        load_settings({"MEMSPINE_UI": "maybe"})


def _sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(ASSETS.iterdir()) if p.is_file()}


def test_no_markup_is_ever_built_from_a_string() -> None:
    # Every node is made by dom.js's el()/svg() with text nodes and one attribute at a time.
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
        r"setHTML|createContextualFragment|DOMParser|\.style\b|setAttribute\(\s*[\"']on"
    )
    for name, text in _sources().items():
        if name.endswith(".js"):
            assert not sinks.search(text), f"{name}: {sinks.search(text)}"


def test_the_page_has_no_inline_script_or_style_and_loads_nothing_from_elsewhere() -> None:
    index = (ASSETS / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", index, re.S)
    assert scripts and all(body.strip() == "" for body in scripts)  # src= only
    assert not re.search(r"\sstyle=|<style|\son[a-z]+=", index)
    local = re.findall(r"(?:src|href)=\"([^\"]+)\"", index)
    assert local and all(u.startswith(("/ui/", "#")) for u in local), local
    for name, text in _sources().items():
        urls = set(re.findall(r"https?://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{name} names {urls}"
        assert "@import" not in text and "url(http" not in text


def test_every_console_file_ships_in_the_package() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["memspine"]
    for path in ASSETS.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(REPO / "memspine").as_posix()
            assert any(fnmatch(rel, p) for p in patterns), f"{rel} is not in package-data"
