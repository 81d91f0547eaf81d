"""Every door over a real socket once: the seed's first session through memspine-server (the
Litestar routes and the hot append), its reviewer's recall (the hot recall), /health and the
OpenAPI document, and what the server logs at start. tests/server runs the same requests and
many more against the app in process; /mcp and stdio are in test_mcp_e2e.py, the CLI in
test_admin_cli.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from memspine.config import MAX_TENANT_THREADS, THREADS_PER_TENANT, max_map_count_ceiling
from memspine.limits import default_max_open_bytes
from storage import tenants_within
from tests.support.first_session import first_session
from tests.support.metrics import value
from tests.support.seed import SUPPORT, SUPPORT_TS, load, review
from tests.support.servers import ServerProcess, serve


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module; each test uses tenants of its own."""
    yield from serve(ServerProcess(tmp_path_factory.mktemp("doors") / "data"))


def test_health_and_the_openapi_document_over_a_socket(real: ServerProcess) -> None:
    body = httpx.get(real.url + "/health", timeout=30).json()
    assert body["service"] == "memspine-server" and body["status"] == "ok"
    r = httpx.get(real.url + "/schema/openapi.json", timeout=30)
    assert r.status_code == 200 and "/v1/memory/event" in r.json()["paths"]


def test_the_seeds_first_session_over_a_socket(real: ServerProcess) -> None:
    with real.client(f"doors-{uuid.uuid4().hex[:8]}") as client:
        first_session(real, client)


def test_the_seeds_reviewer_recall_over_a_socket(real: ServerProcess) -> None:
    with real.client(f"customer-4417-{uuid.uuid4().hex[:8]}") as client:
        ids = load(client, SUPPORT, SUPPORT_TS, {"conversation": "c-1005-01"})
        review(client, ids)


def test_the_fd_limit_is_raised_and_the_default_tenant_cap_follows_from_it(
    real: ServerProcess,
) -> None:
    lines = [json.loads(line) for line in real.log_path.read_text().splitlines()]
    (limit,) = [line for line in lines if line["logger"] == "memspine.limits"]
    (capped,) = [line for line in lines if line["msg"] == "open tenants capped"]
    assert limit["soft"] >= limit["before"]
    # From the memory budget (the server's default, this machine's), under the kernel's map
    # count and the open tenants' threads' ceilings (an idle open tenant holds no descriptor).
    cap = min(tenants_within(default_max_open_bytes()), max_map_count_ceiling())
    if THREADS_PER_TENANT:
        cap = min(cap, MAX_TENANT_THREADS // THREADS_PER_TENANT)
    assert capped["max_open_tenants"] == cap and capped["source"] == "default"
    assert (
        value(httpx.get(real.url + "/metrics", timeout=30).text, "memspine_max_open_tenants") == cap
    )
