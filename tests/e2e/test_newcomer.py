"""A newcomer's first commands: memspine-server's --help and --version, its start line, one
process per data directory, and /mcp loading the MCP SDK only when first asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from memspine import __version__
from tests.support.servers import REPO, ServerProcess

BIN = Path(sys.executable).parent
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "newcomer", "version": "0"},
    },
}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without MEMSPINE_* settings, plus extra."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}, **extra}


@pytest.mark.parametrize(
    ("flag", "printed"),
    [("--help", "usage: memspine-server"), ("--version", f"memspine-server {__version__}")],
)
def test_help_and_version_print_and_touch_nothing(tmp_path: Path, flag: str, printed: str) -> None:
    done = subprocess.run(
        [str(BIN / "memspine-server"), flag],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith(printed), done.stderr
    assert list(tmp_path.iterdir()) == []  # no ./data, nothing else


def test_the_mcp_sdk_is_not_imported_at_start(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from memspine.app import create_app\n"
        "from pathlib import Path\n"
        "from memspine.config import Settings\n"
        f"create_app(Settings(data_dir=Path({str(tmp_path)!r})))\n"
        "import memspine.server\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A fresh server in local mode; its first /mcp request is the module's first test's."""
    server = ServerProcess(tmp_path_factory.mktemp("newcomer") / "data").start()
    yield server
    server.stop()


def test_first_mcp_requests_at_once_all_get_the_endpoint(local: ServerProcess) -> None:
    """The first requests wait together for the SDK to load; none is refused meanwhile."""
    headers = {
        "Authorization": "Bearer newcomer",
        "Accept": "application/json, text/event-stream",
    }

    def initialize(_n: int) -> int:
        r = httpx.post(local.url + "/mcp", json=MCP_INIT, headers=headers, timeout=60)
        return r.status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(initialize, range(4))) == [200] * 4
    assert httpx.get(local.url + "/health", timeout=10).status_code == 200


def test_the_start_line_says_where_what_and_that_it_is_ready(local: ServerProcess) -> None:
    lines = [json.loads(line) for line in local.log_path.read_text().splitlines()]
    [start] = [r for r in lines if r["logger"] == "memspine.server" and "ready" in r["msg"]]
    assert start["level"] == "INFO"
    assert start["url"] == local.url and start["data_dir"] == str(local.data_dir.resolve())
    assert start["auth"] == "local mode" and start["embedder"].startswith("none")
    msg = start["msg"]
    assert msg.startswith(f"memspine-server {__version__} ready on {local.url}: data in ")
    assert "any well-formed token" in msg and "memspine-admin init switches" in msg
    assert "admin routes off" in msg and "embedder: none" in msg


def test_a_second_server_on_a_served_directory_stops_in_one_line(local: ServerProcess) -> None:
    done = subprocess.run(
        [str(BIN / "memspine-server")],
        env=clean_env(MEMSPINE_DATA_DIR=str(local.data_dir), MEMSPINE_BIND="127.0.0.1:9"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"memspine-server: {local.data_dir} is in use by memspine-server (pid ")
    assert local.url in last and "Traceback" not in done.stderr
    assert httpx.get(local.url + "/health", timeout=10).status_code == 200  # the first one serves
