"""Keep an HAProxy routes map equal to the placement in the PostgreSQL control plane.

`memspine-admin proxy-sync` runs beside each HAProxy (deploy/haproxy/memspine.cfg). The map
has one line per placed tenant for its route (the start of its key ids) and one for its id
(its own admin route), each to the node holding it. On every change to the control plane
(LISTEN) and at least every SYNC_SECS, it compares HAProxy's live map (`show map` on the
runtime API) with the control plane, sends the difference (`add map`, `set map`, `del map`),
rewrites the map file (so a restarted HAProxy starts current) and records the generation it
applied in `proxies`, which a tenant's creation waits for (memspine_admin/control_pg.py).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from memspine_admin.control_pg import CHANNEL, CONNECT_TIMEOUT_SECS, PgControl
from memspine_admin.records import now_us
from storage.errors import Unavailable
from storage.fsync import replace_durably

log = logging.getLogger("memspine.proxysync")

SYNC_SECS = 1.0
BATCH = 100  # runtime API commands sent on one connection, separated by ';'


class ProxyError(Unavailable):
    """The HAProxy runtime API refused a command or cannot be reached."""


class Runtime:
    """HAProxy's runtime API (the `stats socket`): a Unix socket path or `host:port`."""

    def __init__(self, address: str, *, timeout: float = 5.0) -> None:
        """`address`: `/path/to/socket`, `unix@/path`, `ipv4@host:port` or `host:port`."""
        self.address = address
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        address = self.address
        for prefix in ("unix@", "ipv4@"):
            address = address.removeprefix(prefix)
        if address.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = address
        else:
            host, _, port = address.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = (host, int(port))
        sock.settimeout(self.timeout)
        try:
            sock.connect(target)
        except OSError as exc:
            sock.close()
            raise ProxyError(
                f"cannot reach the HAProxy runtime API at {self.address}: {exc}"
            ) from None
        return sock

    def command(self, line: str) -> str:
        """Send one line (commands separated by ';') and return the whole answer."""
        if "\n" in line:
            raise ValueError("one line per call")
        with self._connect() as sock:
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def show_map(self, path: str) -> dict[str, str]:
        """The live entries of the map loaded from `path`."""
        answer = self.command(f"show map {path}")
        entries: dict[str, str] = {}
        for row in answer.splitlines():
            parts = row.split()
            if len(parts) == 3 and parts[0].startswith("0x"):
                entries[parts[1]] = parts[2]
            elif row.strip():
                raise ProxyError(f"show map {path}: {row.strip()}")
        return entries

    def apply(self, path: str, changes: list[tuple[str, str, str | None]]) -> None:
        """Run map changes (verb, key, value) in batches; ProxyError names the first refused."""
        for start in range(0, len(changes), BATCH):
            lines = [
                f"{verb} map {path} {key}" + ("" if value is None else f" {value}")
                for verb, key, value in changes[start : start + BATCH]
            ]
            answer = self.command("; ".join(lines))
            problems = [r.strip() for r in answer.splitlines() if r.strip()]
            if problems:
                raise ProxyError(f"HAProxy refused a map change: {problems[0]}")


def diff(live: dict[str, str], wanted: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """The changes (`add`/`set` key value, `del` key) that turn `live` into `wanted`."""
    changes: list[tuple[str, str, str | None]] = [
        ("del", k, None) for k in sorted(live) if k not in wanted
    ]
    for key in sorted(wanted):
        if key not in live:
            changes.append(("add", key, wanted[key]))
        elif live[key] != wanted[key]:
            changes.append(("set", key, wanted[key]))
    return changes


def write_map(path: Path, wanted: dict[str, str]) -> None:
    """Replace the map file atomically (a temporary file fsynced and renamed over it)."""
    head = "# memspine routes: key-id route or tenant id -> node (memspine-admin proxy-sync)\n"
    body = "".join(f"{k} {v}\n" for k, v in sorted(wanted.items()))
    replace_durably(path, lambda f: f.write((head + body).encode("ascii")))


class ProxySync:
    """One HAProxy's map, kept equal to the control plane's placement."""

    def __init__(self, url: str, runtime: Runtime, map_path: Path, name: str) -> None:
        """`map_path` is the path the HAProxy configuration loads the map from."""
        self.url = url
        self.runtime = runtime
        self.map_path = Path(map_path)
        self.name = name
        self.control = PgControl.open(url, actor=f"proxy:{name}")
        self._written: dict[str, str] | None = None

    def sync_once(self) -> int:
        """Bring HAProxy and the file up to date; return the generation applied."""
        generation = self.control.generation()  # before the routes: a lower bound of them
        wanted = self.control.routes()
        changes = diff(self.runtime.show_map(str(self.map_path)), wanted)
        if changes:
            self.runtime.apply(str(self.map_path), changes)
            log.info("proxy map: %d change(s) applied", len(changes))
        if wanted != self._written:
            write_map(self.map_path, wanted)
            self._written = wanted
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO proxies (name, applied_generation, seen_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET applied_generation ="
                " EXCLUDED.applied_generation, seen_at = EXCLUDED.seen_at",
                (self.name, generation, now_us()),
            )
        return generation

    def run(self, stop: threading.Event) -> None:
        """Sync on every notification and at least every SYNC_SECS, until `stop` is set."""
        while not stop.is_set():
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECS
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not stop.is_set():
                        self.sync_once()
                        for _ in conn.notifies(timeout=SYNC_SECS, stop_after=1):
                            pass
            except (psycopg.Error, ProxyError, OSError) as exc:
                log.warning("proxy sync: %s", str(exc).strip().splitlines()[-1:] or exc)
                stop.wait(0.5)

    def close(self) -> None:
        """Close the control plane's connections."""
        self.control.close()


def wait_for_runtime(runtime: Runtime, timeout: float) -> None:
    """Wait until HAProxy answers on its runtime API."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            runtime.command("show info")
            return
        except ProxyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
