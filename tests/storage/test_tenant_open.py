"""Opening a tenant under pressure: running out of file descriptors is never mistaken for damage."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from storage.model import NewEvent
from storage.tenants.indexes import raise_if_out_of_fds
from storage.tenants.tenant import Tenant


def _fill(root: Path) -> list[str]:
    """A tenant with text and vectors, cleanly closed."""
    t = Tenant.open("t", root, embedding_dim=4)
    events = [
        NewEvent(kind="turn", ts=i, text=f"parcel number {i}", embedding=[1.0, float(i), 0.0, 0.0])
        for i in range(20)
    ]
    ids = [r.event_id for r in t.submit_append(events).result()]
    t.close()
    return ids


def test_out_of_file_descriptors_is_an_error_not_a_rebuild(tmp_path: Path) -> None:
    root = tmp_path / "t"
    ids = _fill(root)
    before = {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    script = textwrap.dedent(
        f"""
        import os, resource, sys
        from pathlib import Path
        from storage.tenants.tenant import Tenant
        used = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        for limit in range(used + 2, used + 40):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            try:
                Tenant.open("t", Path({str(root)!r}), embedding_dim=4).close()
            except OSError:
                continue
            except Exception as exc:
                print("other", type(exc).__name__, file=sys.stderr)
                continue
            print(limit)
            break
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "no limit let the tenant open"
    # Every failed open left the files as they were: nothing deleted, nothing rebuilt.
    after = {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    for name, mtime in before.items():
        if name.parts[0] in ("keyword",) or name.name.startswith("vectors"):
            assert name in after and after[name] == mtime, name
    t = Tenant.open("t", root, embedding_dim=4)
    try:
        hits = t.keyword.search("parcel", limit=50)
        assert {e for e, _s in hits} == set(ids)
        assert t.vectors.count() == 20
    finally:
        t.close()


def test_a_caller_cannot_cancel_a_write_its_batch_will_commit(tmp_path: Path) -> None:
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4)
    try:
        future = t.submit_append([NewEvent(kind="turn", ts=1, text="kept")])
        assert future.cancel() is False
        (result,) = future.result()
        with t.log.reader() as r:
            ev = r.get(result.event_id)
        assert ev is not None and ev.text == "kept"
        assert msgspec.json.encode(ev.kind) == b'"turn"'
    finally:
        t.close()


@pytest.mark.parametrize(
    "said",
    [OSError(errno.EMFILE, "Too many open files"), ValueError("Too many open files (os error 24)")],
)
def test_a_failure_that_says_out_of_fds_is_pressure_though_a_descriptor_is_free_now(
    said: BaseException,
) -> None:
    """Between a failed open and the probe another thread may close a file: the failure's own
    words decide first (a loaded run rebuilt vectors.hnsw after an EMFILE so)."""
    damaged = ValueError("vector index file is damaged")
    damaged.__cause__ = said
    with pytest.raises(OSError) as raised:
        raise_if_out_of_fds(damaged)
    assert raised.value.errno == errno.EMFILE
    raise_if_out_of_fds(ValueError("vector index file is damaged"))  # damage stays damage
