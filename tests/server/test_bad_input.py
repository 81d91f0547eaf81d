"""Every bad input of the foundation: its status, code and a sentence saying what to fix; nothing changes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import InProcessServer

TENANT = "bad-input"
T0 = 1791208939000000  # µs: times before 2000 are refused unless the request opts in
MAX_BODY = 256 << 10  # above the longest valid body a case sends, far below the default


class Bad:
    """One bad request and what it must get: status, error code and words the detail must hold."""

    def __init__(
        self,
        name: str,
        method: str,
        path: str,
        status: int,
        code: str,
        words: str,
        *,
        body: str | bytes | None = None,
        params: dict[str, Any] | list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.name, self.method, self.path = name, method, path
        self.status, self.code, self.words = status, code, words
        self.body, self.params, self.headers = body, params, headers or {}


EVENT = "/v1/memory/event"
EVENTS = "/v1/memory/events"
SOME_ID = str(uuid.uuid4())
LOCAL_TOKEN = "in local mode the bearer token is the tenant id"  # a malformed one: 401 saying so


def _event(**fields: Any) -> str:
    """An append body: a valid event with some fields replaced."""
    return json.dumps({"kind": "turn", "text": "hello", **fields})


CASES = [
    # -- the append body --------------------------------------------------------------------
    Bad("malformed json", "POST", EVENT, 400, "invalid_request", "not valid JSON", body='{"kind": "turn",'),
    Bad("not utf-8", "POST", EVENT, 400, "invalid_request", "not valid JSON", body=b'{"kind": "\xff"}'),
    Bad("empty body", "POST", EVENT, 400, "invalid_request", "empty", body=""),
    Bad("array body", "POST", EVENT, 400, "invalid_request", "object", body="[]"),
    Bad("missing kind", "POST", EVENT, 400, "invalid_request", "missing required field `kind`", body='{"text": "hi"}'),
    Bad("kind not a string", "POST", EVENT, 400, "invalid_request", "at `kind`", body='{"kind": 7}'),
    Bad("empty kind", "POST", EVENT, 400, "invalid_request", "kind must be 1 to 64 bytes", body=_event(kind="")),
    Bad("long kind", "POST", EVENT, 400, "invalid_request", "kind must be 1 to 64 bytes", body=_event(kind="k" * 65)),
    Bad("kind with newline", "POST", EVENT, 400, "invalid_request", "printable", body=_event(kind="turn\n")),
    Bad("ts a string", "POST", EVENT, 400, "invalid_request", "at `ts`", body=_event(ts="yesterday")),
    Bad("ts a float", "POST", EVENT, 400, "invalid_request", "at `ts`", body=_event(ts=1.5)),
    Bad("ts negative", "POST", EVENT, 400, "invalid_request", "ts must be microseconds", body=_event(ts=-1)),
    Bad("text a number", "POST", EVENT, 400, "invalid_request", "at `text`", body=_event(text=5)),
    Bad("text too long", "POST", EVENT, 400, "invalid_request", "text may be at most", body=_event(text="x" * 100_001)),
    Bad("embedding of strings", "POST", EVENT, 400, "invalid_request", "at `embedding", body=_event(embedding=["a"])),
    Bad("embedding empty", "POST", EVENT, 400, "invalid_request", "embedding must not be empty", body=_event(embedding=[])),
    Bad("embedding beyond float32", "POST", EVENT, 400, "invalid_request", "embedding[1] is 1e+300, beyond what a float32 vector holds", body=_event(embedding=[0.5, 1e300])),
    Bad("embedding too long", "POST", EVENT, 400, "invalid_request", "embedding may hold at most 4096 values", body=_event(embedding=[0.5] * 4097)),
    Bad("embedding overflow", "POST", EVENT, 400, "invalid_request", "out of range", body='{"kind": "t", "embedding": [1e999, 0, 0, 0]}'),
    Bad("embedding wrong length", "POST", EVENT, 422, "embedding_mismatch", "has 3 values", body=_event(embedding=[1, 2, 3])),
    Bad("unknown field", "POST", EVENT, 400, "invalid_request", "unknown field `speaker`", body=_event(speaker="agent")),
    Bad("properties an array", "POST", EVENT, 400, "invalid_request", "properties must be a JSON object", body=_event(properties=[1])),
    Bad("sources not a list", "POST", EVENT, 400, "invalid_request", "source_event_ids must be a list", body=_event(properties={"source_event_ids": SOME_ID})),
    Bad("sources not strings", "POST", EVENT, 400, "invalid_request", "source_event_ids must be a list", body=_event(properties={"source_event_ids": [1]})),
    Bad("too many sources", "POST", EVENT, 400, "invalid_request", "at most 1000", body=_event(properties={"source_event_ids": [SOME_ID] * 1001})),
    Bad("validity reversed", "POST", EVENT, 400, "invalid_request", "valid_from must be earlier", body=_event(valid_from=T0, valid_until=T0)),
    Bad("ts in seconds", "POST", EVENT, 400, "invalid_request", "ts 1791208939 looks like seconds", body=_event(ts=T0 // 10**6)),
    Bad("ts in milliseconds", "POST", EVENT, 400, "invalid_request", "send 1791208939000000", body=_event(ts=T0 // 1000)),
    Bad("ts in nanoseconds", "POST", EVENT, 400, "invalid_request", "looks like nanoseconds", body=_event(ts=T0 * 1000)),
    Bad("ts 1", "POST", EVENT, 400, "invalid_request", "outside 2000-01-01 to 9999-12-31", body=_event(ts=1)),
    Bad("valid_until in seconds", "POST", EVENT, 400, "invalid_request", "valid_until 1791208939 looks like seconds", body=_event(valid_until=T0 // 10**6)),
    Bad("time check not on or off", "POST", EVENT, 400, "invalid_request", "Memspine-Time-Check must be on or off", body=_event(), headers={"Memspine-Time-Check": "maybe"}),
    Bad("recall's embedding_model too long", "POST", "/v1/memory/recall", 400, "invalid_request", "embedding_model must be 1 to 200 characters", body=json.dumps({"text": "first", "embedding_model": "m" * 201})),
    Bad("as_of in seconds", "POST", "/v1/memory/recall", 400, "invalid_request", "as_of 1791208939 looks like seconds", body=json.dumps({"text": "first", "as_of": T0 // 10**6})),
    Bad("idempotency key with a space", "POST", EVENT, 400, "invalid_request", "Idempotency-Key must be", body=_event(), headers={"Idempotency-Key": "CHG 9038"}),
    Bad("idempotency key too long", "POST", EVENT, 400, "invalid_request", "Idempotency-Key must be", body=_event(), headers={"Idempotency-Key": "k" * 256}),
    Bad("body too large", "POST", EVENT, 413, "payload_too_large", "MEMSPINE_MAX_BODY_BYTES", body=_event(text="x" * MAX_BODY)),
    Bad("query parameter on append", "POST", EVENT, 400, "invalid_request", "unknown query parameter 'tenant'", body=_event(), params={"tenant": "other"}),
    # -- ids in paths -----------------------------------------------------------------------
    Bad("get unknown id", "GET", f"{EVENT}/{SOME_ID}", 404, "not_found", "no event with that id"),
    Bad("delete unknown id", "DELETE", f"{EVENT}/{SOME_ID}", 404, "not_found", "no event with that id"),
    Bad("get non-uuid id", "GET", f"{EVENT}/88213", 400, "invalid_request", "event id must be a UUID"),
    Bad("delete non-uuid id", "DELETE", f"{EVENT}/CHG-9038", 400, "invalid_request", "event id must be a UUID"),
    Bad("id as a path", "GET", f"{EVENT}/..%2F..%2Fetc", 404, "not_found", "no such route"),
    Bad("delete with bad purge flag", "DELETE", f"{EVENT}/{SOME_ID}", 400, "invalid_request", "purge must be true or false", params={"purge": "maybe"}),
    # -- listing ----------------------------------------------------------------------------
    Bad("bad cursor", "GET", EVENTS, 400, "invalid_request", "pass next_cursor", params={"cursor": "not-ours"}),
    Bad("since after until", "GET", EVENTS, 400, "invalid_request", "since must not be later than until", params={"since": T0 + 10, "until": T0 + 9}),
    Bad("until in milliseconds", "GET", EVENTS, 400, "invalid_request", "until 1791208939000 looks like milliseconds", params={"until": T0 // 1000}),
    Bad("as_of of a listing in seconds", "GET", EVENTS, 400, "invalid_request", "or the header Memspine-Time-Check: off", params={"as_of": T0 // 10**6}),
    Bad("since not a number", "GET", EVENTS, 400, "invalid_request", "since must be an integer", params={"since": "monday"}),
    Bad("limit zero", "GET", EVENTS, 400, "invalid_request", "limit must be from 1 to 1000", params={"limit": 0}),
    Bad("limit over max", "GET", EVENTS, 400, "invalid_request", "limit must be from 1 to 1000", params={"limit": 1001}),
    Bad("unknown parameter", "GET", EVENTS, 400, "invalid_request", "unknown query parameter 'supplier'", params={"supplier": "SUP-2207"}),
    Bad("repeated parameter", "GET", EVENTS, 400, "invalid_request", "'kind' is given more than once", params=[("kind", "a"), ("kind", "b")]),
    Bad("long kind filter", "GET", EVENTS, 400, "invalid_request", "kind must be 1 to 64 bytes", params={"kind": "k" * 65}),
    Bad("over-long property filter", "GET", EVENTS, 400, "invalid_request", "longer than 256 bytes", params={"prop.note": "x" * 257}),
    Bad("bad property name", "GET", EVENTS, 400, "invalid_request", "does not name a filterable property", params={"prop.9lives": "x"}),
    Bad("empty property name", "GET", EVENTS, 400, "invalid_request", "does not name a filterable property", params={"prop.": "x"}),
    # -- credentials ------------------------------------------------------------------------
    Bad("no token", "POST", EVENT, 401, "unauthorized", "invalid or expired api key", body=_event(), headers={"Authorization": ""}),
    Bad("basic auth", "GET", EVENTS, 401, "unauthorized", "invalid or expired api key", headers={"Authorization": "Basic YWxhZGRpbjpvcGVuc2VzYW1l"}),
    Bad("token as a path", "POST", EVENT, 401, "unauthorized", LOCAL_TOKEN, body=_event(), headers={"Authorization": "Bearer ../bad-input"}),
    Bad("token with a dot", "GET", EVENTS, 401, "unauthorized", LOCAL_TOKEN, headers={"Authorization": "Bearer bad.input"}),
    Bad("token too long", "GET", EVENTS, 401, "unauthorized", LOCAL_TOKEN, headers={"Authorization": "Bearer " + "a" * 65}),
]  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """A server with a small body limit and one tenant holding three events."""
    server = InProcessServer(
        tmp_path_factory.mktemp("bad") / "data", {"MEMSPINE_MAX_BODY_BYTES": str(MAX_BODY)}
    ).start()
    with server.client(TENANT) as c:
        first = c.post(EVENT, json={"kind": "turn", "ts": T0 + 1, "text": "first"}).json()[
            "event_id"
        ]
        c.post(
            EVENT, json={"kind": "fact", "ts": T0 + 2, "properties": {"source_event_ids": [first]}}
        )
        c.post(EVENT, json={"kind": "turn", "ts": T0 + 3}, headers={"Idempotency-Key": "K-1"})
    yield server
    server.stop()


def snapshot(srv: InProcessServer) -> tuple[list[Any], list[str]]:
    """Everything a client can see of the tenant, and the tenant directories on disk (not the
    server's own `.`/`_` entries: these reads make the read audit's journal, for one)."""
    with srv.client(TENANT) as c:
        events = c.get(EVENTS, params={"limit": 1000}).json()["events"]
        full = [c.get(f"{EVENT}/{e['event_id']}").json() for e in events]
    return full, sorted(p.name for p in srv.data_dir.iterdir() if p.name[0] not in "._")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_with_a_useful_sentence(srv: InProcessServer, case: Bad) -> None:
    before = snapshot(srv)
    headers = {
        "Authorization": f"Bearer {TENANT}",
        "Content-Type": "application/json",
        **case.headers,
    }
    headers = {k: v for k, v in headers.items() if v}
    r = srv.request(case.method, case.path, content=case.body, params=case.params, headers=headers)
    assert r.status_code == case.status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error", "detail"}
    assert body["error"] == case.code
    assert case.words in body["detail"], body["detail"]
    assert body["detail"][0].isalpha() and len(body["detail"]) < 300
    assert "Traceback" not in r.text and str(srv.data_dir) not in r.text
    assert snapshot(srv) == before


def test_chunked_body_over_the_limit_is_413(srv: InProcessServer) -> None:
    before = snapshot(srv)

    def chunks() -> Iterator[bytes]:
        yield b'{"kind": "turn", "text": "'
        for _ in range(MAX_BODY // 512 + 2):
            yield b"x" * 512
        yield b'"}'

    with srv.client(TENANT) as c:
        r = c.post(EVENT, content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"
    assert snapshot(srv) == before


def test_over_long_property_string_is_stored_but_not_filterable(srv: InProcessServer) -> None:
    note = "é" * 129  # 258 bytes
    with srv.client("long-props") as c:
        r = c.post(EVENT, json={"kind": "turn", "properties": {"note": note, "short": "ok"}})
        assert r.status_code == 201
        eid = r.json()["event_id"]
        assert c.get(f"{EVENT}/{eid}").json()["properties"] == {"note": note, "short": "ok"}
        listed = c.get(EVENTS, params={"prop.short": "ok"}).json()["events"]
        assert [e["event_id"] for e in listed] == [eid]
        refused = c.get(EVENTS, params={"prop.note": note})
        assert refused.status_code == 400 and "256 bytes" in refused.json()["detail"]


def test_an_idempotency_key_refused_with_422_keeps_the_first_event(srv: InProcessServer) -> None:
    before = snapshot(srv)
    with srv.client(TENANT) as c:
        r = c.post(EVENT, json={"kind": "turn", "ts": T0 + 4}, headers={"Idempotency-Key": "K-1"})
    assert r.status_code == 422 and r.json()["error"] == "idempotency_mismatch"
    assert snapshot(srv) == before


def test_unknown_route_and_method_use_the_error_shape(srv: InProcessServer) -> None:
    with srv.client(TENANT) as c:
        missing = c.get("/v1/memory/nothing")
        wrong = c.put(EVENT, json={"kind": "turn"})
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
    assert wrong.status_code == 405 and set(wrong.json()) == {"error", "detail"}


def test_no_tenant_directory_is_made_for_a_refused_token(
    srv: InProcessServer, tmp_path: Path
) -> None:
    names = {p.name for p in srv.data_dir.iterdir()}
    assert not any(".." in n or "." in n.strip(".") for n in names)
    assert TENANT in names and "bad.input" not in names
