"""The erasure dry run's identifier search (storage/read/subjects.py, `matching`) finds exactly
what the pass it replaced found: every record decoded whole, properties parsed when escaped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.log.reader import LogReader
from storage.model import NewEvent
from storage.read import subjects
from storage.read.subjects import matching
from storage.tenants.tenant import Tenant

_WORD = re.compile(r"\w+")
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


def _previous(r: LogReader, identifiers: tuple[str, ...]) -> list[str]:
    """The pass the search replaced, verbatim: each record decoded whole less its embedding."""
    wanted = [(i.casefold(), frozenset(_WORD.findall(i.casefold()))) for i in identifiers]
    found = []
    for ev in r.live_light():
        texts = [ev.text] if ev.text else []
        raw = ev.properties_raw
        if raw and b"\\" in raw:
            subjects._strings(ev.properties(), texts)  # unchanged by the search
        elif raw:
            texts.append(raw.decode(errors="replace"))
        hay = " ".join(texts).casefold()
        if hay and any(
            whole in hay or (len(parts) > 1 and parts <= set(_WORD.findall(hay)))
            for whole, parts in wanted
        ):
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
    monkeypatch.setattr(subjects, "CHUNK", 5)  # many chunks, some with a folding that moves
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    ts = iter(range(1_000_000, 10_000_000, 1000))
    hits = 0

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batch=events, identifiers=asked)
    def check(batch: list[tuple[str | None, bytes | None]], identifiers: tuple[str, ...]) -> None:
        nonlocal hits
        t.submit_append(
            [NewEvent(kind="turn", ts=next(ts), text=x, properties_raw=p) for x, p in batch]
        ).result()
        # right after the append: the search reads the log, whatever the indexes folded
        got = t.snapshot_read(lambda r: matching(r, identifiers))
        want = t.snapshot_read(lambda r: _previous(r, identifiers))
        assert got == want
        hits += len(got)

    try:
        check()
    finally:
        t.close()
    assert hits > 0  # the search found something, so equality was not of two empty lists


def test_escaped_accents_emails_and_codes_are_found(tmp_path: Path) -> None:
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    rows = [
        ("write to ANN@Example.com please", None),  # 0: email, case
        (None, json.dumps({"owner": "Zoë Ångström"}, ensure_ascii=True).encode()),  # 1: escaped
        ("ticket sup-2207 reopened", None),  # 2: code, case
        ("Ångström, Zoë called", None),  # 3: words in another order
        ("nothing here", b'{"n": 2207}'),  # 4: one word of the code only
    ]
    ids = t.submit_append(
        [
            NewEvent(kind="turn", ts=1_000_000 + i, text=x, properties_raw=p)
            for i, (x, p) in enumerate(rows)
        ]
    ).result()
    try:
        got = t.snapshot_read(
            lambda r: matching(r, ("ann@example.com", "SUP-2207", "zoë ångström"))
        )
    finally:
        t.close()
    assert set(got) == {o.event_id for o in ids[:4]}
