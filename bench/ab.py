"""A/B of two checkouts at request granularity: appends and fused recalls, alternating.

Two memspine-servers run side by side, each from its own checkout (`--base`, `--new`: a
directory holding memspine/ and storage/, e.g. a `git worktree add --detach` of main), each on
its own data. One client sends every request to both, in alternating order, so a neighbour's
load on a shared machine falls on both alike; runs of a few seconds each (bench/append.py,
bench/recall.py) taken one after the other do not have that property. Reported per server:
its CPU per request (from /proc, over the whole phase) and the median and p99 latency.

    python bench/ab.py --base ../main-copy --new . --requests 1500 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, SUPPORT_WORDS, free_port, machine, scratch_dir

DIM = 384
TEXT_WORDS = 30


def start(tree: Path, data: Path) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """memspine-server from `tree` (local mode) and a client of it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    env.update(
        PYTHONPATH=str(tree),
        MEMSPINE_BIND=f"127.0.0.1:{port}",
        MEMSPINE_DATA_DIR=str(data),
        MEMSPINE_LOG_LEVEL="WARNING",
        MEMSPINE_EMBEDDING_DIM=str(DIM),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "memspine.server"],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, httpx.Client(base_url=url, headers={"Authorization": "Bearer ab"})
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server of {tree} did not start")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bodies(rnd: random.Random, n: int) -> dict[str, list[dict[str, Any]]]:
    """N append bodies and n fused recall bodies."""

    def vector() -> list[float]:
        return [rnd.random() for _ in range(DIM)]

    def words(k: int) -> str:
        return " ".join(rnd.choice(SUPPORT_WORDS) for _ in range(k))

    appends = [
        {
            "kind": "turn",
            "ts": 1_790_000_000_000_000 + i,
            "text": words(TEXT_WORDS),
            "embedding": vector(),
            "properties": {"speaker": "agent"},
        }
        for i in range(n)
    ]
    recalls = [{"text": words(3), "embedding": vector(), "k": 10} for _ in range(n)]
    return {"append": appends, "recall": recalls}


def phase(servers: dict[str, Any], path: str, work: list[dict[str, Any]]) -> dict[str, Any]:
    """Every body to both servers, alternating which goes first."""
    used = dict.fromkeys(servers, 0.0)
    lat: dict[str, list[float]] = {name: [] for name in servers}
    names = list(servers)
    for j, body in enumerate(work):
        for name in names if j % 2 else reversed(names):
            proc, client = servers[name]
            c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            r = client.post(path, json=body)
            lat[name].append(time.perf_counter() - t0)
            used[name] += cpu_seconds(proc.pid) - c0
            if r.status_code not in (200, 201):
                raise SystemExit(f"{name} {path}: {r.status_code} {r.text[:200]}")
    out = {}
    for name in servers:
        ordered = sorted(lat[name])
        out[name] = {
            "cpu_ms_per_req": round(used[name] / len(work) * 1000, 3),
            "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
            "p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 3),
        }
    return out


def main() -> None:
    """Run the rounds and print the medians, base against new."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout A")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--requests", type=int, default=1500, help="per phase and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT / "ab.json")
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        root = scratch_dir("ab")
        servers = {
            "base": start(args.base.resolve(), root / "base"),
            "new": start(args.new.resolve(), root / "new"),
        }
        try:
            work = bodies(random.Random(r), args.requests)
            rounds.append(
                {
                    "append": phase(servers, "/v1/memory/event", work["append"]),
                    "recall": phase(servers, "/v1/memory/recall", work["recall"]),
                    "load": os.getloadavg()[0],
                }
            )
        finally:
            for proc, client in servers.values():
                client.close()
                proc.terminate()
                proc.wait(timeout=30)
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(rounds[-1]))
    # Rounds differ by the machine's load more than the two servers differ within a round:
    # the change is the median of each round's own ratio, not a ratio of medians.
    summary: dict[str, Any] = {}
    for op in ("append", "recall"):
        for measure in ("cpu_ms_per_req", "p50_ms", "p99_ms"):
            pairs = [(x[op]["base"][measure], x[op]["new"][measure]) for x in rounds]
            summary[f"{op} {measure}"] = {
                "base": statistics.median(b for b, _ in pairs),
                "new": statistics.median(n for _, n in pairs),
                "change_pct": round(100 * statistics.median(n / b - 1 for b, n in pairs), 1),
            }
    print(json.dumps(summary, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"bench": "ab", "machine": machine(), "rounds": rounds, "summary": summary}
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
