"""memspine-admin's output commands fail cleanly, run as real processes: a backup or an export
onto a full disk (a small tmpfs; skipped where this process may not mount one) says the cause
in one line naming where it wrote, no traceback, and leaves nothing there; an export killed
while it writes leaves no file at all, not even a partial temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support.admin import COMMAND, Admin
from tests.support.disk_full import tmpfs

TS = 1_790_000_000_000_000


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted on tmp_path/fs (skipped where this process may not mount one)."""
    with tmpfs(tmp_path / "fs", "1m") as mnt:
        yield mnt


def tenant(data_dir: Path, n: int, size: int = 2000) -> None:
    """A local-mode tenant `acme` of n events of about `size` bytes each, closed."""
    t = Tenant.open("acme", data_dir / "acme", embedding_dim=4)
    try:
        for start in range(0, n, 500):
            batch = [
                NewEvent(kind="note", ts=TS + i, text=f"note {i} " + "x" * size)
                for i in range(start, min(n, start + 500))
            ]
            t.submit_append(batch).result()
    finally:
        t.close()


def one_clean_line(stderr: str) -> str:
    """The error's single line (no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_backup_onto_a_full_disk_says_so_in_one_line(tmp_path: Path, small_fs: Path) -> None:
    admin = Admin(tmp_path / "data", tmp_path)
    tenant(admin.data_dir, 1500)  # about 3 MB of records: more than the 1 MiB disk
    result = admin.run("backup", str(small_fs / "bk"))
    assert result.returncode == 1
    line = one_clean_line(result.stderr)
    assert "is full" in line and str(small_fs / "bk") in line
    assert os.listdir(small_fs) == []  # no backup, no stage


def test_an_export_onto_a_full_disk_names_the_out_file(tmp_path: Path, small_fs: Path) -> None:
    admin = Admin(tmp_path / "data", tmp_path)
    tenant(admin.data_dir, 1500)
    out = small_fs / "acme.ndjson"
    result = admin.run("export", "acme", "--out", str(out))
    assert result.returncode == 1
    line = one_clean_line(result.stderr)
    assert "is full" in line and str(out) in line and "--data-dir" not in line
    assert os.listdir(small_fs) == []


def test_a_killed_export_leaves_no_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    tenant(data_dir, 6000, size=1500)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen(
        [*COMMAND, "export", "acme", "--out", str(out_dir / "acme.ndjson")],
        env={**os.environ, "MEMSPINE_DATA_DIR": str(data_dir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Killed while its unnamed output file in out_dir holds part of the export.
        deadline = time.monotonic() + 60
        while not _writing_in(proc.pid, out_dir):
            assert proc.poll() is None, "the export ended before it could be killed"
            assert time.monotonic() < deadline, "the export never wrote"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert os.listdir(out_dir) == []


def _writing_in(pid: int, directory: Path) -> bool:
    """Whether the process holds an unnamed file of directory open, with bytes written."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    return any(
        _link(fd).startswith(f"{directory}/") and _link(fd).endswith("(deleted)") and _size(fd)
        for fd in fds
    )


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def _size(fd: Path) -> int:
    try:
        return fd.stat().st_size
    except OSError:
        return 0
