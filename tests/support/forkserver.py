"""Server processes forked from a process that has imported the server already: a start then
costs a fork and the app's build, not the second of CPU that importing memspine.server, Litestar
and the stores takes (tests/e2e starts 70 to 100 servers). Each child is a real process of
its own (its pid, its signals, kill -9, its descriptors), whose parent is the fork server.

ServerProcess (tests/support/servers.py) uses it when the server's environment differs from the
fork server's only in MEMSPINE_ settings (what the server reads when it starts) and the running
test's name: anything else could change what happens at import, so it starts `python -m
memspine.server` then, as it does everywhere with TESTS_FORK_SERVERS=0.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

# The fork server: imports what every server imports, then forks a server for each request line
# (its environment, working directory and log), reports `started PID`, and `exit PID CODE` when a
# child ends (it is their parent: it reaps them). A child leaves the loop and ends the way `python
# -m memspine.server` does: main()'s status through sys.exit, the interpreter's own shutdown.
FORK_SERVER = r"""
import json, os, select, signal, sys

import memspine.app
import memspine.server
from storage import failpoints

def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        os.write(1, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())

def loop(wake_r):
    buf = b""
    os.write(1, b"ready\n")
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    break
        reap()
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            return None
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            spec = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return spec
            os.write(1, f"started {pid}\n".encode())

wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
spec = loop(wake_r)
if spec is None:
    sys.exit(0)
# The child: the server's process from here on.
signal.set_wakeup_fd(-1)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.dup2(log, 1)
os.dup2(log, 2)
for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
    if fd > 2:
        try:
            os.close(fd)
        except OSError:
            pass
os.chdir(spec["cwd"])
os.environ.clear()
os.environ.update(spec["env"])
failpoints.disarm_all()
failpoints.load(os.environ)  # storage/failpoints.py reads the environment at import
sys.argv = [memspine.server.__file__]
sys.exit(memspine.server.main([]))
"""


class Forked:
    """A forked server, with the part of subprocess.Popen's interface ServerProcess uses."""

    def __init__(self, owner: ForkServer, pid: int) -> None:
        self.owner = owner
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status once the process has ended, else None."""
        with self.owner.ended:
            self.returncode = self.owner.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; subprocess.TimeoutExpired after timeout seconds."""
        with self.owner.ended:
            if not self.owner.ended.wait_for(lambda: self.pid in self.owner.exits, timeout):
                raise subprocess.TimeoutExpired(["memspine.server", str(self.pid)], timeout or 0)
            self.returncode = self.owner.exits[self.pid]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the process unless it has ended (and its pid may be another's)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The fork server of this test process (one per pytest-xdist worker)."""

    def __init__(self, repo: Path) -> None:
        self.env = _fixed(dict(os.environ))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER],
            cwd=repo,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.started: queue.Queue[int] = queue.Queue()
        self.exits: dict[int, int] = {}
        self.ended = threading.Condition()
        self.asking = threading.Lock()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="fork-server").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            word, *rest = raw.decode().split()
            if word == "ready":
                self.ready.set()
            elif word == "started":
                self.started.put(int(rest[0]))
            elif word == "exit":
                with self.ended:
                    self.exits[int(rest[0])] = int(rest[1])
                    self.ended.notify_all()
        self.ready.set()  # ended: whoever waits finds out below

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a server with this environment may be forked here (only MEMSPINE_ differs)."""
        return _fixed(env) == _fixed(self.env) and self.proc.poll() is None

    def spawn(self, env: dict[str, str], cwd: Path, log: Path) -> Forked:
        """A server forked with this environment, working directory and log."""
        assert self.proc.stdin is not None
        with self.asking:
            if not self.ready.wait(120) or self.proc.poll() is not None:
                raise RuntimeError("the fork server did not start")
            spec = {"env": env, "cwd": str(cwd), "log": str(log)}
            self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
            self.proc.stdin.flush()
            return Forked(self, self.started.get(timeout=120))

    def close(self) -> None:
        """End the fork server (its children go on until their tests stop them)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _fixed(env: dict[str, str]) -> dict[str, str]:
    """What of an environment the fork server's imports may have read: all but the server's
    settings and the name of the running test (pytest sets it for each test)."""
    return {
        k: v for k, v in env.items() if not k.startswith("MEMSPINE_") and k != "PYTEST_CURRENT_TEST"
    }


_server: ForkServer | None = None
_made = threading.Lock()


def fork_server(repo: Path) -> ForkServer | None:
    """This process's fork server, started on first use; None with TESTS_FORK_SERVERS=0."""
    global _server
    if os.environ.get("TESTS_FORK_SERVERS", "1") == "0":
        return None
    with _made:
        if _server is None or _server.proc.poll() is not None:
            _server = ForkServer(repo)
            atexit.register(_server.close)
        return _server
