"""How long memspine-server takes from exec to its first answers: /health (and the CPU the
process used until then, which the machine's load does not change), the first /mcp, and the
first append and recall; plus where the import time goes (`python -X importtime`).

Each start is a fresh process on a fresh data directory in local mode. The first start is
not counted (it warms the page cache with the installed packages); the figures are medians of
the counted starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, free_port, median, scratch_dir, write_json

MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}
TOKEN = "bench-startup"


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def one_start(data_dir: Path, checkout: Path) -> dict[str, float]:
    """Seconds from exec to /health 200, then to the first /mcp answer, append and recall."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    env.update(
        {
            "MEMSPINE_BIND": f"127.0.0.1:{port}",
            "MEMSPINE_DATA_DIR": str(data_dir),
            "MEMSPINE_LOG_LEVEL": "WARNING",
        }
    )
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memspine.server"],
        env=env,
        cwd=checkout,  # -m imports memspine from the working directory first
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("memspine-server exited during start")
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
            if time.perf_counter() - start > 60:
                raise RuntimeError("no /health in 60 s")
        health = time.perf_counter() - start
        health_cpu = _cpu_seconds(proc.pid)
        mcp_headers = {**auth, "Accept": "application/json, text/event-stream"}
        status = _post(base + "/mcp", MCP_INIT, mcp_headers)
        if status != 200:
            raise RuntimeError(f"/mcp answered {status}")
        mcp = time.perf_counter() - start
        event = {"kind": "turn", "ts": 1791208939000000, "text": "bench start"}
        if _post(base + "/v1/memory/event", event, auth) != 201:
            raise RuntimeError("append failed")
        append = time.perf_counter() - start
        if _post(base + "/v1/memory/recall", {"text": "bench"}, auth) != 200:
            raise RuntimeError("recall failed")
        recall = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "health_s": health,
        "health_cpu_s": health_cpu,
        "first_mcp_s": mcp,
        "first_append_s": append,
        "first_recall_s": recall,
    }


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU the process has used so far: what the start costs, whatever the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def import_times(module: str, checkout: Path) -> dict[str, float]:
    """Cumulative import seconds of memspine's own modules and the heavy packages, largest first."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found: dict[str, float] = {}
    for line in out.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m is None:
            continue
        cumulative, depth, name = int(m.group(1)), len(m.group(2)), m.group(3)
        if depth <= 4 and cumulative >= 50_000:  # top levels over 50 ms
            found[name] = max(found.get(name, 0.0), cumulative / 1e6)
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    """Run the starts and write the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 starts per checkout, not 7")
    parser.add_argument("--out", type=Path, default=None, help="JSON output")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout (e.g. `git archive` of an older commit) started alternately "
        "with this one, as the baseline of the same run",
    )
    args = parser.parse_args()
    starts = 3 if args.quick else 7
    checkouts = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    root = scratch_dir("startup")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for n in range(starts + 1):  # alternated, so load drifts hit both alike
        for name, checkout in checkouts.items():
            run = one_start(root / f"{name}-{n}", checkout)
            if n > 0:  # the first start of each only warms the page cache
                runs[name].append(run)
    result: dict[str, Any] = {"starts": starts, "loadavg_before": _load()}
    for name, checkout in checkouts.items():
        counted = runs[name]
        result[name] = {
            "checkout": str(checkout),
            "medians": {k: round(median([r[k] for r in counted]), 3) for k in counted[0]},
            "runs": [{k: round(v, 3) for k, v in r.items()} for r in counted],
            # What a start imports before its first answer: the command, then the app.
            "imports_s": import_times("memspine.server, memspine.app", checkout),
        }
    result["loadavg_after"] = _load()
    path = write_json("startup", result, args.out)
    print(json.dumps({name: result[name]["medians"] for name in checkouts}))
    print(json.dumps({"loadavg": [result["loadavg_before"], result["loadavg_after"]]}))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
