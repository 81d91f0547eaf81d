"""The cluster's cost: HAProxy in front of the nodes against one node asked directly, same run.

`deploy/local-cluster up` starts PostgreSQL, three nodes and HAProxy on loopback; six tenants
are made through the proxy (least-loaded placement: two per node), each with a key and a
prefill of events. Then:

1. proxy cost per request: one tenant's `GET /v1/whoami`, then recalls, then appends, one at
   a time, each sent through a keep-alive connection to the proxy and through one to the
   tenant's own node (which goes first alternates, so drift in the machine's load falls on
   both); the figure is the difference of the medians, and the median of the pairs'
   differences (target: at most 0.3 ms at p50; whoami is the cleanest, its own cost is least);
2. aggregate throughput: closed-loop clients sending appends and recalls of every tenant
   through the proxy (three nodes), against the same clients sending those of one node's
   tenants to that node directly (one node).

On a 2-core machine the second figure cannot show scaling: three nodes, HAProxy and the load
generator share two cores, so it shows what the proxy path costs when the CPU is the limit,
not what three machines would serve.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from common import http_request, load, median, parse_args, percentile, write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "deploy" / "local-cluster"
DIM = 64
TENANTS = 6
PREFILL = 200
KINDS = ("whoami", "recall", "append")


def _vector(i: int) -> list[float]:
    return [((i * 7 + j) % 13) / 13 for j in range(DIM)]


def _requests(key: str, n: int, *, kinds: tuple[str, ...] = KINDS) -> list[bytes]:
    """Requests of one tenant, n of each kind, in turn, encoded once."""
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    made: dict[str, list[bytes]] = {kind: [] for kind in kinds}
    for i in range(n):
        append = {"kind": "note", "text": f"bench event {i} about orchids", "embedding": _vector(i)}
        recall = {"text": f"orchids {i % 50}", "embedding": _vector(i), "k": 5}
        if "whoami" in made:
            made["whoami"].append(http_request("GET", "/v1/whoami", b"", auth))
        if "recall" in made:
            body = json.dumps(recall).encode()
            made["recall"].append(http_request("POST", "/v1/memory/recall", body, auth))
        if "append" in made:
            body = json.dumps(append).encode()
            made["append"].append(http_request("POST", "/v1/memory/event", body, auth))
    return [r for group in zip(*made.values(), strict=True) for r in group]


def _blocks(key: str, n: int) -> list[bytes]:
    """The kinds one after the other: no recall waits for the keyword fold of an append."""
    return [r for kind in KINDS for r in _requests(key, n, kinds=(kind,))]


def _kind(request: bytes) -> str:
    head = request[:40]
    if b"/v1/memory/event" in head:
        return "append"
    return "recall" if b"/v1/memory/recall" in head else "whoami"


class Conn:
    """One keep-alive connection, one request at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def send(self, request: bytes) -> tuple[int, float]:
        """Send one request, read its answer: its status and how long it took."""
        started = time.perf_counter()
        self.sock.sendall(request)
        status = int(self.file.readline()[9:12])
        length = 0
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        self.file.read(length)
        return status, time.perf_counter() - started

    def close(self) -> None:
        """Close the connection."""
        self.file.close()
        self.sock.close()


def proxy_cost(proxy: int, node: int, requests: list[bytes]) -> dict[str, Any]:
    """Each request sent once through the proxy and once directly, alternating."""
    via, direct = Conn(proxy), Conn(node)
    times: dict[str, dict[str, list[float]]] = {
        kind: {"proxy": [], "direct": [], "pair": []} for kind in ("whoami", "append", "recall")
    }
    try:
        for i, request in enumerate(requests):
            kind = _kind(request)
            order = [("proxy", via), ("direct", direct)]
            if i % 2:
                order.reverse()
            took = {}
            for name, conn in order:
                status, secs = conn.send(request)
                if status not in (200, 201):
                    raise RuntimeError(f"{name} answered {status}")
                times[kind][name].append(secs)
                took[name] = secs
            times[kind]["pair"].append(took["proxy"] - took["direct"])
    finally:
        via.close()
        direct.close()
    out: dict[str, Any] = {}
    for kind, by in times.items():
        row = {
            f"{name}_{p}_ms": round(percentile(by[name], q) * 1000, 3)
            for name in ("proxy", "direct")
            for p, q in (("p50", 50), ("p99", 99))
        }
        row["cost_p50_ms"] = round((median(by["proxy"]) - median(by["direct"])) * 1000, 3)
        row["paired_cost_p50_ms"] = round(median(by["pair"]) * 1000, 3)
        row["n"] = len(by["proxy"])
        out[kind] = row
    return out


def main() -> int:
    """Start a local cluster, measure, stop it; the figures on stdout and in bench/out."""
    args = parse_args(__doc__.split("\n")[0])
    root = Path(tempfile.mkdtemp(prefix="memspine-bench-cluster-"))  # the postgres user's too
    os.chmod(root, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    env.update({"MEMSPINE_EMBEDDING_DIM": str(DIM), "MEMSPINE_LOG_LEVEL": "WARNING"})
    up = subprocess.run([str(CLUSTER), "up", str(root)], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        sys.stderr.write(up.stderr)
        return 1
    try:
        lines = dict(line.split("=", 1) for line in up.stdout.splitlines())
        state = json.loads((root / "cluster.json").read_text())
        proxy_port = int(lines["MEMSPINE_URL"].rsplit(":", 1)[1])
        admin = httpx.Client(
            base_url=lines["MEMSPINE_URL"],
            headers={"Authorization": f"Bearer {lines['MEMSPINE_ADMIN_KEY']}"},
            timeout=60,
        )
        keys: dict[str, str] = {}
        for i in range(TENANTS):
            tid = admin.post("/v1/admin/tenants", json={"name": f"bench-{i}"}).json()["tenant_id"]
            keys[tid] = admin.post(
                "/v1/admin/keys", json={"tenant_id": tid, "name": "bench"}
            ).json()["api_key"]
        placed = {
            t["tenant_id"]: t["node"] for t in admin.get("/v1/admin/tenants").json()["tenants"]
        }
        prefill = 50 if args.quick else PREFILL
        for key in keys.values():
            with httpx.Client(
                base_url=lines["MEMSPINE_URL"], headers={"Authorization": f"Bearer {key}"}
            ) as c:
                for j in range(prefill):
                    body = {"kind": "note", "text": f"prefill {j} orchids", "embedding": _vector(j)}
                    assert c.post("/v1/memory/event", json=body).status_code == 201
        first = next(iter(keys))
        node = placed[first]
        n = 100 if args.quick else 500
        cost = proxy_cost(proxy_port, state["ports"][node], _blocks(keys[first], n))
        seconds = 3.0 if args.quick else 10.0
        every = [r for key in keys.values() for r in _requests(key, 100)]
        one_node = [
            r for tid, key in keys.items() if placed[tid] == node for r in _requests(key, 100)
        ]
        clients = 16
        three = load(proxy_port, every, clients, warmup=1.0, seconds=seconds)
        one = load(state["ports"][node], one_node, clients, warmup=1.0, seconds=seconds)
        result = {
            "dim": DIM,
            "tenants": TENANTS,
            "placement": {
                n_: sum(1 for v in placed.values() if v == n_) for n_ in set(placed.values())
            },
            "load_average": os.getloadavg(),
            "proxy_cost": cost,
            "aggregate": {"three_nodes_via_proxy": three, "one_node_direct": one},
        }
        path = write_json("cluster", result, args.out)
        print(json.dumps(result, indent=2))
        print(f"written to {path}")
        admin.close()
    finally:
        subprocess.run([str(CLUSTER), "down", str(root)], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", str(root)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
