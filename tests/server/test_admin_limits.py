"""memspine-admin's limits and usage commands through its main() in this process: `tenant
limits`, `tenant show`, `key create --requests-per-minute` and the rate in `key list`
(tests/e2e/test_limits_e2e.py runs them beside a running server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.admin import Admin


@pytest.fixture
def ready(tmp_path: Path) -> Admin:
    admin = Admin(tmp_path / "data", tmp_path, in_process=True)
    admin.ok("init")
    return admin


def test_tenant_limits_set_show_and_remove(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    shown = ready.json("tenant", "show", tid)
    assert (shown["max_events"], shown["max_bytes"], shown["usage"]) == (None, None, None)
    assert "none of its own" in ready.ok("tenant", "show", tid)
    set_ = ready.json("tenant", "limits", tid, "--max-events", "100000", "--max-bytes", "512M")
    assert (set_["max_events"], set_["max_bytes"]) == (100_000, 512 << 20)
    human = ready.ok("tenant", "limits", tid, "--max-events", "none")
    assert "max_events none of its own" in human and f"max_bytes {512 << 20}" in human
    shown = ready.json("tenant", "show", tid)
    assert (shown["max_events"], shown["max_bytes"]) == (None, 512 << 20)
    assert ready.json("tenant", "limits", tid, "--max-memory", "256M")["max_memory"] == 256 << 20
    assert "max_memory: 268435456" in ready.ok("tenant", "show", tid)
    audit = ready.json("audit", "--tenant", tid)["entries"]
    assert [e["detail"] for e in audit if e["action"] == "tenant.limits"] == [
        {"max_events": 100_000, "max_bytes": 512 << 20},
        {"max_events": None},
        {"max_memory": 256 << 20},
    ]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--max-events", "0"], "max_events must be a whole number from 1"),
        (["--max-bytes", "-5"], "expected a whole number"),
        (["--max-bytes", "12Q"], "expected a whole number"),
        (["--max-events", str(2**62 + 1)], "max_events must be a whole number from 1"),
    ],
)
def test_bad_limits_are_refused_naming_the_limit(
    ready: Admin, args: list[str], fragment: str
) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    result = ready.run("tenant", "limits", tid, *args)
    assert result.returncode in (1, 2) and fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert ready.json("tenant", "show", tid)["max_events"] is None


def test_tenant_limits_needs_a_limit_and_a_known_tenant(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    result = ready.run("tenant", "limits", tid)
    assert result.returncode == 2 and "--max-events" in result.stderr
    unknown = "0c6c2c85-59a4-4b2d-8a4b-2b1f4a9d2a11"
    assert ready.error("tenant", "limits", unknown, "--max-events", "5")["error"] == "not_found"
    assert ready.error("tenant", "show", unknown)["error"] == "not_found"


def test_a_keys_rate_is_set_at_creation_and_listed(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    issued = ready.json("key", "create", tid, "bot", "--requests-per-minute", "30")
    assert issued["requests_per_minute"] == 30
    human = ready.ok("key", "create", tid, "human")
    assert "the default rate" in human
    listing = ready.ok("key", "list", "--tenant", tid)
    assert "PER MINUTE" in listing.splitlines()[0]
    rows = {line.split()[2]: line.split() for line in listing.splitlines()[1:]}
    assert rows["bot"][-1] == "30" and rows["human"][-1] == "default"
    bad = ready.run("key", "create", tid, "x", "--requests-per-minute", "0")
    assert bad.returncode == 1 and "requests_per_minute" in bad.stderr
    shown = ready.json("tenant", "show", tid)
    assert shown["keys"] == {"active": 2, "revoked": 0, "expired": 0}
    ready.ok("key", "revoke", issued["key_id"], "--yes")
    assert ready.json("tenant", "show", tid)["keys"]["revoked"] == 1


def test_tenant_show_reads_the_figures_from_the_files(ready: Admin) -> None:
    tid = ready.json("tenant", "create", "acme")["tenant_id"]
    tenant = Tenant.open(tid, ready.data_dir / tid, embedding_dim=4)
    try:
        events = [
            NewEvent(
                kind="note", ts=1_790_000_000_000_000 + i, text=f"note {i}", embedding=[1.0] * 4
            )
            for i in range(5)
        ]
        ids = [r.event_id for r in tenant.submit_append(events).result()]
        tenant.submit_delete(ids[:2]).result()
    finally:
        tenant.close()
    usage = ready.json("tenant", "show", tid)["usage"]
    assert usage["open"] is None  # another process may hold it: the command cannot tell
    assert usage["events"] == {"live": 3, "deleted": 2}
    assert usage["bytes"]["live"] > 0 and usage["bytes"]["total"] >= usage["bytes"]["log"] > 0
    assert usage["vectors"]["graph"] + usage["vectors"]["pending"] == 3
    assert usage["vector_space"] == {
        "dim": 4,
        "model": None,
        "made_by": "client",
        "metric": "cosine",
    }
    assert usage["vectors"]["unembedded"] == 0
    assert usage["last_write"] is not None
    assert usage["memory"] is None  # what the server's budget counts: only the server measures
    human = ready.ok("tenant", "show", tid)
    assert "events: 3 live, 2 deleted awaiting purge" in human
    assert "vector space: 4 dimensions, cosine" in human
