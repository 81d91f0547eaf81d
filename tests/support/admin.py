"""memspine-admin as a subprocess against a data directory or a server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


class Admin:
    """Runs memspine-admin with MEMSPINE_DATA_DIR pointing at one data directory: as its own
    process, or (in_process) its main() in this one with stdin, stdout and stderr captured."""

    def __init__(self, data_dir: Path, cwd: Path, *, in_process: bool = False) -> None:
        self.data_dir = data_dir
        self.cwd = cwd
        self.in_process = in_process

    def run(self, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Any:
        extra = {"MEMSPINE_DATA_DIR": str(self.data_dir), **(env or {})}
        if self.in_process:
            return self._main(list(args), stdin, extra)
        return subprocess.run(
            [*COMMAND, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **extra},
            cwd=self.cwd,
            timeout=60,
        )

    def _main(self, args: list[str], stdin: str, env: dict[str, str]) -> Any:
        """What the process would have done, without its seconds of start: the exit status
        and what it wrote. An exception escapes (a real process would print a traceback)."""
        from memspine_admin.cli import main

        saved = (sys.stdin, sys.stdout, sys.stderr, dict(os.environ), os.getcwd())
        out, err = io.StringIO(), io.StringIO()
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
        os.environ.update(env)
        os.chdir(self.cwd)
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 0
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved[:3]
            os.environ.clear()
            os.environ.update(saved[3])
            os.chdir(saved[4])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    def ok(self, *args: str, stdin: str = "") -> str:
        result = self.run(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return str(result.stdout)

    def json(self, *args: str, stdin: str = "") -> Any:
        return json.loads(self.ok(*args, "--json", stdin=stdin))

    def error(self, *args: str) -> dict[str, str]:
        result = self.run(*args, "--json")
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stdout == ""
        error: dict[str, str] = json.loads(result.stderr)
        return error


SCRIPT = Path(sys.executable).parent / "memspine-admin"


COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "memspine_admin.cli"]
