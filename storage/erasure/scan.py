"""The proof of an erasure: a scan of a tenant's files, after its purge, for what was erased
(docs/erasure.md, "The receipt").

Two scans: every byte of every file under the tenant's directory for each needle (identifiers,
event ids as text), case folded as ASCII, so a lowercased index term is found too; and the log's
keys and values for the erased events' raw ids, outside the places that keep ids by design
(the erasure ledger, the Idempotency-Key records and the delete ops: ids and times or hashes,
never content).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from storage import files
from storage.erasure import apart
from storage.log import layout
from storage.log.reader import LogReader

CHUNK = 1 << 20
# Databases that keep an erased event's id on purpose: the ledger, and the Idempotency-Key record
# that makes a retry of its append a replay rather than a new event.
KEEPS_IDS = frozenset({"erased", "idem"})
# An event id as text, lowercased.
ID_TEXT = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ID_LEN = 36
# Where an id as text has its dashes: every place a chunk has dashes at these offsets is looked
# up among the ids wanted. Found with numpy over the whole chunk at once: a regular expression
# tried at every byte cost seconds a tenant (bench/RESULTS.md, "Erasure by subject"), and testing
# each of an erasure's thousand ids against the chunk would read it a thousand times.
DASHES = (8, 13, 18, 23)
DASH = ord("-")


def tenant_holding(
    root: Path, r: LogReader, needles: Sequence[str], event_ids: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Both scans of a tenant whose log r reads: the files under root holding each needle
    (files_holding) and the log's databases holding each event id (log_holding); in a child
    process for a large log (apart.py), where these loops hold no GIL of the server's."""
    if apart.worth_it(r):
        got = apart.run(
            "scan",
            niceness=apart.SCAN_NICENESS,
            root=str(root),
            needles=list(needles),
            event_ids=list(event_ids),
        )
        return got["files"], got["log"]
    return _holding(root, r, needles, event_ids)


def scan_apart(root: str, needles: list[str], event_ids: list[str]) -> dict[str, Any]:
    """In a child process (apart.py): tenant_holding's two scans."""
    with apart.reading(Path(root) / files.LOG) as r:
        in_files, in_log = _holding(Path(root), r, needles, event_ids)
    return {"files": in_files, "log": in_log}


def _holding(
    root: Path, r: LogReader, needles: Sequence[str], event_ids: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Both scans, here."""
    in_files = files_holding(root, [n.encode() for n in needles])
    return {n.decode(): paths for n, paths in in_files.items()}, log_holding(r, event_ids)


def files_holding(root: Path, needles: Iterable[bytes]) -> dict[bytes, list[str]]:
    """For each needle, the files under root (paths relative to it, sorted) that hold it,
    ASCII case ignored; a needle found nowhere maps to []."""
    wanted = {n: n.lower() for n in needles if n}
    found: dict[bytes, set[str]] = {n: set() for n in wanted}
    if not wanted:
        return {}
    overlap = max(len(low) for low in wanted.values()) - 1
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                held = _scan_file(path, wanted, overlap)
            except FileNotFoundError:  # removed meanwhile (a Tantivy merge)
                continue
            for needle in held:
                found[needle].add(str(path.relative_to(root)))
    return {n: sorted(paths) for n, paths in found.items()}


def _scan_file(path: Path, wanted: dict[bytes, bytes], overlap: int) -> set[bytes]:
    """The needles a file holds, read a chunk at a time (chunks overlap by a needle's length):
    the ids among them by where their dashes are (_id_texts), the rest (identifiers) each
    looked for in the chunk lowercased."""
    ids = {low: n for n, low in wanted.items() if ID_TEXT.fullmatch(low)}
    others = {n: low for n, low in wanted.items() if low not in ids}
    held: set[bytes] = set()
    tail = b""
    with path.open("rb") as f:
        while len(held) < len(wanted):
            chunk = f.read(CHUNK)
            if not chunk:
                break
            window = tail + chunk
            if ids:
                held.update(ids[m] for m in map(bytes.lower, _id_texts(window)) if m in ids)
            if others:
                low_window = window.lower()
                held.update(n for n, low in others.items() if n not in held and low in low_window)
            tail = window[-overlap:] if overlap else b""
    return held


def _id_texts(window: bytes) -> list[bytes]:
    """Every 36-byte run of window with dashes where an id as text has them (overlapping ones
    too): a superset of the ids it holds."""
    n = len(window) - ID_LEN + 1
    if n <= 0:
        return []
    at = np.frombuffer(window, dtype=np.uint8)
    mask = at[DASHES[0] : DASHES[0] + n] == DASH
    for offset in DASHES[1:]:
        mask &= at[offset : offset + n] == DASH
    return [window[i : i + ID_LEN] for i in np.flatnonzero(mask).tolist()]


def log_holding(r: LogReader, event_ids: Iterable[str]) -> dict[str, list[str]]:
    """For each event id, the log's databases (other than KEEPS_IDS) holding its raw id in a key
    or value: where layout.py puts ids (a key's first or last 16 bytes, a value's first 16,
    or those after an op's byte)."""
    raw = {layout.id_bytes(e): e for e in event_ids}
    found: dict[str, set[str]] = {e: set() for e in raw.values()}
    n = layout.ID_BYTES
    get = raw.get
    for name, db in r.dbs.items():
        if name in KEEPS_IDS or name == "meta":
            continue
        ops = name == "ops"
        for key, value in r.txn.cursor(db=db).iternext(keys=True, values=True):
            if ops and value[:1] == layout.OP_DELETE:
                continue  # the delete's own op: the id and nothing else, as in the ledger
            for part in (key[:n], key[-n:], value[:n], value[1 : n + 1]):
                event_id = get(bytes(part))
                if event_id is not None:
                    found[event_id].add(name)
    _records_holding(r, raw, found)
    return {e: sorted(names) for e, names in found.items()}


def _records_holding(r: LogReader, raw: dict[bytes, str], found: dict[str, set[str]]) -> None:
    """Name "records" for each id whose record is there: a record is keyed by its append's seq
    and holds its id inside the encoding, so it is found through "ids" (log format 7)."""
    ids, records = r.dbs.get("ids"), r.dbs.get("records")
    if ids is None or records is None:
        return
    for raw_id, event_id in raw.items():
        key = r.txn.get(raw_id, db=ids)
        if key is not None and r.txn.get(key, db=records) is not None:
            found[event_id].add("records")
