"""The seed's erasure of a door code through a real server, the background purger, and purges
killed with SIGKILL: a server in the middle of one, and a purge process at each of its steps."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from storage.erasure import swap
from storage.index.vectors import EXACT_BELOW
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.erasure import (
    DIM,
    REPLY_TS,
    ROLL_STEPS,
    SUPPORT,
    append,
    check_tenant,
    door_turn_patterns,
    index_terms,
    last_tokens,
    neighbour,
    rare_token,
    scan,
    text_of,
)
from tests.support.servers import REPO, ServerProcess
from tests.support.wait import wait_until

TENANT = "4a2cd816-0f6f-4f89-ac26-41ef06c06e47"
MIN = 60_000_000
DOOR_TEXT = "door code 4471"
NOT_FOUND = {"error": "not_found", "detail": "no event with that id"}

DERIVED_QUERY = (
    "MATCH (d:Event)-[:SOURCE_FROM]->(s:Event) WHERE s.event_id = $id "
    "RETURN d.event_id, d.kind, d.text"
)


def build(client: httpx.Client) -> dict[str, str]:
    """Append the support tenant in order; name -> id."""
    ids: dict[str, str] = {}
    for name, minutes, kind, text, embedding, sources in SUPPORT:
        body: dict[str, Any] = {"kind": kind, "ts": int(REPLY_TS + minutes * MIN), "text": text}
        if embedding is not None:
            body["embedding"] = embedding
        body["properties"] = {"source_event_ids": [ids[s] for s in sources]} if sources else {}
        resp = client.post("/v1/memory/event", json=body)
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["event_id"]
    return ids


def delete(client: httpx.Client, event_id: str, query: str = "") -> httpx.Response:
    return client.delete(f"/v1/memory/event/{event_id}{query}")


def test_the_seeds_door_code_erasure(server: ServerProcess) -> None:
    client = server.client(TENANT)
    ids = build(client)
    tenant_dir = server.data_dir / TENANT

    # What was derived from the message, asked before deleting anything (the seed's query).
    derived = client.post(
        "/v1/memory/cypher", json={"query": DERIVED_QUERY, "params": {"id": ids["door_turn"]}}
    )
    assert derived.status_code == 200, derived.text
    assert derived.json()["rows"] == [[ids["door_fact"], "fact", SUPPORT[9][3]]]
    dry = delete(client, ids["door_turn"], "?cascade=derived&dry_run=true")
    assert dry.json() == {"would_delete": [ids["door_turn"], ids["door_fact"]]}

    resp = delete(client, ids["door_turn"], "?purge=true")
    assert resp.json() == {"deleted": True, "purged": True, "deleted_ids": [ids["door_turn"]]}
    assert scan(server.data_dir, door_turn_patterns()) == {}
    # The fact still holds the code, and is still there.
    assert scan(server.data_dir, {DOOR_TEXT: DOOR_TEXT.encode()}) == {
        DOOR_TEXT: [f"{TENANT}/events/data.mdb"]
    }
    assert client.get(f"/v1/memory/event/{ids['door_fact']}").status_code == 200
    terms = index_terms(tenant_dir / "keyword")
    assert {"4471", "door"} <= terms and "next" not in terms  # "next" was the message's alone

    resp = delete(client, ids["door_fact"], "?purge=true")
    assert resp.json() == {"deleted": True, "purged": True, "deleted_ids": [ids["door_fact"]]}
    # "4471," as both texts have it: the bare digits turn up in random hex ids (a UUIDv4 whose
    # third group is 4471 is one in 4,096) and in binary files.
    assert scan(server.data_dir, {DOOR_TEXT: DOOR_TEXT.encode(), "4471,": b"4471,"}) == {}
    assert index_terms(tenant_dir / "keyword") & {"4471", "door", "code", "hall"} == set()

    for name in ("door_turn", "door_fact"):
        got = client.get(f"/v1/memory/event/{ids[name]}")
        assert (got.status_code, got.json()) == (404, NOT_FOUND)
    # The rest of the tenant answers as before.
    hits = client.post(
        "/v1/memory/recall", json={"text": "signed for at number 16", "kind": "turn", "k": 3}
    )
    assert hits.json()["hits"][0]["event_id"] == ids["reply"]
    assert len(client.get("/v1/memory/events").json()["events"]) == len(SUPPORT) - 2
    server.stop()
    assert b"4471," not in server.log_path.read_bytes()  # logs carry ids, never text


def wait_until_clean(data_dir: Path, patterns: dict[str, bytes], timeout: float) -> float:
    """Seconds until no file under data_dir holds any pattern; fails after timeout."""
    started = time.monotonic()
    while scan(data_dir, patterns):
        assert time.monotonic() - started < timeout, scan(data_dir, patterns)
        time.sleep(0.1)
    return time.monotonic() - started


def test_the_background_purger_erases_without_being_asked(start_server: Any) -> None:
    server = start_server(env={"MEMSPINE_PURGE_INTERVAL_SECS": "0.3"})
    client = server.client(TENANT)
    ids = build(client)
    resp = delete(client, ids["door_turn"])
    assert resp.json() == {"deleted": True, "purged": False, "deleted_ids": [ids["door_turn"]]}
    wait_until_clean(server.data_dir, door_turn_patterns(), timeout=20)
    marker = server.data_dir / TENANT / "purge.pending"
    wait_until(lambda: not marker.exists(), "the pending-purge marker removed")
    assert client.get(f"/v1/memory/event/{ids['door_fact']}").status_code == 200


def count_events(client: httpx.Client) -> int:
    """The tenant's live events, paged through GET /v1/memory/events (a Cypher count has a time
    limit a loaded machine can reach)."""
    total, cursor = 0, None
    while True:
        r = client.get(
            "/v1/memory/events", params={"limit": 100, **({"cursor": cursor} if cursor else {})}
        )
        assert r.status_code == 200, r.text
        total += len(r.json()["events"])
        if (cursor := r.json()["next_cursor"]) is None:
            return total


def test_a_server_killed_during_a_purge_restarts_on_whole_files(
    start_server: Any, tmp_path: Path
) -> None:
    server = start_server()
    client = server.client(TENANT)
    ids = build(client)
    filler = [
        {
            "kind": "turn",
            "ts": REPLY_TS + i,
            "text": f"filler turn number f{i:04d}",
            "embedding": [0.1, 0.2, 0.3, i / 300],
        }
        for i in range(300)
    ]
    with ThreadPoolExecutor(16) as pool:  # concurrent appends share group commits
        fill_ids = list(
            pool.map(lambda b: client.post("/v1/memory/event", json=b).json()["event_id"], filler)
        )

    def purge_request() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server dies under it
            delete(client, ids["door_turn"], "?purge=true")

    thread = threading.Thread(target=purge_request)
    thread.start()
    time.sleep(0.15)
    server.stop(signal.SIGKILL)
    thread.join()

    restarted = start_server(data_dir=server.data_dir)
    client = restarted.client(TENANT)
    for event_id in fill_ids[::10] + [ids[n] for n in ("reply", "case_fact", "door_fact")]:
        assert client.get(f"/v1/memory/event/{event_id}").status_code == 200
    # The tenant's first open finished or dropped the interrupted purge.
    assert not any(
        (server.data_dir / TENANT / n).exists() for n in ("purge.new", "purge.ready", "purge.old")
    )
    # The delete may or may not have committed before the kill; either way it can finish now.
    resp = delete(client, ids["door_turn"], "?purge=true")
    assert resp.status_code in (200, 404)
    if resp.status_code == 404:
        assert count_events(client) == len(SUPPORT) - 1 + 300
        delete(client, ids["door_fact"], "?purge=true")  # a purge of the tenant, whatever was left
    assert scan(server.data_dir, door_turn_patterns()) == {}
    hits = client.post("/v1/memory/recall", json={"text": "filler f0042", "k": 1}).json()["hits"]
    assert [h["event_id"] for h in hits] == [fill_ids[42]]


# -- kill -9 during a purge --------------------------------------------------------------------

# One process that has imported storage forks a purge per kill (as tests/e2e/test_erasure_kills.py
# does): the child opens the tenant, says "go <pid>" and purges, killing itself with SIGKILL at
# the named step ("-": none, the test kills it after a delay); the fork server then says whether
# it was killed.
FORK_SERVER = """
import os, signal, sys
from pathlib import Path
from storage.tenants.tenant import Tenant

dim = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    root, at = line.split()
    pid = os.fork()
    if pid == 0:
        t = Tenant.open("t1", Path(root), embedding_dim=dim)

        def step(name):
            if name == at:
                os.kill(os.getpid(), signal.SIGKILL)

        print("go", os.getpid(), flush=True)
        t.purge(step)
        t.close()
        os._exit(0)
    _pid, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print("killed" if killed else "ended", flush=True)
"""
COMMIT_AND_AFTER = ["committed", *ROLL_STEPS, "cleaned"]
KILL_POINTS = ["stage", "copied", "indexed", "synced", "vectors", "fsynced", *COMMIT_AND_AFTER]


class Template(msgspec.Struct):
    """A closed tenant with deleted events, copied for each kill."""

    root: Path
    live: dict[str, str]  # id -> text
    gone: dict[str, str]  # id -> a token only it used
    patterns: dict[str, bytes]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    rng = random.Random(99)
    root = tmp_path_factory.mktemp("template") / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    # Past EXACT_BELOW, so that the tenant has a graph: a smaller one keeps its vectors as exact
    # rows and saves only the live ones, which leaves a purge no vector file to swap.
    ids = append(t, [neighbour(rng, i) for i in range(EXACT_BELOW + 250)])
    secret = rare_token(rng)
    victim = NewEvent(kind="turn", ts=5, text=f"door code {secret}", embedding=[0.5] * DIM)
    [vid] = append(t, [victim])
    patterns = {"secret": secret.encode(), "text": victim.text.encode()}  # type: ignore[union-attr]
    gone = last_tokens(t, ids[:8]) | {vid: secret.lower()}
    # Closed and opened again, the doomed vectors are in the saved graph whatever the inserter
    # had done: every kill point of the purge, the vector file's swap included, is then reached
    # (a vector deleted while still in the tail is never written, so a purge has none to swap).
    t.close()
    t = Tenant.open("t1", root, embedding_dim=DIM)
    t.submit_delete(list(gone)).result()
    live = {e: text for e in ids[8:] if (text := text_of(t, e)) is not None}
    t.close()
    return Template(root=root, live=live, gone=gone, patterns=patterns)


class Forker:
    """The fork server's process; its children's errors go to `log`."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", FORK_SERVER, str(DIM)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self._line() == "ready", log.read_text()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run_purge_and_kill(self, root: Path, at: str, delay: float | None = None) -> None:
        """A purge in its own process, killed with SIGKILL at a named step or after a delay."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{root} {at or '-'}\n")
        self.proc.stdin.flush()
        go, pid = self._line().split()
        assert go == "go", self.log.read_text()[-2000:]
        if delay is not None:
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):  # it may have ended already
                os.kill(int(pid), signal.SIGKILL)
        killed = self._line() == "killed"
        if at:
            assert killed, self.log.read_text()[-2000:]

    def close(self) -> None:
        """Stop the fork server."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    forker = Forker(tmp_path_factory.mktemp("forker") / "children.log")
    yield forker
    forker.close()


def verify_after_crash(root: Path, template: Template) -> bool:
    """The tenant opens on one generation, whole; returns whether the purge had committed."""
    t = Tenant.open("t1", root, embedding_dim=DIM)
    assert not any((root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    committed = t.log.tombstones() == []
    if not committed:  # the old files: everything deleted is still awaiting a purge, redo it
        assert sorted(t.log.tombstones()) == sorted(template.gone)
        assert t.purge().purged == len(template.gone)
    with t.log.reader() as r:
        assert {e: r.get(e).text for e in template.live} == template.live  # type: ignore[union-attr]
        assert r.count() == len(template.live)
    check_tenant(t, list(template.live), template.gone)
    t.close()
    assert scan(root, template.patterns) == {}
    return committed


@pytest.mark.parametrize("at", KILL_POINTS)
def test_kill_9_at_each_step_of_a_purge(
    tmp_path: Path, template: Template, forker: Forker, at: str
) -> None:
    root = tmp_path / "t1"
    shutil.copytree(template.root, root)
    forker.run_purge_and_kill(root, at)
    assert verify_after_crash(root, template) == (at in COMMIT_AND_AFTER)


@pytest.mark.parametrize("delay", [0.02, 0.08, 0.15, 0.3])
def test_kill_9_at_a_random_moment_of_a_purge(
    tmp_path: Path, template: Template, forker: Forker, delay: float
) -> None:
    root = tmp_path / "t1"
    shutil.copytree(template.root, root)
    forker.run_purge_and_kill(root, "", delay)
    verify_after_crash(root, template)
