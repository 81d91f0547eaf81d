"""Mem0's memories as records: the answer of `Memory.get_all` (mem0/memory/main.py, `{"results":
[...]}`), each memory with its `history(memory_id)` rows (mem0/memory/storage.py's history table:
ADD, UPDATE, DELETE) under `history`, or every row in one top-level `history` list.

Mem0 updates a memory in place and keeps the old text in its history; here each version is an
event and each UPDATE supersedes the one before, so the memory's current text is the head of its
chain and keeps the key `mem0:<memory id>`. A memory whose history ends in DELETE is not imported.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from storage.errors import InvalidRequest
from storage.model import check_subject
from storage.transfer.foreign import source as src
from storage.transfer.foreign.records import (
    Conversion,
    Record,
    Report,
    key_of,
    micros,
    ordered,
    window,
)

PREFIX = "mem0"
KIND = "memory"
# MemoryItem's fields with a place of their own, and what get_all adds that is Mem0's own.
_PLACED = ("id", "memory", "created_at", "updated_at", "expiration_date", "history", "metadata")
_DERIVED = {
    "hash": "Mem0's MD5 of the text",
    "score": "a search score, not part of the memory",
    "text_lemmatized": "Mem0's keyword form of the text",
}
MAPPING = [
    "memory id -> Idempotency-Key mem0:<id> (event_id derived) and properties.mem0_id",
    "memory -> text of the chain's head (the current version)",
    "history ADD/UPDATE rows -> earlier versions, mem0:<id>@<history id>, each superseded by "
    "the next; DELETE -> the memory is not imported",
    "updated_at (else created_at) -> ts; created_at -> properties.created_at",
    "expiration_date -> valid_until",
    "user_id, agent_id, run_id, app_id, actor_id, role, categories and any other field -> "
    "properties; metadata -> properties.metadata",
]


class Export(msgspec.Struct):
    """get_all's answer, optionally with the history table's rows beside it."""

    results: list[dict[str, Any]]
    history: list[dict[str, Any]] | None = None


SUBJECTS_MAPPING = "user_id -> subjects of every version (--subjects), and properties.user_id"


def convert(
    raw: bytes, *, user: str | None = None, name: str = "file", subjects: bool = False
) -> Conversion:
    """Records of a Mem0 export; with `user`, only that user_id's memories ("": those
    without one); with `subjects`, each memory's user_id is the subject of its events (a
    user_id that cannot be a subject id is refused naming its place)."""
    data = src.gunzip(raw, name)
    if data.lstrip()[:1] == b"[":  # get_all of an old version: the list alone
        data = b'{"results":' + data + b"}"
    export = src.decode(data, Export, name)
    report = Report(source="mem0", mapping=[*MAPPING, *([SUBJECTS_MAPPING] if subjects else [])])
    rows = _rows_by_memory(export.history or [], name)
    users = report.users
    records: list[Record] = []
    held = set()
    for i, item in enumerate(export.results):
        where = f"{name}: results[{i}]"
        memory_id = item.get("id")
        if not isinstance(memory_id, str) or not memory_id:
            raise InvalidRequest(f"{where}.id: expected the memory's id")
        held.add(memory_id)
        report.count("memories")
        owner = item.get("user_id")
        owner = "" if owner is None else str(owner)
        users[owner] = users.get(owner, 0) + 1
        if user is not None and owner != user:
            report.drop(f"memory of another user_id (--user {user})")
            continue
        history = item.get("history")
        if history is not None and not isinstance(history, list):
            raise InvalidRequest(f"{where}.history: expected a list of history rows")
        versions = [*(history or []), *rows.get(memory_id, [])]
        chain = _chain(item, versions, where, report)
        if subjects and owner:
            about = [_subject(owner, f"{where}.user_id")]
            for rec in chain:
                rec.subjects = about
        records.extend(chain)
    _unheld(rows, held, report)
    if len(users) > 1 and not subjects:
        report.notes.append(
            "memories of several user_ids: "
            + ", ".join(f"{u or '(none)'} ({n})" for u, n in sorted(users.items()))
            + "; for one tenant per user: --per-user, or --user ID with --tenant ID per user; "
            "for one tenant with each user as the data subject of its memories: --subjects"
        )
    records = ordered(records, report)
    for rec in records:
        report.created[rec.kind] = report.created.get(rec.kind, 0) + 1
    return Conversion(records=records, report=report)


def _subject(owner: str, where: str) -> str:
    """A user_id as a subject id (storage/model.py's rules), else InvalidRequest naming it."""
    try:
        return check_subject(owner, where)
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"{exc.detail}: this user_id cannot be a data subject; import without --subjects "
            "(--per-user or --user)"
        ) from None


def _rows_by_memory(rows: list[dict[str, Any]], name: str) -> dict[str, list[dict[str, Any]]]:
    """The top-level history rows by memory id, in their order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        memory_id = row.get("memory_id")
        if not isinstance(memory_id, str):
            raise InvalidRequest(f"{name}: history[{i}].memory_id: expected the memory's id")
        out.setdefault(memory_id, []).append(row)
    return out


def _unheld(rows: dict[str, list[dict[str, Any]]], held: set[str], report: Report) -> None:
    """Count the histories of memories get_all no longer returns."""
    for memory_id, history in rows.items():
        if memory_id in held:
            continue
        if history and history[-1].get("event") == "DELETE":
            report.count("deleted memories (history only)")
            report.drop("memory deleted in Mem0 (its history ends in DELETE)")
        else:
            report.drop("history of a memory get_all did not return")


def _chain(
    item: dict[str, Any], rows: list[dict[str, Any]], where: str, report: Report
) -> list[Record]:
    """A memory's versions, oldest first, each superseding the one before; the head last."""
    if rows and rows[-1].get("event") == "DELETE":
        report.drop("memory deleted in Mem0 (its history ends in DELETE)")
        return []
    head = _head(item, where, report)
    earlier: list[Record] = []
    for j, row in enumerate(rows):
        row_where = f"{where}.history[{j}]"
        event = row.get("event")
        report.count("history rows")
        if event not in ("ADD", "UPDATE"):
            report.drop(f"history row with event {event!r} (only ADD and UPDATE make versions)")
            continue
        earlier.append(_version(item, row, row_where, head))
    if earlier and earlier[-1].text == head.text:
        earlier.pop()  # the last ADD or UPDATE wrote what get_all returns: the head itself
    chain = [*earlier, head]
    for before, after in itertools.pairwise(chain):
        after.supersedes.append(before.key)
    return chain


def _head(item: dict[str, Any], where: str, report: Report) -> Record:
    """The memory as get_all returns it."""
    memory_id = item["id"]
    created = micros(item.get("created_at"), f"{where}.created_at")
    updated = micros(item.get("updated_at"), f"{where}.updated_at")
    ts = updated if updated is not None else created
    if ts is None:
        report.drop("created_at and updated_at (both absent: the event's ts is 1970)")
    properties: dict[str, Any] = {"mem0_id": memory_id}
    for field, value in item.items():
        if field in _DERIVED:
            report.drop(f"{field} ({_DERIVED[field]})")
        elif field not in _PLACED and value is not None:
            properties[field] = value
    if item.get("created_at") is not None:
        properties["created_at"] = item["created_at"]
    metadata = item.get("metadata")
    if metadata not in (None, {}):
        properties["metadata"] = metadata
    rec = Record(
        key=key_of(PREFIX, memory_id),
        kind=KIND,
        ts=ts or 0,
        text=src.text(item.get("memory"), f"{where}.memory"),
        properties=properties,
        valid_until=micros(item.get("expiration_date"), f"{where}.expiration_date"),
        where=where,
    )
    return window(rec, report)


def _version(item: dict[str, Any], row: dict[str, Any], where: str, head: Record) -> Record:
    """An earlier version from its history row."""
    row_id = row.get("id")
    if not isinstance(row_id, str | int) or row_id == "":
        raise InvalidRequest(f"{where}.id: expected the history row's id")
    when = micros(row.get("updated_at"), f"{where}.updated_at")
    if when is None:
        when = micros(row.get("created_at"), f"{where}.created_at")
    properties: dict[str, Any] = {
        k: head.properties[k]
        for k in ("mem0_id", "user_id", "agent_id", "run_id")
        if k in head.properties
    }
    properties["mem0_history_id"] = row_id
    properties["mem0_event"] = row.get("event")
    for field in ("actor_id", "role"):
        if row.get(field) is not None:
            properties[field] = row[field]
    return Record(
        key=key_of(PREFIX, f"{item['id']}@{row_id}"),
        kind=KIND,
        ts=when if when is not None else head.ts,
        text=src.text(row.get("new_memory"), f"{where}.new_memory"),
        properties=properties,
        where=where,
    )
