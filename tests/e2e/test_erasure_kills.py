"""Erasure survives a kill -9 at every step of a purge and around a delete's commit: a forked
purge in its own process is killed at each named step, and the next open finishes or discards
it, leaving no byte of the deleted events (tests/storage/test_erasure_shapes.py builds the
tenants of each shape and checks them the same way)."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from storage.erasure import swap
from storage.tenants.tenant import Tenant
from tests.support.erasure import DIM, append, check_erased, fill, victim
from tests.support.servers import REPO

# One process that has imported storage forks a child per kill: each child opens the tenant and
# runs the purge (or a delete) and kills itself with SIGKILL at the named point.
FORK_SERVER = """
import os, signal, sys
from pathlib import Path
from storage.tenants.tenant import Tenant

dim = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    what, root, at, *ids = line.split()
    pid = os.fork()
    if pid == 0:
        t = Tenant.open("t1", Path(root), embedding_dim=dim)
        steps = []

        def step(name):
            steps.append(name)
            if name == at:
                os.kill(os.getpid(), signal.SIGKILL)

        if what == "purge":
            t.purge(step)
        else:  # a delete killed just before or just after its LMDB commit
            write = t.log.write

            def killing_write(fn):
                step("before-commit")
                out = write(fn)
                step("after-commit")
                return out

            t.log.write = killing_write
            if what == "delete":
                t.submit_delete(ids).result()
            else:
                t.submit_delete_cascade(ids[0]).result()
        t.close()
        print(" ".join(steps), flush=True)
        os._exit(0)
    _pid, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print("killed" if killed else "ended", flush=True)
"""


class Forker:
    """The fork server's process: run(what, root, at) -> the steps seen (if it ended) and
    whether the child was killed."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER, str(DIM)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run(
        self, what: str, root: Path, at: str, ids: tuple[str, ...] = ()
    ) -> tuple[list[str], bool]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join([what, str(root), at, *ids]) + "\n")
        self.proc.stdin.flush()
        first = self._line()
        if first == "killed":
            return [], True
        assert self._line() == "ended"
        return first.split(), False

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def forker() -> Iterator[Forker]:
    f = Forker()
    yield f
    f.close()


class Template(msgspec.Struct):
    """A closed tenant with deleted events awaiting a purge, copied for each kill."""

    root: Path
    live: list[str]
    gone: list[str]
    patterns: dict[str, bytes]


def template(base: Path, vectors: str) -> Template:
    """Build the tenant: 200 events of the shape, 6 and a victim deleted, closed."""
    rng = random.Random(vectors)
    root = base / f"template-{vectors}" / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = fill(t, rng, vectors, 0, 200)
    doomed = victim(rng, vectors)
    [vid] = append(t, [doomed.event])
    gone = [*ids[:6], vid]
    t.submit_delete(gone).result()
    t.close()
    return Template(root=root, live=ids[6:], gone=gone, patterns=doomed.patterns)


def after_crash(tmp: Template, root: Path) -> bool:
    """The next open finishes or discards the purge; a later purge (or none, if it had
    committed) leaves no byte of the deleted events. Returns whether it had committed."""
    t = Tenant.open("t1", root, embedding_dim=DIM)
    assert not any((root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    left = sorted(t.log.tombstones())
    assert left in ([], sorted(tmp.gone))
    if left:
        assert (root / swap.PENDING).exists()  # still found by the purger once closed
    assert t.purge().purged == len(left)
    check_erased(root.parent, t, tmp.patterns, tmp.live)
    with t.log.reader() as r:
        assert r.count() == len(tmp.live)
    t.close()
    return not left


@pytest.mark.parametrize("vectors", ["none", "mixed"])
def test_kill_9_at_every_step_of_a_purge(tmp_path: Path, forker: Forker, vectors: str) -> None:
    tmp = template(tmp_path, vectors)
    whole = tmp_path / "whole" / "t1"
    shutil.copytree(tmp.root, whole)
    steps, killed = forker.run("purge", whole, "-")
    assert not killed and after_crash(tmp, whole)
    assert steps[:2] == ["stage", "copied"] and steps[-1] == "cleaned"
    committed_at = steps.index("committed")
    for i, at in enumerate(steps):
        root = tmp_path / at.replace(":", "_") / "t1"
        shutil.copytree(tmp.root, root)
        assert forker.run("purge", root, at) == ([], True), at
        assert after_crash(tmp, root) == (i >= committed_at), at


@pytest.mark.parametrize("cascade", [False, True])
@pytest.mark.parametrize("at", ["before-commit", "after-commit"])
def test_kill_9_around_a_deletes_commit_leaves_the_marker(
    tmp_path: Path, forker: Forker, at: str, cascade: bool
) -> None:
    rng = random.Random(at)
    root = tmp_path / "t1"
    t = Tenant.open("t1", root, embedding_dim=DIM)
    ids = fill(t, rng, "none", 0, 20)
    doomed = victim(rng, "none")
    [vid] = append(t, [doomed.event])
    t.close()
    assert forker.run("cascade" if cascade else "delete", root, at, (vid,)) == ([], True)
    assert (root / swap.PENDING).exists()  # whichever side of the commit the kill fell
    assert swap.pending_tenants(tmp_path) == ["t1"]
    t = Tenant.open("t1", root, embedding_dim=DIM)
    assert t.log.tombstones() == ([vid] if at == "after-commit" else [])
    if at == "before-commit":  # nothing was deleted: a marker alone is dropped by the purge
        assert t.purge().purged == 0 and not (root / swap.PENDING).exists()
        assert t.submit_delete([vid]).result() == [vid]
    assert t.purge().purged == 1
    check_erased(tmp_path, t, doomed.patterns, ids)
    t.close()
