"""What a newcomer tripped on (issue 30), each as a test: the start line names the embedder the
server has, the docs' admin keys are ones the server takes, `memspine-admin --version`, `GET /`
points the way, `HEAD /health` is 200, Swagger's example bodies are taken, and no stray file
sits at the repository's root."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from memspine.config import load_settings
from memspine.examples import EXAMPLES
from memspine.routes import OPERATIONS
from memspine.startline import start_line
from memspine_admin.cli import main as admin_main
from memspine_admin.control import ControlDB
from tests.support.servers import REPO, InProcessServer

ADMIN_KEY = "newcomer-admin-key-0123"
TENANT = "newcomer"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    server = InProcessServer(tmp_path_factory.mktemp("local") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    data_dir = tmp_path_factory.mktemp("issued") / "data"
    ControlDB.init(data_dir, actor="test")
    server = InProcessServer(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"MEMSPINE_EMBEDDER": "none"}, "embedder: none (clients send embeddings of 384 numbers)"),
        ({}, "embedder: local (sentence-transformers/all-MiniLM-L6-v2: the server embeds"),
        (
            {"MEMSPINE_EMBEDDING_DIM": "4"},
            "embedder: local (sentence-transformers/all-MiniLM-L6-v2) makes 384 numbers, not "
            "MEMSPINE_EMBEDDING_DIM=4",
        ),
        (
            {
                "MEMSPINE_EMBEDDER": "openai",
                "MEMSPINE_EMBEDDER_URL": "http://user:secret@gpu.internal:11434/v1",
                "MEMSPINE_EMBEDDER_MODEL": "nomic-embed-text",
            },
            "embedder: openai (nomic-embed-text at gpu.internal: the server embeds",
        ),
    ],
)
def test_the_start_line_names_the_embedder_the_server_has(
    tmp_path: Path, env: dict[str, str], words: str
) -> None:
    settings = load_settings({"MEMSPINE_DATA_DIR": str(tmp_path), **env})
    msg, fields = start_line(settings)
    assert words in msg and fields["embedder"] in msg
    assert "secret" not in msg


def test_every_admin_key_the_docs_start_a_server_with_is_long_enough() -> None:
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for value in re.findall(r"MEMSPINE_ADMIN_KEY=([^\s`$…]+)", page.read_text()):
            if value not in ("...",):
                found.append((page.name, value))
                load_settings({"MEMSPINE_ADMIN_KEY": value})  # SettingsError if refused
    assert found  # the pattern reads the pages


def test_memspine_admin_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        admin_main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"memspine-admin \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


def test_the_root_points_to_the_console_and_the_schema(local: InProcessServer) -> None:
    r = local.request("GET", "/")
    assert r.status_code == 200
    body = r.json()
    assert body["console"] == "/ui" and body["schema"] == "/schema"
    assert local.request("GET", body["schema"]).status_code == 200
    assert local.request("GET", body["console"]).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/"])
def test_head_of_health_is_200_without_a_body(local: InProcessServer, path: str) -> None:
    r = local.request("HEAD", path)
    assert r.status_code == 200 and r.content == b""
    assert local.request("HEAD", "/metrics").status_code == 405  # the others take no HEAD


def test_every_body_of_the_document_has_an_example(local: InProcessServer) -> None:
    doc = local.request("GET", "/schema/openapi.json").json()
    with_body = {op.name for op in OPERATIONS if op.body is not None}
    assert set(EXAMPLES) == with_body
    for path in doc["paths"].values():
        for op in path.values():
            body = op.get("requestBody")
            if body is not None and op["operationId"] in with_body:
                assert body["content"]["application/json"]["example"] == EXAMPLES[op["operationId"]]
    for op in OPERATIONS:
        if op.body is not None:
            msgspec.json.decode(msgspec.json.encode(EXAMPLES[op.name]), type=op.body)


MEMORY = [("append_event", 201), ("append_events", 201), ("recall", 200), ("cypher", 200)]


@pytest.mark.parametrize(("name", "status"), MEMORY)
def test_the_memory_examples_are_taken_as_they_stand(
    local: InProcessServer, name: str, status: int
) -> None:
    [op] = [op for op in OPERATIONS if op.name == name]
    with local.client(TENANT) as c:
        r = c.request(op.method, op.path, json=EXAMPLES[name])
    assert r.status_code == status, r.text


def test_the_admin_examples_are_taken(issued: InProcessServer) -> None:
    with issued.client(ADMIN_KEY) as c:
        r = c.post("/v1/admin/tenants", json=EXAMPLES["create_tenant"])
        assert r.status_code == 201, r.text
        tenant_id = r.json()["tenant_id"]
        r = c.patch(f"/v1/admin/tenants/{tenant_id}", json=EXAMPLES["set_tenant_limits"])
        assert r.status_code == 200, r.text
        key = {
            **EXAMPLES["create_key"],
            "tenant_id": tenant_id,
        }  # the example's names no tenant here
        r = c.post("/v1/admin/keys", json=key)
        assert r.status_code == 201, r.text
        r = c.post(f"/v1/admin/tenants/{tenant_id}/holds", json=EXAMPLES["place_hold"])
        assert r.status_code == 201, r.text


def test_no_empty_stray_file_is_tracked_at_the_root() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    root_files = [REPO / name for name in tracked if "/" not in name]
    assert [p.name for p in root_files if p.stat().st_size == 0] == []


T0 = 1_791_208_939_000_000


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/memory/recall", {"text": "billing", "k": 2.0, "hops": 0.0}, 200),
        ("/v1/memory/recall", {"text": "billing", "k": 1e1}, 200),
        ("/v1/memory/event", {"kind": "turn", "text": "x", "ts": float(T0)}, 201),
        ("/v1/memory/events", {"events": [{"kind": "turn", "ts": float(T0)}]}, 201),
    ],
)
def test_integral_numbers_are_integers(
    local: InProcessServer, path: str, body: dict[str, object], status: int
) -> None:
    with local.client(TENANT) as c:
        r = c.post(path, json=body)
    assert r.status_code == status, r.text


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"text": "billing", "k": 2.5}, "Expected `int`, got `float` - at `k`"),
        ({"text": "billing", "k": "2"}, "Expected `int`, got `str` - at `k`"),
        ({"text": "billing", "explain": 1, "k": 2.0}, "Expected `bool`, got `int` - at `explain`"),
        ({"text": "billing", "k": 1e17}, "Expected `int`, got `float` - at `k`"),
    ],
)
def test_other_numbers_stay_refused_where_an_integer_goes(
    local: InProcessServer, body: dict[str, object], words: str
) -> None:
    with local.client(TENANT) as c:
        r = c.post("/v1/memory/recall", json=body)
    assert r.status_code == 400 and words in r.json()["detail"], r.text


def test_a_query_integer_may_be_spelled_integral(local: InProcessServer) -> None:
    with local.client(TENANT) as c:
        assert c.get("/v1/memory/events", params={"limit": "2.0"}).status_code == 200
        assert c.get("/v1/memory/events", params={"limit": "2e0"}).status_code == 200
        for bad in ("2.5", "1e999999999", "nan", "two"):
            r = c.get("/v1/memory/events", params={"limit": bad})
            assert r.status_code == 400 and "limit must be an integer" in r.json()["detail"], bad


def test_an_mcp_tools_integer_may_be_spelled_integral() -> None:
    from memspine.mcp.tools import BY_NAME
    from storage.errors import InvalidRequest

    spec = BY_NAME["memory_recall"]
    parsed = spec.parse({"text": "x", "k": 3.0})
    assert parsed.k == 3 and isinstance(parsed.k, int)
    with pytest.raises(InvalidRequest, match="Expected `int`, got `float`"):
        spec.parse({"text": "x", "k": 3.5})
