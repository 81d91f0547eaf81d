"""A real PostgreSQL for the control-plane tests: one private cluster per test session.

Debian's `postgresql` package is installed by scripts/install-debian-packages when absent (as
root); where it cannot be, the tests that need PostgreSQL are skipped with the reason. Each
test gets its own schema (through the URL's search_path), so tests share one server and
nothing else.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from memspine_admin.pgserver import PostgresMissing, PrivatePostgres

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install-debian-packages"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def schema_url(base: str, schema: str) -> str:
    """`base` with every session's search_path set to `schema`."""
    return f"{base}?options={quote(f'-csearch_path={schema}', safe='')}"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL on a free loopback port, stopped and removed after the session."""
    installed = subprocess.run([str(INSTALL), "postgresql"], capture_output=True, text=True)
    if installed.returncode != 0:
        pytest.skip(f"no PostgreSQL for the control-plane tests: {installed.stderr.strip()}")
    root = Path(tempfile.mkdtemp(prefix="memspine-pg-"))  # /tmp: the postgres user can reach it
    try:
        pg = PrivatePostgres(root)
        pg.start(_free_port(), durable=False)
    except PostgresMissing as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no PostgreSQL for the control-plane tests: {exc}")
    yield pg
    pg.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def control_url(pg_server: PrivatePostgres) -> Iterator[str]:
    """A MEMSPINE_CONTROL_URL of an empty schema of its own."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield schema_url(pg_server.url(), schema)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["lmdb", "postgresql"])
def url(request: pytest.FixtureRequest) -> str | None:
    """The control plane a test runs on, each in turn: None for the LMDB control database (in
    the test's data directory), else the URL of a PostgreSQL schema of its own."""
    if request.param == "lmdb":
        return None
    return str(request.getfixturevalue("control_url"))
