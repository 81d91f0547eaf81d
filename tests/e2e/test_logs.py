"""Structured logs: JSON lines with request id, route, status, duration and tenant id; never a key,
never event text, never an exception's message."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memspine.logs import JsonFormatter, configure_logging, request_id_of
from tests.support.servers import ServerProcess
from tests.support.wait import wait_until

ADMIN_KEY = "logs-test-admin-key-5e1d9c"
SCRIPT = Path(sys.executable).parent / "memspine-admin"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "memspine_admin.cli"]
EVENT_TEXT = "the pangolin hid the ledger under seventeen"


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with issued keys (control database made by the real CLI) and an admin key."""
    data_dir = tmp_path_factory.mktemp("logs") / "data"
    env = {**os.environ, "MEMSPINE_DATA_DIR": str(data_dir)}
    done = subprocess.run([*COMMAND, "init"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    server = ServerProcess(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    yield server
    server.stop()


def log_lines(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line the server wrote, each parsed as JSON (a line that is not JSON fails the test)."""
    return [json.loads(line) for line in server.log_path.read_text().splitlines() if line]


def test_request_lines_carry_ids_route_status_and_tenant_but_no_key_or_text(
    issued: ServerProcess,
) -> None:
    admin = issued.client(ADMIN_KEY)
    tenant_id = admin.post("/v1/admin/tenants", json={"name": "logs"}).json()["tenant_id"]
    key = admin.post("/v1/admin/keys", json={"tenant_id": tenant_id, "name": "agent"}).json()
    api_key, key_id = key["api_key"], key["key_id"]
    with issued.client(api_key) as c:
        body = {"kind": "turn", "text": EVENT_TEXT, "properties": {"note": EVENT_TEXT}}
        r = c.post("/v1/memory/event", json=body, headers={"X-Request-Id": "trace-42.a"})
        assert r.status_code == 201
        assert r.headers["x-request-id"] == "trace-42.a"
        event_id = r.json()["event_id"]
        assert c.get(f"/v1/memory/event/{event_id}?x=1").status_code == 400
        wild = c.get("/v1/memory/events", headers={"X-Request-Id": "bad id with spaces"})
    generated = wild.headers["x-request-id"]
    assert generated != "bad id with spaces" and len(generated) == 32
    with issued.client(api_key + "x") as wrong:
        assert wrong.get("/v1/memory/events").status_code == 401

    # A request's line is written once its response is out: wait for the last one (the 401).
    def logged() -> list[dict[str, Any]]:
        return [line for line in log_lines(issued) if line["logger"] == "memspine.request"]

    wait_until(lambda: any(line["status"] == 401 for line in logged()), "the 401 logged")
    requests = logged()
    raw = issued.log_path.read_text()
    for secret in (api_key, api_key.rsplit("_", 1)[1], ADMIN_KEY, EVENT_TEXT, "pangolin"):
        assert secret not in raw
    by_id = {line["request_id"]: line for line in requests}
    write = by_id["trace-42.a"]
    assert write["route"] == "/v1/memory/event" and write["method"] == "POST"
    assert write["status"] == 201 and write["level"] == "INFO"
    assert write["tenant_id"] == tenant_id and write["key_id"] == key_id
    assert 0 < write["duration_ms"] < 60_000
    assert by_id[generated]["route"] == "/v1/memory/events"
    bad_param = [line for line in requests if line["status"] == 400]
    assert bad_param and bad_param[0]["route"] == "/v1/memory/event/{event_id}"
    assert all("x=1" not in json.dumps(line) for line in requests)  # no query strings
    refused = [line for line in requests if line["status"] == 401]
    assert refused and refused[0]["tenant_id"] is None and refused[0]["key_id"] is None


def test_formatter_logs_extra_fields_and_exception_type_without_its_message() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("memspine.test.formatter")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"could not parse {EVENT_TEXT}")
        except ValueError:
            logger.error("append failed", exc_info=True, extra={"tenant_id": "t1", "n": 3})
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["msg"] == "append failed" and line["level"] == "ERROR"
    assert line["tenant_id"] == "t1" and line["n"] == 3
    assert line["exc_type"] == "ValueError"
    assert any("test_logs.py" in frame for frame in line["stack"])
    assert "pangolin" not in stream.getvalue()


def test_configure_logging_replaces_handlers_with_one_json_handler() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    try:
        configure_logging("WARNING", stream)
        logging.getLogger("memspine.x").info("hidden")
        logging.getLogger("uvicorn.error").warning("shown")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["msg"]) for line in lines] == [("uvicorn.error", "shown")]


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("abc-123", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("", False),
        ("x\ny", False),
        ("<script>", False),
    ],
)
def test_request_id_is_echoed_only_when_plain(given: str, kept: bool) -> None:
    scope: Any = {"headers": [(b"x-request-id", given.encode())]}
    got = request_id_of(scope)
    assert (got == given) is kept
    if not kept:
        assert len(got) == 32 and int(got, 16) >= 0
