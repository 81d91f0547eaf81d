"""GET /v1/memory/export against the app in process: a tenant written over HTTP exports, imports
into another data directory, and answers every read there as it did here; an export holds no
purged event and leaves no file behind."""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage.readlog import READS_JOURNAL
from storage.transfer import format as fmt
from storage.transfer.landing import import_tenant
from tests.support.servers import InProcessServer, serve

JSON = {"Content-Type": "application/json"}
TS = 1_791_208_939_000_000


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    yield from serve(InProcessServer(tmp_path_factory.mktemp("export") / "data"))


def _token() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def append(c: httpx.Client, body: dict[str, Any] | str, **headers: str) -> str:
    content = body if isinstance(body, str) else json.dumps(body)
    r = c.post("/v1/memory/event", content=content, headers={**JSON, **headers})
    assert r.status_code == 201, r.text
    return str(r.json()["event_id"])


def write_some(c: httpx.Client) -> list[str]:
    """Events of every shape a client can send: links, supersession, windows, keyed appends,
    pretty-printed properties, embeddings with a model."""
    ids = [append(c, {"kind": "turn", "ts": TS, "text": "the parcel from SUP-7 is late"})]
    pretty = (
        f'{{"kind": "fact", "ts": {TS + 1}, "text": "refund agreed for the late parcel",\n'
        f' "properties": {{ "supplier" : "SUP-7",\n  "source_event_ids": ["{ids[0]}"] }},\n'
        ' "embedding": [0.1, 0.2, 0.3, 0.4], "embedding_model": "m1"}'
    )
    ids.append(append(c, pretty))
    ids.append(
        append(
            c,
            {
                "kind": "fact",
                "ts": TS + 2,
                "text": "refund paid, the parcel case is closed",
                "supersedes": [ids[1]],
                "valid_from": TS + 2,
                "properties": {"supplier": "SUP-7", "n": 2},
                "embedding": [0.4, 0.3, 0.2, 0.1],
                "embedding_model": "m1",
            },
            **{"Idempotency-Key": "close-the-case"},
        )
    )
    ids.append(append(c, {"kind": "turn", "ts": TS + 3, "text": "lunch on friday"}))
    return ids


def reads(c: httpx.Client, ids: list[str]) -> list[Any]:
    """What the tests compare between a tenant and its copy."""
    out: list[Any] = [c.get(f"/v1/memory/event/{e}").json() for e in ids]
    out.append(c.get("/v1/memory/events", params={"current": "false"}).json())
    out.append(c.get("/v1/memory/events").json())
    for body in (
        {"text": "parcel refund", "hops": 2},
        {"embedding": [0.1, 0.2, 0.3, 0.4], "embedding_model": "m1", "k": 3},
        {"text": "parcel", "filter": {"supplier": "SUP-7"}, "current": False},
    ):
        out.append(c.post("/v1/memory/recall", json=body).json())
    for q in (
        "MATCH (a)-[:SOURCE_FROM]->(b) RETURN a.event_id, b.event_id",
        "MATCH (a)-[:SUPERSEDES]->(b) RETURN a.event_id, b.event_id",
        "MATCH (e:Event) RETURN e.kind, count(*) AS n ORDER BY e.kind",
    ):
        out.append(c.post("/v1/memory/cypher", json={"query": q}).json())
    return out


def export(c: httpx.Client) -> httpx.Response:
    r = c.get("/v1/memory/export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(fmt.MEDIA_TYPE)
    assert int(r.headers["content-length"]) == len(r.content)
    return r


def test_an_export_imports_into_a_tenant_that_answers_alike(
    srv: InProcessServer, tmp_path: Path
) -> None:
    token = _token()
    with srv.client(token) as c:
        ids = write_some(c)
        before = reads(c, ids)
        body = export(c).content
    reader = fmt.Reader()
    items = [reader.feed(line) for line in io.BytesIO(body)]
    assert reader.finish().events == len(ids) == len(items) - 2
    assert isinstance(items[0], fmt.Header) and items[0].tenant_id == token
    import_tenant(tmp_path / "copy", token, io.BytesIO(body))
    other = InProcessServer(tmp_path / "copy")
    for copy in serve(other):
        with copy.client(token) as c:
            assert reads(c, ids) == before
            again = export(c).content
            assert again.splitlines()[1:-1] == body.splitlines()[1:-1]


def test_a_tenant_never_written_exports_empty_and_stays_uncreated(srv: InProcessServer) -> None:
    token = _token()
    with srv.client(token) as c:
        lines = export(c).content.splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["header", "end"]
    assert json.loads(lines[0])["tenant_id"] == token
    assert not (srv.data_dir / token).exists()


def test_an_export_needs_a_key(srv: InProcessServer) -> None:
    with srv.client() as c:
        r = c.get("/v1/memory/export")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    with srv.client(_token()) as c:
        r = c.get("/v1/memory/export", params={"since": "1"})
    assert r.status_code == 400 and "unknown query parameter" in r.json()["detail"]


def test_a_purged_event_is_in_no_export_made_after(srv: InProcessServer) -> None:
    with srv.client(_token()) as c:
        secret = "door code 5521"
        gone = append(c, {"kind": "turn", "ts": TS, "text": secret})
        append(c, {"kind": "turn", "ts": TS + 1, "text": "kept"})
        assert secret.encode() in export(c).content
        assert c.delete(f"/v1/memory/event/{gone}", params={"purge": "true"}).status_code == 200
        after = export(c).content
    assert secret.encode() not in after and gone.encode() not in after
    assert b"kept" in after


def test_the_spool_leaves_no_file_in_the_data_directory(srv: InProcessServer) -> None:
    with srv.client(_token()) as c:
        append(c, {"kind": "turn", "ts": TS, "text": "x" * 5000})
        # The export is noted in _receipts/copies.ndjson (a copy an erasure receipt names,
        # docs/erasure.md) and its read in the read audit's journal: records, not the spool.
        records = {"_receipts", READS_JOURNAL}
        before = sorted(set(os.listdir(srv.data_dir)) | records)
        with c.stream("GET", "/v1/memory/export") as r:
            first = next(r.iter_bytes(16))
            assert (
                sorted(set(os.listdir(srv.data_dir)) | records) == before
            )  # the spool has no name
        assert first.startswith(b'{"type":"header"')
    assert sorted(set(os.listdir(srv.data_dir)) | records) == before


def test_one_tenant_exports_one_at_a_time_and_another_is_served_ahead(
    srv: InProcessServer,
) -> None:
    """Parallel exports of one tenant spool one at a time (each holds a read thread for the
    whole tenant); another tenant's export goes ahead of the one waiting. Counted: which
    answered while the first tenant's slot was held."""
    assert srv.app is not None
    shares = srv.app.state.engine.export_shares
    a, b = _token(), _token()
    with srv.client(a) as ca, srv.client(b) as cb:
        append(ca, {"kind": "turn", "ts": TS, "text": "a's note"})
        append(cb, {"kind": "turn", "ts": TS, "text": "b's note"})
        assert shares.try_acquire(a)  # an export of a is under way
        try:
            with ThreadPoolExecutor(1) as pool:
                second = pool.submit(export, ca)
                deadline = time.monotonic() + 30
                while shares.waiting() != 1:
                    assert time.monotonic() < deadline, "a's second export did not wait"
                    time.sleep(0.01)
                assert b"b's note" in export(cb).content  # served ahead of a's second
                assert not second.done() and shares.held(a) == 1 and shares.waiting() == 1
                shares.release(a)
                assert b"a's note" in second.result(timeout=30).content
        finally:
            if shares.held(a):
                shares.release(a)
    assert shares.held(a) == shares.held(b) == 0
