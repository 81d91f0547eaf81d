"""A small file system to fill, and what a server answers on it (tests/e2e's disk-full tests)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def recall_ids(c: httpx.Client, query: dict[str, Any]) -> list[str]:
    """The ranked ids of one recall; fails on anything but 200."""
    r = c.post("/v1/memory/recall", json=query)
    assert r.status_code == 200, (r.status_code, r.text)
    return [h["event_id"] for h in r.json()["hits"]]


def listed_ids(c: httpx.Client) -> set[str]:
    """Every id the listing returns, page by page."""
    ids: set[str] = set()
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        r = c.get("/v1/memory/events", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        ids.update(e["event_id"] for e in page["events"])
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def check_refusal(r: httpx.Response) -> None:
    """A write refused for a full disk: 503 `unavailable`, Retry-After, a sentence saying so."""
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers.get("retry-after", "").isdigit()
    answer = r.json()
    assert answer["error"] == "unavailable"
    assert "disk is full" in answer["detail"]


def fill_disk(where: Path) -> Path:
    """A file that takes every byte the filesystem has left (freed by deleting it)."""
    filler = where / "filler"
    chunk = 1 << 20
    with open(filler, "wb", buffering=0) as f:
        while chunk >= 4096:
            try:
                f.write(b"\xff" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk //= 4
    return filler


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on mnt (skipped where this process may not mount one)."""
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount to make a small filesystem: {exc}")
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted on tmp_path/fs (skipped where this process may not mount one)."""
    with tmpfs(tmp_path / "fs", "16m") as mnt:
        yield mnt
