"""A data subject whose id holds '/' (an "org/7"), through a real server and the real CLI: sent
in the path as %2F (either case) the dry run, the access export and the erasure reach it, as the
Python client sends it; sent with a bare '/' the answer is a 400 in the API's shape saying how
to send it, not "no such route"; the CLI takes the id as it is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from memspine.client import Memspine
from tests.support.admin import Admin
from tests.support.servers import REPO, ServerProcess

SUBJECT = "org/7"


def admin(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """memspine-admin as its own process on data_dir."""
    result: subprocess.CompletedProcess[str] = Admin(data_dir, REPO).run(*args)
    return result


def event_ids(ndjson: str) -> list[str]:
    return [x["event_id"] for x in map(json.loads, ndjson.splitlines()) if x["type"] == "event"]


def test_a_subject_with_a_slash_over_http_and_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data).start()
    try:
        with server.client("acme") as c:
            made = [
                c.post("/v1/memory/event", json={"kind": "note", "text": t, "subjects": [s]})
                for t, s in (("org seven's note", SUBJECT), ("org's note", "org"))
            ]
            assert [r.status_code for r in made] == [201, 201]
            mine, other = (r.json()["event_id"] for r in made)
            for encoded in ("org%2F7", "org%2f7"):
                dry = c.post(f"/v1/memory/subjects/{encoded}/erase", json={})
                assert dry.status_code == 200, dry.text
                assert (dry.json()["subject"], dry.json()["count"]) == (SUBJECT, 1)
                export = c.get(f"/v1/memory/subjects/{encoded}/export")
                assert export.status_code == 200 and event_ids(export.text) == [mine]
            for bare in ("/v1/memory/subjects/org/7/export", "/v1/memory/subjects/org/7/erase"):
                method = "GET" if bare.endswith("export") else "POST"
                r = c.request(method, bare, json=None if method == "GET" else {})
                assert r.status_code == 400, r.text
                assert set(r.json()) == {"error", "detail"}
                assert r.json()["error"] == "invalid_request" and "%2F" in r.json()["detail"]
        # The CLI's export beside the running server takes the id as it is.
        out = admin(data, "subject", "export", "acme", SUBJECT)
        assert out.returncode == 0, out.stderr
        assert event_ids(out.stdout) == [mine]
        # The Python client encodes it: the real erasure reaches that subject only.
        with Memspine(server.url, "acme") as client:
            erased = client.erase_subject(SUBJECT, dry_run=False)
        assert erased.deleted_ids == [mine]
        with server.client("acme") as c:
            assert c.get(f"/v1/memory/event/{other}").status_code == 200
            assert c.get(f"/v1/memory/event/{mine}").status_code == 404
            c.post(
                "/v1/memory/event", json={"kind": "note", "text": "again", "subjects": [SUBJECT]}
            )
    finally:
        server.stop()
    # The CLI's erasure (no server holds the data directory): a dry run, then the real one.
    dry = admin(data, "--json", "subject", "erase", "acme", SUBJECT, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["count"] == 1
    done = admin(data, "--json", "subject", "erase", "acme", SUBJECT)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["deleted_ids"]) == 1
