"""Shared fixtures: a tenant on tmp_path and a real memspine-server process on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pgcluster import control_url, pg_server  # noqa: F401  (fixtures: a real PostgreSQL)

from storage.tenants.tenant import Tenant

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A memspine-server subprocess with its data directory, base URL and log."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_env = dict(env or {})
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"server-{id(self)}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        """Start the server and wait until /health answers."""
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
        env.update(
            {
                "MEMSPINE_BIND": f"127.0.0.1:{self.port}",
                "MEMSPINE_DATA_DIR": str(self.data_dir),
                "MEMSPINE_EMBEDDING_DIM": "4",
            }
        )
        env.update(self.extra_env)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memspine.server"], env=env, stdout=log, stderr=log, cwd=REPO
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("server did not start in 30 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGKILL to simulate a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        """An httpx client for this server, with a bearer token if given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """A factory: start_server(env=...) -> a running ServerProcess on tmp_path/data; all stop at teardown."""
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, data_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / "data", env).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server: Any) -> ServerProcess:
    """A running server in local mode (the bearer token is the tenant id), embedding dimension 4."""
    return start_server()  # type: ignore[no-any-return]


@pytest.fixture
def tenant(tmp_path: Path) -> Iterator[Tenant]:
    """An open tenant on tmp_path with 4-dimensional embeddings."""
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    yield t
    t.close()
