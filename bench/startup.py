"""How long memspine-server takes from exec to its first answers: /health, the first /mcp, and
the first append and recall; plus where the import time goes (`python -X importtime`).

Each start is a fresh process on a fresh data directory in local mode. The first start is
not counted (it warms the page cache with the installed packages); the figures are medians of
the counted starts.
"""

from __future__ import annotations

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

from common import REPO, free_port, median, parse_args, scratch_dir, write_json

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


def one_start(data_dir: Path) -> dict[str, float]:
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
        cwd=REPO,
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
    return {"health_s": health, "first_mcp_s": mcp, "first_append_s": append, "first_recall_s": recall}


def import_times(module: str) -> dict[str, float]:
    """Cumulative import seconds of memspine's own modules and the heavy packages, largest first."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=REPO,
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


def main() -> int:
    """Run the starts and write the medians."""
    args = parse_args(__doc__.splitlines()[0])
    starts = 3 if args.quick else 7
    root = scratch_dir("startup")
    runs = []
    for n in range(starts + 1):
        runs.append(one_start(root / f"data-{n}"))
    counted = runs[1:]
    medians = {key: round(median([r[key] for r in counted]), 3) for key in counted[0]}
    load = os.getloadavg()
    result = {
        "starts": starts,
        "medians": medians,
        "runs": [{k: round(v, 3) for k, v in r.items()} for r in counted],
        "loadavg": [round(x, 2) for x in load],
        "imports_memspine_server_s": import_times("memspine.server"),
    }
    path = write_json("startup", result, args.out)
    print(json.dumps({"medians": medians, "loadavg": result["loadavg"]}))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
