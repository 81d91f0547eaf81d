"""Who read which events: each tenant's read log, its one writer thread, retention and verify.

Records hold ids and keys, never event content (storage/readlog/format.py); the file lives in
the tenant's directory and goes with it.
"""

from __future__ import annotations

from storage.readlog.format import (
    IDS_PER_RECORD,
    MAX_PURPOSE_BYTES,
    PURPOSE_HEADER,
    Read,
    ReadLogCorrupt,
    check_purpose_text,
    records_of,
)
from storage.readlog.journal import JOURNAL as READS_JOURNAL
from storage.readlog.logfile import (
    Found,
    Mark,
    append_beside,
    await_carried,
    awaits_carried,
    carried_in,
    first_ts,
    read_bytes,
    reads_of_events,
    reads_path,
    records,
    whole_bytes,
)
from storage.readlog.verify import Verdict, verify
from storage.readlog.writer import (
    MAX_PENDING,
    MAX_PENDING_PER_TENANT,
    Backlogged,
    ReadLogWriter,
)

__all__ = [
    "IDS_PER_RECORD",
    "MAX_PENDING",
    "MAX_PENDING_PER_TENANT",
    "MAX_PURPOSE_BYTES",
    "PURPOSE_HEADER",
    "READS_JOURNAL",
    "Backlogged",
    "Found",
    "Mark",
    "Read",
    "ReadLogCorrupt",
    "ReadLogWriter",
    "Verdict",
    "append_beside",
    "await_carried",
    "awaits_carried",
    "carried_in",
    "check_purpose_text",
    "first_ts",
    "read_bytes",
    "reads_of_events",
    "reads_path",
    "records",
    "records_of",
    "verify",
    "whole_bytes",
]
