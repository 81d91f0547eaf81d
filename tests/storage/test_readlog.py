"""The read log: its bytes, the writer's group commits, tamper detection, retention."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from storage.readlog import Mark, Read, ReadLogWriter, reads_of_events, records, verify
from storage.readlog.format import HEADER_BYTES, decode_header, encode_body, frame, frames
from storage.readlog.journal import JOURNAL
from storage.readlog.logfile import Appender, reads_path

T0 = 1_800_000_000_000_000


def a_read(n: int, ids: int = 3, ts: int | None = None, purpose: str | None = None) -> Read:
    return Read(
        ts=T0 + n * 1000 if ts is None else ts,
        key_id="Ab3dE5gH9jK1",
        door="http",
        route="/v1/memory/recall",
        request_id=os.urandom(16).hex(),
        purpose=purpose,
        event_ids=[str(uuid.uuid4()) for _ in range(ids)],
    )


def write(root: Path, reads: list[Read]) -> Mark:
    f = Appender(root, reads[0].ts)
    try:
        f.append(reads)
        return f.mark()
    finally:
        f.close()


def test_a_record_reads_back_as_written_and_a_ten_hit_recall_takes_under_200_bytes(
    tmp_path: Path,
) -> None:
    given = [
        a_read(1, ids=10),
        a_read(2, ids=0, purpose="support ticket 4411"),
        Read(
            ts=T0 - 5,  # a clock step back
            key_id="embedded",
            door="bridge",
            route="some_tool",
            request_id="caller-id:7",
            purpose=None,
            event_ids=[str(uuid.uuid4())],
        ),
    ]
    write(tmp_path, given)
    assert [f.read for f in records(tmp_path)] == given
    assert [f.seq for f in records(tmp_path)] == [1, 2, 3]
    # One 10-hit recall 20 ms after the one before.
    body = encode_body(a_read(21, ids=10), bytes(32), T0 + 1000)
    assert len(frame(body)) <= 200


@pytest.mark.parametrize("journal", [False, True])
def test_the_writer_commits_buffered_and_durable_records_for_many_tenants(
    tmp_path: Path, journal: bool
) -> None:
    roots = [tmp_path / f"t{i}" for i in range(3)]
    for r in roots:
        r.mkdir()
    heads: dict[str, Mark] = {}
    path = tmp_path / JOURNAL if journal else None
    for durable in (False, True):
        w = ReadLogWriter(durable=durable, interval=0.01, on_head=heads.__setitem__, journal=path)
        w.start()
        futures = [w.submit(f"t{i}", roots[i], a_read(n)) for n in range(20) for i in range(3)]
        if durable:
            for f in futures:
                assert f is not None
                f.result(10)
        w.flush().result(10)
        w.stop()
    for i, r in enumerate(roots):
        assert len(list(records(r))) == 40
        assert heads[f"t{i}"].seq == 40
        assert verify(r, heads[f"t{i}"], None).ok


def test_the_backlog_is_bounded_per_tenant_and_in_all(tmp_path: Path) -> None:
    from storage.readlog import Backlogged

    w = ReadLogWriter(durable=False, max_pending=10, max_pending_per_tenant=4)  # not started
    for _ in range(4):
        w.submit("a", tmp_path, a_read(1))
    with pytest.raises(Backlogged):
        w.submit("a", tmp_path, a_read(1))
    for _ in range(4):
        w.submit("b", tmp_path, a_read(1))
    w.submit("c", tmp_path, a_read(1))
    w.submit("c", tmp_path, a_read(1))
    with pytest.raises(Backlogged):
        w.submit("d", tmp_path, a_read(1))  # 10 in all
    w.flush().result(10)  # runs a round here
    assert w.pending() == 0
    w.submit("d", tmp_path, a_read(1))


def _rewrite(root: Path, change: object) -> None:
    """Apply change(list of framed records) and write the file back with the same header."""
    buf = reads_path(root).read_bytes()
    header = decode_header(buf)
    framed = [bytes(buf[f.start : f.end]) for f in frames(buf, HEADER_BYTES, header.base_seq)]
    framed = change(framed)  # type: ignore[operator]
    reads_path(root).write_bytes(buf[:HEADER_BYTES] + b"".join(framed))


@pytest.mark.parametrize(
    ("change", "bad"),
    [
        ("edit", 5),
        ("remove", 5),
        ("reorder", 5),
        ("truncate", 10),
        ("drop_front", 1),
    ],
)
def test_verify_names_the_first_bad_record(tmp_path: Path, change: str, bad: int) -> None:
    head = write(tmp_path, [a_read(n) for n in range(1, 11)])
    assert verify(tmp_path, head, None).ok

    def edit(fr: list[bytes]) -> list[bytes]:
        rec = bytearray(fr[4])
        rec[-1] ^= 0x01  # one bit of an event id
        return [*fr[:4], bytes(rec), *fr[5:]]

    changes = {
        "edit": edit,
        "remove": lambda fr: fr[:4] + fr[5:],
        "reorder": lambda fr: [*fr[:4], fr[5], fr[4], *fr[6:]],
        "truncate": lambda fr: fr[:9],
        "drop_front": lambda fr: fr[1:],
    }
    _rewrite(tmp_path, changes[change])
    verdict = verify(tmp_path, head, None)
    assert not verdict.ok
    # An edited record is found by the record after it (its link), unless it is the last.
    expected = bad + 1 if change == "edit" else bad
    if change == "drop_front":
        expected = 1
    assert verdict.bad_seq == expected, verdict.detail


def test_an_edit_with_every_link_recomputed_is_caught_by_the_head(tmp_path: Path) -> None:
    reads = [a_read(n) for n in range(1, 6)]
    head = write(tmp_path, reads)
    reads_path(tmp_path).unlink()
    forged = [*reads[:2], a_read(99), *reads[3:]]
    write(tmp_path, forged)
    verdict = verify(tmp_path, head, None)
    assert not verdict.ok and verdict.bad_seq == 5
    assert verify(tmp_path, None, None).ok  # without the control plane's head: undetectable


def test_retention_drops_old_records_in_chain_order_and_the_chain_still_verifies(
    tmp_path: Path,
) -> None:
    reads = [a_read(n) for n in range(1, 11)]
    head = write(tmp_path, reads)
    cuts: list[Mark] = []
    w = ReadLogWriter(durable=True)
    dropped = w.cut("t", tmp_path, reads[6].ts, cuts.append).result(10)
    assert dropped == 6
    assert [f.seq for f in records(tmp_path)] == [7, 8, 9, 10]
    assert [f.read for f in records(tmp_path)] == reads[6:]
    assert verify(tmp_path, head, cuts[-1]).ok
    assert not verify(tmp_path, head, None).ok  # a cut nobody recorded
    # Appending after the cut goes on from the chain's head.
    more = a_read(11)
    w.submit("t", tmp_path, more)
    w.flush().result(10)
    assert [f.seq for f in records(tmp_path)][-1] == 11
    assert verify(tmp_path, Mark(11, Appender(tmp_path, 0).hash), cuts[-1]).ok


def test_a_write_cut_short_is_dropped_on_open(tmp_path: Path) -> None:
    write(tmp_path, [a_read(1), a_read(2)])
    with open(reads_path(tmp_path), "ab") as fh:
        fh.write(frame(encode_body(a_read(3), bytes(32), T0))[:-7])
    f = Appender(tmp_path, 0)
    assert f.seq == 2
    f.append([a_read(4)])
    f.close()
    assert verify(tmp_path, None, None).ok
    assert len(list(records(tmp_path))) == 3


def test_reads_of_events_finds_the_records_that_name_them(tmp_path: Path) -> None:
    reads = [a_read(n) for n in range(1, 6)]
    write(tmp_path, reads)
    wanted = [reads[1].event_ids[2], reads[3].event_ids[0]]
    assert [f.seq for f in reads_of_events(tmp_path, wanted)] == [2, 4]
    # Searched in the raw bytes first: the same records, the same times, decoded.
    assert [f.read for f in records(tmp_path, naming=wanted[1])] == [reads[3]]
    assert [f.read for f in records(tmp_path, after=3, naming=wanted[0])] == []
    assert reads_of_events(tmp_path / "none", wanted) == []


def test_a_damaged_last_record_is_named_without_a_head(tmp_path: Path) -> None:
    write(tmp_path, [a_read(n) for n in range(1, 6)])
    buf = reads_path(tmp_path).read_bytes()
    last = list(frames(buf, HEADER_BYTES, 0))[-1]
    reads_path(tmp_path).write_bytes(buf[: last.start] + frame(last.body + b"x"))
    verdict = verify(tmp_path, None, None)
    assert not verdict.ok and verdict.bad_seq == 5 and "damaged" in verdict.detail


def test_the_saved_tail_spares_a_walk_and_a_wrong_one_is_not_believed(tmp_path: Path) -> None:
    write(tmp_path, [a_read(n) for n in range(1, 6)])
    saved = tmp_path / "reads.log.tail"
    old = saved.read_bytes()
    write(tmp_path, [a_read(n) for n in range(6, 9)])
    truth = Appender(tmp_path, 0)
    expected = (truth.seq, truth.hash, truth.ts, truth.size)
    truth.close()
    assert expected[0] == 8
    for hint in (
        old,  # older than the log: the records after it are followed
        old[:24] + bytes(32) + old[56:],  # a wrong chain value: the next link disagrees
        old[:-8] + (10**9).to_bytes(8, "big"),  # an end past the log
        b"junk",
    ):
        saved.write_bytes(hint)
        f = Appender(tmp_path, 0)
        assert (f.seq, f.hash, f.ts, f.size) == expected
        f.close()
    assert verify(tmp_path, Mark(8, expected[1]), None).ok


def test_a_second_appender_beside_the_writer_is_chained_in_and_an_export_is_split(
    tmp_path: Path,
) -> None:
    from storage.readlog.format import IDS_PER_RECORD, records_of
    from storage.readlog.logfile import append_beside

    server = Appender(tmp_path, T0)
    server.append([a_read(1)])
    many = [str(uuid.uuid4()) for _ in range(IDS_PER_RECORD + 5)]
    beside = records_of(T0 + 2000, "cli:ops", "cli", "export", "0" * 32, "audit", many)
    assert [len(r.event_ids) for r in beside] == [IDS_PER_RECORD, 5]
    head = append_beside(tmp_path, beside)  # another process's Appender, under the file's lock
    assert head == Mark(3, head.hash)
    server.append([a_read(4)])  # finds the file grown: follows those records, then appends
    found = [f.read for f in records(tmp_path)]
    assert [r.door for r in found] == ["http", "cli", "cli", "http"]
    assert found[1].event_ids + found[2].event_ids == many
    assert verify(tmp_path, server.mark(), None).ok
    assert server.mark().seq == 4
    assert append_beside(tmp_path / "gone", beside) is None


def test_a_carried_log_takes_the_place_of_the_new_nodes_and_its_own_records_follow(
    tmp_path: Path,
) -> None:
    from storage.readlog.logfile import take_carried, whole_bytes

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    theirs = [a_read(n) for n in range(1, 5)]
    old_head = write(old, theirs)
    ours = [a_read(n) for n in range(10, 12)]  # the new node served reads before the carry
    write(new, ours)
    carried = whole_bytes(old)
    assert carried is not None
    head = take_carried(new, carried + b"\x05ab")  # a record cut short there is left out
    assert [f.read for f in records(new)] == theirs + ours
    assert head.seq == 6 and verify(new, head, None).ok
    assert verify(new, old_head, None).ok  # the old node's head is a head of this chain
    again = take_carried(new, carried)  # a hand-over tried again: nothing twice
    assert again == head and [f.read for f in records(new)] == theirs + ours
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert take_carried(fresh, carried) == old_head


def test_verify_on_a_moves_target_before_the_hand_over_says_pending_not_broken(
    tmp_path: Path,
) -> None:
    """Between a move's switch and the hand-over, the new node's log holds only its own
    records while the control plane's head is the old node's (or its own, soon stale): verify
    says the move is in progress, still catching an edited record there; once the carried log
    is in and the note gone, it verifies against the new head."""
    from storage.readlog import await_carried, carried_in
    from storage.readlog.logfile import take_carried, whole_bytes

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    old_head = write(old, [a_read(n) for n in range(1, 5)])
    await_carried(new)
    write(new, [a_read(n) for n in range(10, 12)])
    for head in (old_head, None):
        v = verify(new, head, None)
        assert (v.ok, v.pending, v.bad_seq, v.checked) == (False, True, None, 2), v
        assert "hand-over is pending" in v.detail
    assert not verify(old, old_head, None).pending  # the old node's copy: judged as ever
    _rewrite(new, lambda framed: [framed[0][:-1] + bytes([framed[0][-1] ^ 1]), *framed[1:]])
    v = verify(new, old_head, None)
    assert (v.ok, v.pending, v.bad_seq) == (False, False, 2), v  # broken is still broken
    _rewrite(new, lambda framed: [framed[0][:-1] + bytes([framed[0][-1] ^ 1]), *framed[1:]])
    carried = whole_bytes(old)
    assert carried is not None
    head = take_carried(new, carried)
    assert verify(new, head, None).pending  # until the new head is recorded and the note goes
    carried_in(new)
    v = verify(new, head, None)
    assert v.ok and not v.pending and v.checked == 6, v


def test_the_round_journal_writes_again_what_a_crash_took_from_the_logs(tmp_path: Path) -> None:
    """A round's records are synced in the journal, not yet in their logs: a crash that loses
    a log's tail (or leaves zeros where it was) loses nothing, as the next writer writes the
    journal's entries again; a log replaced since (retention, an erased and recreated
    tenant) is left alone."""
    roots = {t: tmp_path / t for t in ("a", "b", "c")}
    for r in roots.values():
        r.mkdir()
    heads: dict[str, Mark] = {}
    w = ReadLogWriter(durable=False, on_head=heads.__setitem__, journal=tmp_path / JOURNAL)
    first = {t: [a_read(n) for n in range(1, 4)] for t in roots}
    for t, reads in first.items():
        for r in reads:
            w.submit(t, roots[t], r)
    w.flush().result(10)  # a checkpoint: the logs synced, the journal's file ended removed
    assert list((tmp_path / JOURNAL).iterdir()) == []
    synced = {t: reads_path(r).stat().st_size for t, r in roots.items()}
    later = {t: [a_read(n) for n in range(4, 7)] for t in roots}
    for t, reads in later.items():
        for r in reads:
            w.submit(t, roots[t], r)
    w._round()  # written and journaled; the crash comes before the next checkpoint
    assert [p.stat().st_size > 0 for p in (tmp_path / JOURNAL).iterdir()] == [True]
    whole = {t: [f.read for f in records(r)] for t, r in roots.items()}
    assert whole == {t: first[t] + later[t] for t in roots}
    os.truncate(reads_path(roots["a"]), synced["a"])  # the tail lost
    with open(reads_path(roots["b"]), "r+b") as fh:  # its size kept, its data not
        fh.seek(synced["b"])
        fh.write(bytes(reads_path(roots["b"]).stat().st_size - synced["b"]))
    reads_path(roots["c"]).unlink()  # replaced since: a new log, whose records stay its own
    own = [a_read(9)]
    write(roots["c"], own)
    again = ReadLogWriter(durable=False, journal=tmp_path / JOURNAL)  # the restart
    assert [f.read for f in records(roots["a"])] == whole["a"]
    assert [f.read for f in records(roots["b"])] == whole["b"]
    assert [f.read for f in records(roots["c"])] == own
    for t in ("a", "b"):
        assert verify(roots[t], heads[t], None).ok
    again.submit("a", roots["a"], a_read(10))  # the chain goes on after them
    again.flush().result(10)
    assert len(list(records(roots["a"]))) == 7
    again.stop()
    assert not (tmp_path / JOURNAL).exists()  # all synced: nothing to write again


@pytest.mark.parametrize("durable", [False, True])
def test_a_round_whose_journal_and_log_syncs_both_fail_is_taken_back_and_held(
    tmp_path: Path, durable: bool
) -> None:
    """The journal and the log's own fdatasync both refused for want of room: the round's bytes
    are cut off the log again, so nothing unsynced stays behind a head. Buffered, its records
    are held in memory (the tenant `stuck`) and written, same links, once the syncs succeed;
    durable, the reads waiting for them are refused."""
    from storage import failpoints

    root = tmp_path / "t"
    root.mkdir()
    heads: dict[str, Mark] = {}
    w = ReadLogWriter(durable=durable, on_head=heads.__setitem__, journal=tmp_path / JOURNAL)
    try:
        first = [a_read(n) for n in range(1, 4)]
        for r in first:
            w.submit("t", root, r)
        w.flush().result(10)
        size = reads_path(root).stat().st_size
        failpoints.arm("reads.journal", "enospc")
        failpoints.arm("reads.sync", "enospc")
        held = [a_read(n) for n in range(4, 7)]
        futures = [w.submit("t", root, r) for r in held]
        w.flush().result(10)  # a round: written, neither synced, taken back
        assert reads_path(root).stat().st_size == size
        assert heads["t"].seq == 3  # no head past what the file holds
        if durable:
            for f in futures:
                assert f is not None
                with pytest.raises(OSError):
                    f.result(10)
            assert not w.stuck("t") and w.pending() == 0
        else:
            assert w.stuck("t") and w.pending() == 3
        failpoints.disarm_all()
        w.flush().result(10)
        assert not w.stuck("t") and w.pending() == 0
        kept = first if durable else first + held
        assert [f.read for f in records(root)] == kept
        assert heads["t"].seq == len(kept)
        assert verify(root, heads["t"], None).ok
    finally:
        failpoints.disarm_all()
        w.stop()
