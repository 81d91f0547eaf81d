"""Tenants of real size for the memory budget's tests: built once, copied for each name."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from storage.model import NewEvent
from storage.tenants.tenant import Tenant

BIG_DIM = 384


BIG_EVENTS = 3000  # per tenant of the real server: a graph of several MB, as in production


BIG_TENANTS = 12


BUDGET = 40 << 20  # the real server's: room for about four of the big tenants


def build(root: Path, n: int, dim: int, seed: int = 7) -> Path:
    """A closed tenant at root with n events, each with text and a random embedding."""
    rng = np.random.default_rng(seed)
    tenant = Tenant.open(root.name, root, embedding_dim=dim)
    for lo in range(0, n, 500):
        rows = rng.standard_normal((min(500, n - lo), dim), dtype=np.float32)
        events = [
            NewEvent(kind="turn", ts=1_791_208_939_000_000 + lo + i, text=f"fact {lo + i} of {root.name}",
                     embedding=row.tolist())
            for i, row in enumerate(rows)
        ]  # fmt: skip
        tenant.submit_append(events).result(timeout=120)
    tenant.vectors.flush()
    tenant.close()
    return root


def copies(template: Path, data: Path, names: list[str]) -> None:
    """Copy a closed tenant's directory under each name."""
    for name in names:
        shutil.copytree(template, data / name)
