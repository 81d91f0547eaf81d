"""The seed's first session (a reply with sources, read back, 404 to another tenant) and the
request helpers it uses: tests/server/test_api.py in process, tests/e2e/test_doors.py over a socket."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

from tests.support.servers import InProcessServer, ServerProcess

JSON = {"Content-Type": "application/json"}


NOT_FOUND = {"error": "not_found", "detail": "no event with that id"}


def at(day: int, clock: str) -> int:
    """Microseconds at HH:MM:SS UTC on October `day`, 2026 (the seed's week)."""
    h, m, s = (int(x) for x in clock.split(":"))
    return int(datetime(2026, 10, day, h, m, s, tzinfo=UTC).timestamp()) * 1_000_000


def post(c: httpx.Client, body: dict[str, Any] | str, **headers: str) -> httpx.Response:
    """POST /v1/memory/event with a JSON body (a str is sent byte for byte)."""
    content = body if isinstance(body, str) else json.dumps(body)
    return c.post("/v1/memory/event", content=content, headers={**JSON, **headers})


def append(c: httpx.Client, body: dict[str, Any], **headers: str) -> str:
    """Append and return the new id, asserting the seed's 201 {"event_id"} answer."""
    r = post(c, body, **headers)
    assert r.status_code == 201, r.text
    assert list(r.json()) == ["event_id"]
    return str(r.json()["event_id"])


def first_session(srv: InProcessServer | ServerProcess, client: httpx.Client) -> None:
    """The seed's first session: a reply with sources, read back, and 404 to another tenant."""
    customer = append(
        client,
        {"kind": "turn", "ts": at(5, "14:01:02"), "text": "Customer: order 88213 shows delivered"},
    )
    lookup = append(
        client,
        {
            "kind": "tool_call",
            "ts": at(5, "14:01:40"),
            "text": "get_order(88213)",
            "properties": {"tool": "get_order"},
        },
    )
    missing = "354192b1-c84e-4f91-9374-7296fa56b173"
    reply = (
        '{\n  "kind": "turn",\n  "ts": 1791208939000000,\n'
        '  "text": "Agent: the carrier shows it signed for at number 16, on 1 October at 14:12. Please check there",\n'
        '  "embedding": [0.9, 0.1, 0.0, 0.0],\n'
        '  "properties": {\n    "speaker": "agent",\n    "conversation": "c-1005-01",\n'
        f'    "source_event_ids": [\n      "{customer}",\n      "{lookup}",\n      "{missing}"\n    ]\n  }}\n}}\n'
    )
    r = post(client, reply)
    assert r.status_code == 201
    # The seed's answer is {"event_id"}; memspine adds `unlinked` only for ids it could not link.
    assert r.json()["unlinked"] == [missing]
    reply_id = r.json()["event_id"]
    assert uuid.UUID(reply_id).version == 4

    got = client.get(f"/v1/memory/event/{reply_id}")
    assert got.status_code == 200
    ev = got.json()
    assert {"event_id", "kind", "ts", "text", "embedding", "properties"} <= set(ev)
    assert (ev["event_id"], ev["kind"], ev["ts"]) == (reply_id, "turn", 1791208939000000)
    assert ev["embedding"] == [0.9, 0.1, 0.0, 0.0]
    assert ev["properties"]["source_event_ids"] == [customer, lookup, missing]
    # Properties come back as the client sent them, down to the whitespace.
    assert reply[reply.index('{\n    "speaker"') : reply.rindex("\n}")] in got.text

    with srv.client("another-customer") as other:
        foreign = other.get(f"/v1/memory/event/{reply_id}")
        assert (foreign.status_code, foreign.json()) == (404, NOT_FOUND)
        assert other.delete(f"/v1/memory/event/{reply_id}").status_code == 404
    assert client.get(f"/v1/memory/event/{reply_id}").status_code == 200
