"""The OpenAPI document is the server's contract: schemathesis fuzzes a live server against it
with every check, for a read-write key, a read-only key and the admin key; and the document
lists every route and status docs/api.md lists.

tests/e2e/schemathesis.toml and tests/e2e/contract_hooks.py say where an answer depends on what no
JSON Schema can state (a Cypher query's syntax, an order between two fields, stored state).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import REPO, ServerProcess

from memspine_admin.control import ControlDB

ADMIN_KEY = "contract-admin-key-5d0c9e1f"
TESTS = Path(__file__).resolve().parent
CONFIG = TESTS / "schemathesis.toml"
SCRIPT = Path(sys.executable).parent / "schemathesis"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "schemathesis.cli"]
# Examples per operation and phase: about a minute for the three keys on a loaded 2-core machine.
MAX_EXAMPLES = {"read-write": 8, "read-only": 6, "admin": 5}


class Live:
    """A server with issued keys: one tenant with a read-write and a read-only key."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        admin = server.client(ADMIN_KEY)
        r = admin.post("/v1/admin/tenants", json={"name": "contract"})
        assert r.status_code == 201, r.text
        tenant = r.json()["tenant_id"]
        self.keys = {"admin": ADMIN_KEY}
        for role, scopes in (("read-write", ["read", "write"]), ("read-only", ["read"])):
            r = admin.post(
                "/v1/admin/keys", json={"tenant_id": tenant, "name": role, "scopes": scopes}
            )
            assert r.status_code == 201, r.text
            self.keys[role] = r.json()["api_key"]
            assert server.client(self.keys[role]).get("/v1/whoami").status_code == 200  # warm


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("contract") / "data"
    ControlDB.init(data_dir, actor="test")
    server = ServerProcess(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    try:
        yield Live(server)
    finally:
        server.stop()


def fuzz(live: Live, role: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """One schemathesis run, every check on, as `role`."""
    env = {**os.environ, "PYTHONPATH": str(TESTS), "NO_COLOR": "1"}
    args = [
        *COMMAND,
        "--config-file",
        str(CONFIG),
        "run",
        f"{live.server.url}/schema/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {live.keys[role]}",
        "--max-examples",
        str(MAX_EXAMPLES[role]),
        "--workers",
        "1",
    ]
    return subprocess.run(
        args, cwd=workdir, env=env, capture_output=True, text=True, timeout=240, check=False
    )


# Admin last: its fuzzing deletes tenants and revokes keys it finds in listings.
@pytest.mark.parametrize("role", ["read-write", "read-only", "admin"])
def test_the_server_answers_as_its_document_says(live: Live, role: str, tmp_path: Path) -> None:
    done = fuzz(live, role, tmp_path)
    tail = done.stdout[done.stdout.find("FAILURES") :] if "FAILURES" in done.stdout else done.stdout
    assert done.returncode == 0, f"{tail[-12000:]}\n{done.stderr[-2000:]}"
    assert re.search(r"\d+ generated, \d+ passed", done.stdout), done.stdout[-3000:]


def api_md_routes() -> dict[tuple[str, str], set[int]]:
    """Every `## METHOD /path` section of docs/api.md and the statuses it names in bold."""
    text = (REPO / "docs" / "api.md").read_text()
    routes: dict[tuple[str, str], set[int]] = {}
    sections = re.split(r"^## ", text, flags=re.M)
    for section in sections:
        head = re.match(r"`(GET|POST|DELETE) ([^`]+)`", section)
        if head is None:
            continue
        path = re.sub(r"\{id\}", "{event_id}", head.group(2))
        routes[(head.group(1).lower(), path)] = {
            int(s) for s in re.findall(r"\*\*([1-5]\d\d)\*\*", section)
        }
    return routes


def api_md_error_statuses() -> set[int]:
    """The statuses of docs/api.md's error table."""
    text = (REPO / "docs" / "api.md").read_text()
    return {int(s) for s in re.findall(r"^\| ([45]\d\d) \| `", text, flags=re.M)}


def test_the_document_lists_every_route_and_status_of_docs_api_md(live: Live) -> None:
    doc: dict[str, Any] = httpx.get(live.server.url + "/schema/openapi.json").json()
    paths = doc["paths"]
    routes = api_md_routes()
    assert len(routes) >= 9, routes  # the parse found the sections
    for (method, path), statuses in routes.items():
        assert path in paths and method in paths[path], (method, path)
        answers = {int(s) for s in paths[path][method]["responses"]}
        assert statuses <= answers, (method, path, statuses - answers)
        assert {200, 201} & answers or path == "/ui", (method, path)
    # The error table's statuses each appear in the document, on the routes that can answer them.
    every = {int(s) for p in paths.values() for op in p.values() for s in op["responses"]}
    assert api_md_error_statuses() <= every
    for p in paths.values():
        for op in p.values():
            for status, answer in op["responses"].items():
                if status.startswith(("4", "5")) and op["operationId"] not in (
                    "mcp",
                    "mcp_get",
                    "mcp_delete",
                ):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (
                        op["operationId"],
                        status,
                    )
    # Recall answers 200, appends 201 (200 for a replay), the admin routes and /mcp are there.
    assert set(paths["/v1/memory/recall"]["post"]["responses"]) >= {"200"}
    assert "201" not in paths["/v1/memory/recall"]["post"]["responses"]
    assert {
        "/health",
        "/metrics",
        "/v1/whoami",
        "/mcp",
        "/v1/admin/tenants",
        "/v1/admin/keys",
    } <= set(paths)
    schemes = doc["components"]["securitySchemes"]
    assert schemes["tenantKey"]["scheme"] == schemes["adminKey"]["scheme"] == "bearer"
    assert paths["/v1/memory/event"]["post"]["security"] == [{"tenantKey": []}]
    assert paths["/v1/admin/keys"]["post"]["security"] == [{"adminKey": []}]
    assert paths["/health"]["get"]["security"] == []


def test_the_schema_viewer_needs_no_other_host(live: Live) -> None:
    page = httpx.get(live.server.url + "/schema")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert refs and all(ref.startswith("/schema/") for ref in refs), refs
    assert "//" not in page.text.replace("<!DOCTYPE html>", "")
    for ref in refs:
        r = httpx.get(live.server.url + ref)
        assert r.status_code == 200 and len(r.content) > 100, ref
    start = httpx.get(live.server.url + "/schema/assets/start.js").text
    assert "/schema/openapi.json" in start and "validatorUrl: null" in start
    # Only the viewer's own files are served from the package.
    assert httpx.get(live.server.url + "/schema/assets/swagger-editor.js").status_code == 404


def test_the_hooks_excuse_only_what_no_schema_can_state() -> None:
    """tests/e2e/contract_hooks.py drops failures: each rule must drop its case and nothing else."""
    import contract_hooks as hooks

    assert hooks.whole_numbers_as_integers({"k": 74.0, "e": [1.5, 2.0], "t": "1.0"}) == {
        "k": 74,
        "e": [1.5, 2],
        "t": "1.0",
    }

    class Case:
        def __init__(self, query: Any = None, body: Any = None) -> None:
            self.query, self.body = query, body

    since = "since must not be later than until"
    assert hooks.broken_order(Case(query={"since": "9", "until": "3"}), 400, since)
    assert not hooks.broken_order(Case(query={"since": "3", "until": "9"}), 400, since)
    assert not hooks.broken_order(Case(query={"since": "9", "until": "3"}), 400, "limit must be")
    assert not hooks.broken_order(Case(query={"since": "9", "until": "3"}), 500, since)
    window = "valid_from must be earlier than valid_until"
    assert hooks.broken_order(Case(body={"valid_from": 5, "valid_until": 5}), 400, window)
    assert not hooks.broken_order(Case(body={"valid_from": 4, "valid_until": 5}), 400, window)

    class UseAfterFree:
        def __init__(self, free: str) -> None:
            self.free = free

    hooks.DRY_RUNS.add("/v1/memory/event/a")
    hooks.DRY_RUNS.add("/v1/memory/event/b")
    hooks.DELETED.add("/v1/memory/event/b")
    try:
        assert hooks.only_dry_run(UseAfterFree("DELETE /v1/memory/event/a"))
        assert not hooks.only_dry_run(UseAfterFree("DELETE /v1/memory/event/b"))  # really deleted
        assert not hooks.only_dry_run(UseAfterFree("DELETE /v1/memory/event/c"))
    finally:
        hooks.DRY_RUNS.clear()
        hooks.DELETED.clear()
