"""Erasure's probes: events whose bytes only they hold, a scan of every file of a data
directory for those bytes, and a tenant's check after a purge."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import string
import struct
from pathlib import Path

import msgspec
import numpy as np
import tantivy

from storage import files
from storage.erasure import swap
from storage.model import NewEvent, StoredEvent
from storage.tenants.tenant import Tenant

DIM = 16


def embedding_patterns(vector: list[float]) -> dict[str, bytes]:
    """Every encoding of an embedding the code writes or reads, as bytes to search for."""
    arr = np.asarray(vector, dtype=np.float64)
    unit = arr / np.linalg.norm(arr)
    patterns = {
        "float32": arr.astype("<f4").tobytes(),
        "float64": arr.astype("<f8").tobytes(),
        "normalised float32": unit.astype("<f4").tobytes(),
        "normalised float64": unit.astype("<f8").tobytes(),
        "msgpack": msgspec.msgpack.encode(vector),
        "json": msgspec.json.encode(vector),
    }
    for i, x in enumerate(vector):  # msgpack stores each float as 0xcb + big-endian float64
        patterns[f"msgpack[{i}]"] = b"\xcb" + struct.pack(">d", x)
    return patterns


def text_patterns(text: str, rare: list[str]) -> dict[str, bytes]:
    """The text and each of its rare tokens, as written and lowercase."""
    patterns = {"text": text.encode()}
    for token in rare:
        patterns[f"token {token}"] = token.encode()
        patterns[f"token {token.lower()}"] = token.lower().encode()
    return patterns


def scan(root: Path, patterns: dict[str, bytes], *, any_case: bool = False) -> dict[str, list[str]]:
    """For each pattern, the files under root whose bytes contain it (in any ASCII case if
    any_case: the patterns are then lowercase)."""
    found: dict[str, list[str]] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # a Tantivy temp file gone since the listing holds nothing
                continue
            if any_case:
                data = data.lower()
            for label, pattern in patterns.items():
                if pattern in data:
                    found.setdefault(label, []).append(str(path.relative_to(root)))
    return found


def index_terms(path: Path) -> set[str]:
    """Every term in the text field's dictionary of the Tantivy index at path, deleted documents'
    terms included (bytes alone cannot show that: the dictionary is an FST)."""
    searcher = tantivy.Index.open(str(path)).searcher()
    return {term for term, _count in searcher.terms_with_prefix("text", "")}


def rare_token(rng: random.Random) -> str:
    """A made-up word no other event uses (consonants only, so stemming leaves it whole)."""
    letters = "bcdfghjklmnpqrtvwxz"
    return rng.choice(string.ascii_uppercase) + "".join(rng.choice(letters) for _ in range(9))


def neighbour(rng: random.Random, i: int) -> NewEvent:
    """An ordinary event sharing words, kinds and properties with the victim."""
    words = " ".join(rng.choice(VOCAB) for _ in range(12))
    props = {"speaker": rng.choice(["agent", "customer"]), "n": i}
    return NewEvent(
        kind=rng.choice(["turn", "fact"]),
        ts=1_000_000 + i,
        text=f"{words} nb{i:05d}",
        embedding=[rng.uniform(-1, 1) for _ in range(DIM)],
        properties_raw=msgspec.json.encode(props),
    )


def append(t: Tenant, events: list[NewEvent]) -> list[str]:
    """Append and return the new ids."""
    return [r.event_id for r in t.submit_append(events).result()]


def text_of(t: Tenant, event_id: str) -> str | None:
    """The live event's text, or None."""
    ev = record(t, event_id)
    return None if ev is None else ev.text


def check_tenant(t: Tenant, live: list[str], gone: dict[str, str]) -> None:
    """Every live event readable and found by keyword and by vector; gone ones (id -> a token
    only they used) nowhere."""
    with t.log.reader() as r:
        assert [e for e in live if r.get(e) is None] == []
        assert [e for e in gone if r.get(e) is not None] == []
        assert r.tombstone_ids() == []
        sample = [ev for e in live[::20] if (ev := r.get(e)) is not None and ev.embedding]
    assert sample
    for ev in sample:
        assert ev.text and ev.embedding
        token = ev.text.split()[-1]
        assert [e for e, _s in t.keyword.search(token, limit=3)] == [ev.event_id]
        [(label, sim)] = t.vectors.search(ev.embedding, 1)
        assert label == ev.seq and sim > 0.999
    for token in gone.values():
        assert t.keyword.search(token, limit=1) == []


def last_tokens(t: Tenant, ids: list[str]) -> dict[str, str]:
    """Each event's last word (the neighbours' unique token)."""
    with t.log.reader() as r:
        return {e: ev.text.split()[-1] for e in ids if (ev := r.get(e)) is not None and ev.text}


ROLL_STEPS = [f"swap:{name}" for name in files.STORES] + ["swap:done"]


class Victim(msgspec.Struct):
    """An event to erase and every byte pattern it leaves on disk."""

    event: NewEvent
    patterns: dict[str, bytes]


def victim(rng: random.Random, vectors: str) -> Victim:
    """An event whose text, rare words, property value and embedding only it holds."""
    rare = [rare_token(rng) for _ in range(2)]
    secret = "gate-" + rare_token(rng)
    text = None if vectors == "no-text" else f"the door code is 4471, {rare[0]} {rare[1]}"
    embedding = None if vectors == "none" else [rng.uniform(-1, 1) for _ in range(DIM)]
    props = msgspec.json.encode({"gate": secret})
    ev = NewEvent(kind="turn", ts=2_000_000, text=text, embedding=embedding, properties_raw=props)
    patterns = {"property": secret.encode()}
    if text is not None:
        patterns |= text_patterns(text, rare)
    if embedding is not None:
        patterns |= embedding_patterns(embedding)
    return Victim(event=ev, patterns=patterns)


def shaped(rng: random.Random, i: int, vectors: str) -> NewEvent:
    """A neighbour of the given shape: with or without its embedding and text."""
    ev = neighbour(rng, i)
    if vectors == "none" or (vectors == "mixed" and i % 2):
        return msgspec.structs.replace(ev, embedding=None)
    if vectors == "no-text":
        return msgspec.structs.replace(ev, text=None)
    return ev


def fill(t: Tenant, rng: random.Random, vectors: str, start: int, n: int) -> list[str]:
    """N neighbours in one batch."""
    return append(t, [shaped(rng, i, vectors) for i in range(start, start + n)])


def check_erased(data_dir: Path, t: Tenant, patterns: dict[str, bytes], live: list[str]) -> None:
    """No byte of the erased events anywhere, nothing awaiting a purge, the rest readable."""
    assert scan(data_dir, patterns) == {}
    assert t.log.tombstones() == []
    assert not (t.root / swap.PENDING).exists()
    assert not any((t.root / n).exists() for n in (swap.STAGING, swap.READY, swap.OLD))
    with t.log.reader() as r:
        assert [e for e in live if r.get(e) is None] == []
        sample = [ev for e in live[::7] if (ev := r.get(e)) is not None]
    for ev in sample:
        if ev.text:
            token = ev.text.split()[-1]
            assert [e for e, _s in t.keyword.search(token, limit=1)] == [ev.event_id]
        if ev.embedding:
            [(label, sim)] = t.vectors.search(ev.embedding, 1)
            assert label == ev.seq and sim > 0.999


def ballast(disk: Path, leave: int) -> Path:
    """Fill the file system until `leave` bytes are free (or fewer)."""
    path = disk / "ballast"
    free = shutil.disk_usage(disk).free
    with contextlib.suppress(OSError), open(path, "ab", buffering=0) as fh:
        fh.write(b"\0" * max(0, free - leave))
    return path


VOCAB = ["parcel", "order", "carrier", "refund", "street", "delivery", "agent", "customer"]


def record(t: Tenant, event_id: str) -> StoredEvent | None:
    """The live record, or None."""
    with t.log.reader() as r:
        return r.get(event_id)


REPLY_TS = 1_791_208_939_000_000


# The seed's support tenant: name, minutes from the reply, kind, text, embedding, sources.
# fmt: off
SUPPORT: list[tuple[str, float, str, str, list[float] | None, list[str]]] = [
    ("message", -1.5, "turn", "Customer: order 88213 shows delivered on 1 October but nothing arrived",
     [0.8, 0.2, 0.1, 0.0], []),
    ("get_order", -1.2, "tool_call", "get_order(88213) -> 1 item, shipped 2026-09-29, carrier ref PX-55790112",
     None, []),
    ("track", -0.8, "tool_call", "track_parcel(PX-55790112) -> delivered, signed for at no. 16, 2026-10-01 14:12",
     None, []),
    ("reply", 0, "turn",
     "Agent: the carrier shows it signed for at number 16, on 1 October at 14:12. Please check there",
     [0.9, 0.1, 0.0, 0.0], ["message", "get_order", "track"]),
    ("objection", 0.4, "turn", "Customer: there is no number 16 on my street. I want a refund",
     [0.7, 0.3, 0.0, 0.1], []),
    ("open_case", 0.6, "tool_call", "open_case(88213, disputed delivery) -> case C-5117 opened", None, []),
    ("handover", 0.7, "turn",
     "Agent: I have opened case C-5117; a colleague will contact you within one working day",
     [0.2, 0.8, 0.0, 0.0], []),
    ("case_fact", 0.78, "fact",
     "Case C-5117: customer disputes the delivery of order 88213; street has no number 16",
     [0.6, 0.4, 0.0, 0.0], ["track", "objection", "open_case"]),
    ("door_turn", 2.2, "turn", "Customer: next time, the door code is 4471, please leave parcels in the hall",
     [0.013, 0.217, 0.931, 0.0472], []),
    ("door_fact", 2.38, "fact", "Delivery instruction: door code 4471, leave parcels in the hall",
     [0.0, 0.1, 1.0, 0.0], ["door_turn"]),
]
# fmt: on


def door_turn_patterns() -> dict[str, bytes]:
    """The door message's text, the words only it used, and its embedding in every encoding."""
    text = SUPPORT[8][3]
    embedding = SUPPORT[8][4]
    assert embedding is not None
    return {"text": text.encode(), "next time": b"next time"} | embedding_patterns(embedding)
