"""The names of the files in a tenant's directory (one directory per tenant under the data
directory): its three stores, and the temp files a save leaves if a crash interrupts it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from storage.fsync import TMP_SUFFIX

LOG = "events"  # the event log's LMDB environment (a directory; storage/log/layout.py)
KEYWORD = "keyword"  # the Tantivy keyword index (a directory)
VECTORS = "vectors.hnsw"  # the saved HNSW graph (storage/index/vecfile.py)
LIVE_SUFFIX = ".live.npy"  # beside a saved graph, its live labels (storage/index/vecfile.py)
VECTORS_LIVE = VECTORS + LIVE_SUFFIX
READS = "reads.log"  # who read which events (storage/readlog/format.py); never event content
# A move's target: the read records of the node the tenant left are still to be handed over
# (memspine/readmove.py); until then `audit verify` says so rather than judge the chain.
READS_AWAITED = "reads.awaited"
STORES = (LOG, KEYWORD, VECTORS, VECTORS_LIVE)
# Temp files of a vector save a crash interrupted: old vectors, possibly of purged events.
STALE = (VECTORS + TMP_SUFFIX, VECTORS_LIVE + TMP_SUFFIX)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under path (a file's own size if path is one; 0 if it is missing)."""
    with contextlib.suppress(FileNotFoundError):
        if not path.is_dir():
            return path.stat().st_size
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # a Tantivy file merged away meanwhile
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total
