"""The seed's recalls: its tenants reproduced through the API (the app in process; tests/e2e/
test_doors.py runs the first over a real server), answers in its order (the tenants' rows: tests/support/seed.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.seed import (
    MIN,
    MONDAY_9,
    PROJECT,
    SUPPORT,
    SUPPORT_TS,
    load,
    names,
    recall,
    review,
)
from tests.support.servers import InProcessServer

STATUS_QUERY = {
    "text": "cutover plan for billing: date, freeze, copy time",
    "embedding": [0.7, 0.4, 0.0, 0.6],
    "kind": "fact",
    "k": 3,
}
PREFERENCE_QUERY = {
    "text": "how Lena wants status notes written",
    "embedding": [0.0, 0.0, 1.0, 0.1],
    "kind": "fact",
    "k": 1,
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One app for the module, embedding dimension 4 as in the seed; each test has its own tenants."""
    server = InProcessServer(tmp_path_factory.mktemp("seed") / "data").start()
    yield server
    server.stop()


def tenant_client(srv: InProcessServer, name: str) -> httpx.Client:
    """A client whose token (the tenant id, in local mode) is unique to this test."""
    return srv.client(f"{name}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def support(srv: InProcessServer) -> tuple[httpx.Client, dict[str, str]]:
    """The support tenant loaded through the server: (its client, name -> id)."""
    client = tenant_client(srv, "customer-4417")
    return client, load(client, SUPPORT, SUPPORT_TS, {"conversation": "c-1005-01"})


@pytest.fixture
def project(srv: InProcessServer) -> tuple[httpx.Client, dict[str, str]]:
    """The project tenant loaded through the server: (its client, name -> id)."""
    client = tenant_client(srv, "billing-ledger")
    return client, load(client, PROJECT, MONDAY_9, {})


def test_reviewer_recall_returns_the_reply_the_objection_then_the_replys_sources(
    support: tuple[httpx.Client, dict[str, str]],
) -> None:
    review(*support)


def test_another_tenant_recalls_nothing_of_the_customer(
    srv: InProcessServer, support: tuple[httpx.Client, dict[str, str]]
) -> None:
    other = tenant_client(srv, "customer-5530")
    assert recall(other, {"text": "order 88213 delivered", "k": 5}) == {"hits": []}


def test_status_recall_ranks_both_dates_then_after_the_delete_the_copy_time(
    project: tuple[httpx.Client, dict[str, str]],
) -> None:
    client, ids = project
    before = recall(client, STATUS_QUERY)["hits"]
    assert names(ids, before) == ["old_date", "new_date", "decision"]
    scores = [h["score"] for h in before]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3
    assert all("via" not in h and "replaces" not in h for h in before)

    resp = client.delete(f"/v1/memory/event/{ids['old_date']}")
    assert (resp.json()["deleted"], resp.json()["purged"]) == (True, False)

    after = recall(client, STATUS_QUERY)["hits"]
    assert names(ids, after) == ["new_date", "decision", "copy_time"]


def test_preference_recall_finds_mondays_fact(project: tuple[httpx.Client, dict[str, str]]) -> None:
    client, ids = project
    hits = recall(client, PREFERENCE_QUERY)["hits"]
    assert names(ids, hits) == ["preference"]
    assert hits[0]["text"] == "Lena wants status notes as three bullets, no tables"
    assert hits[0]["ts"] == MONDAY_9 + 11 * MIN
