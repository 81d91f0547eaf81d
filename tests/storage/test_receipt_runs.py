"""Retention receipts kept per tenant (storage/receipts.py): the newest KEEP_RUNS, found through
the tenant's list of runs without decoding its erasure receipts, and found again without it."""

from __future__ import annotations

import uuid
from pathlib import Path

from storage import receipts
from storage.receipts import DIR, KEEP_RUNS, RUNS, RunReceipt


def _run(tenant_id: str, at: int) -> RunReceipt:
    """A retention receipt of a run that ended at `at`."""
    return RunReceipt(
        receipt_id=uuid.uuid4().hex,
        tenant_id=tenant_id,
        started_at=at - 1,
        finished_at=at,
        windows={"turn": 30},
        deleted=0,
        deleted_ids=[],
        held=0,
        purged=0,
    )


def _store(data_dir: Path, receipt: RunReceipt) -> None:
    receipts.store(data_dir, receipts.sign(data_dir, receipt))


def test_the_newest_runs_are_kept_and_the_last_is_found(tmp_path: Path) -> None:
    stored = [_run("t1", at) for at in range(1, KEEP_RUNS + 6)]
    for receipt in stored:
        _store(tmp_path, receipt)
    folder = tmp_path / DIR / "t1"
    kept = {p.stem for p in folder.glob("*.json")}
    assert kept == {r.receipt_id for r in stored[-KEEP_RUNS:]}
    assert (folder / RUNS).read_text().split()[0] == stored[-1].receipt_id
    assert receipts.last_run(tmp_path, "t1") == stored[-1]
    assert receipts.last_run(tmp_path, "t2") is None


def test_without_the_list_of_runs_the_receipts_are_read(tmp_path: Path) -> None:
    first, second = _run("t1", 10), _run("t1", 20)
    _store(tmp_path, first)
    _store(tmp_path, second)
    (tmp_path / DIR / "t1" / RUNS).unlink()  # a data directory restored from a backup
    assert receipts.last_run(tmp_path, "t1") == second
    third = _run("t1", 30)
    _store(tmp_path, third)
    ids = (tmp_path / DIR / "t1" / RUNS).read_text().split()
    assert ids == [third.receipt_id, second.receipt_id, first.receipt_id]


def test_a_damaged_list_of_runs_is_not_trusted(tmp_path: Path) -> None:
    receipt = _run("t1", 10)
    _store(tmp_path, receipt)
    (tmp_path / DIR / "t1" / RUNS).write_text("../../etc/passwd\n")
    assert receipts.last_run(tmp_path, "t1") == receipt
