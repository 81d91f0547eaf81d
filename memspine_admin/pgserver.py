"""A private PostgreSQL cluster in one directory, on a loopback port (tests, deploy/local-cluster).

Debian's `postgresql` package provides initdb and pg_ctl; no system service is touched. The
server refuses to run as root, so as root it runs as the `postgres` user the package creates
(through runuser), which then owns the cluster's directory.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

USER = "memspine"  # the cluster's superuser, with a generated password (scram-sha-256)
DATABASE = "memspine"


class PostgresMissing(RuntimeError):
    """initdb and pg_ctl are not installed, or cannot run here; the message says why."""


def pg_bindir() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PostgresMissing(
        "PostgreSQL is not installed (no initdb): run scripts/install-debian-packages as root"
    )


def run_as() -> str | None:
    """The user PostgreSQL runs as: None (this user) unless this is root, then `postgres`."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresMissing(
            "running as root and there is no postgres user to run PostgreSQL as"
        ) from None
    return "postgres"


class PrivatePostgres:
    """One PostgreSQL cluster under `root` (`root/pgdata`, its log and password beside it)."""

    def __init__(self, root: Path) -> None:
        """Nothing starts here: call `start` (which runs initdb the first time)."""
        self.root = Path(root)
        self.data = self.root / "pgdata"
        self.log = self.root / "postgres.log"
        self.password_file = self.root / "pgpass"
        self.port_file = self.root / "pgport"
        self.user = run_as()
        self.bindir = pg_bindir()

    def _cmd(self, *args: str) -> list[str]:
        if self.user is None:
            return list(args)
        return ["runuser", "-u", self.user, "--", *args]

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    @property
    def password(self) -> str:
        """The superuser's password (made by `init`)."""
        return self.password_file.read_text().strip()

    @property
    def port(self) -> int:
        """The port the cluster was last started on."""
        return int(self.port_file.read_text())

    def url(self, database: str = DATABASE) -> str:
        """A libpq URL for `database` as the superuser, over TCP on loopback."""
        return (
            f"postgresql://{USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"
        )

    def initialised(self) -> bool:
        """True once initdb has made the cluster."""
        return (self.data / "PG_VERSION").is_file()

    def init(self, *, durable: bool = True) -> None:
        """initdb: a superuser `memspine` with a random password, host logins by scram."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._chown(self.root)
        if self.user is not None:
            reach = subprocess.run(self._cmd("test", "-w", str(self.root)), capture_output=True)
            if reach.returncode != 0:
                raise PostgresMissing(
                    f"the {self.user} user cannot reach {self.root}: every directory above it "
                    "must be searchable by others (chmod o+x), or choose one under /tmp"
                )
        self.password_file.write_text(secrets.token_urlsafe(24) + "\n")
        os.chmod(self.password_file, 0o600)
        self._chown(self.password_file)
        command = [
            str(self.bindir / "initdb"),
            "-D", str(self.data),
            "-U", USER,
            "-E", "UTF8",
            "--locale=C",
            "--auth-host=scram-sha-256",
            "--auth-local=peer",
            f"--pwfile={self.password_file}",
        ]  # fmt: skip
        if not durable:
            command.append("--no-sync")
        done = subprocess.run(self._cmd(*command), capture_output=True, text=True)
        if done.returncode != 0:
            raise PostgresMissing(f"initdb failed: {(done.stderr or done.stdout).strip()[-500:]}")

    def start(self, port: int, *, durable: bool = True, timeout: float = 60.0) -> None:
        """Start the cluster on 127.0.0.1:`port` (no Unix socket), initdb first if needed,
        and make the `memspine` database."""
        if not self.initialised():
            self.init(durable=durable)
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-p {port}",
            "-c unix_socket_directories=''",
            "-c max_connections=200",
        ]
        if not durable:  # tests: a crash of the machine may lose the cluster, and that is fine
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self.port_file.write_text(str(port))
        if not self.log.exists():
            self.log.touch()
            self._chown(self.log)
        command = [
            str(self.bindir / "pg_ctl"),
            "-D", str(self.data),
            "-l", str(self.log),
            "-o", " ".join(options),
            "-w", "-t", str(int(timeout)),
            "start",
        ]  # fmt: skip
        done = subprocess.run(self._cmd(*command), capture_output=True, text=True)
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-800:] if self.log.exists() else ""
            raise PostgresMissing(f"PostgreSQL did not start: {done.stderr.strip()} {tail}")
        self._create_database(timeout)

    def _create_database(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                    ).fetchone()
                    if exists is None:
                        conn.execute(f"CREATE DATABASE {DATABASE}")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def running(self) -> bool:
        """True if pg_ctl says the cluster runs."""
        if not self.initialised():
            return False
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]
        return subprocess.run(self._cmd(*command), capture_output=True).returncode == 0

    def stop(self) -> None:
        """Stop the cluster (fast shutdown: sessions are ended, nothing committed is lost)."""
        if not self.running():
            return
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
        subprocess.run(self._cmd(*command), capture_output=True)
