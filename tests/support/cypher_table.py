"""The Cypher case table (tests/support/cypher_cases.txt), read once for the parser and engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CASES = Path(__file__).resolve().parent / "cypher_cases.txt"


def table(*kinds: str) -> list[Any]:
    """Pytest params (query, kind, expected) for the table's lines of the given kinds."""
    cases = []
    for number, line in enumerate(CASES.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        query, _, outcome = line.rpartition(" => ")
        kind, _, expected = outcome.partition(" ")
        if kind in kinds:
            cases.append(pytest.param(query.strip(), kind, expected, id=f"line{number}"))
    return cases
