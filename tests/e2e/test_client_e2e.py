"""memspine.client against a real memspine-server: an append whose connection drops after the
server stored it is sent again and stored once (a real TCP proxy that cuts the connection as the
answer starts), and docs/python.md's session, run top to bottom (tests/server/test_client*.py:
every route, error and retry in process)."""

from __future__ import annotations

import doctest
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from memspine.client import AsyncMemspine, ConnectionFailed, Memspine, NotFound
from tests.support.servers import REPO, ServerProcess

ADMIN_KEY = "doc-admin-key-3f9a1c"
DOC = REPO / "docs" / "python.md"
DOC_URL = "http://127.0.0.1:7781"
ADMIN = Path(sys.executable).parent / "memspine-admin"


class DroppingProxy:
    """A TCP proxy to the server that cuts its first `drops` connections as soon as the server's
    answer begins: the request was served, its answer never reaches the client."""

    def __init__(self, port: int, drops: int = 1) -> None:
        self.target = ("127.0.0.1", port)
        self.drops = drops
        self.connections = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(down,), daemon=True).start()

    def _serve(self, down: socket.socket) -> None:
        with self.lock:
            self.connections += 1
            drop = self.dropped < self.drops
            self.dropped += drop
        up = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
        if not drop:
            self._pump(up, down)
            return
        up.recv(65536)  # the answer's first bytes: the server has done the work
        # Reset, as a crashed middlebox looks to the client; shutdown first, or the pump
        # thread blocked in down.recv would keep the connection open until the client gave up.
        down.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        down.shutdown(socket.SHUT_RDWR)
        down.close()
        up.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server for the module, local mode, with an admin key for the doc's last part
    (which creates the control database: the doc's test runs last)."""
    data_dir = tmp_path_factory.mktemp("client") / "data"
    served = ServerProcess(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    yield served
    served.stop()


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[DroppingProxy]:
    dropping = DroppingProxy(server.port)
    yield dropping
    dropping.close()


def stored(server: ServerProcess, tenant: str) -> list[str | None]:
    with Memspine(server.url, tenant) as direct:
        return [e.text for e in direct.iter_events()]


def test_an_append_whose_answer_was_lost_is_sent_again_and_stored_once(
    server: ServerProcess, proxy: DroppingProxy
) -> None:
    with Memspine(proxy.url, "dropped") as memory:
        made = memory.append("fact", "stored once, answered twice")
    assert (proxy.dropped, proxy.connections) == (1, 2)
    assert made.replayed  # the second send found the first one's event and answered with it
    assert stored(server, "dropped") == ["stored once, answered twice"]


def test_the_async_client_too(server: ServerProcess, proxy: DroppingProxy) -> None:
    async def main() -> None:
        async with AsyncMemspine(proxy.url, "dropped-async") as memory:
            made = await memory.append("fact", "async, stored once")
        assert made.replayed

    anyio.run(main)
    assert (proxy.dropped, proxy.connections) == (1, 2)
    assert stored(server, "dropped-async") == ["async, stored once"]


def test_a_delete_whose_answer_was_lost_is_not_sent_again(
    server: ServerProcess, proxy: DroppingProxy
) -> None:
    """A second copy of a served delete would be 404: the caller hears that it may have been served."""
    with Memspine(server.url, "dropped-delete") as direct:
        event_id = direct.append("fact", "to delete").event_id
    with Memspine(proxy.url, "dropped-delete") as memory, pytest.raises(ConnectionFailed) as lost:
        memory.delete(event_id)
    assert "may have been served" in str(lost.value) and lost.value.attempts == 1
    assert proxy.connections == 1
    with Memspine(server.url, "dropped-delete") as direct, pytest.raises(NotFound):
        direct.get(event_id)


# -- docs/python.md ----------------------------------------------------------------------------

BLOCK = re.compile(r"^```(pycon|console)\n(.*?)^```$", re.S | re.M)


def run_admin(line: str, data_dir: Path) -> None:
    """A `$ memspine-admin ...` line of the doc, run as the doc's reader would."""
    args = shlex.split(line)
    assert args[0] == "memspine-admin", f"docs/python.md runs only memspine-admin: {line}"
    command = [str(ADMIN)] if ADMIN.exists() else [sys.executable, "-m", "memspine_admin.cli"]
    env = {**os.environ, "MEMSPINE_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [*command, *args[1:]], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_session_of_docs_python_md(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSPINE_ADMIN_KEY", ADMIN_KEY)
    text = DOC.read_text()
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    globs: dict[str, object] = {}
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) >= 8
    for block in blocks:
        lineno = text.count("\n", 0, block.start(2))
        if block.group(1) == "console":
            for line in block.group(2).splitlines():
                run_admin(line.removeprefix("$ "), server.data_dir)
            continue
        source = block.group(2).replace(DOC_URL, server.url)
        test = parser.get_doctest(source, globs, "docs/python.md", str(DOC), lineno)
        runner.run(test, out=report.append, clear_globs=False)
        globs = test.globs  # a DocTest runs on a copy: the next block goes on from this one
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)
    assert results.attempted > 30
