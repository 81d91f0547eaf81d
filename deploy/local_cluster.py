"""deploy/local-cluster up|down DIR: PostgreSQL, three memspine nodes and HAProxy on loopback.

`up DIR` starts, each on a free loopback port and with everything under DIR:
  DIR/postgres        a private PostgreSQL cluster (Debian's package; initdb/pg_ctl as the
                      postgres user when run as root): the control plane
  DIR/node-N/data     the data directory of node-N (N = 1, 2, 3), all on that control plane
  DIR/haproxy         HAProxy (deploy/haproxy/memspine.cfg), its routes map, its runtime
                      API on the unix socket runtime.sock (mode 600, never a TCP port), and
                      `memspine-admin proxy-sync` keeping the map current
then prints exactly two lines, MEMSPINE_URL=… (the proxy) and MEMSPINE_ADMIN_KEY=…; `down DIR`
stops all of it (the data stays: `up DIR` again serves it); `restart DIR node-N` starts again a
node whose process is gone. No system service is touched.
haproxy and postgresql are installed from Debian when absent (as root, by
scripts/install-debian-packages).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "deploy" / "haproxy" / "memspine.cfg"
NODES = ("node-1", "node-2", "node-3")
STATE = "cluster.json"
START_TIMEOUT_SECS = 90.0
SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path holds 108 with its NUL)


class ClusterError(Exception):
    """Why the cluster could not be started or stopped, in one sentence."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(message: str) -> None:
    sys.stderr.write(f"local-cluster: {message}\n")


def _alive(pid: int) -> bool:
    """Whether pid runs: a killed node whose parent (`up`, long gone) left it unreaped is a
    zombie, which signal 0 still finds, and a restart must not wait for it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: signal 0 is all there is
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _install() -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "install-debian-packages"), "postgresql", "haproxy"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ClusterError(done.stderr.strip() or "postgresql and haproxy could not be installed")


def _spawn(command: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,  # down stops it by pid; a ^C of `up` does not
        )
    return proc.pid


def _wait_http(url: str, log: Path, pid: int, deadline: float) -> None:
    while True:
        if not _alive(pid):
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise ClusterError(f"a process exited while starting ({log}):\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"{url} did not answer in time (see {log})")
        time.sleep(0.1)


def _base_env() -> dict[str, str]:
    # The nodes' settings are the cluster's; a MEMSPINE_* of the caller's (say the embedding
    # dimension) passes through unless the cluster sets it.
    return {k: v for k, v in os.environ.items() if k not in ("MEMSPINE_URL", "MEMSPINE_API_KEY")}


def up(root: Path) -> dict[str, Any]:
    """Start the cluster in `root` (or find it running); return its state."""
    from memspine_admin.control_pg import PgControl
    from memspine_admin.pgserver import PostgresMissing, PrivatePostgres
    from memspine_admin.proxysync import write_map

    root = root.resolve()
    state_path = root / STATE
    if state_path.exists():
        state: dict[str, Any] = json.loads(state_path.read_text())
        if all(_alive(pid) for pid in state["pids"].values()):
            return state
        _say("a previous cluster in this directory is partly down: stopping what is left")
        down(root)
    _install()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # the postgres user must reach DIR/postgres
    deadline = time.monotonic() + START_TIMEOUT_SECS
    state = {"pids": {}, "ports": {}}
    pg = PrivatePostgres(root / "postgres")
    try:
        pg.start(free_port())
    except PostgresMissing as exc:
        raise ClusterError(str(exc)) from None
    state["ports"]["postgres"] = pg.port
    url = pg.url()
    state["control_url"] = url
    state_path.write_text(json.dumps(state))
    os.chmod(state_path, 0o600)  # it holds the database password
    try:
        PgControl.init(url, actor="local-cluster")
        key_file = root / "admin-key"
        if not key_file.exists():
            key_file.write_text(secrets.token_urlsafe(24) + "\n")
            os.chmod(key_file, 0o600)
        admin_key = key_file.read_text().strip()
        state["admin_key"] = admin_key
        for node in NODES:
            (root / node / "data").mkdir(parents=True, exist_ok=True)
            state["ports"][node] = free_port()
            state["pids"][node] = _spawn_node(root, state, node)
            state_path.write_text(json.dumps(state))
        for node in NODES:
            _wait_http(
                f"http://127.0.0.1:{state['ports'][node]}/health",
                root / node / "server.log",
                state["pids"][node],
                deadline,
            )
        proxy_dir = root / "haproxy"
        proxy_dir.mkdir(exist_ok=True)
        routes = proxy_dir / "routes.map"
        with PgControl.open(url) as control:
            write_map(routes, control.routes())  # HAProxy loads it at start
        front = free_port()
        # The runtime API is at admin level (it changes maps and servers): a unix socket that
        # only this user may open (mode 600 in the config), never a TCP port any local
        # process could reach.
        runtime = str(proxy_dir / "runtime.sock")
        if len(runtime.encode()) > SOCKET_PATH_MAX:
            raise ClusterError(f"{runtime} is too long for a unix socket: use a shorter DIR")
        env = _base_env()
        env.update(
            {
                "FRONTEND_BIND": f"127.0.0.1:{front}",
                "RUNTIME_SOCKET": runtime,
                "ROUTES_MAP": str(routes),
                **{
                    f"NODE_{i + 1}_ADDR": f"127.0.0.1:{state['ports'][n]}"
                    for i, n in enumerate(NODES)
                },
                **{f"NODE_{i + 1}_NAME": n for i, n in enumerate(NODES)},
            }
        )
        check = subprocess.run(
            ["haproxy", "-c", "-q", "-f", str(CONFIG)], env=env, capture_output=True, text=True
        )
        if check.returncode != 0:
            raise ClusterError(f"haproxy refuses {CONFIG}: {check.stderr.strip()}")
        state["pids"]["haproxy"] = _spawn(
            ["haproxy", "-db", "-f", str(CONFIG)], env, proxy_dir / "haproxy.log"
        )
        state["ports"]["proxy"] = front
        state["runtime_socket"] = runtime
        state_path.write_text(json.dumps(state))
        sync_env = _base_env()
        sync_env["MEMSPINE_CONTROL_URL"] = url
        state["pids"]["proxy-sync"] = _spawn(
            [
                sys.executable,
                "-m",
                "memspine_admin.cli",
                "proxy-sync",
                "--runtime",
                runtime,
                "--map",
                str(routes),
                "--name",
                "local-haproxy",
            ],
            sync_env,
            proxy_dir / "proxy-sync.log",
        )
        state_path.write_text(json.dumps(state))
        _wait_http(
            f"http://127.0.0.1:{front}/health",
            proxy_dir / "haproxy.log",
            state["pids"]["haproxy"],
            deadline,
        )
        _wait_synced(
            url,
            "local-haproxy",
            proxy_dir / "proxy-sync.log",
            state["pids"]["proxy-sync"],
            deadline,
        )
    except BaseException:
        down(root)
        raise
    return state


def _spawn_node(root: Path, state: dict[str, Any], node: str) -> int:
    """Start one node on its port and data directory; its pid."""
    env = _base_env()
    env.update(
        {
            "MEMSPINE_BIND": f"127.0.0.1:{state['ports'][node]}",
            "MEMSPINE_DATA_DIR": str(root / node / "data"),
            "MEMSPINE_CONTROL_URL": state["control_url"],
            "MEMSPINE_NODE": node,
            "MEMSPINE_ADMIN_KEY": state["admin_key"],
            # Behind the proxy every request comes from one address.
            "MEMSPINE_MAX_CONNECTIONS_PER_CLIENT": "4096",
        }
    )
    home = root / node
    return _spawn([sys.executable, "-m", "memspine.server"], env, home / "server.log")


def restart(root: Path, node: str) -> dict[str, Any]:
    """Start again a node of a running cluster whose process is gone (killed, crashed), on its
    port and data directory; HAProxy sees it healthy within a second."""
    root = root.resolve()
    state_path = root / STATE
    if not state_path.exists():
        raise ClusterError(f"no cluster is running in {root}")
    if node not in NODES:
        raise ClusterError(f"no node named {node!r}: the nodes are {', '.join(NODES)}")
    state: dict[str, Any] = json.loads(state_path.read_text())
    if _alive(state["pids"][node]):
        raise ClusterError(f"{node} is running (pid {state['pids'][node]})")
    state["pids"][node] = _spawn_node(root, state, node)
    state_path.write_text(json.dumps(state))
    _wait_http(
        f"http://127.0.0.1:{state['ports'][node]}/health",
        root / node / "server.log",
        state["pids"][node],
        time.monotonic() + START_TIMEOUT_SECS,
    )
    return state


def _wait_synced(url: str, name: str, log: Path, pid: int, deadline: float) -> None:
    """Wait until proxy-sync has applied the control plane's current generation."""
    import psycopg

    while True:
        if not _alive(pid):
            raise ClusterError(
                f"proxy-sync exited ({log}): {log.read_text(errors='replace')[-800:]}"
            )
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT p.applied_generation >= m.generation FROM proxies p, control_meta m"
                " WHERE p.name = %s",
                (name,),
            ).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"proxy-sync did not apply the routes in time (see {log})")
        time.sleep(0.05)


def _stop(pid: int, timeout: float = 20.0) -> None:
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        try:  # a child of this process (up failed midway) must be reaped, not only waited for
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def down(root: Path) -> None:
    """Stop everything `up` started in `root`; the data stays."""
    from memspine_admin.pgserver import PrivatePostgres

    root = root.resolve()
    state_path = root / STATE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        pids = state.get("pids", {})
        for name in ("proxy-sync", "haproxy"):
            if name in pids:
                _stop(pids[name])
        for node in NODES:  # the nodes stop together: each finishes its requests
            if node in pids and _alive(pids[node]):
                os.kill(pids[node], signal.SIGTERM)
        for node in NODES:
            if node in pids:
                _stop(pids[node])
    if (root / "postgres" / "pgdata").exists():
        PrivatePostgres(root / "postgres").stop()
    state_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of deploy/local-cluster."""
    parser = argparse.ArgumentParser(prog="local-cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "restart"])
    parser.add_argument("dir", type=Path, help="where the cluster keeps everything")
    parser.add_argument("node", nargs="?", help="restart: the node to start again (node-N)")
    args = parser.parse_args(argv)
    try:
        if args.command == "restart":
            if args.node is None:
                parser.error("restart needs the node's name: restart DIR node-N")
            restart(args.dir, args.node)
        elif args.command == "up":
            state = up(args.dir)
            sys.stdout.write(
                f"MEMSPINE_URL=http://127.0.0.1:{state['ports']['proxy']}\n"
                f"MEMSPINE_ADMIN_KEY={state['admin_key']}\n"
            )
        else:
            down(args.dir)
    except ClusterError as exc:
        _say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
