"""What the issued-key check costs: GET throughput with a warm issued key against local mode, one cold argon2id verification, and another tenant's latency under a wrong-secret flood.

Two memspine-server processes run side by side on loopback, one in local mode and one over a
control database, each holding one event. Each round loads `GET /v1/memory/event/{id}` on
both at the same time, from the same asyncio client, with the same number of keep-alive
connections: whatever else runs on the machine slows both alike, and the server that spends
more CPU per request answers fewer. The median ratio over the rounds is the throughput cost.
In the same run: the check itself timed in-process (warm issued key and local mode) and one
cold verification (a key-row read and one argon2id run). Then fairness: tenant B's first use of
a new key and its warm key right after a control change, each without load (the baseline) and
while 100 connections send wrong secrets for tenant A's key id, and how long each kind of
refusal takes (unknown, revoked, expired-alike warm refusal, wrong secret).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from common import (  # noqa: E402  (bench scripts run as plain files)
    http_request,
    median,
    parse_args,
    scratch_dir,
    start_memspine,
    write_json,
)

from memspine.auth import Authenticator  # noqa: E402
from memspine.verifier import KeyVerifier  # noqa: E402
from memspine_admin import keys  # noqa: E402
from memspine_admin.control import ControlDB  # noqa: E402

ADMIN_KEY = "bench-admin-key-5b0c2f81"
LOCAL_TOKEN = "bench"
TARGET_COST_PCT = 10.0
EVENT = {
    "kind": "turn",
    "ts": 1791208939000000,
    "text": "Agent: the carrier shows it signed for at number 16, on 1 October at 14:12. "
    "Please check there",
    "embedding": [0.9, 0.1, 0.0, 0.0],
    "properties": {"speaker": "agent", "conversation": "c-1005-01"},
}


def call(port: int, method: str, path: str, body: Any, token: str) -> Any:
    """One JSON request with a bearer token; the decoded answer."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


async def _connection(port: int, request: bytes, stop_at: float, done: list[int]) -> None:
    """One keep-alive connection sending the same GET until stop_at; counts 200s and others."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            done[0 if head[9:12] == b"200" else 1] += 1
    finally:
        writer.close()


def cpu_secs(pid: int) -> float:
    """User plus system CPU seconds a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def paired_round(
    targets: dict[str, tuple[int, bytes]], secs: float, conns: int
) -> dict[str, tuple[int, float]]:
    """Load every target at once for `secs`; (requests answered, seconds) for each."""
    counts = {name: [0, 0] for name in targets}

    async def run() -> float:
        start = time.perf_counter()
        stop_at = start + secs
        await asyncio.gather(
            *(
                _connection(port, request, stop_at, counts[name])
                for name, (port, request) in targets.items()
                for _ in range(conns)
            )
        )
        return time.perf_counter() - start

    elapsed = asyncio.run(run())
    failed = {name: c[1] for name, c in counts.items() if c[1]}
    if failed:
        raise RuntimeError(f"requests that did not answer 200: {failed}")
    return {name: (c[0], elapsed) for name, c in counts.items()}


def measure(
    targets: dict[str, tuple[int, bytes]],
    pids: dict[str, int],
    secs: float,
    rounds: int,
    conns: int,
) -> dict[str, Any]:
    """Paired rounds: per-round throughput of each server, and CPU time per request over all."""
    rps: dict[str, list[float]] = {name: [] for name in targets}
    requests = dict.fromkeys(targets, 0)
    cpu_before = {name: cpu_secs(pid) for name, pid in pids.items()}
    names = list(targets)
    for i in range(rounds):
        # Swap which server's connections the client opens and serves first, round by round.
        order = names if i % 2 == 0 else names[::-1]
        ordered = {name: targets[name] for name in order}
        for name, (n, elapsed) in paired_round(ordered, secs, conns).items():
            rps[name].append(n / elapsed)
            requests[name] += n
    cpu = {name: cpu_secs(pid) - cpu_before[name] for name, pid in pids.items()}
    return {
        "rps": rps,
        "cpu_us_per_request": {name: cpu[name] / requests[name] * 1e6 for name in targets},
    }


def micro_checks(data_dir: Path, token: str, n: int) -> dict[str, float]:
    """µs per authentication in-process: the warm issued-key probe and the local-mode check."""
    issued = Authenticator(data_dir, None)
    local = Authenticator(scratch_dir("auth-local-micro"), None)
    issued.authenticate(token)  # warm it (one argon2 run)
    out: dict[str, float] = {}
    for name, auth, tok in (("warm_issued_us", issued, token), ("local_us", local, LOCAL_TOKEN)):
        start = time.perf_counter()
        for _ in range(n):
            auth.authenticate(tok)
        out[name] = round((time.perf_counter() - start) / n * 1e6, 2)
    issued.close()
    return out


def cold_verifications(data_dir: Path, token: str, n: int) -> dict[str, float]:
    """Ms for one verification by a fresh verifier: a key-row read plus one argon2id run."""
    times = []
    with ControlDB.open(data_dir) as control:
        for _ in range(n):
            verifier = KeyVerifier(control)
            start = time.perf_counter()
            verifier.verify(token)
            times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": round(median(times), 1), "min_ms": round(min(times), 1), "runs": n}


FLOOD_CONNECTIONS = 100


def timed_get(port: int, path: str, token: str) -> tuple[float, int]:
    """(ms, status) of one GET on a new connection."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return (time.perf_counter() - start) * 1e3, status


class Flood:
    """`conns` keep-alive connections sending wrong secrets for one key id, each as soon as the
    last was answered, in a thread of their own; `statuses` counts the answers."""

    def __init__(self, port: int, key_id: str, conns: int) -> None:
        self.port = port
        self.tokens = [
            keys.format_token(key_id, keys.random_base62(keys.SECRET_LEN)) for _ in range(500)
        ]
        self.conns = conns
        self.statuses: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    async def _main(self) -> None:
        await asyncio.gather(*(self._connection(i) for i in range(self.conns)))

    async def _connection(self, i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            while not self._stop.is_set():
                token = self.tokens[i % len(self.tokens)]
                i += self.conns
                writer.write(
                    http_request("GET", "/v1/whoami", b"", {"Authorization": f"Bearer {token}"})
                )
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                status = int(head[9:12])
                self.statuses[status] = self.statuses.get(status, 0) + 1
        finally:
            writer.close()


def victim_latencies(port: int, tenant_id: str, warm_token: str, n: int) -> dict[str, Any]:
    """Ms of B's new keys' first use and of its warm key right after a control change."""
    first, warm = [], []
    for i in range(n):
        key = call(port, "POST", "/v1/admin/keys", {"tenant_id": tenant_id, "name": "v"}, ADMIN_KEY)
        ms, status = timed_get(port, "/v1/whoami", key["api_key"])
        assert status == 200, status
        first.append(ms)
        name = f"change-{time.monotonic_ns()}-{i}"
        call(port, "POST", "/v1/admin/tenants", {"name": name}, ADMIN_KEY)  # moves the generation
        ms, status = timed_get(port, "/v1/whoami", warm_token)
        assert status == 200, status
        warm.append(ms)
    return {
        "first_use_ms": {"median": round(median(first), 1), "max": round(max(first), 1)},
        "warm_after_change_ms": {"median": round(median(warm), 2), "max": round(max(warm), 2)},
    }


def refusal_times(port: int, tenant_id: str, n: int) -> dict[str, float]:
    """Median ms of each kind of 401, interleaved: unknown, revoked, wrong secret."""
    revoked = call(port, "POST", "/v1/admin/keys", {"tenant_id": tenant_id, "name": "r"}, ADMIN_KEY)
    call(port, "DELETE", f"/v1/admin/keys/{revoked['key_id']}", None, ADMIN_KEY)
    ids = [
        call(port, "POST", "/v1/admin/keys", {"tenant_id": tenant_id, "name": "w"}, ADMIN_KEY)[
            "key_id"
        ]
        for _ in range(n)
    ]
    kinds = {
        "unknown": lambda _i: keys.generate_key().token,
        "revoked": lambda _i: revoked["api_key"],
        "wrong_secret": lambda i: keys.format_token(ids[i], keys.random_base62(keys.SECRET_LEN)),
    }
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(n):
        for kind, token in kinds.items():
            ms, status = timed_get(port, "/v1/whoami", token(i))
            assert status == 401, (kind, status)
            times[kind].append(ms)
    return {kind: round(median(t), 1) for kind, t in times.items()}


def fairness(port: int, n: int) -> dict[str, Any]:
    """Tenant B's latencies without load and under a wrong-secret flood on tenant A's key id."""
    a = call(port, "POST", "/v1/admin/tenants", {"name": "flood-a"}, ADMIN_KEY)["tenant_id"]
    b = call(port, "POST", "/v1/admin/tenants", {"name": "flood-b"}, ADMIN_KEY)["tenant_id"]
    a_key = call(port, "POST", "/v1/admin/keys", {"tenant_id": a, "name": "a"}, ADMIN_KEY)
    b_warm = call(port, "POST", "/v1/admin/keys", {"tenant_id": b, "name": "b"}, ADMIN_KEY)
    assert timed_get(port, "/v1/whoami", b_warm["api_key"])[1] == 200
    out: dict[str, Any] = {"refusal_ms": refusal_times(port, b, n)}
    out["baseline"] = victim_latencies(port, b, b_warm["api_key"], n)
    with Flood(port, a_key["key_id"], FLOOD_CONNECTIONS) as flood:
        time.sleep(1.0)
        out["under_flood"] = victim_latencies(port, b, b_warm["api_key"], n)
        ms, _status = timed_get(port, "/v1/whoami", keys.generate_key().token)
        out["under_flood"]["unknown_refusal_ms"] = round(ms, 1)
    out["flood_statuses"] = dict(flood.statuses)
    return out


def main() -> int:
    """Run the benchmark and write its JSON."""
    args = parse_args(__doc__.splitlines()[0])
    secs, rounds, conns = (1.0, 3, 4) if args.quick else (3.0, 15, 4)
    load_at_start = os.getloadavg()[0]
    local_dir, issued_dir = scratch_dir("auth-local"), scratch_dir("auth-issued")
    local = start_memspine(local_dir, {"MEMSPINE_EMBEDDING_DIM": "4"})
    issued = start_memspine(
        issued_dir, {"MEMSPINE_EMBEDDING_DIM": "4", "MEMSPINE_ADMIN_KEY": ADMIN_KEY}
    )
    try:
        # Created beside the running server: it switches to issued keys by itself.
        ControlDB.init(issued_dir, actor="bench")
        tenant = call(issued.port, "POST", "/v1/admin/tenants", {"name": "bench"}, ADMIN_KEY)
        key = call(
            issued.port,
            "POST",
            "/v1/admin/keys",
            {"tenant_id": tenant["tenant_id"], "name": "b"},
            ADMIN_KEY,
        )["api_key"]
        targets: dict[str, tuple[int, bytes]] = {}
        for name, server, token in (("local", local, LOCAL_TOKEN), ("issued", issued, key)):
            event_id = call(server.port, "POST", "/v1/memory/event", EVENT, token)["event_id"]
            request = http_request(
                "GET", f"/v1/memory/event/{event_id}", b"", {"Authorization": f"Bearer {token}"}
            )
            targets[name] = (server.port, request)
        paired_round(targets, 1.0, conns)  # warm-up: tenants open, the key cached
        pids = {"local": local.proc.pid, "issued": issued.proc.pid}
        measured = measure(targets, pids, secs, rounds, conns)
        fair = fairness(issued.port, 3 if args.quick else 7)
    finally:
        local.stop()
        issued.stop()
    rps = measured["rps"]
    cpu = measured["cpu_us_per_request"]
    ratios = [i / lo for i, lo in zip(rps["issued"], rps["local"], strict=True)]
    # CPU per request decides throughput on a machine the server has to itself, and other
    # load barely moves it; the paired throughput ratio is reported beside it.
    cost = (1 - cpu["local"] / cpu["issued"]) * 100
    local_rps = median(rps["local"])
    micro = micro_checks(issued_dir, key, 2000 if args.quick else 20000)
    share = (micro["warm_issued_us"] - micro["local_us"]) / cpu["local"] * 100
    result = {
        "quick": args.quick,
        "round_secs": secs,
        "rounds": rounds,
        "connections_per_server": conns,
        "load_average_1m_start_end": [round(load_at_start, 2), round(os.getloadavg()[0], 2)],
        "local_rps": round(local_rps, 1),
        "issued_rps": round(median(rps["issued"]), 1),
        "issued_over_local_per_round": [round(x, 3) for x in ratios],
        "paired_throughput_cost_pct": round((1 - statistics.median(ratios)) * 100, 2),
        "server_cpu_us_per_request": {k: round(v, 1) for k, v in cpu.items()},
        "throughput_cost_pct": round(cost, 2),
        "target_cost_pct": TARGET_COST_PCT,
        "within_target": cost <= TARGET_COST_PCT,
        "in_process": micro,
        "check_share_of_request_cpu_pct": round(share, 2),
        "cold_argon2id_verify": cold_verifications(issued_dir, key, 3 if args.quick else 10),
        "fairness": fair,
    }
    path = write_json("auth", result, args.out)
    print(json.dumps(result, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
