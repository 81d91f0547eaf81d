"""Vectors through a real server, stored as float32s (docs/api.md, "Append an event"): the seed's
four-number vectors come back exactly as sent, from GET, Cypher and an export, also after a
kill -9; a 384-dimension vector of doubles comes back as each value's float32, printed as its
shortest decimal; an export imported by `memspine-admin import` gives the same vectors back."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.admin import Admin
from tests.support.seed import SUPPORT, load
from tests.support.servers import REPO, ServerProcess

TENANT = "acme"
T0 = 1_791_208_939_000_000


def vectors_read(server: ServerProcess, ids: dict[str, str]) -> dict[str, list[float]]:
    """Each event's embedding as GET returns it, by name (those that have one)."""
    out = {}
    with server.client(TENANT) as c:
        for name, event_id in ids.items():
            r = c.get(f"/v1/memory/event/{event_id}")
            assert r.status_code == 200, r.text
            if "embedding" in r.json():
                out[name] = r.json()["embedding"]
    return out


def exported(server: ServerProcess) -> list[dict[str, Any]]:
    """The event lines of the tenant's export."""
    with server.client(TENANT) as c:
        r = c.get("/v1/memory/export")
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    return [line for line in lines if line["type"] == "event"]


def test_the_seed_vectors_come_back_exactly_as_sent(start_server: Any, tmp_path: Path) -> None:
    server = start_server()
    with server.client(TENANT) as c:
        ids = load(c, SUPPORT, T0, {})
    sent = {row[0]: row[4] for row in SUPPORT if row[4] is not None}
    assert vectors_read(server, ids) == sent
    with server.client(TENANT) as c:
        r = c.post("/v1/memory/cypher", json={"query": "MATCH (e:Event) RETURN e"})
    assert r.status_code == 200, r.text
    by_id = {row[0]["event_id"]: row[0].get("embedding") for row in r.json()["rows"]}
    assert {name: by_id[ids[name]] for name in sent} == sent
    lines = {line["event_id"]: line["embedding"] for line in exported(server)}
    assert {name: lines[ids[name]] for name in sent} == sent
    export = tmp_path / "acme.ndjson"
    with server.client(TENANT) as c:
        export.write_bytes(c.get("/v1/memory/export").content)

    server.stop(signal.SIGKILL)
    server.start()
    assert vectors_read(server, ids) == sent
    server.stop()

    # Imported into another data directory, then served: the same vectors.
    other = tmp_path / "other"
    done = Admin(other, REPO).run(
        "import", TENANT, "--in", str(export), env={"MEMSPINE_EMBEDDING_DIM": "4"}
    )
    assert done.returncode == 0, done.stderr
    assert vectors_read(start_server(data_dir=other), ids) == sent


def test_a_vector_of_doubles_comes_back_to_float32_precision(start_server: Any) -> None:
    server = start_server({"MEMSPINE_EMBEDDING_DIM": "384"})
    rng = np.random.default_rng(34)
    sent = {f"e{i}": rng.standard_normal(384).tolist() for i in range(8)}
    ids = {}
    with server.client(TENANT) as c:
        for i, (name, vector) in enumerate(sent.items()):
            body = {"kind": "turn", "ts": T0 + i, "text": name, "embedding": vector}
            r = c.post("/v1/memory/event", json=body)
            assert r.status_code == 201, r.text
            ids[name] = r.json()["event_id"]
    got = vectors_read(server, ids)
    for name, vector in sent.items():
        stored = np.asarray(vector, dtype=np.float32)
        back = np.asarray(got[name], dtype=np.float64)
        assert (back.astype(np.float32) == stored).all()  # the float32 of what was sent
        assert got[name] == [float(str(v)) for v in stored]  # each its shortest decimal
        assert np.allclose(back, vector, rtol=2**-23, atol=0)
        assert got[name] != vector  # doubles: float32 rounds them (the test can fail)
