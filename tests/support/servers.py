"""The two ways a test talks to memspine over HTTP, with one interface (data_dir, url, client,
request, stop): ServerProcess, a real memspine-server subprocess on a free loopback port
(tests/e2e), and InProcessServer, the same app in this process behind an in-process transport
(tests/server): real Litestar, real stores, no socket, no seconds of imports per start."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.support.forkserver import Forked, fork_server

if TYPE_CHECKING:
    from argon2 import PasswordHasher
    from litestar import Litestar
    from litestar.testing import TestClient

    from memspine.auth import Authenticator
    from memspine.config import Settings

REPO = Path(__file__).resolve().parents[2]
# The embedder is off unless a test turns it on (MEMSPINE_EMBEDDER=local): at dimension 4 the
# local model (384) would make every tenant client-space anyway, and with it off no test pays
# for loading it or waits on background work it did not ask for.
#
# A Cypher query's time limit is 2 s by default: on a busy machine a test's ordinary query (the
# seed's audit query on a fresh server) can pass it and be refused. A test about that limit sets
# its own (MEMSPINE_CYPHER_TIMEOUT_MS in its env); every other test's servers do not hurry.
DIM_ENV = {
    "MEMSPINE_EMBEDDING_DIM": "4",
    "MEMSPINE_EMBEDDER": "none",
    "MEMSPINE_CYPHER_TIMEOUT_MS": "120000",
}
# One TLS context for every client made here: httpx otherwise builds one for each client,
# loading the CA bundle every time (tens of ms of CPU a client), and these clients speak plain
# http to loopback.
TLS = ssl.create_default_context()
# How long a server may take to answer /health: a start took 30 s at a load of 34 on 2 cores (a
# bound that holds costs nothing: the wait ends when the server answers).
START_SECS = 120


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health_status(port: int) -> int | None:
    """The status of GET /health on a connection of its own; None while nothing answers."""
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    head = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(request.encode())
            while b"\r\n" not in head and (chunk := s.recv(256)):
                head += chunk
    except OSError:
        return None
    status = head.split(b" ", 2)[1:2]
    return int(status[0]) if status and status[0].isdigit() else None


def cheap_hasher() -> PasswordHasher:
    """argon2id at the lowest cost: for tests where a key's verification cost is not the point."""
    from argon2 import PasswordHasher

    return PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


class ServerProcess:
    """A memspine-server subprocess with its data directory, base URL and log."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_env = dict(env or {})
        self.port = 0
        self.proc: subprocess.Popen[bytes] | Forked | None = None
        self.log_path = data_dir.parent / f"server-{id(self)}.log"
        self._log_from = 0  # where this start's lines begin in the log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        """Start the server and wait until /health answers."""
        return self.launch().ready()

    def launch(self) -> ServerProcess:
        """Start the server process on a free port without waiting for it (`ready` waits), so
        that servers launched one after the other start side by side."""
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
        env.update(
            {
                "MEMSPINE_BIND": f"127.0.0.1:{self.port}",
                "MEMSPINE_DATA_DIR": str(self.data_dir),
                **DIM_ENV,
            }
        )
        env.update(self.extra_env)
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        forks = fork_server(REPO)
        if forks is not None and forks.fits(env):  # a fork of an imported server: no imports
            self.proc = forks.spawn(env, REPO, self.log_path)
            return self
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memspine.server"], env=env, stdout=log, stderr=log, cwd=REPO
            )
        return self

    def ready(self) -> ServerProcess:
        """Wait until /health answers 200 (polled over a bare socket: an httpx client a poll
        would cost more CPU than the server's start). A port another process took between
        free_port() and the server's bind is no failure of the server: it starts again on
        another, twice at most."""
        assert self.proc is not None, "launch() first"
        for attempt in range(3):
            deadline = time.monotonic() + START_SECS
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    log = self.log_path.read_text(errors="replace")
                    if "address already in use" in log[self._log_from :].lower() and attempt < 2:
                        self.launch()
                        break
                    raise RuntimeError(f"server exited: {log[-2000:]}")
                if health_status(self.port) == 200:
                    return self
                time.sleep(0.05)
            else:
                self.stop(signal.SIGKILL)  # no fixture stops a server whose start failed
                raise RuntimeError(f"server did not start in {START_SECS} s")
        raise RuntimeError("no free port for the server in three tries")

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
        kw.setdefault("verify", TLS)
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request on a connection of its own, as `httpx.request` sends it."""
        kw.setdefault("timeout", 30)
        kw.setdefault("verify", TLS)
        return httpx.request(method, self.url + path, **kw)


class AppTransport(httpx.BaseTransport):
    """Sends each request to the app through a running TestClient's event loop, as uvicorn
    would: the header bytes as sent, the body in the chunks it was sent in, a loopback peer."""

    def __init__(self, runner: TestClient[Any], port: int) -> None:
        self.runner = runner
        self.port = port
        self.peer_port = 40000

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Run the app on one request; the whole answer, buffered."""
        from urllib.parse import unquote

        chunks = [bytes(c) for c in request.stream]  # type: ignore[union-attr]
        self.peer_port += 1
        url = request.url
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": unquote(url.raw_path.split(b"?", 1)[0].decode("ascii")),
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", self.peer_port),
            "server": ("127.0.0.1", self.port),
            "state": {},
            "extensions": {},
        }
        status = 500
        headers: list[tuple[bytes, bytes]] = []
        body = bytearray()

        async def call() -> None:
            import anyio

            nonlocal status, headers
            pending = list(chunks) or [b""]
            done = anyio.Event()

            async def receive() -> dict[str, Any]:
                if pending:
                    chunk = pending.pop(0)
                    return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
                await done.wait()  # the answer is complete: the client "disconnects"
                return {"type": "http.disconnect"}

            async def send(message: Mapping[str, Any]) -> None:
                nonlocal status, headers
                if message["type"] == "http.response.start":
                    status = message["status"]
                    headers = list(message.get("headers", []))
                elif message["type"] == "http.response.body":
                    body.extend(message.get("body", b""))
                    if not message.get("more_body", False):
                        done.set()

            await self.runner.app(scope, receive, send)  # type: ignore[arg-type]

        self.runner.blocking_portal.call(call)
        return httpx.Response(status, headers=headers, content=bytes(body), request=request)


class InProcessServer:
    """memspine-server's app built from the same MEMSPINE_* settings, served in this process.

    Its lifespan runs (idle closer, purger, MCP session manager) on a TestClient's event loop;
    every `client()` shares that one app. `hasher` replaces argon2's production cost where a
    key's verification cost is not what the test checks.
    """

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str] | None = None,
        *,
        hasher: PasswordHasher | None = None,
        clock: Any = None,
        hot_routes: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.extra_env = dict(env or {})
        self.hasher = hasher
        self.clock = clock
        self.hot_routes = hot_routes
        self.port = 7781
        self.runner: TestClient[Any] | None = None
        self.app: Litestar | None = None
        self.settings: Settings | None = None
        self.auth: Authenticator | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> InProcessServer:
        """Build the app and run its startup."""
        from litestar.testing import TestClient

        from memspine.app import create_app
        from memspine.auth import Authenticator, AuthLimits
        from memspine.config import load_settings

        env = {
            "MEMSPINE_BIND": f"127.0.0.1:{self.port}",
            "MEMSPINE_DATA_DIR": str(self.data_dir),
            **DIM_ENV,
            **self.extra_env,
        }
        self.settings = settings = load_settings(env)
        self.auth = Authenticator(
            settings.data_dir,
            settings.admin_key,
            hasher=self.hasher,
            clock=self.clock,
            limits=AuthLimits.of(settings),
            control_url=settings.control_url,
            node=settings.node,
        )
        self.app = create_app(settings, auth=self.auth, hot_routes=self.hot_routes)
        self.runner = TestClient(self.app, base_url=self.url)
        self.runner.__enter__()
        return self

    def stop(self) -> None:
        """Run the app's shutdown (tenants closed, background work stopped)."""
        if self.runner is not None:
            self.runner.__exit__(None, None, None)
            self.runner = None

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        """An httpx client for the app, with a bearer token if given."""
        assert self.runner is not None, "start() first"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        return httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=AppTransport(self.runner, self.port),
            timeout=30,
            **kw,
        )

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request without default headers, as `httpx.request` sends it."""
        with self.client() as c:
            return c.request(method, path, **kw)


def serve(server: ServerProcess | InProcessServer) -> Iterator[Any]:
    """Start a server for a fixture and stop it after."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
