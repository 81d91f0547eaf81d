"""memspine-server as a command: a bad setting or a data directory that cannot be made stops it
with one line and no traceback, before it touches anything (tests/server/test_config.py parses
the settings in process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _server(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run memspine-server with exactly these MEMSPINE_* variables; it must stop on its own."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    return subprocess.run(
        [sys.executable, "-m", "memspine.server"],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"MEMSPINE_EMBEDDING_DIM": "lots"},
            "memspine-server: MEMSPINE_EMBEDDING_DIM: expected an integer, got 'lots'",
        ),
        (
            {"MEMSPINE_BIND": "127.0.0.1"},
            "memspine-server: MEMSPINE_BIND: expected host:port, got '127.0.0.1'",
        ),
        (
            {"MEMSPINE_PURGE_INTERVALS": "5"},
            "memspine-server: unknown setting MEMSPINE_PURGE_INTERVALS; see docs/configuration.md",
        ),
    ],
)
def test_a_bad_value_stops_the_server_with_a_clear_message(
    tmp_path: Path, env: dict[str, str], line: str
) -> None:
    proc = _server({"MEMSPINE_DATA_DIR": str(tmp_path / "data"), **env}, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == line  # one line, no traceback
    assert not (tmp_path / "data").exists()  # stopped before touching anything


def test_a_data_directory_that_cannot_be_created_stops_the_server_in_one_line(
    tmp_path: Path,
) -> None:
    proc = _server({"MEMSPINE_DATA_DIR": "/proc/memspine-cannot-exist/data"}, tmp_path)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("memspine-server: ")
    assert "Traceback" not in proc.stderr
