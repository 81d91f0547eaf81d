"""Verifying a tenant's read chain against the marks the control plane keeps.

The file alone proves little (whoever edits it can recompute every link), so a verify takes
the last head and the last retention cut the control plane recorded: the chain must pass
through both. An edited, removed or reordered record breaks the link of the record after it
(or, for the last ones, the head); records dropped from the front without a recorded cut
leave the file starting after the cut; records removed from the end leave it shorter than
the head. Records written after the last head was recorded are checked by their links only.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from storage.readlog.format import (
    HEADER_BYTES,
    LINK_BYTES,
    ReadLogCorrupt,
    chain,
    decode_body,
    decode_header,
    frames,
)
from storage.readlog.logfile import Mark, reads_path


class Verdict(NamedTuple):
    """A verify's outcome: intact or not, the records checked, the seq of the first bad
    record (None when intact) and a sentence saying what is wrong."""

    ok: bool
    checked: int
    bad_seq: int | None
    detail: str


def verify(root: Path, head: Mark | None, cut: Mark | None) -> Verdict:
    """Check a tenant's read log: every record's link and shape, and the marks given."""
    try:
        buf = reads_path(root).read_bytes()
    except FileNotFoundError:
        if head is not None and head.seq > (cut.seq if cut is not None else 0):
            return Verdict(
                False, 0, 1, f"the read log is missing; records up to {head.seq} were recorded"
            )
        return Verdict(True, 0, None, "no reads recorded")
    try:
        header = decode_header(buf)
    except ReadLogCorrupt as exc:
        return Verdict(False, 0, 1, f"the read log's header is damaged: {exc}")
    seq, value, ts = header.base_seq, header.base_hash, header.base_ts
    if cut is not None and seq > cut.seq:
        return Verdict(
            False,
            0,
            cut.seq + 1,
            f"records {cut.seq + 1} to {seq} were removed without a recorded cut",
        )
    if cut is None and seq > 0:
        return Verdict(False, 0, 1, f"records 1 to {seq} were removed without a recorded cut")
    marks = {m.seq: m.hash for m in (cut, head) if m is not None and m.seq >= seq}
    if seq in marks and marks[seq] != value:
        return Verdict(
            False, 0, seq + 1, f"the chain's start does not match the recorded cut at record {seq}"
        )
    checked = 0
    end = HEADER_BYTES
    for f in frames(buf, HEADER_BYTES, header.base_seq):
        if f.body[:LINK_BYTES] != value[:LINK_BYTES]:
            return Verdict(
                False,
                checked,
                f.seq,
                f"record {f.seq} does not follow record {f.seq - 1} (one of them was edited, "
                "or records between them were removed or reordered)",
            )
        try:
            ts = decode_body(f.body, ts).ts
        except ReadLogCorrupt as exc:
            return Verdict(False, checked, f.seq, f"record {f.seq} is damaged: {exc}")
        value = chain(value, f.body)
        seq, end, checked = f.seq, f.end, checked + 1
        if seq in marks and marks[seq] != value:
            return Verdict(
                False, checked, seq, f"the chain at record {seq} does not match its recorded head"
            )
    if end < len(buf):
        return Verdict(False, checked, seq + 1, f"bytes after record {seq} are not a whole record")
    for m in (cut, head):
        if m is not None and m.seq > seq:
            return Verdict(
                False,
                checked,
                seq + 1,
                f"records {seq + 1} to {m.seq} were recorded and are missing",
            )
    return Verdict(
        True, checked, None, f"{checked} records intact (records {header.base_seq + 1} to {seq})"
    )
