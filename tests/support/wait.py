"""Waiting on a condition: how a test lets background work (a commit, a close, an embedder, a
server's start) happen without guessing how long it takes (docs/architecture.md, "How the suite
holds under load")."""

from __future__ import annotations

import errno
import shutil
import time
from collections.abc import Callable
from pathlib import Path

# Long enough for a machine running the suite beside other work; a condition that holds returns
# at once, so a generous bound costs nothing when the code is right.
PATIENCE_SECS = 120.0


def wait_for(
    condition: Callable[[], object], what: str, secs: float = PATIENCE_SECS, every: float = 0.02
) -> bool:
    """Poll condition() until it is true; False if it still was not after secs (`what` names it
    for the caller's message)."""
    deadline = time.monotonic() + secs
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def wait_until(
    condition: Callable[[], object], what: str, secs: float = PATIENCE_SECS, every: float = 0.02
) -> None:
    """Poll condition() until it is true; fail the test with `what` if it never is within secs."""
    assert wait_for(condition, what, secs, every), f"{what}: not within {secs:g} s"


def remove_tree(path: Path) -> None:
    """Remove a directory a let-go keyword index used: its watcher thread may recreate a lock file
    until its next poll ends it, so a removal that finds the directory refilled tries again."""

    def removed() -> bool:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
            return False
        return True

    wait_until(removed, f"{path.name} removed")
