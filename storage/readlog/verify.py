"""Verifying a tenant's read chain against the marks the control plane keeps.

The file alone proves little (whoever edits it can recompute every link), so a verify takes
the last head and the last retention cut the control plane recorded: the chain must pass
through both. An edited, removed or reordered record breaks the link of the record after it
(or, for the last ones, the head); records dropped from the front without a recorded cut
leave the file starting after the cut; records removed from the end leave it shorter than
the head. Records written after the last head was recorded are checked by their links only.
"""

from __future__ import annotations

from hashlib import sha256
from pathlib import Path
from typing import NamedTuple

from storage.readlog.format import (
    HEADER_BYTES,
    LINK_BYTES,
    ReadLogCorrupt,
    body_at,
    check_body,
    decode_header,
)
from storage.readlog.logfile import Mark, awaits_carried, reads_path


class Verdict(NamedTuple):
    """A verify's outcome: intact or not, the records checked, the seq of the first bad
    record (None when intact), a sentence saying what is wrong, and whether it could not be
    judged yet (a move's hand-over of the records pending: not ok, not broken)."""

    ok: bool
    checked: int
    bad_seq: int | None
    detail: str
    pending: bool = False


PENDING = (
    "a move's hand-over is pending: the read records of the node the tenant left are not yet "
    "chained before this node's ({checked} records here, their links intact); verify again "
    "once the move has erased the old copy"
)


def verify(root: Path, head: Mark | None, cut: Mark | None) -> Verdict:
    """Check a tenant's read log: every record's link and shape, and the marks given. On a
    move's target before the hand-over (memspine/readmove.py) the marks are the old node's
    or name a chain not yet whole here: only the links are checked, and the verdict is
    pending."""
    if awaits_carried(root):
        own = _verify(root, None, None)
        if not own.ok:
            return own
        return Verdict(False, own.checked, None, PENDING.format(checked=own.checked), True)
    return _verify(root, head, cut)


def _verify(root: Path, head: Mark | None, cut: Mark | None) -> Verdict:
    try:
        buf = reads_path(root).read_bytes()
    except FileNotFoundError:
        if head is not None and head.seq > (cut.seq if cut is not None else 0):
            detail = f"the read log is missing; records up to {head.seq} were recorded"
            return Verdict(False, 0, 1, detail)
        return Verdict(True, 0, None, "no reads recorded")
    try:
        header = decode_header(buf)
    except ReadLogCorrupt as exc:
        return Verdict(False, 0, 1, f"the read log's header is damaged: {exc}")
    wrong = _start(header.base_seq, header.base_hash, cut)
    if wrong is not None:
        return wrong
    marks = {m.seq: m.hash for m in (cut, head) if m is not None and m.seq >= header.base_seq}
    if marks.get(header.base_seq, header.base_hash) != header.base_hash:
        detail = f"the chain's start does not match the head recorded at record {header.base_seq}"
        return Verdict(False, 0, header.base_seq + 1, detail)
    found = _walk(buf, header.base_seq, header.base_hash, marks)
    if isinstance(found, Verdict):
        return found
    seq, end, checked = found
    if end < len(buf):
        return Verdict(False, checked, seq + 1, f"bytes after record {seq} are not a whole record")
    for m in (cut, head):
        if m is not None and m.seq > seq:
            detail = f"records {seq + 1} to {m.seq} were recorded and are missing"
            return Verdict(False, checked, seq + 1, detail)
    detail = f"{checked} records intact (records {header.base_seq + 1} to {seq})"
    return Verdict(True, checked, None, detail)


def _start(seq: int, value: bytes, cut: Mark | None) -> Verdict | None:
    """What is wrong with where the file starts, given the recorded cut (None: nothing)."""
    if cut is not None and seq > cut.seq:
        detail = f"records {cut.seq + 1} to {seq} were removed without a recorded cut"
        return Verdict(False, 0, cut.seq + 1, detail)
    if cut is None and seq > 0:
        return Verdict(False, 0, 1, f"records 1 to {seq} were removed without a recorded cut")
    if cut is not None and seq == cut.seq and value != cut.hash:
        detail = f"the chain's start does not match the recorded cut at record {seq}"
        return Verdict(False, 0, seq + 1, detail)
    return None


def _walk(
    buf: bytes, seq: int, value: bytes, marks: dict[int, bytes]
) -> Verdict | tuple[int, int, int]:
    """Every whole record's link, shape and chain value, against the marks on the way: the
    first problem, or the last seq, where the records end and how many were checked.

    One loop over the bytes, no object per record: a million records take seconds.
    """
    size, pos, checked, body = len(buf), HEADER_BYTES, 0, b""
    while pos < size:
        at, end = body_at(buf, pos)
        if not 0 <= end <= size:
            break  # a record cut short
        body = buf[at:end]
        seq += 1
        if not buf.startswith(value[:LINK_BYTES], at):
            detail = (
                f"record {seq} does not follow record {seq - 1} (one of them was edited, "
                "or records between them were removed or reordered)"
            )
            return Verdict(False, checked, seq, detail)
        value = sha256(value + body).digest()
        pos, checked = end, checked + 1
        if seq in marks and marks[seq] != value:
            detail = f"the chain at record {seq} does not match its recorded head"
            return Verdict(False, checked, seq, detail)
    # A damaged record is caught by the link of the next one, or by a head; the last one has
    # neither, so its shape is checked here (every record's would cost a third of the walk).
    if checked:
        problem = check_body(body)
        if problem is not None:
            return Verdict(False, checked - 1, seq, f"record {seq} is damaged: {problem}")
    return seq, pos, checked
