"""A tenant's retention runs on disk: the journal of a run under way, in `<tenant>/retention/`,
and the signed receipt each run leaves (counts and event ids, never text) beside the erasure
receipts, in `_receipts/<tenant>/` (storage/receipts.py).

The journal makes a run resumable after a crash: each batch's ids are appended to it, durably,
before their delete is submitted, so the receipt of a run that a kill -9 interrupted names
every event it deleted (the ids journaled that are no longer live) once the next run finishes
it. A batch's delete is one transaction: a crash leaves it wholly done or not at all.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import msgspec

from storage import failpoints, receipts
from storage.fsync import fsync_file, replace_durably
from storage.read.retention import Outlook, Policy
from storage.receipts import RunReceipt

RUNS = "retention"  # the directory, inside the tenant's
JOURNAL = "run.journal"


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The last run as `tenant show` gives it: its receipt's id, when it finished, its counts."""

    receipt_id: str
    finished_at: int
    deleted: int
    held: int
    purged: int
    purge_pending: bool


class RetentionView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's retention as shown: the windows in force (its own, "*" from the server's
    default when it set none), its oldest event (ts), the events due now and within 7 days
    (held ones included), its last run (null: none has deleted anything yet), and the kinds
    of its events (the names a window may give)."""

    in_force: dict[str, int]
    oldest_event: int | None
    due_now: int
    due_next_7_days: int
    last_run: RunSummary | None
    kinds: list[str]


class _Header(msgspec.Struct, frozen=True):
    run_id: str
    started_at: int


class Journal:
    """The run under way in one tenant: its id, its start, the ids journaled so far."""

    def __init__(self, root: Path, header: _Header, ids: list[str]) -> None:
        self.root = root
        self.path = root / RUNS / JOURNAL
        self.run_id = header.run_id
        self.started_at = header.started_at
        self.ids = ids

    @classmethod
    def find(cls, root: Path) -> Journal | None:
        """The run a crash interrupted, if any (a torn last line is a batch never submitted)."""
        try:
            lines = (root / RUNS / JOURNAL).read_bytes().split(b"\n")
        except FileNotFoundError:
            return None
        try:
            header = msgspec.json.decode(lines[0], type=_Header)
        except msgspec.DecodeError:
            return None  # torn before its header was durable: no batch was submitted
        ids: list[str] = []
        for line in lines[1:]:
            try:
                ids += msgspec.json.decode(line, type=list[str])
            except msgspec.DecodeError:
                break
        return cls(root, header, ids)

    @classmethod
    def begin(cls, root: Path, now: int) -> Journal:
        """Start a run's journal (durable before any of its batches)."""
        (root / RUNS).mkdir(exist_ok=True)
        header = _Header(uuid.uuid4().hex, now)
        journal = cls(root, header, [])
        replace_durably(journal.path, lambda fh: fh.write(msgspec.json.encode(header) + b"\n"))
        return journal

    def intend(self, event_ids: list[str]) -> None:
        """Journal a batch durably, before its delete is submitted."""
        failpoints.hit("retention.journal")
        with open(self.path, "ab") as fh:
            fh.write(msgspec.json.encode(event_ids) + b"\n")
        fsync_file(self.path)
        self.ids += event_ids

    def finish(self, receipt: RunReceipt) -> None:
        """Keep the receipt signed and durably (storage/receipts.py), then drop the journal: a
        crash between the two leaves a journal whose next run signs the receipt again."""
        data_dir = self.root.parent
        receipts.store(data_dir, receipts.sign(data_dir, receipt))
        os.unlink(self.path)


def last_receipt(root: Path) -> RunReceipt | None:
    """The newest receipt of the tenant at root (data_dir/<tenant>), or None."""
    return receipts.last_run(root.parent, root.name)


def view_of(policy: Policy, outlook: Outlook | None, last: RunReceipt | None) -> RetentionView:
    """The shown retention of a tenant from its policy, its outlook and its last receipt."""
    summary = None
    if last is not None:
        summary = RunSummary(
            receipt_id=last.receipt_id,
            finished_at=last.finished_at,
            deleted=last.deleted,
            held=last.held,
            purged=last.purged,
            purge_pending=last.purge_pending,
        )
    return RetentionView(
        in_force=dict(policy.windows),
        oldest_event=None if outlook is None else outlook.oldest_event,
        due_now=0 if outlook is None else outlook.due_now,
        due_next_7_days=0 if outlook is None else outlook.due_next_7_days,
        last_run=summary,
        kinds=[] if outlook is None else outlook.kinds,
    )
