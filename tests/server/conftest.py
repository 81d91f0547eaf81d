"""In-process fixtures: `start_server` and `server` here are memspine-server's app in this
process (tests/support/servers.py InProcessServer), with the interface of the real one, so a test
reads the same in tests/server and tests/e2e."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import InProcessServer


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """A factory of started InProcessServer (start_server(env=..., hasher=...)); all stop at teardown."""
    started: list[InProcessServer] = []

    def start(
        env: dict[str, str] | None = None, data_dir: Path | None = None, **kw: Any
    ) -> InProcessServer:
        server = InProcessServer(data_dir or tmp_path / "data", env, **kw).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server: Any) -> InProcessServer:
    """The app in local mode (the bearer token is the tenant id), embedding dimension 4."""
    return start_server()  # type: ignore[no-any-return]
