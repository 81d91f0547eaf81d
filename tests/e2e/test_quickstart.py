"""The pasteable sessions of the docs, run as a tester would run them, output compared.

Each page's ```console blocks are one shell session: `$ ` starts a command, indented lines
continue it, the other lines are what it prints. The commands run in order in one bash, from a
directory that has the checkout's `.venv` (as the checkout has), against a fresh
memspine-server started there the way `make run` starts it (its data in ./data). What is
compared is the output exactly, but for what the test normalises, and nothing else:

- the port: the pages say 7781, the test's server listens on a free port;
- random ids: UUIDv4 tenant ids and issued keys (`smk_live_...`) are renamed in order of first
  appearance on each side, so the same id must come back where the page repeats it (ids derived
  from an Idempotency-Key are UUIDv5 and compared as they are);
- in the server's start line: the data directory's path (the page shows /home/you/...).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from memspine.config import Settings, load_settings
from memspine.startline import embedder
from tests.support.servers import DIM_ENV, REPO, ServerProcess

PAGES = ["docs/quickstart.md", "docs/current-state.md"]
PORT = re.compile(r"\b(localhost|127\.0\.0\.1):7781\b")
RANDOM = re.compile(
    r"smk_live_[0-9A-Za-z]{12}(?:_[0-9A-Za-z]{38})?|"
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\b"
)
MARK = "::step-done::"


class Step(NamedTuple):
    """One command of a page and the lines the page shows it printing."""

    command: str
    expected: list[str]


def console_steps(page: str) -> list[Step]:
    """Every command of the page's console blocks, in order."""
    steps: list[Step] = []
    for block in re.findall(r"^```console\n(.*?)^```", page, re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append(Step(line[2:], []))
            elif steps and line.startswith("  ") and not steps[-1].expected:
                steps[-1] = Step(steps[-1].command + "\n" + line, [])
            elif steps:
                steps[-1].expected.append(line)
    return [Step(s.command, _trim(s.expected)) for s in steps]


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def rename_random(lines: list[str]) -> list[str]:
    """Random ids renamed <id1>, <id2>... in order of first appearance."""
    names: dict[str, str] = {}

    def name(m: re.Match[str]) -> str:
        return names.setdefault(m.group(0), f"<id{len(names) + 1}>")

    return [RANDOM.sub(name, line) for line in lines]


def at_port(text: str, port: int) -> str:
    """The text with the pages' port 7781 replaced by the test server's."""
    return PORT.sub(lambda m: f"{m.group(1)}:{port}", text)


def run_session(steps: list[Step], cwd: Path, port: int) -> list[list[str]]:
    """The commands in one bash, in order; what each printed (stdout and stderr, interleaved)."""
    script = "".join(f"{at_port(s.command, port)}\necho {MARK}\n" for s in steps)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSPINE_")}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc"],
        input=script,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stderr == "", done.stderr
    chunks = done.stdout.split(MARK + "\n")
    assert len(chunks) == len(steps) + 1, done.stdout
    return [_trim(chunk.splitlines()) for chunk in chunks[:-1]]


@pytest.mark.parametrize("path", PAGES)
def test_the_page_runs_as_shown(path: str, tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("jq") is None:
        pytest.skip("the pages use curl and jq")
    page = (REPO / path).read_text()
    steps = console_steps(page)
    assert len(steps) >= 5, f"{path} has no session to run"
    home = tmp_path / "checkout"
    home.mkdir()
    (home / ".venv").symlink_to(Path(sys.executable).parent.parent)
    # make run's dimension; no embedder, so that what recall answers does not depend on when
    # the background embedder got to an event (the start line's embedder: _check_start_line).
    server = ServerProcess(home / "data", {"MEMSPINE_EMBEDDING_DIM": "384"})
    server.start()
    try:
        got = run_session(steps, home, server.port)
    finally:
        server.stop()
    expected = rename_random([line for s in steps for line in [MARK, *s.expected]])
    actual = rename_random([line for out in got for line in [MARK, *out]])
    expected = [at_port(line, server.port) for line in expected]
    for step, want, have in zip(steps, _split(expected), _split(actual), strict=True):
        assert have == want, f"$ {step.command}"
    if path.endswith("quickstart.md"):
        _check_start_line(page, server, home / "data")


def _split(lines: list[str]) -> list[list[str]]:
    """Lines split at each MARK (one list per command)."""
    out: list[list[str]] = []
    for line in lines:
        if line == MARK:
            out.append([])
        else:
            out[-1].append(line)
    return out


def _check_start_line(page: str, server: ServerProcess, data_dir: Path) -> None:
    """The start line the page shows is the one the server logged, but for the data path."""
    shown = re.search(r"^```text\n(memspine-server .*? ready on .*?)\n```", page, re.M | re.S)
    assert shown is not None, "the quickstart shows the server's start line"
    logged = [
        line
        for line in server.log_path.read_text().splitlines()
        if '"logger":"memspine.server"' in line and " ready on " in line
    ]
    assert len(logged) == 1, logged
    msg = re.search(r'"msg":"(.*?)","', logged[0])
    assert msg is not None

    def normal(text: str) -> str:
        text = text.replace(str(data_dir.resolve()), "<data>").replace(
            "/home/you/memspine/data", "<data>"
        )
        return at_port(" ".join(text.split()), server.port)

    # The test's server runs without an embedder; `make run`'s has the default one, whose words
    # the page must show: the logged clause is swapped for what those settings make it say.
    made_by_make_run = embedder(load_settings({"MEMSPINE_DATA_DIR": str(data_dir)}))
    logged_line = msg.group(1).replace(embedder(server_settings(server)), made_by_make_run)
    assert "embedder: local" in logged_line
    assert normal(logged_line) == normal(shown.group(1))


def server_settings(server: ServerProcess) -> Settings:
    """The settings the test's server ran with, as it read them."""
    env = {"MEMSPINE_DATA_DIR": str(server.data_dir), **DIM_ENV, **server.extra_env}
    return load_settings(env)


def test_the_harness_reads_steps_and_renames_ids() -> None:
    page = (
        "text\n```console\n$ echo a \\\n    b\na b\n\n$ true\n```\n"
        "```sh\nnot run\n```\n```console\n$ x=1\n$ echo $x\n1\n```\n"
    )
    assert console_steps(page) == [
        Step("echo a \\\n    b", ["a b"]),
        Step("true", []),
        Step("x=1", []),
        Step("echo $x", ["1"]),
    ]
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    fixed = str(uuid.uuid5(uuid.NAMESPACE_URL, "x"))
    assert rename_random([f"{a} {b}", f"{a} {fixed}"]) == ["<id1> <id2>", f"<id1> {fixed}"]
