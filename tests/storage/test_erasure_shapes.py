"""Erasure completes for every shape of tenant, on real LMDB, Tantivy and hnswlib files: without
vectors, with only vectors, mixed; reopened, evicted, idle-closed, purged before; and when the
disk cannot hold the purge, until it can (tests/e2e/test_erasure_kills.py: after a kill -9 at
each step of a purge). Each check is a byte scan of the whole data directory, as
tests/storage/test_purge.py does."""

from __future__ import annotations

import errno
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from storage.erasure import swap
from storage.erasure.purge import NoRoomToPurge
from storage.index import vecfile
from storage.space import names_full_disk
from storage.tenants.manager import TenantManager
from storage.tenants.tenant import Tenant
from tests.support.erasure import (
    DIM,
    Victim,
    append,
    ballast,
    check_erased,
    fill,
    scan,
    shaped,
    victim,
)

VECTORS = ["none", "all", "mixed", "no-text"]  # which events carry an embedding (and text)
LIVES = ["open", "reopened", "deleted-then-reopened", "purged-before", "purged-twice"]


# -- a tenant of a given shape -----------------------------------------------------------------


def reopen(t: Tenant) -> Tenant:
    """Close (saving every index, an empty vector file included) and open again."""
    t.close()
    return Tenant.open(t.tenant_id, t.root, embedding_dim=DIM)


@pytest.mark.parametrize("life", LIVES)
@pytest.mark.parametrize("vectors", VECTORS)
def test_erasure_completes_for_every_shape(tmp_path: Path, vectors: str, life: str) -> None:
    rng = random.Random(f"{vectors}/{life}")
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    live = fill(t, rng, vectors, 0, 40)
    doomed = victim(rng, vectors)
    batch = [shaped(rng, i, vectors) for i in range(40, 80)]
    batch.insert(20, doomed.event)  # shares pages and a segment with its neighbours
    ids = append(t, batch)
    target = ids.pop(20)
    live += ids
    if life != "open":
        t = reopen(t)
        if vectors == "none":  # the shape that failed: a vector file holding no record
            assert (root / "vectors.hnsw").stat().st_size == vecfile.HEADER.size
    for _round in range({"purged-before": 1, "purged-twice": 2}.get(life, 0)):
        gone, live = live[:3], live[3:]
        t.submit_delete(gone).result()
        assert t.purge().purged == 3
        assert t.purge().purged == 0  # nothing left: a second purge in a row touches nothing
        t = reopen(t)
    assert scan(tmp_path, doomed.patterns)  # the scan can fail: the victim is on disk

    assert t.submit_delete([target]).result() == [target]
    assert (root / swap.PENDING).exists()  # made by storage itself, with the delete
    if life == "deleted-then-reopened":
        t = reopen(t)
    assert t.purge().purged == 1
    check_erased(tmp_path, t, doomed.patterns, live)
    t = reopen(t)
    check_erased(tmp_path, t, doomed.patterns, live)
    t.close()


@pytest.mark.parametrize("vectors", ["none", "mixed"])
def test_an_evicted_and_an_idle_closed_tenant_are_purged(tmp_path: Path, vectors: str) -> None:
    rng = random.Random(vectors)
    manager = TenantManager(tmp_path, embedding_dim=DIM, max_open=1, idle_secs=60)
    doomed = {name: victim(rng, vectors) for name in ("evicted", "idle")}
    targets: dict[str, str] = {}
    live: dict[str, list[str]] = {}
    for name, v in doomed.items():
        with manager.use(name) as t:
            live[name] = fill(t, rng, vectors, 0, 30)
            [targets[name]] = append(t, [v.event])
            t.submit_delete([targets[name]]).result()
    assert manager.evictions == 1  # "evicted" made room for "idle"
    assert manager.close_idle(now=float("inf")) == 1 and manager.open_count() == 0
    # Closed, each is found by its marker alone, as the background purger finds it.
    assert swap.pending_tenants(tmp_path) == ["evicted", "idle"]
    for name, v in doomed.items():
        with manager.use(name) as t:
            assert t.purge().purged == 1
            check_erased(tmp_path, t, v.patterns, live[name])
    manager.close_all()


# -- the pending-purge marker belongs to the delete ----------------------------------------------


def test_a_delete_through_storage_marks_the_tenant_and_an_open_repairs_a_lost_marker(
    tmp_path: Path,
) -> None:
    rng = random.Random(3)
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = fill(t, rng, "none", 0, 10)
    assert t.submit_delete(["1f0e4bd4-1d4f-4a5e-9a35-0cd7e0d7c2b1"]).result() == []
    assert not (root / swap.PENDING).exists()  # deleting nothing marks nothing
    assert t.submit_delete_cascade(ids[0]).result() == [ids[0]]  # the cascading delete marks too
    assert (root / swap.PENDING).exists()
    assert t.purge().purged == 1 and not (root / swap.PENDING).exists()
    t.submit_delete([ids[1]]).result()
    t.close()
    (root / swap.PENDING).unlink()  # as a delete made before markers were storage's left it
    t = Tenant.open("t1", root, embedding_dim=DIM)
    assert (root / swap.PENDING).exists()  # tombstones without a marker get one on open
    assert t.purge().purged == 1 and not (root / swap.PENDING).exists()
    t.close()


# -- a disk too full for a purge ----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (needs root; skipped where mounting is refused)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def big_tenant(root: Path, rng: random.Random) -> tuple[Tenant, list[str], Victim]:
    """A tenant of a few hundred KB with a victim in it, its vectors saved."""
    t = Tenant.open("t1", root, embedding_dim=DIM)
    filler = [
        msgspec.structs.replace(
            shaped(rng, i, "mixed"), text=f"long turn {'lorem ipsum dolor ' * 20} nb{i:05d}"
        )
        for i in range(300)
    ]
    live = append(t, filler)
    doomed = victim(rng, "mixed")
    [vid] = append(t, [doomed.event])
    t.save_vectors()
    live += fill(t, rng, "mixed", 300, 10)
    return t, [vid, *live], doomed


def test_a_purge_the_disk_cannot_hold_is_refused_and_succeeds_once_it_can(
    small_disk: Path,
) -> None:
    rng = random.Random(11)
    t, (vid, *live), doomed = big_tenant(small_disk / "t1", rng)
    assert t.submit_delete([vid]).result() == [vid]
    weight = ballast(small_disk, leave=64 << 10)
    with pytest.raises(NoRoomToPurge) as refused:
        t.purge()
    assert refused.value.errno == errno.ENOSPC and names_full_disk(refused.value)
    # Refused before writing anything: no stage, the delete stands, the tenant works.
    assert not any((t.root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    assert t.log.tombstones() == [vid] and (t.root / swap.PENDING).exists()
    assert scan(small_disk, doomed.patterns)  # still on disk: the purge is pending
    weight.unlink()
    assert t.purge().purged == 1
    check_erased(small_disk, t, doomed.patterns, live)
    t.close()


@pytest.mark.parametrize("at", ["stage", "copied", "indexed"])
def test_a_purge_that_runs_out_of_disk_half_way_is_retried(small_disk: Path, at: str) -> None:
    rng = random.Random(at)
    t, (vid, *live), doomed = big_tenant(small_disk / "t1", rng)
    t.submit_delete([vid]).result()
    weights: list[Path] = []

    def fill_the_disk(name: str) -> None:
        if name == at:  # past the up-front check: the disk fills while the purge writes
            weights.append(ballast(small_disk, leave=0))

    with pytest.raises(Exception) as failed:  # LMDB, Tantivy or the OS say it their own way
        t.purge(fill_the_disk)
    assert weights and names_full_disk(failed.value), repr(failed.value)
    assert not any((t.root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    assert t.log.tombstones() == [vid] and (t.root / swap.PENDING).exists()
    weights[0].unlink()
    more = fill(t, rng, "mixed", 900, 3)  # the writer carries on
    assert t.purge().purged == 1
    check_erased(small_disk, t, doomed.patterns, live + more)
    t.close()
