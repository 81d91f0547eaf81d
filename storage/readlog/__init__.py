"""Who read which events: each tenant's read log, its one writer thread, retention and verify.

Records hold ids and keys, never event content (storage/readlog/format.py); the file lives in
the tenant's directory and goes with it.
"""

from __future__ import annotations

from storage.readlog.format import Read, ReadLogCorrupt
from storage.readlog.logfile import Found, Mark, first_ts, read_bytes, reads_of_events, records
from storage.readlog.verify import Verdict, verify
from storage.readlog.writer import (
    MAX_PENDING,
    MAX_PENDING_PER_TENANT,
    Backlogged,
    ReadLogWriter,
)

__all__ = [
    "MAX_PENDING",
    "MAX_PENDING_PER_TENANT",
    "Backlogged",
    "Found",
    "Mark",
    "Read",
    "ReadLogCorrupt",
    "ReadLogWriter",
    "Verdict",
    "first_ts",
    "read_bytes",
    "reads_of_events",
    "records",
    "verify",
]
