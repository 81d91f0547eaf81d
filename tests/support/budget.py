"""How much a soak, fuzz or crash-loop test does: a share of it in `make test`, all of it in
`make test-long` (run by .ci/run after `make test`; docs/architecture.md, "How the suite holds
under load"). Such a test is marked `long`, so `make test-long` runs it again at its full size."""

from __future__ import annotations

import os

# Set by `make test-long`.
LONG = os.environ.get("MEMSPINE_TESTS_LONG") == "1"


def size(full: int, quick: int) -> int:
    """`full` rounds, examples or tenants under `make test-long`, `quick` under `make test`."""
    return full if LONG else quick
