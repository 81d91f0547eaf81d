"""Server vectors across processes: events acknowledged while the embedder failed get their
vectors after the server is killed and started again (the work is in the log), and the real
local model gives a handful of text-only events vectors that recall by meaning finds, from a
child process of the server's that the server's stop ends."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from tests.support.endpoint import Endpoint

T0 = 1_800_000_000_000_000


def recall_with_vectors(c: Any, body: dict[str, Any], secs: float = 120) -> Any:
    """A recall with wait_for_vectors, sent again while it answers 503 as docs/api.md says a
    client should: the server waits a bounded time per request, and on a machine busy with
    the rest of the suite the model may embed more slowly than that."""
    deadline = time.monotonic() + secs
    while True:
        r = c.post("/v1/memory/recall", json={**body, "wait_for_vectors": True})
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        assert r.json()["error"] == "unavailable", r.text


def model_children(pid: int) -> list[int]:
    """The server's child processes that run the local model (storage/embedders/child.py)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid and b"storage.embedders.child" in cmdline:
            found.append(int(proc.name))
    return found


def test_pending_work_survives_a_kill_and_is_embedded_after_the_restart(
    start_server: Any, tmp_path: Any
) -> None:
    ep = Endpoint()
    try:
        env = {
            "MEMSPINE_EMBEDDER": "openai",
            "MEMSPINE_EMBEDDER_URL": ep.url,
            "MEMSPINE_EMBEDDER_MODEL": "test-embed",
            "MEMSPINE_EMBEDDING_DIM": "8",
        }
        first = start_server(env=env)
        c = first.client("acme")
        deadline = time.monotonic() + 30
        while not c.get("/v1/whoami").json()["vector_space"]["server_embeds"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ep.script[:] = [{"status": 400}] * 1000  # from here every embedding fails
        ids = [
            c.post(
                "/v1/memory/event", json={"kind": "note", "ts": T0 + i, "text": f"n {i}"}
            ).json()["event_id"]
            for i in range(3)
        ]
        assert c.get("/v1/whoami").json()["vector_space"]["unembedded"] == 3
        first.stop(signal.SIGKILL)
        ep.script.clear()  # the endpoint is back
        second = start_server(env=env, data_dir=first.data_dir)
        c = second.client("acme")
        r = recall_with_vectors(c, {"text": "n"})
        assert r.status_code == 200, r.text
        for event_id in ids:
            got = c.get(f"/v1/memory/event/{event_id}").json()
            assert got["embedding_model"] == "test-embed" and len(got["embedding"]) == 8
    finally:
        ep.close()


def test_the_local_model_finds_a_handful_of_notes_by_meaning(start_server: Any) -> None:
    s = start_server(env={"MEMSPINE_EMBEDDER": "local", "MEMSPINE_EMBEDDING_DIM": "384"})
    c = s.client("acme")
    notes = [
        "Lena wants status notes as three bullets, no tables.",
        "The parcel for number 16 was signed for by a neighbour.",
        "Invoices go out on the second Tuesday of the quarter.",
        "Marek is allergic to peanuts.",
    ]
    for i, text in enumerate(notes):
        assert (
            c.post(
                "/v1/memory/event", json={"kind": "note", "ts": T0 + i, "text": text}
            ).status_code
            == 201
        )
    for question, want in (
        ("who received the package?", notes[1]),
        ("what food must be avoided at the team lunch?", notes[3]),
    ):
        r = recall_with_vectors(c, {"text": question, "k": 1})
        assert r.status_code == 200, r.text
        assert [h["text"] for h in r.json()["hits"]] == [want]
    server_pid = s.proc.pid if s.proc is not None else 0
    children = model_children(server_pid)
    assert len(children) == 1  # the model runs in one child process
    s.stop()
    assert not Path(f"/proc/{children[0]}").exists()  # ended and reaped with the server
