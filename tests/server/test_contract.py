"""The OpenAPI document is the server's contract: schemathesis fuzzes the app against it with every
check, for a read-write key, a read-only key and the admin key; and the document lists every route
and status docs/api.md lists.

The app runs in this process: the schemathesis CLI's own run (its checks, phases, exit status and
report), with the schema loaded from the app and every request sent through schemathesis's ASGI
transport. tests/e2e/test_contract_e2e.py makes one pass over a real socket.

tests/support/schemathesis.toml and contract_hooks.py say where an answer depends on what no
JSON Schema can state (a Cypher query's syntax, an order between two fields, stored state).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from memspine_admin.control import ControlDB
from tests.support import contract_hooks as hooks
from tests.support.budget import LONG, size
from tests.support.contract import (
    ADMIN_KEY,
    ALL_PHASES,
    DOCUMENT,
    check_run,
    cli_args,
)
from tests.support.servers import REPO, InProcessServer, cheap_hasher

# Examples per operation and phase (a fuzz run: a share of it in make test, tests/support/budget.py).
MAX_EXAMPLES = {"read-write": size(8, 3), "read-only": size(6, 2), "admin": size(5, 2)}
# The coverage phase's boundary values are the same bodies for every key: make test sends them
# with the read-write key only, make test-long with the admin key too.
PHASES = {
    "read-write": ALL_PHASES,
    "read-only": "examples,fuzzing,stateful",
    "admin": ALL_PHASES if LONG else "examples,fuzzing,stateful",
}
# schemathesis's ASGI transport sends `Host: testserver`; a loopback-bound server answers only to
# the names it is told (memspine/edge.py), as a deployment behind a proxy is told its own.
ASGI_HOST = "testserver"


def issued_keys(data_dir: Path) -> dict[str, str]:
    """A control database with one tenant, its read-write and read-only keys; role -> token."""
    with ControlDB.open(data_dir, create=True, hasher=cheap_hasher()) as db:
        tenant = db.create_tenant("contract", actor="test").tenant_id
        keys = {"admin": ADMIN_KEY}
        for role, scopes in (("read-write", ("read", "write")), ("read-only", ("read",))):
            keys[role] = db.create_key(tenant, role, scopes, actor="test").api_key
    return keys


def app_of(data_dir: Path) -> Any:
    """memspine-server's app over data_dir with the admin key, as `memspine-server` builds it."""
    from memspine.app import create_app
    from memspine.auth import Authenticator, AuthLimits
    from memspine.config import load_settings

    settings = load_settings(
        {
            "MEMSPINE_BIND": "127.0.0.1:7781",
            "MEMSPINE_DATA_DIR": str(data_dir),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
            "MEMSPINE_ALLOWED_HOSTS": ASGI_HOST,
        }
    )
    # argon2 at its lowest cost: the admin key's fuzzing makes keys, and their cost is not the point.
    auth = Authenticator(
        settings.data_dir, ADMIN_KEY, hasher=cheap_hasher(), limits=AuthLimits.of(settings)
    )
    return create_app(settings, auth=auth)


def fuzz_in_process(app: Any, args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Run the schemathesis CLI here against `app`: (exit status, what it printed)."""
    import schemathesis
    from click.testing import CliRunner
    from schemathesis.cli import loaders
    from schemathesis.cli import schemathesis as command
    from schemathesis.python import asgi

    def from_app(_location: str, config: Any) -> Any:
        return schemathesis.openapi.from_asgi(DOCUMENT, app, config=config)

    # The CLI loads the document from a URL; here the same loader call reads it from the app,
    # which then makes schemathesis send every request to the app itself.
    monkeypatch.setattr(loaders, "detect_loader", lambda _location, _module: from_app)
    hooks.DRY_RUNS.clear()  # one run's deletes are not the next one's
    hooks.DELETED.clear()
    try:
        done = CliRunner().invoke(command, args, env={"NO_COLOR": "1"})
    finally:
        asgi.shutdown_lifespans()  # the app's shutdown: its tenants closed before tmp_path goes
    crashed = done.exception is not None and not isinstance(done.exception, SystemExit)
    return done.exit_code, done.output + (f"\n{done.exception!r}" if crashed else "")


# A bound on liveness, not on speed: at load 40 on 2 cores the read-write run passed pytest's
# default 300 s (about 20 s of CPU a run).
@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("role", ["read-write", "read-only", "admin"])
def test_the_server_answers_as_its_document_says(
    role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An app of its own for each key: the admin key's fuzzing deletes tenants and revokes keys.
    keys = issued_keys(tmp_path / "data")
    monkeypatch.chdir(tmp_path)  # whatever schemathesis writes goes there
    args = cli_args(f"http://{ASGI_HOST}{DOCUMENT}", keys[role], MAX_EXAMPLES[role], PHASES[role])
    check_run(*fuzz_in_process(app_of(tmp_path / "data"), args, monkeypatch))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """The app in process with issued keys and the admin key."""
    data_dir = tmp_path_factory.mktemp("contract") / "data"
    ControlDB.init(data_dir, actor="test")
    server = InProcessServer(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    try:
        yield server
    finally:
        server.stop()


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


def test_the_document_lists_every_route_and_status_of_docs_api_md(live: InProcessServer) -> None:
    doc: dict[str, Any] = live.request("GET", DOCUMENT).json()
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


def test_the_schema_viewer_needs_no_other_host(live: InProcessServer) -> None:
    page = live.request("GET", "/schema")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert refs and all(ref.startswith("/schema/") for ref in refs), refs
    assert "//" not in page.text.replace("<!DOCTYPE html>", "")
    for ref in refs:
        r: httpx.Response = live.request("GET", ref)
        assert r.status_code == 200 and len(r.content) > 100, ref
    start = live.request("GET", "/schema/assets/start.js").text
    assert "/schema/openapi.json" in start and "validatorUrl: null" in start
    # Only the viewer's own files are served from the package.
    assert live.request("GET", "/schema/assets/swagger-editor.js").status_code == 404


def test_the_hooks_excuse_only_what_no_schema_can_state() -> None:
    """contract_hooks.py drops failures: each rule must drop its case and nothing else."""
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
