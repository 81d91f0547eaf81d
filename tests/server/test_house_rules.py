"""The checks a commit gets before it is made are the ones `make test` runs first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def make_target(name: str) -> tuple[list[str], list[str]]:
    """A Makefile target's prerequisites and recipe lines."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, f"no {name} target"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_pre_commit_runs_make_lint_and_typecheck_and_make_test_runs_them_first() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [hook["entry"] for hook in hooks] == ["make lint", "make typecheck"]
    assert all(hook["pass_filenames"] is False for hook in hooks)  # the whole tree, as make does
    needs, recipe = make_target("test")
    # lint before anything; typecheck before the tests or beside them, on the recipe's first line
    assert "lint" in needs
    assert "typecheck" in needs or "typecheck" in recipe[0].split(), recipe[:1]
    _, lint = make_target("lint")
    assert any("ruff check" in line for line in lint)
    assert any("ruff format --check" in line for line in lint)
    _, typecheck = make_target("typecheck")
    assert any("mypy" in line for line in typecheck)


def test_mypy_is_strict_and_finds_a_missing_first_party_module(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from storage.no_such_module import nothing\n\n\ndef f(x):\n    return x\n")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(probe)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 1, run.stdout
    assert "storage.no_such_module" in run.stdout  # an import of a module that is gone
    assert "Function is missing a type annotation" in run.stdout  # strict
