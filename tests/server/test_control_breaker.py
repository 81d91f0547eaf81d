"""The control plane's circuit breaker (memspine_admin/breaker.py) on a real PostgreSQL: once
the database cannot be reached, calls are refused at once (503) instead of each waiting for the
pool's timeout, one call at a time tries again, and the first answer closes it. Counted: how
many calls were refused without reaching the pool."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from memspine_admin.control_pg import ControlUnavailable, PgControl
from memspine_admin.pgserver import PrivatePostgres


@pytest.fixture
def database(pg_server: PrivatePostgres) -> Iterator[tuple[PrivatePostgres, str]]:
    """A database of its own (connections to it can be cut off), and its name."""
    import psycopg

    name = f"breaker_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server, name
    allow(pg_server, name, True)
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def allow(pg: PrivatePostgres, name: str, allowed: bool) -> None:
    """Let clients connect to the database again, or cut every one off."""
    import psycopg

    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(allowed).lower()}")
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


@pytest.mark.parametrize("watch", [False, True])
def test_calls_are_refused_at_once_while_the_database_is_down(
    database: tuple[PrivatePostgres, str], watch: bool
) -> None:
    pg, name = database
    control = PgControl.open(pg.url(name), actor="test", watch=watch)
    try:
        assert control.get_tenant(str(uuid.uuid4())) is None
        allow(pg, name, False)
        outcomes = []
        for _ in range(20):
            try:
                control.get_tenant(str(uuid.uuid4()))
                outcomes.append("answered")
            except ControlUnavailable:
                outcomes.append("refused")
        # Every call refused, and most of them without waiting for the pool: only the first
        # and the probes (one per OPEN_SECS) reached it.
        assert outcomes == ["refused"] * 20
        assert control.breaker.refused >= 10
        allow(pg, name, True)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert control.get_tenant(str(uuid.uuid4())) is None
                break
            except ControlUnavailable:
                assert time.monotonic() < deadline, "the control plane did not come back"
                time.sleep(0.05)
        refused = control.breaker.refused
        assert control.get_tenant(str(uuid.uuid4())) is None  # closed: no more refusals
        assert control.breaker.refused == refused
    finally:
        allow(pg, name, True)
        control.close()
