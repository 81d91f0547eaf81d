"""What one tenant's abuse costs another: a victim tenant's GET and recall latency under attack.

One memspine-server with issued keys serves a victim tenant and an attacker tenant. The victim
runs a closed loop of GET-by-id and keyword recall from one keep-alive connection. It runs
first alone (the baseline of the same run), then while, in turn:

- `cypher`: 8 clients send pathological read-only Cypher queries on the attacker's tenant
  (integer squaring, string and list doubling per WITH, deep nesting, a 5,000-digit literal,
  a cartesian product, a long variable-length walk, a nested UNWIND of a large parameter);
- `auth`: 100 connections send wrong secrets for the attacker's key id;
- `slow`: 1,000 connections each send a partial request header and then trickle bytes;
- `bulk`: a bulk writer appends large events to the attacker's tenant from 8 connections;
- `tenants`: more tenants than fit the open-tenant budget are opened in turn;
- `exports`: 8 loops export the attacker's whole tenant (GET /v1/memory/export) back to back;
- `purges`: a loop appends to the attacker's tenant and deletes with `?purge=true`, 4 at once.

Targets: victim p99 ≤ 50 ms and no victim request over 1 s in every scenario; each
pathological query answered within the Cypher time bound + 100 ms; server RSS back within
20 % of its start after each scenario.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from common import (  # noqa: E402  (bench scripts run as plain files)
    Process,
    http_request,
    load,
    median,
    parse_args,
    percentile,
    scratch_dir,
    serve_memspine,
    write_json,
)

from memspine_admin.keys import SECRET_LEN, format_token, random_base62  # noqa: E402

ADMIN_KEY = "bench-admin-key-0e1d6c55"
DIM = 16
CYPHER_TIMEOUT_MS = 2000
VICTIM_P99_MS = 50.0
VICTIM_MAX_MS = 1000.0
RSS_SLACK = 0.20
SLOW_CONNECTIONS = 1000
AUTH_CONNECTIONS = 100
CYPHER_CLIENTS = 8
# The floods come from another loopback address than the victim's, as another client's would:
# the server caps connections per client address (MEMSPINE_MAX_CONNECTIONS_PER_CLIENT).
ATTACKER_ADDR = ("127.0.0.2", 0)


def _chain(start: str, step: str, times: int) -> str:
    """`WITH start AS x WITH step AS x ... RETURN x`: one value grown once per WITH."""
    return f"WITH {start} AS x " + " ".join(f"WITH {step} AS x" for _ in range(times)) + " RETURN x"


PATHOLOGICAL: dict[str, tuple[str, dict[str, Any]]] = {
    "int_squaring": (_chain("3", "x * x", 40), {}),
    "string_doubling": (_chain("'abcdefgh'", "x + x", 40), {}),
    "list_doubling": (_chain("[1, 2, 3, 4]", "x + x", 40), {}),
    "deep_nesting": ("RETURN " + "(" * 6000 + "1" + ")" * 6000, {}),
    "huge_literal": ("RETURN " + "9" * 5000 + " AS n", {}),
    "cartesian": ("MATCH (a), (b), (c) RETURN count(*)", {}),
    "var_length": ("MATCH (a)-[*1..5]-(b) RETURN count(*)", {}),
    "nested_unwind": (
        "UNWIND $xs AS a UNWIND $xs AS b UNWIND $xs AS c RETURN count(*)",
        {"xs": list(range(2000))},
    ),
}


def call(port: int, method: str, path: str, body: Any, token: str, timeout: float = 60) -> Any:
    """One JSON request with a bearer token; the decoded answer (errors raise)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def rss_bytes(proc: Process, field: str = "VmRSS") -> int:
    """The server's resident set size now (VmRSS), or one part of it (RssAnon: what the process
    itself holds, without the pages of the files it maps, which the kernel may reclaim)."""
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def event(i: int, size: int = 0) -> dict[str, Any]:
    """A support-chat event with a small embedding; `size` pads its text."""
    words = ["order", "parcel", "carrier", "signed", "refund", "street", "number", "case"]
    text = f"case {i}: " + " ".join(words[(i * 7 + j) % len(words)] for j in range(12))
    if size:
        text += " " + ("lorem ipsum " * (size // 12 + 1))[:size]
    vec = [((i * 31 + d * 17) % 97) / 97 + 0.01 for d in range(DIM)]
    return {"kind": "turn", "text": text, "embedding": vec, "properties": {"n": i}}


class Victim:
    """The victim's closed loop: GET by id and keyword recall, alternately, on one connection."""

    def __init__(self, port: int, token: str, event_id: str) -> None:
        self.port = port
        auth = {"Authorization": f"Bearer {token}"}
        recall = json.dumps({"text": "parcel signed at number", "k": 5}).encode()
        self.requests = [
            http_request("GET", f"/v1/memory/event/{event_id}", b"", auth),
            http_request(
                "POST", "/v1/memory/recall", recall, auth | {"Content-Type": "application/json"}
            ),
        ]

    def run(self, seconds: float) -> dict[str, Any]:
        """Loop for `seconds`; latencies in ms and any non-200."""
        latencies: list[float] = []
        failures: dict[str, int] = {}
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.settimeout(30)
        reader = sock.makefile("rb")
        stop = time.monotonic() + seconds
        i = 0
        try:
            while time.monotonic() < stop:
                start = time.perf_counter()
                try:
                    sock.sendall(self.requests[i % 2])
                    status = _read_status(reader)
                except OSError as exc:
                    failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                    sock.close()
                    sock = socket.create_connection(("127.0.0.1", self.port))
                    sock.settimeout(30)
                    reader = sock.makefile("rb")
                    continue
                latencies.append((time.perf_counter() - start) * 1000)
                if status != 200:
                    failures[str(status)] = failures.get(str(status), 0) + 1
                i += 1
        finally:
            sock.close()
        return {
            "requests": len(latencies),
            "p50_ms": round(percentile(latencies, 50), 3),
            "p99_ms": round(percentile(latencies, 99), 3),
            "max_ms": round(max(latencies, default=0.0), 3),
            "over_1s": sum(1 for x in latencies if x > 1000),
            "failures": failures,
        }


def _read_status(reader: Any) -> int:
    """Read one Content-Length framed response; its status."""
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    reader.read(length)
    return status


class Background:
    """An attack running on a thread until stopped; what it recorded."""

    def __init__(self, name: str, body: Callable[[threading.Event, dict[str, Any]], None]) -> None:
        self.stop = threading.Event()
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=body, args=(self.stop, self.result), name=name)

    def __enter__(self) -> Background:
        self.thread.start()
        time.sleep(1.0)  # let the attack reach full strength before the victim is measured
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=120)


def cypher_attack(port: int, token: str) -> Callable[[threading.Event, dict[str, Any]], None]:
    """8 clients, each sending the pathological queries in turn; per query, its answer times."""

    def client(n: int, stop: threading.Event, seen: dict[str, list[Any]]) -> None:
        names = list(PATHOLOGICAL)
        i = n
        while not stop.is_set():
            name = names[i % len(names)]
            query, params = PATHOLOGICAL[name]
            start = time.perf_counter()
            try:
                call(
                    port, "POST", "/v1/memory/cypher", {"query": query, "params": params}, token, 30
                )
                status = 200
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                status = 0
            seen.setdefault(name, []).append((status, (time.perf_counter() - start) * 1000))
            i += 1

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        seen: dict[str, list[Any]] = {}
        threads = [
            threading.Thread(target=client, args=(n, stop, seen)) for n in range(CYPHER_CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, answers in seen.items():
            times = [ms for _s, ms in answers]
            statuses: dict[str, int] = {}
            for s, _ms in answers:
                statuses[str(s)] = statuses.get(str(s), 0) + 1
            result[name] = {
                "answers": len(answers),
                "statuses": statuses,
                "p50_ms": round(median(times), 1),
                "max_ms": round(max(times), 1),
            }

    return body


def auth_attack(port: int, key_id: str) -> Callable[[threading.Event, dict[str, Any]], None]:
    """100 keep-alive connections sending wrong secrets for one real key id."""

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        wrong = format_token(key_id, random_base62(SECRET_LEN))  # well formed: reaches argon2
        req = http_request("GET", "/v1/whoami", b"", {"Authorization": f"Bearer {wrong}"})
        statuses: dict[str, int] = {}

        async def one() -> None:
            while not stop.is_set():
                try:
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", port, local_addr=ATTACKER_ADDR
                    )
                    while not stop.is_set():
                        writer.write(req)
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                        status = head[9:12].decode()
                        statuses[status] = statuses.get(status, 0) + 1
                        length = 0
                        for line in head.split(b"\r\n")[1:]:
                            k, _, v = line.partition(b":")
                            if k.strip().lower() == b"content-length":
                                length = int(v)
                        await reader.readexactly(length)
                        if b"connection: close" in head.lower():
                            break
                    writer.close()
                except (TimeoutError, OSError, asyncio.IncompleteReadError):
                    statuses["closed"] = statuses.get("closed", 0) + 1
                    await asyncio.sleep(0.05)

        async def main() -> None:
            await asyncio.gather(*(one() for _ in range(AUTH_CONNECTIONS)))

        asyncio.run(main())
        result["statuses"] = statuses

    return body


def slow_attack(port: int) -> Callable[[threading.Event, dict[str, Any]], None]:
    """1,000 connections, each a partial header trickled one byte a second."""

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        counts = {"opened": 0, "refused": 0, "closed_by_server": 0}

        async def one(n: int) -> None:
            await asyncio.sleep(n * 0.002)  # spread the connects over two seconds
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=ATTACKER_ADDR
                )
            except OSError:
                counts["refused"] += 1
                return
            counts["opened"] += 1
            try:
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                while not stop.is_set():
                    await asyncio.sleep(1)
                    writer.write(b"X")
                    await writer.drain()
                    if reader.at_eof():
                        counts["closed_by_server"] += 1
                        return
            except OSError:
                counts["closed_by_server"] += 1
            finally:
                writer.close()

        async def main() -> None:
            await asyncio.gather(*(one(n) for n in range(SLOW_CONNECTIONS)))

        asyncio.run(main())
        result.update(counts)

    return body


def bulk_attack(port: int, token: str) -> Callable[[threading.Event, dict[str, Any]], None]:
    """8 connections appending 20 kB events to the attacker's tenant back to back."""

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        reqs = [
            http_request(
                "POST", "/v1/memory/event", json.dumps(event(10_000 + i, 20_000)).encode(), headers
            )
            for i in range(64)
        ]
        seconds = 0.0
        while not stop.is_set() and seconds < 300:
            out = load(port, reqs, 8, warmup=0.0, seconds=2.0)
            seconds += 2.0
            result["appends"] = result.get("appends", 0) + out["ok"]
            for code, n in out["errors"].items():
                result.setdefault("errors", {})[code] = result.get("errors", {}).get(code, 0) + n

    return body


def exports_attack(port: int, token: str) -> Callable[[threading.Event, dict[str, Any]], None]:
    """8 loops exporting the attacker's tenant back to back (one export spools at a time per
    tenant: memspine/engine.py's export shares)."""

    def loop(stop: threading.Event, counts: dict[str, int]) -> None:
        while not stop.is_set():
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/memory/export",
                headers={"Authorization": f"Bearer {token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                counts["200"] = counts.get("200", 0) + 1
            except urllib.error.HTTPError as exc:
                counts[str(exc.code)] = counts.get(str(exc.code), 0) + 1

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        counts: dict[str, int] = {}
        threads = [threading.Thread(target=loop, args=(stop, counts)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["exports"] = counts

    return body


def purges_attack(port: int, token: str) -> Callable[[threading.Event, dict[str, Any]], None]:
    """4 loops each appending an event to the attacker's tenant and deleting it with
    ?purge=true (purges run one at a time across tenants, niced: memspine/purging.py)."""

    def loop(n: int, stop: threading.Event, counts: dict[str, int]) -> None:
        i = 0
        while not stop.is_set():
            try:
                made = call(port, "POST", "/v1/memory/event", event(50_000 + n * 10_000 + i), token)
                call(port, "DELETE", f"/v1/memory/event/{made['event_id']}?purge=true", None, token)
                counts["purged"] = counts.get("purged", 0) + 1
            except urllib.error.HTTPError as exc:
                counts[str(exc.code)] = counts.get(str(exc.code), 0) + 1
            i += 1

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        counts: dict[str, int] = {}
        threads = [threading.Thread(target=loop, args=(n, stop, counts)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["purges"] = counts

    return body


def tenants_attack(
    port: int, tokens: list[str]
) -> Callable[[threading.Event, dict[str, Any]], None]:
    """Open many tenants in turn (a recall on each), more than the open-tenant budget holds."""

    def body(stop: threading.Event, result: dict[str, Any]) -> None:
        statuses: dict[str, int] = {}
        i = 0
        while not stop.is_set():
            token = tokens[i % len(tokens)]
            try:
                call(port, "POST", "/v1/memory/recall", {"text": "parcel", "k": 3}, token, 30)
                statuses["200"] = statuses.get("200", 0) + 1
            except urllib.error.HTTPError as exc:
                statuses[str(exc.code)] = statuses.get(str(exc.code), 0) + 1
            i += 1
        result["statuses"] = statuses
        result["opened_in_turn"] = i

    return body


def setup(quick: bool) -> tuple[Process, dict[str, Any]]:
    """A server over a control database with the victim, the attacker and the crowd of tenants."""
    import subprocess

    data = scratch_dir("noisy")
    subprocess.run(
        [str(Path(sys.executable).with_name("memspine-admin")), "--data-dir", str(data), "init"],
        check=True,
        capture_output=True,
    )
    env = {
        "MEMSPINE_ADMIN_KEY": ADMIN_KEY,
        "MEMSPINE_EMBEDDING_DIM": str(DIM),
        "MEMSPINE_CYPHER_TIMEOUT_MS": str(CYPHER_TIMEOUT_MS),
        "MEMSPINE_MAX_OPEN_TENANTS": "64",
        # Each crowd tenant holds ~3 MB of graph table: the budget holds about a third of them.
        "MEMSPINE_MAX_OPEN_BYTES": "32M",
    }
    proc = serve_memspine(data, env)
    port = proc.port
    world: dict[str, Any] = {"port": port}
    for role in ("victim", "attacker"):
        t = call(port, "POST", "/v1/admin/tenants", {"name": role}, ADMIN_KEY)
        k = call(
            port, "POST", "/v1/admin/keys", {"tenant_id": t["tenant_id"], "name": role}, ADMIN_KEY
        )
        world[role] = {"tenant_id": t["tenant_id"], "token": k["api_key"], "key_id": k["key_id"]}
    ids = [
        call(port, "POST", "/v1/memory/event", event(i), world["victim"]["token"])["event_id"]
        for i in range(200)
    ]
    world["victim"]["event_id"] = ids[7]
    for i in range(300 if quick else 1500):
        ev = event(i)
        ev["properties"]["source_event_ids"] = []
        call(port, "POST", "/v1/memory/event", ev, world["attacker"]["token"])
    crowd = []
    for n in range(12 if quick else 24):
        t = call(port, "POST", "/v1/admin/tenants", {"name": f"crowd-{n}"}, ADMIN_KEY)
        k = call(
            port, "POST", "/v1/admin/keys", {"tenant_id": t["tenant_id"], "name": "c"}, ADMIN_KEY
        )
        for i in range(50):
            call(port, "POST", "/v1/memory/event", event(i), k["api_key"])
        crowd.append(k["api_key"])
    world["crowd"] = crowd
    return proc, world


def main() -> None:
    """Run the baseline and every scenario; JSON out."""
    args = parse_args(__doc__.splitlines()[0])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    seconds = 4.0 if args.quick else 10.0
    proc, world = setup(args.quick)
    port = world["port"]
    victim = Victim(port, world["victim"]["token"], world["victim"]["event_id"])
    victim.run(1.0)  # warm
    scenarios: dict[str, Callable[[threading.Event, dict[str, Any]], None]] = {
        "cypher": cypher_attack(port, world["attacker"]["token"]),
        "auth": auth_attack(port, world["attacker"]["key_id"]),
        "slow": slow_attack(port),
        "bulk": bulk_attack(port, world["attacker"]["token"]),
        "tenants": tenants_attack(port, world["crowd"]),
        "exports": exports_attack(port, world["attacker"]["token"]),
        "purges": purges_attack(port, world["attacker"]["token"]),
    }
    results: dict[str, Any] = {}
    try:
        results["alone"] = {"victim": victim.run(seconds), "rss_mb": rss_bytes(proc) / 2**20}
        for name, body in scenarios.items():
            rss_start, anon_start = rss_bytes(proc), rss_bytes(proc, "RssAnon")
            with Background(name, body) as attack:
                measured = victim.run(seconds)
            time.sleep(3.0)  # the server settles: queued attack work drains
            rss_end, anon_end = rss_bytes(proc), rss_bytes(proc, "RssAnon")
            results[name] = {
                "victim": measured,
                "attack": attack.result,
                "rss_start_mb": round(rss_start / 2**20, 1),
                "rss_end_mb": round(rss_end / 2**20, 1),
                "anon_start_mb": round(anon_start / 2**20, 1),
                "anon_end_mb": round(anon_end / 2**20, 1),
                "rss_ok": rss_end <= rss_start * (1 + RSS_SLACK),
                "anon_ok": anon_end <= anon_start * (1 + RSS_SLACK),
                "victim_ok": measured["p99_ms"] <= VICTIM_P99_MS and measured["over_1s"] == 0,
            }
            print(name, json.dumps(results[name]), flush=True)
    finally:
        proc.stop()
    bound = CYPHER_TIMEOUT_MS + 100
    cypher = results.get("cypher", {}).get("attack", {})
    results["cypher_bound_ok"] = (
        all(q["max_ms"] <= bound for q in cypher.values()) if cypher else False
    )
    write_json(
        "noisy_neighbour",
        {
            "seconds_per_scenario": seconds,
            "targets": {
                "victim_p99_ms": VICTIM_P99_MS,
                "victim_max_ms": VICTIM_MAX_MS,
                "cypher_bound_ms": bound,
                "rss_slack": RSS_SLACK,
            },
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
