"""Shared by the bench scripts: arguments, servers as subprocesses, a lean HTTP load generator, JSON out."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"


# The vocabulary of generated support-chat texts (append and tenant benchmarks alike).
SUPPORT_WORDS = [
    "order",
    "parcel",
    "carrier",
    "signed",
    "delivered",
    "refund",
    "case",
    "customer",
    "agent",
    "street",
    "number",
]


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options every bench script takes: --quick for a short run, --out for the JSON file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="short run (seconds, not minutes)")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output (bench/out/<name>.json)"
    )
    return parser.parse_args(argv)


def scratch_dir(name: str) -> Path:
    """A fresh directory on the repository's filesystem (not /tmp, which may be a RAM disk)."""
    root = OUT / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def write_json(name: str, data: dict[str, Any], path: Path | None = None) -> Path:
    """Write a result document to bench/out/<name>.json (or path) and return where it went."""
    target = path or OUT / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"bench": name, "machine": machine(), **data}, indent=2) + "\n")
    return target


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def median(values: Sequence[float]) -> float:
    """The median (the 50th percentile)."""
    return percentile(values, 50)


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A server subprocess on a loopback port, waited for until `health` answers 200."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, health: str) -> None:
        self.port = port
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the process)
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{argv[-1]} exited: {self.output()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("server did not start in 30 s") from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """User plus system CPU time the process (all its threads) has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def main_thread_cpu_seconds(self) -> float:
        """User plus system CPU time of the process's main thread (a server's event loop)."""
        pid = self.proc.pid
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def output(self) -> str:
        """What the process wrote so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop within 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_memspine(data_dir: Path, env: dict[str, str] | None = None) -> Process:
    """memspine-server in local mode on a free port with data_dir (cleared first)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    return serve_memspine(data_dir, env)


def serve_memspine(data_dir: Path, env: dict[str, str] | None = None) -> Process:
    """memspine-server in local mode on a free port over data_dir as it is, plus env."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    clean.update(
        {
            "MEMSPINE_BIND": f"127.0.0.1:{port}",
            "MEMSPINE_DATA_DIR": str(data_dir),
            "MEMSPINE_LOG_LEVEL": "WARNING",
            **(env or {}),
        }
    )
    return Process([sys.executable, "-m", "memspine.server"], clean, port, "/health")


# -- load generation --------------------------------------------------------------------------


def http_request(method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 keep-alive request, encoded once so the load generator spends no time on it."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one response (Content-Length framed, as uvicorn sends) and return its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def _client(
    port: int,
    requests: Sequence[bytes],
    offset: int,
    stop_at: float,
    record_from: float,
    latencies: list[float],
    statuses: dict[int, int],
    done: list[int],
) -> None:
    """One connection sending requests back to back until stop_at, recording after record_from."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = offset
    try:
        while True:
            start = time.perf_counter()
            if start >= stop_at:
                return
            writer.write(requests[i % len(requests)])
            i += 1
            status = await _read_response(reader)
            end = time.perf_counter()
            done[0] += 1
            if start >= record_from:
                latencies.append(end - start)
                statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _load(
    port: int, requests: Sequence[bytes], clients: int, warmup: float, seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    done = [0]
    begin = time.perf_counter()
    record_from = begin + warmup
    stop_at = record_from + seconds
    await asyncio.gather(
        *(
            _client(port, requests, n * 7919, stop_at, record_from, latencies, statuses, done)
            for n in range(clients)
        )
    )
    elapsed = max(time.perf_counter(), stop_at) - record_from
    ok = sum(n for s, n in statuses.items() if 200 <= s < 300)
    return {
        "clients": clients,
        "all_requests": done[0],
        "seconds": round(elapsed, 3),
        "requests": len(latencies),
        "ok": ok,
        "errors": {str(s): n for s, n in statuses.items() if not 200 <= s < 300},
        "per_sec": round(ok / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 99) * 1000, 3),
    }


def load(
    server: Process | int,
    requests: Sequence[bytes],
    clients: int,
    *,
    warmup: float,
    seconds: float,
) -> dict[str, Any]:
    """Closed-loop load: `clients` connections, each sending its next request when answered.

    Given the server's Process (not just its port), also reports its CPU time per request
    (all its threads, warm-up included) and its main thread's (the event loop's): unlike the
    rate, they hardly move when other work shares the machine.
    """
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # the stdlib loop works too, just slower
        runner = asyncio.run
    if isinstance(server, int):
        return dict(runner(_load(server, requests, clients, warmup, seconds)))
    cpu_before, loop_before = server.cpu_seconds(), server.main_thread_cpu_seconds()
    result = dict(runner(_load(server.port, requests, clients, warmup, seconds)))
    cpu = server.cpu_seconds() - cpu_before
    loop = server.main_thread_cpu_seconds() - loop_before
    result["server_cpu_ms_per_req"] = round(cpu * 1000 / max(result["all_requests"], 1), 3)
    result["loop_cpu_ms_per_req"] = round(loop * 1000 / max(result["all_requests"], 1), 3)
    return result
