"""How long the test suite takes, and where the time goes.

Runs what `make test` runs, each step timed: `ruff check`, `mypy`, then pytest over the suite
(or `--paths`, e.g. `tests/storage tests/server` for `make test-fast`) with a JUnit report.
Reports the wall time of each step, the CPU time of pytest and every process it started
(servers, CLIs: children's rusage), the load average before and after (the machine may be
shared), the number of tests, and the sum of the per-test durations overall, per part of the
layout (tests/storage, tests/server, tests/e2e) and for the slowest files. The sum of durations
and the CPU time move less with the machine's load than the wall time does.

`--split` runs pytest as the measured checkout's `make test` does: each pytest command that
`make -n test` prints there (e.g. tests/storage and tests/server on one pytest-xdist worker per
core beside tests/e2e on as many, then the `timing` tests alone), in order, each a step, with
its own arguments; the commands of a `make -jN` line side by side, as make runs them. `--tree
DIR` measures another checkout (say `git archive main | tar -x -C DIR`) with this checkout's
virtualenv: DIR goes first on PYTHONPATH, so its packages, tests and the servers they start
are DIR's own. `--quick` runs tests/storage only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def children_cpu() -> float:
    """User plus system seconds of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], tree: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run one step to completion; its wall and CPU seconds and exit status."""
    cpu0, wall0 = children_cpu(), time.perf_counter()
    with open(log, "ab") as out:
        rc = subprocess.run(cmd, cwd=tree, env=env, stdout=out, stderr=out, check=False).returncode
    return {
        "cmd": " ".join(c for c in cmd if not c.startswith("--junitxml")),
        "wall_s": round(time.perf_counter() - wall0, 1),
        "cpu_s": round(children_cpu() - cpu0, 1),
        "rc": rc,
    }


def make_test_runs(tree: Path) -> list[list[list[str]]]:
    """The pytest commands `make test` runs in `tree`, from `make -n test`: a list of groups, the
    commands of one group run side by side (a `make -jN` of N targets), the groups one by one."""
    printed = subprocess.run(
        ["make", "-n", "-s", "-C", str(tree), "test", f"VENV={VENV_BIN.parent}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    groups: list[list[list[str]]] = []
    together = 0  # commands still to come of the last `make -jN` line (one a target)
    for line in printed.splitlines():
        words = shlex.split(line)
        if words and Path(words[0]).name == "make" and any(w.startswith("-j") for w in words):
            together = sum(1 for w in words[1:] if not w.startswith("-") and "=" not in w)
            groups.append([])
            continue
        at = next((i for i, w in enumerate(words) if Path(w).name == "pytest"), None)
        if at is None:
            together -= 1 if together and words else 0  # e.g. mypy beside the tests: timed apart
            continue
        run = words[at + 1 :]
        # make test's own -q and -p no:cacheprovider: main() gives every pytest those
        for i in range(len(run) - 1, -1, -1):
            if run[i] == "-q":
                del run[i]
            elif run[i : i + 2] == ["-p", "no:cacheprovider"]:
                del run[i : i + 2]
        if together:
            groups[-1].append(run)
            together -= 1
        else:
            groups.append([run])
    if not any(groups):
        raise SystemExit(f"`make -n test` in {tree} runs no pytest")
    return [g for g in groups if g]


def timed_together(
    cmds: list[list[str]], tree: Path, env: dict[str, str], logs: list[Path]
) -> list[dict[str, Any]]:
    """Run steps side by side to completion; each one's wall and CPU seconds and exit status."""
    wall0 = time.perf_counter()
    outs = [open(log, "ab") for log in logs]  # noqa: SIM115  (closed below, after the waits)
    procs = [
        subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=out)
        for cmd, out in zip(cmds, outs, strict=True)
    ]
    waiting = {proc.pid: i for i, proc in enumerate(procs)}
    steps: list[dict[str, Any]] = [{} for _ in cmds]
    while waiting:
        # wait4: each step's own CPU time (the children's rusage would sum the steps running)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in waiting:
            continue
        i = waiting.pop(pid)
        procs[i].returncode = os.waitstatus_to_exitcode(status)
        steps[i] = {
            "cmd": " ".join(c for c in cmds[i] if not c.startswith("--junitxml")),
            "wall_s": round(time.perf_counter() - wall0, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "rc": procs[i].returncode,
        }
    for out in outs:
        out.close()
    return steps


def part(classname: str) -> tuple[str, str]:
    """(part of the layout, file) of a JUnit test case's class name, e.g. tests.e2e.test_x."""
    dotted = [p for p in classname.split(".") if not p[:1].isupper()]
    parts = dotted[1:] if dotted and dotted[0] == "tests" else dotted
    where = parts[0] if len(parts) > 1 else "tests"
    return where, "/".join(parts)


def durations(junits: list[Path]) -> dict[str, Any]:
    """Test count and summed durations overall, per part and for the 15 slowest files."""
    by_part: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_file: dict[str, float] = defaultdict(float)
    outcomes: dict[str, int] = defaultdict(int)
    cases = [case for junit in junits for case in ET.parse(junit).getroot().iter("testcase")]
    for case in cases:
        where, name = part(case.get("classname", ""))
        seconds = float(case.get("time", 0))
        by_part[where][0] += seconds
        by_part[where][1] += 1
        by_file[name] += seconds
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[outcome] += 1
    slowest = sorted(by_file.items(), key=lambda kv: -kv[1])[:15]
    return {
        "tests": sum(n for _, n in by_part.values()),
        "outcomes": dict(outcomes),
        "sum_s": round(sum(s for s, _ in by_part.values()), 1),
        "parts": {k: {"sum_s": round(s, 1), "tests": n} for k, (s, n) in sorted(by_part.items())},
        "slowest_files": {k: round(v, 1) for k, v in slowest},
    }


def main() -> None:
    """Time the suite as asked and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tests/storage only, no ruff or mypy")
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout to measure")
    ap.add_argument("--paths", nargs="*", default=None, help="pytest paths (default: all)")
    ap.add_argument("--no-lint", action="store_true", help="skip ruff and mypy")
    ap.add_argument(
        "--split", action="store_true", help="each pytest command of the tree's make test"
    )
    ap.add_argument(
        "--markers", default="not cluster", help="pytest -m (make test's default; not with --split)"
    )
    ap.add_argument(
        "--env-as-is",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE if set (make test unsets it; a Makefile before did not)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tree = args.tree.resolve()
    env = dict(os.environ)
    if not args.env_as_is:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree != REPO:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(":")
    paths = ["tests/storage"] if args.quick else (args.paths or [])
    work = Path(tempfile.mkdtemp(prefix="suite-"))
    log = work / "log.txt"
    result: dict[str, Any] = {"tree": str(tree), "split": args.split, "load_before": load()}
    result["bytecode"] = "PYTHONDONTWRITEBYTECODE" not in env
    steps = []
    if not (args.quick or args.no_lint):
        packages = ["memspine", "memspine_admin", "storage"]
        steps.append(
            timed([str(VENV_BIN / "ruff"), "check", *packages, "tests", "bench"], tree, env, log)
        )
        steps.append(timed([str(VENV_BIN / "mypy"), *packages], tree, env, log))
    pytest = [str(VENV_BIN / "pytest"), "-q", "-p", "no:cacheprovider"]
    groups = [[["-m", args.markers, *paths]]]
    if args.split:
        groups = make_test_runs(tree)
    junits: list[Path] = []
    walls = [s["wall_s"] for s in steps]
    for group in groups:
        cmds = []
        for run in group:
            junits.append(work / f"junit{len(junits)}.xml")
            cmds.append([*pytest, f"--junitxml={junits[-1]}", *run])
        if len(cmds) == 1:
            steps.append(timed(cmds[0], tree, env, log))
            walls.append(steps[-1]["wall_s"])
            continue
        # side by side, as make -jN runs them: each its own log, appended to the log after
        logs = [work / f"log{len(steps) + i}.txt" for i in range(len(cmds))]
        together = timed_together(cmds, tree, env, logs)
        for step in together:
            step["together"] = True
        steps.extend(together)
        walls.append(max(s["wall_s"] for s in together))
        with open(log, "ab") as out:
            for part_log in logs:
                out.write(part_log.read_bytes())
    result["steps"] = steps
    result["wall_s"] = round(sum(walls), 1)
    result["load_after"] = load()
    result |= durations(junits)
    result["log"] = str(log)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
