"""An MCP-only tenant the way an agent host runs it: `memspine mcp` over stdio on a data
directory with the default embedder (`local`, the model in a child process, docs/embeddings.md).
Notes sent as text only are found by meaning; the model's process ends with the bridge, whether
the host closes it or kills it, and no acknowledged note is lost by the kill."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from tests.support.mcp_calls import AWAITING_VECTORS, COMMAND, call, recall_embedded, stdio
from tests.support.wait import wait_until

NOTES = [
    "Lena wants status notes as three bullets, no tables.",
    "The parcel for number 16 was signed for by a neighbour.",
]
QUESTION = "how does Lena want status reports formatted?"  # no word in common with NOTES[0]
CHILD = "storage.embedders.child"


def cmdline(pid: int) -> list[str]:
    """A process's arguments, [] once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name, None once pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie counts as gone: it has ended, only its parent has not waited)."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def pids() -> list[int]:
    """Every process id in /proc."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def model_children(pid: int) -> list[int]:
    """The model processes pid started."""
    return [
        p for p in pids() if (f := stat(p)) and int(f[1]) == pid and CHILD in " ".join(cmdline(p))
    ]


def bridge_of(data_dir: Path) -> int:
    """The pid of the `memspine mcp` serving data_dir (tests run side by side: found by its dir)."""
    found = [p for p in pids() if str(data_dir) in cmdline(p) and "mcp" in cmdline(p)]
    assert len(found) == 1, found
    return found[0]


def gone_within(pid: int, secs: float) -> bool:
    """Wait up to secs for pid to end."""
    deadline = time.monotonic() + secs
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_text_only_notes_are_found_by_meaning_and_the_model_ends_with_the_bridge(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    params = stdio(["--data-dir", str(data_dir), "--tenant", "agent-1"])  # no MEMSPINE_* at all
    children: list[int] = []

    async def main() -> None:
        async with Client(params) as c:
            for text in NOTES:
                await call(c, "memory_append", {"kind": "note", "text": text})
            out = await recall_embedded(c, {"text": QUESTION, "k": 1})
            assert [h["text"] for h in out["hits"]] == [NOTES[0]]
            children.extend(model_children(bridge_of(data_dir)))

    anyio.run(main)
    assert len(children) == 1, children
    assert gone_within(children[0], 15), "the model's process outlived the bridge"


def rpc(proc: subprocess.Popen[str], message: dict[str, Any]) -> dict[str, Any] | None:
    """Send one JSON-RPC message over the bridge's stdin; the answer when it has an id."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()
    if "id" not in message:
        return None
    while True:
        answer: dict[str, Any] = json.loads(proc.stdout.readline())
        if answer.get("id") == message["id"]:
            return answer


def tool(proc: subprocess.Popen[str], n: int, name: str, arguments: dict[str, Any]) -> None:
    """Call one tool over the bridge's stdin and check that it answered without an error."""
    params = {"name": name, "arguments": arguments}
    answer = rpc(proc, {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params})
    assert answer is not None and not answer["result"].get("isError"), answer


def test_a_killed_bridge_takes_its_idle_model_along_and_loses_no_note(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    proc = subprocess.Popen(
        [*COMMAND, "mcp", "--data-dir", str(data_dir), "--tenant", "agent-1"],
        env=clean,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
        hello["clientInfo"] = {"name": "host", "version": "1"}
        rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        for n, text in enumerate(NOTES, start=2):
            tool(proc, n, "memory_append", {"kind": "note", "text": text})
        # Every note has its vector: the model's process now waits on its stdin, idle.
        ids = itertools.count(9)

        def embedded() -> bool:
            params = {
                "name": "memory_recall",
                "arguments": {"text": QUESTION, "wait_for_vectors": True},
            }
            answer = rpc(
                proc, {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call", "params": params}
            )
            assert answer is not None
            if answer["result"].get("isError"):
                assert AWAITING_VECTORS in json.dumps(answer), answer
                return False
            return True

        wait_until(embedded, "every note has its vector")
        children = model_children(proc.pid)
        assert len(children) == 1, children
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert gone_within(children[0], 15), "the model's process outlived a killed bridge"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    async def main() -> None:  # the host starts the bridge again: both notes, found by meaning
        params = stdio(["--data-dir", str(data_dir), "--tenant", "agent-1"])
        async with Client(params) as c:
            out = await recall_embedded(c, {"text": QUESTION, "k": 1})
            assert [h["text"] for h in out["hits"]] == [NOTES[0]]
            listed = await call(c, "memory_recall", {"text": "parcel neighbour", "k": 5})
            assert NOTES[1] in [h["text"] for h in listed["hits"]]

    anyio.run(main)
