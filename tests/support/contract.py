"""The schemathesis command line and its verdict, shared by the in-process contract test
(tests/server/test_contract.py) and its pass over a socket (tests/e2e/test_contract_e2e.py)."""

from __future__ import annotations

import re
from pathlib import Path

ADMIN_KEY = "contract-admin-key-5d0c9e1f"


HERE = Path(__file__).resolve().parent


CONFIG = HERE / "schemathesis.toml"


DOCUMENT = "/schema/openapi.json"


# schemathesis's phases for each key. The coverage phase's boundary values are the same bodies
# for every key; the read-only key's writes are refused (403) before any body is read
# (memspine/pipeline.py checks the scope first) and its reads are the read-write key's, so its
# coverage phase (a third of the file's CPU) would test nothing the read-write run has not.
ALL_PHASES = "examples,coverage,fuzzing,stateful"


def cli_args(location: str, token: str, max_examples: int, phases: str = ALL_PHASES) -> list[str]:
    """The schemathesis command line of one run with every check on, as `token`."""
    return [
        "--config-file",
        str(CONFIG),
        "run",
        location,
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        str(max_examples),
        "--phases",
        phases,
        "--workers",
        "1",
    ]


def check_run(status: int, output: str) -> None:
    """One run passed: exit status 0, and it generated requests that all passed."""
    tail = output[output.find("FAILURES") :] if "FAILURES" in output else output
    assert status == 0, tail[-12000:]
    assert re.search(r"\d+ generated, \d+ passed", output), output[-3000:]
