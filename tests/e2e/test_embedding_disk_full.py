"""A real server's background embedder on a real filesystem that fills while it has a backlog
of text-only events (a 16 MiB tmpfs, as tests/e2e/test_disk_full.py mounts one; skipped where
this process may not mount it; tests/storage/test_embedder_disk_full.py makes the same writes
fail by the log's failpoint without root). Nothing acknowledged is lost, the server answers
writes 503 and reads as before, the embedder backs off, says so once and counts `disk_full`,
and every event gets its vector once space is freed, without a restart or after a kill -9.
The embedder is the loopback endpoint of tests/support/endpoint.py (8 dimensions): deterministic and
fast, and held by the test while the backlog builds up."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.disk_full import check_refusal, fill_disk, listed_ids, recall_ids
from tests.support.endpoint import Endpoint, fake_vector
from tests.support.servers import ServerProcess
from tests.support.wait import wait_until

TENANT = "acme"
T0 = 1_800_000_000_000_000
DIM = 8
EARLY = 10  # events embedded before the disk fills
BACKLOG = 150  # events acknowledged while the embedder is busy, then the disk fills
VOCABULARY = [f"w{n}x" for n in range(3000)]
WORDS_PER_QUERY = 25


def word(i: int) -> str:
    """The one word event i alone holds."""
    return f"tok{i}q"


def text(i: int) -> str:
    """Event i's text: its word and about 4 KB of padding (records of two pages and more)."""
    return " ".join([word(i), *random.Random(i).choices(VOCABULARY, k=600)])


def vector(i: int) -> list[float]:
    """The vector the endpoint gives event i's text, of unit length as the embedder stores it."""
    v = np.asarray(fake_vector(text(i), DIM), dtype=np.float64)
    return [float(x) for x in v / np.linalg.norm(v)]


def env(ep: Endpoint) -> dict[str, str]:
    """The server's settings: the endpoint as its embedder."""
    return {
        "MEMSPINE_EMBEDDER": "openai",
        "MEMSPINE_EMBEDDER_URL": ep.url,
        "MEMSPINE_EMBEDDER_MODEL": "test-embed",
        "MEMSPINE_EMBEDDING_DIM": str(DIM),
    }


def append(c: httpx.Client, ids: range) -> dict[str, int]:
    """Append text-only notes i in ids, 100 to a batch; acknowledged id -> i."""
    acked: dict[str, int] = {}
    for lo in range(ids.start, ids.stop, 100):
        part = range(lo, min(lo + 100, ids.stop))
        events = [{"kind": "note", "ts": T0 + i, "text": text(i)} for i in part]
        r = c.post("/v1/memory/events", json={"events": events})
        assert r.status_code == 201, r.text
        acked.update(zip(r.json()["event_ids"], part, strict=True))
    return acked


def check_refused(c: httpx.Client) -> None:
    """A batch of 200 events is refused for the full disk, nothing written (a single small
    event may still fit in pages LMDB freed before the disk filled)."""
    events = [{"kind": "note", "ts": T0 + i, "text": text(i)} for i in range(10_000, 10_200)]
    check_refusal(c.post("/v1/memory/events", json={"events": events}))


def metric(c: httpx.Client, pattern: str) -> float:
    """The value of the /metrics line that matches pattern (0 if none does)."""
    found = re.search(rf"^{pattern} (\S+)$", c.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


DISK_FULL = r'memspine_embedder_failures_total\{reason="disk_full"\}'
PENDING = "memspine_embeddings_pending"


def wait_for(check: Any, secs: float = 30.0) -> None:
    """Poll check() until it holds."""
    deadline = time.monotonic() + secs
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def cpu_secs(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vector_hit(c: httpx.Client, i: int) -> list[str]:
    """The id vector recall returns first for event i's vector."""
    return recall_ids(c, {"embedding": vector(i), "k": 1})


def check_tenant(c: httpx.Client, acked: dict[str, int]) -> None:
    """Every acknowledged event is listed, has its server vector, and is found first by its
    word and by its vector; nothing awaits a vector any more."""
    assert c.get("/v1/whoami").json()["vector_space"]["unembedded"] == 0
    # The worker counts its backlog again after its write lands, a moment after the log shows it.
    wait_until(lambda: metric(c, PENDING) == 0, "the embedder's backlog counted again")
    assert metric(c, PENDING) == 0
    assert listed_ids(c) == set(acked)
    for e, i in acked.items():
        got = c.get(f"/v1/memory/event/{e}")
        assert got.status_code == 200, (e, got.text)
        ev = got.json()
        assert ev["embedding_model"] == "test-embed", e
        assert np.allclose(ev["embedding"], vector(i), atol=1e-5), e
    for e, i in list(acked.items())[::7]:  # the graph holds them (a sample: HTTP costs)
        assert vector_hit(c, i) == [e], e
    # Recall by text is hybrid here: 25 words to a query keep every keyword hit in the top 100
    # of the fusion (at most 25 of the vector arm's hits score as high as the 25th word's).
    words = sorted(word(i) for i in acked.values())
    found: set[str] = set()
    for lo in range(0, len(words), WORDS_PER_QUERY):
        found.update(recall_ids(c, {"text": " ".join(words[lo : lo + WORDS_PER_QUERY]), "k": 100}))
    assert not set(acked) - found, f"{len(set(acked) - found)} events lost to keyword recall"


def wait_embedded(c: httpx.Client) -> None:
    """Wait until nothing awaits a vector, by recall's wait_for_vectors (docs/embeddings.md)."""
    deadline = time.monotonic() + 60
    while True:
        r = c.post("/v1/memory/recall", json={"text": word(0), "wait_for_vectors": True})
        if r.status_code == 200:
            return
        assert r.status_code == 503 and time.monotonic() < deadline, r.text


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    """The embedding endpoint on loopback."""
    ep = Endpoint()
    ep.dim = DIM
    yield ep
    ep.close()


@pytest.fixture
def fs_server(small_fs: Path, tmp_path: Path, endpoint: Endpoint) -> Iterator[ServerProcess]:
    """A started server embedding by the endpoint, its data on the small filesystem, its log
    not."""
    server = ServerProcess(small_fs / "data", env(endpoint))
    server.log_path = tmp_path / "server.log"
    try:
        yield server.start()
    finally:
        server.stop()


def backlog_on_a_full_disk(
    server: ServerProcess, ep: Endpoint, small_fs: Path
) -> tuple[dict[str, int], Path]:
    """EARLY events embedded, BACKLOG more acknowledged while the endpoint is held, then the
    disk filled and the endpoint let go: the embedder's write of its first batch is refused.
    The acknowledged events and the filler that holds the disk full."""
    with server.client(TENANT) as c:
        wait_for(lambda: c.get("/v1/whoami").json()["vector_space"]["server_embeds"])
        acked = append(c, range(EARLY))
        wait_embedded(c)
        ep.gate.clear()  # the embedder's next batch waits for its answer
        asked = len(ep.requests)
        acked.update(append(c, range(EARLY, EARLY + BACKLOG)))
        wait_for(lambda: len(ep.requests) > asked)  # the first batch of the backlog is asked for
        filler = fill_disk(small_fs)
        check_refused(c)  # a write the disk has no room for: 503, Retry-After, nothing written
        ep.gate.set()  # the vectors come back; their write finds the disk full
        wait_for(lambda: metric(c, DISK_FULL) >= 1)
        assert metric(c, PENDING) == BACKLOG  # the backlog stays in view
        assert c.get("/v1/whoami").json()["vector_space"]["unembedded"] == BACKLOG
    return acked, filler


def test_a_disk_full_under_the_embedder_loses_nothing_and_it_resumes_when_freed(
    fs_server: ServerProcess, endpoint: Endpoint, small_fs: Path
) -> None:
    server, ep = fs_server, endpoint
    acked, filler = backlog_on_a_full_disk(server, ep, small_fs)
    assert server.proc is not None
    with server.client(TENANT) as c:
        asked, cpu, t0 = len(ep.requests), cpu_secs(server.proc.pid), time.monotonic()
        failures = metric(c, DISK_FULL)
        # Reads answer meanwhile: every acknowledged event by GET, the embedded ones by vector,
        # by word and by a text the server embeds; the keyword arm is refused only while its
        # own commit waits for space (docs/operations.md), never answered without an event.
        for e in list(acked)[:: BACKLOG // 10]:
            assert c.get(f"/v1/memory/event/{e}").status_code == 200
        for e, i in list(acked.items())[:EARLY]:
            assert vector_hit(c, i) == [e]
        for e, i in list(acked.items())[EARLY - 2 : EARLY + 2]:
            r = c.post("/v1/memory/recall", json={"text": word(i), "k": 1})
            if r.status_code == 503:
                check_refusal(r)
            else:
                assert r.status_code == 200 and [h["event_id"] for h in r.json()["hits"]] == [e]
        check_refused(c)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
        spent, took = cpu_secs(server.proc.pid) - cpu, time.monotonic() - t0
        # It backs off (0.5 s doubling to 2 s): a few more refused writes, not a loop; the
        # vectors it made are kept, so the endpoint is not asked again while the disk is full.
        more = metric(c, DISK_FULL) - failures
        assert more <= 1 + took / 0.5, more  # a slow machine only tries fewer
        assert not [r for r in ep.requests[asked:] if " " in r["body"]["input"][0]]  # queries only
        assert spent < took / 2, (spent, took)  # a process that spun would use a core
        assert metric(c, PENDING) == BACKLOG

        filler.unlink()  # space is freed: no restart
        wait_embedded(c)
        acked.update(append(c, range(EARLY + BACKLOG, EARLY + BACKLOG + 5)))
        wait_embedded(c)
        check_tenant(c, acked)
    log = server.log_path.read_text(errors="replace")
    assert log.count("the disk is full: server vectors not written") == 1, log[-3000:]
    assert "server vectors written again (resumed)" in log
    assert "Traceback" not in log, log[-3000:]


def test_a_kill_while_the_disk_is_full_leaves_the_work_in_the_log(
    fs_server: ServerProcess, endpoint: Endpoint, small_fs: Path
) -> None:
    server, ep = fs_server, endpoint
    acked, filler = backlog_on_a_full_disk(server, ep, small_fs)
    server.stop(signal.SIGKILL)
    filler.unlink()
    ep.gate.clear()  # the restarted embedder waits for its first answer: the count stays put
    server.start()
    with server.client(TENANT) as c:
        # The work is read from the log, not from what the killed process held.
        assert c.get("/v1/whoami").json()["vector_space"]["unembedded"] == BACKLOG
        assert metric(c, PENDING) == BACKLOG
        ep.gate.set()
        wait_embedded(c)
        check_tenant(c, acked)
