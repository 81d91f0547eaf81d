"""What only a real memspine-server process shows: its file descriptors stay bounded while
tenants cycle through a cap of three, and its resident memory while they cycle through a
memory budget (tests/server/test_manager.py and test_manager_memory.py test the rest)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from memspine.config import FDS_PER_TENANT
from storage.tenants.manager import MEMORY
from tests.support.big_tenants import BIG_DIM, BIG_EVENTS, BIG_TENANTS, BUDGET, build, copies
from tests.support.metrics import metric, value
from tests.support.procfs import fd_count, vm_rss
from tests.support.servers import ServerProcess
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server for the module with at most three tenants open."""
    server = ServerProcess(
        tmp_path_factory.mktemp("capped") / "data", {"MEMSPINE_MAX_OPEN_TENANTS": "3"}
    ).start()
    yield server
    server.stop()


# Not a tenant: the descriptors the read audit's writer holds on tenants' read logs. It opens a
# log for each group of records and closes it after (storage/readlog/logfile.py), so it may be
# writing to a tenant the cap just evicted, up to 100 ms after the read.
READ_LOGS = "(read logs)"


def tenant_files(pid: int, data_dir: Path) -> Counter[str]:
    """The descriptors a process holds on files of each tenant directory under data_dir."""
    held: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
            parts = target.relative_to(data_dir).parts if target.is_relative_to(data_dir) else ()
            if len(parts) > 1 and parts[-1].startswith("reads.log"):
                held[READ_LOGS] += 1  # the read audit's one writer, at most one file at a time
            elif len(parts) > 1 and not parts[0].startswith(("_", ".")):
                held[parts[0]] += 1
    return held


def test_twelve_tenants_through_a_cap_of_three_all_answer_with_bounded_fds(
    capped: ServerProcess,
) -> None:
    """Counted between requests (the test's only requests, one at a time, so no tenant is being
    opened or evicted then): the tenants holding files, never more than the cap; each one's
    descriptors within FDS_PER_TENANT, what the default cap reserves for it (Tantivy writes a new
    segment's files beside a merge's while it commits); and once the writes settled, the process
    back to its baseline plus the cap's tenants at rest."""
    server = capped
    assert server.proc is not None
    pid = server.proc.pid
    with server.client("warmup") as c:
        assert c.get("/v1/memory/events").status_code == 200
        before = c.get("/metrics").text
    baseline = fd_count(pid)  # sockets and libraries loaded, the empty stand-in; no tenant open
    ids: dict[str, str] = {}
    seen: list[Counter[str]] = []
    for i in range(12):
        name = f"tenant{i}"
        with server.client(name) as c:
            r = c.post("/v1/memory/event", json={"kind": "turn", "text": f"fact of {name}"})
            assert r.status_code == 201, r.text
            ids[name] = r.json()["event_id"]
        seen.append(tenant_files(pid, server.data_dir))
    for name, event_id in ids.items():  # each was evicted since: every one reopens from disk
        with server.client(name) as c:
            listed = [e["event_id"] for e in c.get("/v1/memory/events").json()["events"]]
            assert listed == [event_id]
            assert c.get(f"/v1/memory/event/{event_id}").json()["text"] == f"fact of {name}"
        seen.append(tenant_files(pid, server.data_dir))
    assert max(held.pop(READ_LOGS, 0) for held in seen) <= 1, seen
    assert max(len(held) for held in seen) == 3, seen  # three tenants hold files, never four
    assert max(n for held in seen for n in held.values()) <= FDS_PER_TENANT, seen
    # At rest an open tenant holds 4 (LMDB's data file twice and its lock, Tantivy's writer lock):
    # wait for the last commits to close their segment files, and for the server to close the
    # test's sockets.
    settled = wait_for(lambda: fd_count(pid) <= baseline + 3 * 4, "descriptors settle", 60)
    assert settled, (baseline, fd_count(pid), tenant_files(pid, server.data_dir))
    with server.client("x") as c:
        text = c.get("/metrics").text

    def delta(name: str) -> float:
        return metric(text, name) - metric(before, name)

    # 12 new tenants, then 12 reopens (each was evicted by the time it was read again); the
    # warm-up's read opened nothing (a read does not create a tenant), so 9 + 12 evictions at least
    assert metric(text, "memspine_open_tenants") == 3
    assert delta("memspine_tenant_opens_total") == 24
    assert 21 <= delta("memspine_tenant_evictions_total") <= 24


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server over BIG_TENANTS tenants of BIG_EVENTS 384-float events, with a budget
    that holds about four of them."""
    root = tmp_path_factory.mktemp("budgeted")
    template = build(root / "template" / "big", BIG_EVENTS, BIG_DIM)
    copies(template, root / "data", [f"big{i:02d}" for i in range(BIG_TENANTS)])
    server = ServerProcess(root / "data", {
        "MEMSPINE_EMBEDDING_DIM": str(BIG_DIM), "MEMSPINE_MAX_OPEN_BYTES": str(BUDGET),
    }).start()  # fmt: skip
    yield server
    server.stop()


def test_server_rss_stays_bounded_while_cycling_through_more_tenants_than_fit(
    budgeted: ServerProcess,
) -> None:
    server = budgeted
    assert server.proc is not None
    pid = server.proc.pid
    query = np.random.default_rng(3).standard_normal(BIG_DIM).tolist()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        # Warm up the code paths (imports, the empty stand-in) on a tenant that does not exist.
        warm = c.post("/v1/memory/recall", json={"text": "fact", "embedding": query},
                      headers={"Authorization": "Bearer warmup"})  # fmt: skip
        assert warm.status_code == 200
        base = vm_rss(pid)
        after_round: list[int] = []
        peak = base
        for _round in range(3):
            for i in range(BIG_TENANTS):
                r = c.post("/v1/memory/recall", json={"text": "fact", "embedding": query, "k": 5},
                           headers={"Authorization": f"Bearer big{i:02d}"})  # fmt: skip
                assert r.status_code == 200, r.text
                assert len(r.json()["hits"]) == 5
                peak = max(peak, vm_rss(pid))
            after_round.append(vm_rss(pid))
        text = c.get("/metrics").text
    opened = value(text, "memspine_open_tenant_bytes")
    assert 0 < opened <= BUDGET
    assert value(text, "memspine_open_bytes_budget") == BUDGET
    assert (
        value(text, "memspine_tenant_evictions_by_reason_total", reason=MEMORY)
        >= 3 * BIG_TENANTS - 5
    )
    assert value(text, "memspine_open_tenant_part_bytes", part="graph") > opened / 2
    assert value(text, "memspine_open_tenants") <= 5
    # All twelve open would hold about three times the budget; within it, the process holds the
    # budget plus allocator slack, and once the first round has warmed what a process keeps
    # (allocator arenas, caches), a round holds no more than the one before it did: a leak of
    # what a tenant's open and close leave behind would grow every round. (The first round
    # once grew 8.4 MB and the next 0.08 MB.)
    assert peak - base < BUDGET + (24 << 20), (base, peak, after_round)
    assert after_round[2] < after_round[1] + (4 << 20), after_round
