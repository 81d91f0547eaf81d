"""The control plane in PostgreSQL (`MEMSPINE_CONTROL_URL=postgresql://…`), shared by nodes.

The same records and answers as the LMDB ControlDB (memspine_admin/control.py). Every change
locks the one `control_meta` row first, so changes are serialised as LMDB's writers are, the
audit seqs have no gaps, and the generation moves by one per change; the change's transaction
ends with NOTIFY on `memspine_control`. A server keeps the generation current from a thread
that LISTENs on that channel and reads the counter again at least every POLL_SECS, so a
revocation through any node is seen by every node within milliseconds, and within POLL_SECS
if a notification were lost. A generation not confirmed for STALE_SECS (the listening
connection is down) is read from the database on each call instead: a node that cannot reach
the control plane refuses keys (503) rather than trust a stale generation.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import msgspec
import psycopg
from argon2 import PasswordHasher
from psycopg.types.json import Json
from psycopg_pool import ConnectionPool, PoolTimeout

from memspine_admin import keys
from memspine_admin.breaker import Breaker
from memspine_admin.control import (
    NO_CONTROL_DB,
    check_audit_page,
    check_limits,
    held_tenant,
)
from memspine_admin.controlurl import redact
from memspine_admin.issuing import KeyRequest
from memspine_admin.placement import (
    HOLD_LEASE_SECS,
    NodeFigures,
    NodeLoad,
    Placement,
    holding,
    is_node_name,
    least_loaded,
)
from memspine_admin.records import (
    DEFAULT_SCOPES,
    AuditEntry,
    HoldRecord,
    IssuedKey,
    KeyInfo,
    KeyRecord,
    ReadMark,
    TenantRecord,
    check_name,
    check_tenant_id,
    now_us,
)
from memspine_admin.retention import (
    hold_audit,
    is_hold_id,
    merge_retention,
    new_hold,
    retention_audit,
)
from storage.errors import Conflict, InvalidRequest, NotFound, Unavailable
from storage.tenants.directory import is_tenant_id

log = logging.getLogger("memspine.control")

CHANNEL = "memspine_control"
POLL_SECS = 0.25  # the generation is read again at least this often, notification or not
STALE_SECS = 0.5  # past this without a confirmation, generation() asks the database itself
POOL_MAX = 8
POOL_TIMEOUT_SECS = 5.0
CONNECT_TIMEOUT_SECS = 5
HEARTBEAT_SECS = 5.0  # how often a node refreshes its nodes.seen_at
REPORT_SECS = 5.0  # how often a node reports its figures (memspine_admin/placement.py's load)
# A tenant's creation waits, at most this long, until every proxy seen within PROXY_LIVE_SECS
# has applied its route (memspine_admin/proxysync.py), so its first key is routed to its node.
PROXY_WAIT_SECS = 3.0
PROXY_LIVE_SECS = 10.0
MAX_BIGINT = 2**63 - 1
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql\Z")

_TENANT_COLUMNS = "tenant_id, name, created_at, node, max_events, max_bytes, max_memory, retention"
_HOLD_COLUMNS = "hold_id, tenant_id, reason, subject, placed_at, placed_by"
_PLACEMENT_COLUMNS = "node, move_to, move_from, writes_held"
_KEY_COLUMNS = (
    "key_id, tenant_id, name, scopes, created_at, expires_at, revoked_at, secret_hash,"
    " requests_per_minute, require_purpose"
)


class ControlUnavailable(Unavailable):
    """The PostgreSQL control plane cannot be reached (503 with Retry-After)."""

    def __init__(self, detail: str = "the control plane cannot be reached; retry shortly") -> None:
        super().__init__(detail, headers={"Retry-After": "1"})


def migrations() -> list[tuple[int, str, str]]:
    """The package's migrations (memspine_admin/migrations/NNNN_name.sql) in order."""
    found = []
    for entry in importlib.resources.files("memspine_admin.migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1, 2, 3 … without gaps: {versions}")
    return found


def migrate(conn: psycopg.Connection[Any], *, clock: Callable[[], int] = now_us) -> list[int]:
    """Apply the migrations `conn`'s schema lacks, in order, in the caller's transaction;
    return the versions applied now. Concurrent callers wait on an advisory lock."""
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('memspine:' || current_schema(), 0))"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS memspine_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL, applied_at bigint NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT version FROM memspine_migrations")}
    known = migrations()
    if done and max(done) > len(known):
        raise Conflict("the control database has an unknown schema version")
    applied = []
    for version, name, sql in known:
        if version in done:
            continue
        conn.execute(sql.encode())  # no parameters: several statements in one go
        conn.execute(
            "INSERT INTO memspine_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
            (version, name, clock()),
        )
        applied.append(version)
    return applied


def _connect(url: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            url, connect_timeout=CONNECT_TIMEOUT_SECS, application_name="memspine"
        )
    except psycopg.OperationalError as exc:
        raise ControlUnavailable(
            f"cannot reach the control plane at {redact(url)}: {_first_line(exc)}"
        ) from None
    except psycopg.ProgrammingError as exc:  # a URL libpq cannot parse
        raise InvalidRequest(f"MEMSPINE_CONTROL_URL is not a valid PostgreSQL URL: {exc}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1].strip() if text else type(exc).__name__


def _tenant(row: tuple[Any, ...]) -> TenantRecord:
    return TenantRecord(
        tenant_id=row[0],
        name=row[1],
        created_at=row[2],
        node=row[3],
        max_events=row[4],
        max_bytes=row[5],
        max_memory=row[6],
        retention=row[7],
    )


def _hold(row: tuple[Any, ...]) -> HoldRecord:
    return HoldRecord(
        hold_id=row[0],
        tenant_id=row[1],
        reason=row[2],
        subject=row[3],
        placed_at=row[4],
        placed_by=row[5],
    )


def _placement(row: tuple[Any, ...], conn: psycopg.Connection[Any], tenant_id: str) -> Placement:
    placement = Placement(node=row[0], move_to=row[1], move_from=row[2], writes_held=row[3])
    if not placement.writes_held:
        return placement
    # The hold's lease runs from its step in the audit (no column of its own).
    held = conn.execute(
        "SELECT ts FROM audit WHERE tenant_id = %s AND action = 'tenant.move'"
        " AND detail->>'step' = 'hold' ORDER BY seq DESC LIMIT 1",
        (tenant_id,),
    ).fetchone()
    return msgspec.structs.replace(placement, held_since=None if held is None else held[0])


def _placed(name: str, node: str | None) -> dict[str, Any]:
    """The audit detail of a tenant's creation: its name, and its node when placed."""
    return {"name": name} if node is None else {"name": name, "node": node}


def _node_loads(conn: psycopg.Connection[Any]) -> list[NodeLoad]:
    """Every registered node with its last figures and the tenants placed on it."""
    rows = conn.execute(
        "SELECT n.name, n.url, n.tenants, n.bytes, n.open_tenants, n.seen_at,"
        " (SELECT count(*) FROM tenants t WHERE t.node = n.name)"
        " FROM nodes n ORDER BY n.name"
    ).fetchall()
    return [
        NodeLoad(
            name=r[0],
            url=r[1],
            tenants=r[2],
            bytes=r[3],
            open_tenants=r[4],
            seen_at=r[5],
            placed=r[6],
        )
        for r in rows
    ]


def _key(row: tuple[Any, ...]) -> KeyRecord:
    return KeyRecord(
        key_id=row[0],
        tenant_id=row[1],
        name=row[2],
        scopes=tuple(row[3]),
        created_at=row[4],
        expires_at=row[5],
        revoked_at=row[6],
        secret_hash=row[7],
        requests_per_minute=row[8],
        require_purpose=bool(row[9]),
    )


class _Change:
    """One change to the control plane: holds the meta row's lock, counts what it writes."""

    def __init__(self, conn: psycopg.Connection[Any], now: Callable[[], int]) -> None:
        row = conn.execute("SELECT generation, audit_seq FROM control_meta FOR UPDATE").fetchone()
        if row is None:
            raise Conflict(NO_CONTROL_DB)
        self.conn = conn
        self.now = now
        self.generation, self.seq = int(row[0]), int(row[1])
        self.start = self.generation

    def bump(self) -> None:
        """Tenants or keys changed: move the generation (once per change)."""
        self.generation = self.start + 1

    def log(
        self,
        actor: str,
        action: str,
        tenant_id: str | None,
        key_id: str | None,
        detail: dict[str, Any],
    ) -> None:
        """Append an audit entry with the next seq."""
        self.seq += 1
        self.conn.execute(
            "INSERT INTO audit (seq, ts, actor, action, tenant_id, key_id, detail)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (self.seq, self.now(), actor, action, tenant_id, key_id, Json(detail)),
        )

    def finish(self) -> None:
        """Write the counters back; NOTIFY (sent at commit) if the generation moved."""
        self.conn.execute(
            "UPDATE control_meta SET generation = %s, audit_seq = %s", (self.generation, self.seq)
        )
        if self.generation != self.start:
            self.conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(self.generation)))


class GenerationWatcher:
    """A thread that keeps the generation current: LISTEN, and a read every POLL_SECS."""

    def __init__(self, url: str, node: str | None = None, *, poll_secs: float = POLL_SECS) -> None:
        """Starts at once; `node` gets its nodes.seen_at refreshed every HEARTBEAT_SECS."""
        self.url = url
        self.node = node
        self.poll_secs = poll_secs
        self.breaker: Breaker | None = None  # PgControl's: opened when the watch is lost
        self._seen: tuple[int, float] | None = None  # (generation, monotonic time confirmed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-watch", daemon=True)
        self._thread.start()

    def current(self) -> int | None:
        """The generation if it was confirmed within STALE_SECS, else None."""
        seen = self._seen
        if seen is None or time.monotonic() - seen[1] > STALE_SECS:
            return None
        return seen[0]

    def wait_confirmed(self, timeout: float) -> bool:
        """Wait until a first generation is known; True if it is."""
        deadline = time.monotonic() + timeout
        while self.current() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.current() is not None

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT_SECS,
                    application_name="memspine-watch",
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")  # before the read: no change falls between
                    beat = 0.0
                    while not self._stop.is_set():
                        row = conn.execute("SELECT generation FROM control_meta").fetchone()
                        self._seen = (int(row[0]) if row else 0, time.monotonic())
                        failures = 0
                        if self.breaker is not None:
                            self.breaker.succeeded()
                        if self.node is not None and time.monotonic() - beat > HEARTBEAT_SECS:
                            conn.execute(
                                "UPDATE nodes SET seen_at = %s WHERE name = %s",
                                (now_us(), self.node),
                            )
                            beat = time.monotonic()
                        for _ in conn.notifies(timeout=self.poll_secs, stop_after=1):
                            pass
            except psycopg.Error as exc:
                failures += 1
                if self.breaker is not None:  # requests need not each find it out
                    self.breaker.failed()
                if failures == 1:
                    log.warning("control plane watch lost: %s", _first_line(exc))
                self._stop.wait(min(2.0, 0.1 * failures))

    def stop(self) -> None:
        """Stop the thread (it ends within POLL_SECS)."""
        self._stop.set()
        self._thread.join(timeout=self.poll_secs + CONNECT_TIMEOUT_SECS)


class NodeReporter:
    """A thread that writes the node's own figures (its tenants, their bytes on disk, tenants
    open) into `nodes` every REPORT_SECS, for the least-loaded placement; apart from the
    watcher so that a slow scan of a large data directory never delays the generation."""

    def __init__(
        self, url: str, node: str, figures: Callable[[], NodeFigures], *, every: float = REPORT_SECS
    ) -> None:
        """Reports once at once, then every `every` seconds until stopped."""
        self.url = url
        self.node = node
        self.figures = figures
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-report", daemon=True)
        self._thread.start()

    def report(self) -> None:
        """Measure and write the figures once."""
        figures = self.figures()
        with psycopg.connect(
            self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECS
        ) as conn:
            conn.execute(
                "UPDATE nodes SET tenants = %s, bytes = %s, open_tenants = %s, reported_at = %s"
                " WHERE name = %s",
                (figures.tenants, figures.bytes, figures.open_tenants, now_us(), self.node),
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.report()
            except (psycopg.Error, OSError) as exc:
                log.warning("node report failed: %s", _first_line(exc))
            self._stop.wait(self.every)

    def stop(self) -> None:
        """Stop the thread."""
        self._stop.set()
        self._thread.join(timeout=CONNECT_TIMEOUT_SECS + 1)


class PgControl:
    """Tenants, keys, audit and generation in PostgreSQL; safe across processes and nodes.

    One per process; thread-safe (a connection pool of at most POOL_MAX).
    """

    def __init__(
        self,
        url: str,
        pool: ConnectionPool[Any],
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
        node: str | None = None,
        watcher: GenerationWatcher | None = None,
        reporter: NodeReporter | None = None,
    ) -> None:
        """Wrap an open pool; use PgControl.open instead."""
        self.url = url
        self.hasher = hasher or keys.default_hasher()
        self.now: Callable[[], int] = clock or now_us
        self.node = node
        self._pool = pool
        self._watcher = watcher
        self._reporter = reporter
        self.breaker = Breaker()  # the watcher's lost connection opens it too
        if watcher is not None:
            watcher.breaker = self.breaker

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def init(cls, url: str, *, actor: str) -> bool:
        """Apply the migrations and make the meta row unless present; True if this call made it."""
        with _connect(url) as conn, conn.transaction():
            migrate(conn)
            if conn.execute("SELECT 1 FROM control_meta").fetchone() is not None:
                return False
            conn.execute("INSERT INTO control_meta (generation, audit_seq) VALUES (1, 1)")
            conn.execute(
                "INSERT INTO audit (seq, ts, actor, action, detail) VALUES (1, %s, %s, %s, %s)",
                (now_us(), actor, "control.init", Json({})),
            )
        return True

    @classmethod
    def open(
        cls,
        url: str,
        *,
        actor: str = "system",
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
        node: str | None = None,
        watch: bool = False,
        node_url: str | None = None,
        figures: Callable[[], NodeFigures] | None = None,
    ) -> PgControl:
        """Connect, migrate (and init) if needed, register `node` (reachable at `node_url`,
        reporting `figures` every REPORT_SECS); ControlUnavailable if the database cannot be
        reached."""
        if node is not None and not is_node_name(node):
            raise InvalidRequest("a node name is a lower-case DNS label (a-z, 0-9 and -)")
        cls.init(url, actor=actor)
        if node is not None:
            with _connect(url) as conn:
                t = now_us()
                conn.execute(
                    "INSERT INTO nodes (name, registered_at, seen_at, url) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (name) DO UPDATE SET seen_at = EXCLUDED.seen_at,"
                    " url = coalesce(EXCLUDED.url, nodes.url)",
                    (node, t, t, node_url),
                )
        pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_MAX,
            timeout=POOL_TIMEOUT_SECS,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_SECS, "application_name": "memspine"},
            name="memspine-control",
            open=False,
        )
        try:
            pool.open(wait=True, timeout=POOL_TIMEOUT_SECS + CONNECT_TIMEOUT_SECS)
        except PoolTimeout:
            pool.close()
            raise ControlUnavailable(f"cannot reach the control plane at {redact(url)}") from None
        watcher = GenerationWatcher(url, node) if watch else None
        reporter = NodeReporter(url, node, figures) if node and figures else None
        db = cls(
            url, pool, hasher=hasher, clock=clock, node=node, watcher=watcher, reporter=reporter
        )
        if watcher is not None and not watcher.wait_confirmed(POOL_TIMEOUT_SECS):
            db.close()
            raise ControlUnavailable(f"cannot listen on the control plane at {redact(url)}")
        return db

    def close(self) -> None:
        """Stop the watcher and the reporter, and close the pool."""
        if self._watcher is not None:
            self._watcher.stop()
        if self._reporter is not None:
            self._reporter.stop()
        self._pool.close()

    def __enter__(self) -> PgControl:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def where(self) -> str:
        """The database's URL, without its password."""
        return redact(self.url)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction (committed on exit, rolled back on an error);
        a database that cannot be reached is ControlUnavailable, never a 500."""
        wait = self.breaker.admit()
        if wait is None:  # found unreachable a moment ago: 503 now, not after the pool's wait
            raise ControlUnavailable()
        try:
            with self._pool.connection(timeout=wait or None) as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            self.breaker.failed()
            log.warning("control plane unavailable: %s", _first_line(exc))
            raise ControlUnavailable() from None
        self.breaker.succeeded()

    # -- generation --------------------------------------------------------------------------

    def generation(self) -> int:
        """The counter bumped by every change to tenants or keys: the watcher's if it is
        current (no I/O), else one query."""
        if self._watcher is not None:
            current = self._watcher.current()
            if current is not None:
                return current
        with self._conn() as conn:
            row = conn.execute("SELECT generation FROM control_meta").fetchone()
        return int(row[0]) if row is not None else 0

    def database_generation(self) -> int:
        """The generation as the database has it now (one query; no watcher's lag)."""
        with self._conn() as conn:
            row = conn.execute("SELECT generation FROM control_meta").fetchone()
        return int(row[0]) if row is not None else 0

    # -- read chain marks (docs/audit.md) ----------------------------------------------------

    def keep_read_mark(self, tenant_id: str, mark: ReadMark, *, cut: bool = False) -> None:
        """Record the head (or, with cut, the retention base) of a tenant's read chain."""
        seq, value = ("cut_seq", "cut_hash") if cut else ("head_seq", "head_hash")
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO read_marks (tenant_id, {seq}, {value}) VALUES (%s, %s, %s)"
                f" ON CONFLICT (tenant_id) DO UPDATE SET {seq} = EXCLUDED.{seq},"
                f" {value} = EXCLUDED.{value}",
                (tenant_id, mark.seq, mark.hash),
            )

    def read_marks(self, tenant_id: str) -> tuple[ReadMark | None, ReadMark | None]:
        """The last head and the last cut recorded for a tenant's read chain (None: none)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT head_seq, head_hash, cut_seq, cut_hash FROM read_marks"
                " WHERE tenant_id = %s",
                (tenant_id,),
            ).fetchone()
        if row is None:
            return None, None
        head = None if row[0] is None else ReadMark(seq=row[0], hash=bytes(row[1]))
        cut = None if row[2] is None else ReadMark(seq=row[2], hash=bytes(row[3]))
        return head, cut

    # -- tenants -----------------------------------------------------------------------------

    def create_tenant(
        self, name: str, *, actor: str, tenant_id: str | None = None, node: str | None = None
    ) -> TenantRecord:
        """Create a tenant (with the id given, or a new one) on `node`, or on the least-loaded
        registered node if any (memspine_admin/placement.py); Conflict (409) if a live tenant
        already has that name or that id, NotFound if `node` is not a registered node."""
        name = check_name(name, "name")
        chosen = check_tenant_id(tenant_id) if tenant_id is not None else None
        if node is not None and not is_node_name(node):
            raise InvalidRequest("a node name is a lower-case DNS label (a-z, 0-9 and -)")
        with self._conn() as conn:
            change = _Change(conn, self.now)
            existing = conn.execute(
                "SELECT tenant_id FROM tenants WHERE name = %s", (name,)
            ).fetchone()
            if existing is not None:
                raise Conflict(f"a tenant named {name!r} already exists: {existing[0]}")
            if (
                chosen is not None
                and conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (chosen,)).fetchone()
            ):
                raise Conflict(f"a tenant with id {chosen} already exists")
            tenant_id = chosen or str(uuid.uuid4())
            route = keys.new_route()
            while conn.execute("SELECT 1 FROM tenants WHERE route = %s", (route,)).fetchone():
                route = keys.new_route()
            loads = _node_loads(conn)
            if node is not None and node not in {n.name for n in loads}:
                raise NotFound(f"no node named {node!r} is registered")
            tenant = TenantRecord(
                tenant_id=tenant_id,
                name=name,
                created_at=self.now(),
                node=node or least_loaded(loads, now_us()),
            )
            conn.execute(
                "INSERT INTO tenants (tenant_id, name, created_at, route, node)"
                " VALUES (%s, %s, %s, %s, %s)",
                (tenant.tenant_id, tenant.name, tenant.created_at, route, tenant.node),
            )
            change.bump()
            change.log(actor, "tenant.create", tenant_id, None, _placed(name, tenant.node))
            change.finish()
        if tenant.node is not None:
            self._await_proxies(change.generation)
        return tenant

    def _await_proxies(self, generation: int) -> None:
        """Wait (at most PROXY_WAIT_SECS) until every live proxy has applied `generation`."""
        deadline = time.monotonic() + PROXY_WAIT_SECS
        while True:
            with self._conn() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM proxies WHERE seen_at >= %s AND applied_generation < %s",
                    (now_us() - int(PROXY_LIVE_SECS * 1e6), generation),
                ).fetchone()
            if row is None or row[0] == 0:
                return
            if time.monotonic() >= deadline:
                log.warning("%d proxy map(s) have not applied generation %d", row[0], generation)
                return
            time.sleep(0.01)

    def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        """The tenant with that id, or None."""
        if not is_tenant_id(tenant_id):
            return None
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
        return None if row is None else _tenant(row)

    def tenant_route(self, tenant_id: str) -> str | None:
        """The tenant's route (the start of its key ids), None if unknown."""
        if not is_tenant_id(tenant_id):
            return None
        with self._conn() as conn:
            row = conn.execute(
                "SELECT route FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    def list_tenants(self) -> list[TenantRecord]:
        """Every tenant, oldest first."""
        with self._conn() as conn:
            rows = conn.execute(
                f'SELECT {_TENANT_COLUMNS} FROM tenants ORDER BY created_at, tenant_id COLLATE "C"'
            ).fetchall()
        return [_tenant(r) for r in rows]

    def delete_tenant(self, tenant_id: str, *, actor: str) -> list[str]:
        """Delete a tenant and revoke its keys in one transaction; return the revoked key ids.

        The caller then erases the directory with `erase_tenant_dir` on the node that holds it.
        """
        if not is_tenant_id(tenant_id):
            raise NotFound("no tenant with that id")
        now = self.now()
        with self._conn() as conn:
            change = _Change(conn, self.now)
            hold = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE tenant_id = %s"
                " ORDER BY placed_at, hold_id LIMIT 1",
                (tenant_id,),
            ).fetchone()
            if hold is not None:
                raise held_tenant(_hold(hold))
            row = conn.execute(
                "DELETE FROM tenants WHERE tenant_id = %s RETURNING name", (tenant_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no tenant with that id")
            revoked = sorted(
                r[0]
                for r in conn.execute(
                    "UPDATE keys SET revoked_at = %s"
                    " WHERE tenant_id = %s AND revoked_at IS NULL RETURNING key_id",
                    (now, tenant_id),
                )
            )
            conn.execute("DELETE FROM read_marks WHERE tenant_id = %s", (tenant_id,))
            change.bump()
            detail = {"name": row[0], "revoked_keys": revoked}
            change.log(actor, "tenant.delete", tenant_id, None, detail)
            change.finish()
        return revoked

    def set_tenant_limits(
        self, tenant_id: str, limits: dict[str, int | None], *, actor: str
    ) -> TenantRecord:
        """Set or remove (None) a tenant's own limits (records.LIMITS); the others stay."""
        changes = check_limits(limits)
        if not is_tenant_id(tenant_id):
            raise NotFound("no tenant with that id")
        # The names are LIMITS' (check_limits refused any other): safe to spell into SQL.
        assignments = ", ".join(f"{name} = %s" for name in changes)
        with self._conn() as conn:
            change = _Change(conn, self.now)
            row = conn.execute(
                f"UPDATE tenants SET {assignments} WHERE tenant_id = %s"
                f" RETURNING {_TENANT_COLUMNS}",
                (*changes.values(), tenant_id),
            ).fetchone()
            if row is None:
                raise NotFound("no tenant with that id")
            change.bump()
            change.log(actor, "tenant.limits", tenant_id, None, dict(changes))
            change.finish()
        return _tenant(row)

    # -- retention and legal holds ------------------------------------------------------------

    def set_retention(
        self, tenant_id: str, changes: Mapping[str, object] | None, *, actor: str
    ) -> TenantRecord:
        """Set (days) or remove (None) a tenant's retention windows by kind; the others stay."""
        if not is_tenant_id(tenant_id):
            raise NotFound("no tenant with that id")
        with self._conn() as conn:
            change = _Change(conn, self.now)  # serialises changes, as LMDB's one writer does
            row = conn.execute(
                "SELECT retention FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no tenant with that id")
            merged = merge_retention(row[0], changes)
            row = conn.execute(
                f"UPDATE tenants SET retention = %s WHERE tenant_id = %s"
                f" RETURNING {_TENANT_COLUMNS}",
                (None if merged is None else Json(merged), tenant_id),
            ).fetchone()
            assert row is not None  # the tenant row is locked by the SELECT above's transaction
            change.log(actor, "tenant.retention", tenant_id, None, retention_audit(changes))
            change.finish()
        return _tenant(row)

    def place_hold(
        self, tenant_id: str, reason: str, subject: str | None = None, *, actor: str
    ) -> HoldRecord:
        """Place a legal hold on a tenant, or on one subject's events of it."""
        hold = new_hold(tenant_id, reason, subject, actor=actor, now=self.now())
        if not is_tenant_id(tenant_id):
            raise NotFound("no tenant with that id")
        with self._conn() as conn:
            change = _Change(conn, self.now)
            found = conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (tenant_id,))
            if found.fetchone() is None:
                raise NotFound("no tenant with that id")
            conn.execute(
                f"INSERT INTO holds ({_HOLD_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)",
                (*msgspec.structs.astuple(hold),),
            )
            change.log(actor, "hold.place", tenant_id, None, hold_audit(hold))
            change.finish()
        return hold

    def list_holds(self, tenant_id: str) -> list[HoldRecord]:
        """The tenant's holds, oldest first (none for an unknown tenant)."""
        if not is_tenant_id(tenant_id):
            return []
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE tenant_id = %s"
                ' ORDER BY placed_at, hold_id COLLATE "C"',
                (tenant_id,),
            ).fetchall()
        return [_hold(r) for r in rows]

    def lift_hold(self, tenant_id: str, hold_id: str, *, actor: str) -> HoldRecord:
        """Lift a hold: what it kept may be deleted again. NotFound for an unknown hold."""
        if not (is_tenant_id(tenant_id) and is_hold_id(hold_id)):
            raise NotFound("no hold with that id on this tenant")
        with self._conn() as conn:
            change = _Change(conn, self.now)
            row = conn.execute(
                f"DELETE FROM holds WHERE tenant_id = %s AND hold_id = %s"
                f" RETURNING {_HOLD_COLUMNS}",
                (tenant_id, hold_id),
            ).fetchone()
            if row is None:
                raise NotFound("no hold with that id on this tenant")
            hold = _hold(row)
            change.log(actor, "hold.lift", tenant_id, None, hold_audit(hold))
            change.finish()
        return hold

    # -- keys --------------------------------------------------------------------------------

    def create_key(
        self,
        tenant_id: str,
        name: str,
        scopes: Iterable[str] = DEFAULT_SCOPES,
        ttl_secs: int | None = None,
        *,
        actor: str,
        requests_per_minute: int | None = None,
        require_purpose: bool = False,
    ) -> IssuedKey:
        """Issue a key for a tenant; its id starts with the tenant's route."""
        request = KeyRequest.check(name, scopes, ttl_secs, requests_per_minute, require_purpose)
        route = self.tenant_route(tenant_id)
        if route is None:
            raise NotFound("no tenant with that id")  # before paying for argon2
        draft = request.draft(tenant_id, route, self.hasher, self.now())
        with self._conn() as conn:
            change = _Change(conn, self.now)
            row = conn.execute(
                "SELECT route FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no tenant with that id")
            if row[0] != route:
                raise Conflict("the tenant changed while its key was made; try again")
            while conn.execute("SELECT 1 FROM keys WHERE key_id = %s", (draft.key_id,)).fetchone():
                draft = draft.with_new_key_id()
            record = draft.record()
            conn.execute(
                f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, %s, %s)",
                (
                    record.key_id,
                    record.tenant_id,
                    record.name,
                    list(record.scopes),
                    record.created_at,
                    record.expires_at,
                    record.secret_hash,
                    record.requests_per_minute,
                    record.require_purpose,
                ),
            )
            change.bump()
            change.log(actor, "key.create", tenant_id, draft.key_id, draft.audit_detail())
            change.finish()
        return draft.issued()

    def get_key(self, key_id: str) -> KeyInfo | None:
        """The key with that id (no hash), or None."""
        record = self.get_key_record(key_id)
        return None if record is None else record.info()

    def get_key_record(self, key_id: str) -> KeyRecord | None:
        """The stored record, hash included: for the verifier only, never for display."""
        if not keys.is_key_id(key_id):
            return None
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM keys WHERE key_id = %s", (key_id,)
            ).fetchone()
        return None if row is None else _key(row)

    def list_keys(self, tenant_id: str | None = None) -> list[KeyInfo]:
        """Every key, or one tenant's (NotFound if the tenant is unknown), oldest first."""
        order = 'ORDER BY created_at, key_id COLLATE "C"'
        with self._conn() as conn:
            if tenant_id is None:
                rows = conn.execute(f"SELECT {_KEY_COLUMNS} FROM keys {order}").fetchall()
            else:
                if (
                    not is_tenant_id(tenant_id)
                    or not conn.execute(
                        "SELECT 1 FROM tenants WHERE tenant_id = %s", (tenant_id,)
                    ).fetchone()
                ):
                    raise NotFound("no tenant with that id")
                rows = conn.execute(
                    f"SELECT {_KEY_COLUMNS} FROM keys WHERE tenant_id = %s {order}", (tenant_id,)
                ).fetchall()
        return [_key(r).info() for r in rows]

    def revoke_key(self, key_id: str, *, actor: str) -> KeyInfo:
        """Revoke a key (every node refuses it within POLL_SECS); revoking twice changes nothing."""
        if not keys.is_key_id(key_id):
            raise NotFound("no key with that id")
        with self._conn() as conn:
            change = _Change(conn, self.now)
            row = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM keys WHERE key_id = %s", (key_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no key with that id")
            record = _key(row)
            if record.revoked_at is not None:
                return record.info()
            record = msgspec.structs.replace(record, revoked_at=self.now())
            conn.execute(
                "UPDATE keys SET revoked_at = %s WHERE key_id = %s", (record.revoked_at, key_id)
            )
            change.bump()
            change.log(actor, "key.revoke", record.tenant_id, key_id, {"name": record.name})
            change.finish()
        return record.info()

    def update_hash(self, key_id: str, old_hash: str, new_hash: str) -> bool:
        """Replace a key's hash if it is still `old_hash` (rehash after verify); True if done."""
        with self._conn() as conn:
            done = conn.execute(
                "UPDATE keys SET secret_hash = %s"
                " WHERE key_id = %s AND secret_hash = %s AND revoked_at IS NULL",
                (new_hash, key_id, old_hash),
            ).rowcount
        return done == 1

    # -- audit -------------------------------------------------------------------------------

    def audit(
        self, after: int | None = None, limit: int = 100, *, tenant_id: str | None = None
    ) -> tuple[list[AuditEntry], int | None]:
        """Audit entries with seq > `after`, oldest first; the cursor is the last seq or None."""
        check_audit_page(after, limit)
        start = min(after or 0, MAX_BIGINT)
        query = "SELECT seq, ts, actor, action, tenant_id, key_id, detail FROM audit WHERE seq > %s"
        params: list[Any] = [start]
        if tenant_id is not None:
            query += " AND tenant_id = %s"
            params.append(tenant_id)
        query += " ORDER BY seq LIMIT %s"
        params.append(limit + 1)
        with self._conn() as conn:
            rows = conn.execute(query, params).fetchall()
        entries = [
            AuditEntry(
                seq=r[0], ts=r[1], actor=r[2], action=r[3], tenant_id=r[4], key_id=r[5], detail=r[6]
            )
            for r in rows[:limit]
        ]
        more = len(rows) > limit
        return entries, (entries[-1].seq if more else None)

    # -- the cluster -------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """Registered node names, sorted."""
        with self._conn() as conn:
            return sorted(r[0] for r in conn.execute("SELECT name FROM nodes"))

    def node_loads(self) -> list[NodeLoad]:
        """Every registered node, its URL, its last reported figures and its placed tenants."""
        with self._conn() as conn:
            return _node_loads(conn)

    def placement(self, tenant_id: str) -> Placement | None:
        """Where the tenant is and the state of its move; None for an unknown tenant."""
        if not is_tenant_id(tenant_id):
            return None
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_PLACEMENT_COLUMNS} FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
            return None if row is None else _placement(row, conn, tenant_id)

    def moved_away(self, node: str, tenant_ids: list[str]) -> dict[str, Placement]:
        """Of `tenant_ids` (copies on `node`'s disk), those a move took away from `node` or gave
        up on its way to `node`, now placed elsewhere and not moving to it, with their
        placement: what a killed move left on its source, or an abandoned one on its target
        (memspine/leftovers.py). The audit names both (the switch step its source, the abort
        step its target), so a node renamed or a tenant placed by hand is never taken for one."""
        ids = [t for t in tenant_ids if is_tenant_id(t)]
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT tenant_id, {_PLACEMENT_COLUMNS} FROM tenants t"
                " WHERE t.tenant_id = ANY(%s) AND t.node IS NOT NULL AND t.node <> %s"
                " AND (t.move_to IS NULL OR t.move_to <> %s) AND EXISTS ("
                "  SELECT 1 FROM audit a WHERE a.tenant_id = t.tenant_id"
                "  AND a.action = 'tenant.move' AND ("
                "   (a.detail->>'step' = 'switch' AND a.detail->>'from' = %s)"
                "   OR (a.detail->>'step' = 'abort' AND a.detail->>'to' = %s)))",
                (ids, node, node, node, node),
            ).fetchall()
            return {row[0]: _placement(row[1:], conn, row[0]) for row in rows}

    # -- moving a tenant (memspine_admin/move.py drives these steps in order) ----------------

    def begin_move(self, tenant_id: str, to: str, *, actor: str) -> Placement:
        """Start moving a tenant to node `to`: it stays on its node, which keeps serving it,
        while its data is copied. Asking again for the same node resumes (writes released)."""
        if not is_node_name(to):
            raise InvalidRequest("a node name is a lower-case DNS label (a-z, 0-9 and -)")

        def step(conn: psycopg.Connection[Any], p: Placement) -> Placement:
            if p.node is None:
                raise Conflict("the tenant is not placed on a node; there is nothing to move")
            if p.move_from is not None:
                raise Conflict(
                    f"the tenant has switched to {p.node} and its move is finishing; "
                    "run the move again to finish it"
                )
            if p.move_to is not None and p.move_to != to:
                raise Conflict(f"the tenant is being moved to {p.move_to}; abort that move first")
            if p.node == to:
                raise Conflict(f"the tenant is on {to} already")
            if not conn.execute("SELECT 1 FROM nodes WHERE name = %s", (to,)).fetchone():
                raise NotFound(f"no node named {to!r} is registered")
            return Placement(node=p.node, move_to=to)

        return self._move_step(tenant_id, "begin", step, actor=actor)

    def hold_writes(self, tenant_id: str, *, actor: str) -> Placement:
        """Refuse the tenant's writes (503 with Retry-After) on every node: the copy's tail."""

        def step(_conn: psycopg.Connection[Any], p: Placement) -> Placement:
            if p.move_to is None:
                raise Conflict("the tenant is not being moved")
            return msgspec.structs.replace(p, writes_held=True)

        return self._move_step(tenant_id, "hold", step, actor=actor)

    def switch_move(self, tenant_id: str, *, actor: str) -> Placement:
        """Place the tenant on its new node; the old one still serves reads (writes held)."""

        def step(_conn: psycopg.Connection[Any], p: Placement) -> Placement:
            if p.move_to is None or not p.writes_held:
                raise Conflict("the tenant's writes are not held for a move")
            # The nodes' clock, as they judge the lease: writes went on at the source.
            if not holding(p, now_us()):
                raise Conflict(
                    f"the hold on the tenant's writes ran past its {HOLD_LEASE_SECS:.0f} s lease "
                    "and writes resumed; run the move again"
                )
            return Placement(node=p.move_to, move_from=p.node, writes_held=True)

        return self._move_step(tenant_id, "switch", step, actor=actor)

    def finish_move(self, tenant_id: str, *, actor: str) -> Placement:
        """End a switched move: writes resume on the new node, the old one serves no more."""

        def step(_conn: psycopg.Connection[Any], p: Placement) -> Placement:
            if p.move_from is None:
                raise Conflict("the tenant has not switched to a new node")
            return Placement(node=p.node)

        return self._move_step(tenant_id, "finish", step, actor=actor)

    def abort_move(self, tenant_id: str, *, actor: str) -> Placement:
        """Give up a move before its switch: the tenant stays where it is, writes resume."""

        def step(_conn: psycopg.Connection[Any], p: Placement) -> Placement:
            if p.move_from is not None:
                raise Conflict("the tenant has switched already; finish the move instead")
            if p.move_to is None:
                raise Conflict("the tenant is not being moved")
            return Placement(node=p.node)

        return self._move_step(tenant_id, "abort", step, actor=actor)

    def _move_step(
        self,
        tenant_id: str,
        name: str,
        step: Callable[[psycopg.Connection[Any], Placement], Placement],
        *,
        actor: str,
    ) -> Placement:
        """Apply one step of a move in one change (generation, audit, NOTIFY)."""
        if not is_tenant_id(tenant_id):
            raise NotFound("no tenant with that id")
        with self._conn() as conn:
            change = _Change(conn, self.now)
            row = conn.execute(
                f"SELECT {_PLACEMENT_COLUMNS} FROM tenants WHERE tenant_id = %s", (tenant_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no tenant with that id")
            before = _placement(row, conn, tenant_id)
            after = step(conn, before)
            conn.execute(
                "UPDATE tenants SET node = %s, move_to = %s, move_from = %s, writes_held = %s"
                " WHERE tenant_id = %s",
                (after.node, after.move_to, after.move_from, after.writes_held, tenant_id),
            )
            change.bump()
            detail = {"step": name, "node": after.node, "from": before.node}
            if after.move_to or before.move_to:
                detail["to"] = after.move_to or before.move_to
            change.log(actor, "tenant.move", tenant_id, None, detail)
            change.finish()
        return after

    def await_proxies(self) -> None:
        """Wait (at most PROXY_WAIT_SECS) until every live proxy has applied the current
        generation (a switched tenant is routed to its new node)."""
        self._await_proxies(self.database_generation())

    def routes(self) -> dict[str, str]:
        """What a proxy routes: each placed tenant's route and id, to its node."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT route, tenant_id, node FROM tenants WHERE node IS NOT NULL"
            ).fetchall()
        table: dict[str, str] = {}
        for route, tenant_id, node in rows:
            table[route] = node
            table[tenant_id] = node  # /v1/admin/tenants/{id} goes to the node that holds it
        return table
