"""`make bench`: run every benchmark script in bench/ and collect their JSON in bench/out/.

A benchmark script is any bench/*.py with an `if __name__ == "__main__":` guard (helpers such
as common.py have none). Each is run in its own process as
`python bench/<name>.py [--quick] --out bench/out/<name>.json` and must write that file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
MAIN_GUARD = 'if __name__ == "__main__":'


def scripts() -> list[Path]:
    """The benchmark scripts, in name order."""
    found = []
    for path in sorted(BENCH.glob("*.py")):
        if path.name == Path(__file__).name:
            continue
        if MAIN_GUARD in path.read_text():
            found.append(path)
    return found


def run(path: Path, quick: bool, timeout: float) -> tuple[int, float, Path]:
    """Run one script; returns its exit status (124 on timeout), seconds taken and JSON path."""
    out = OUT / f"{path.stem}.json"
    argv = [sys.executable, str(path), "--out", str(out)] + (["--quick"] if quick else [])
    start = time.monotonic()
    try:
        status = subprocess.run(argv, cwd=BENCH.parent, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        status = 124
    if status == 0 and not out.exists():
        print(f"{path.name} exited 0 but wrote no {out.name}", file=sys.stderr)
        status = 1
    return status, time.monotonic() - start, out


def main(argv: list[str] | None = None) -> int:
    """Run the selected scripts one after another (never two at once: they would share the CPUs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per script")
    parser.add_argument("names", nargs="*", help="only these scripts (by name, without .py)")
    args = parser.parse_args(argv)
    selected = [p for p in scripts() if not args.names or p.stem in args.names]
    unknown = set(args.names) - {p.stem for p in scripts()}
    if unknown:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))}")
    OUT.mkdir(parents=True, exist_ok=True)
    failed = []
    for path in selected:
        print(f"== {path.name}", flush=True)
        status, seconds, out = run(path, args.quick, args.timeout)
        print(f"== {path.name}: exit {status} in {seconds:.0f} s -> {out}", flush=True)
        if status != 0:
            failed.append(path.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
