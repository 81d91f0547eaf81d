"""The erasure dry run's identifier search (storage/read/subjects.py, `matching`): through the
keyword index it finds exactly what a pass over every record finds, whatever the index has folded
yet; and what it finds is a word search (docs/erasure.md, "Finding a person by identifiers")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.index import keyword
from storage.index.keyword import words
from storage.log.reader import LogReader
from storage.model import NewEvent
from storage.read import subjects
from storage.read.subjects import matching, matching_by_pass
from storage.tenants.tenant import Tenant

PIECES = [
    "ann@example.com",
    "joann@example.community",
    "SUP-2207",
    "sup 2207",
    "Zoë Ångström",
    "ZOË ÅNGSTRÖM",
    "Straße",
    "STRASSE",
    "Smith, Ann",
    "Ann Smith",
    "planning",
    "order_no",
    "ORD-77123",
    "w0001",
    "café",
    "Café",
    " ",
    ",",
]
IDENTIFIERS = [
    "ann@example.com",
    "Ann Smith",
    "sup-2207",
    "SUP 2207",
    "zoë ångström",
    "strasse",
    "café",
    "ord-77123",
    "order_no",
    "@example.",
    "ann",
]


def _every_record(r: LogReader, identifiers: tuple[str, ...]) -> list[str]:
    """The rule spelled out over every record decoded whole: each word of an identifier is a
    word of the event's text or properties (keys and values, as they read)."""
    wanted = [set(words(i)) for i in identifiers if words(i)]
    found = []
    for ev in r.live_light():
        texts = [ev.text] if ev.text else []
        keyword._strings(ev.properties(), texts)
        held = set(words(" ".join(texts)))
        if any(w <= held for w in wanted):
            found.append(ev.event_id)
    return found


texts = st.none() | st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
props = st.none() | st.tuples(
    st.dictionaries(st.sampled_from(PIECES), st.sampled_from(PIECES) | st.integers(), max_size=3),
    st.booleans(),
).map(lambda p: json.dumps(p[0], ensure_ascii=p[1]).encode())
events = st.lists(st.tuples(texts, props), min_size=1, max_size=8)
asked = st.lists(st.sampled_from(IDENTIFIERS), min_size=1, max_size=3, unique=True).map(tuple)


def test_the_search_finds_what_the_full_decode_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subjects, "CHUNK", 5)  # many chunks
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    ts = iter(range(1_000_000, 10_000_000, 1000))
    hits = 0

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=events, identifiers=asked, settle=st.booleans())
    def check(
        batch: list[tuple[str | None, bytes | None]], identifiers: tuple[str, ...], settle: bool
    ) -> None:
        nonlocal hits
        t.submit_append(
            [NewEvent(kind="turn", ts=next(ts), text=x, properties_raw=p) for x, p in batch]
        ).result()
        if settle:
            t.keyword.flush()  # now and then all of it committed, else part in the fold's queue
        # right after the append: the log holds what the index has not committed yet
        got = t.snapshot_read(lambda r: matching(r, identifiers, t.keyword))
        want = t.snapshot_read(lambda r: _every_record(r, identifiers))
        assert sorted(got) == sorted(want)
        assert t.snapshot_read(lambda r: matching_by_pass(r, identifiers)) == want
        hits += len(got)

    try:
        check()
    finally:
        t.close()
    assert hits > 0  # the search found something, so equality was not of two empty lists


def test_words_are_found_whole_in_any_order_case_and_accents_aside(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    rows = [
        ("write to ANN@Example.com please", None),  # 0: email, case
        (None, json.dumps({"owner": "Zoë Ångström"}, ensure_ascii=True).encode()),  # 1: escaped
        ("ticket sup-2207 reopened", None),  # 2: code, case
        ("Angstrom, Zoe called", None),  # 3: words in another order, accents folded
        ("nothing here", b'{"n": 2207}'),  # 4: one word of the code only
        ("joann@example.community is planning", None),  # 5: inside longer words: not found
        ("Ann's order", b'{"order_no": "ORD-77123/b"}'),  # 6: the code in a property value
        ("Zelda deleted", None),  # 7: deleted before the search
    ]
    ids = [
        o.event_id
        for o in t.submit_append(
            [
                NewEvent(kind="turn", ts=1_000_000 + i, text=x, properties_raw=p)
                for i, (x, p) in enumerate(rows)
            ]
        ).result()
    ]
    asked = ("ann@example.com", "SUP-2207", "zoë ångström", "ord-77123", "Zelda")
    try:
        t.submit_delete([ids[7]]).result()
        queued = t.snapshot_read(lambda r: matching(r, asked, t.keyword))
        t.keyword.flush()
        committed = t.snapshot_read(lambda r: matching(r, asked, t.keyword))
        t.purge()  # a rebuilt index finds the same
        rebuilt = t.snapshot_read(lambda r: matching(r, asked, t.keyword))
        single = t.snapshot_read(lambda r: matching(r, ("ann",), t.keyword))
    finally:
        t.close()
    assert (
        sorted(queued)
        == sorted(committed)
        == sorted(rebuilt)
        == sorted(ids[i] for i in (0, 1, 2, 3, 6))
    )
    assert sorted(single) == sorted([ids[0], ids[6]])  # "Ann's": a word; "joann", "planning": not
