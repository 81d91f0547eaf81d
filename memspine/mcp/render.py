"""Tool answers as compact text a model reads well: one line per event, full ids, UTC times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from storage.errors import InvalidRequest

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LINE_TEXT_CHARS = 1000  # a recall or listing line cuts text here; memory_get has all of it
TEXT_ROWS = 100  # Cypher rows shown as text; the structured content has every row
SEP = " · "
MAX_TIME_DIGITS = 19  # 2^62 has 19 digits


def iso(ts: int) -> str:
    """Microseconds since the epoch as an ISO 8601 UTC time to the second."""
    try:
        return (EPOCH + timedelta(microseconds=ts)).strftime("%Y-%m-%dT%H:%M:%SZ")
    except OverflowError:
        return f"{ts} µs"


def parse_time(value: str | int, field: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) or integer microseconds, as microseconds."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.isascii() and text.isdigit():
        if len(text) > MAX_TIME_DIGITS:  # int() of thousands of digits is slow, then refused
            raise InvalidRequest(f"{field} must be from 0 to 2^62 microseconds")
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(
            f"{field} must be an ISO 8601 time such as 2026-05-01T09:00:00Z, "
            "or microseconds since the Unix epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) // timedelta(microseconds=1)


def one_line(text: str | None, limit: int = LINE_TEXT_CHARS) -> str:
    """Text on one line (whitespace collapsed), cut at limit characters with a note of what was left."""
    if not text:
        return "(no text)"
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]}… [{len(flat) - limit} more characters: memory_get has the rest]"


def event_line(ev: dict[str, Any]) -> str:
    """event_id · kind · time · text, then how a recall reached it."""
    line = SEP.join((ev["event_id"], ev["kind"], iso(ev["ts"]), one_line(ev.get("text"))))
    if "via" in ev:
        line += f"{SEP}via {ev['via']} (hop {ev.get('hop', 1)})"
    if ev.get("replaces"):
        line += f"{SEP}replaces {', '.join(ev['replaces'])}"
    return line


def recall_text(out: dict[str, Any]) -> str:
    """Ranked hits, then walked ones, then what the walk left out."""
    hits = out["hits"]
    withheld = withheld_text(out.get("withheld"))
    if not hits:
        if withheld:
            return f"No current matching events. {withheld}"
        return "No matching events. Try other distinctive words, or drop kind/filter."
    ranked = [h for h in hits if "via" not in h]
    walked = [h for h in hits if "via" in h]
    lines = [f"{len(ranked)} hit(s), best first:"]
    lines += [f"{i}. {event_line(h)}" for i, h in enumerate(ranked, 1)]
    if walked:
        lines.append(f"{len(walked)} linked event(s) reached over SOURCE_FROM links:")
        lines += [f"- {event_line(h)}" for h in walked]
    walk = out.get("walk")
    if walk and walk.get("omitted"):
        omitted = walk["omitted"]
        lines.append(
            f"The walk reached {walk['reached']} linked event(s) and left out {len(omitted)}: "
            + ", ".join(omitted)
        )
    if withheld:
        lines.append(withheld)
    return "\n".join(lines)


WITHHELD_REASONS = (
    ("superseded", "superseded by newer events"),
    ("expired", "past their valid_until"),
    ("not_yet_valid", "before their valid_from"),
)


def withheld_text(withheld: dict[str, int] | None) -> str | None:
    """What current state kept out of a recall, in words; None if nothing."""
    if not withheld:
        return None
    parts = [f"{withheld[key]} {why}" for key, why in WITHHELD_REASONS if withheld.get(key)]
    return "Current state left out matching events: " + "; ".join(parts) + "."


def list_text(out: dict[str, Any]) -> str:
    """One line per event newest first, and the cursor for more."""
    events = out["events"]
    if not events:
        return "No events match."
    lines = [f"{len(events)} event(s), newest first:"]
    lines += [f"- {event_line(ev)}" for ev in events]
    if out.get("next_cursor"):
        lines.append(f'More events: call memory_list again with cursor "{out["next_cursor"]}".')
    return "\n".join(lines)


def event_text(ev: dict[str, Any]) -> str:
    """One event in full."""
    lines = [
        f"event_id: {ev['event_id']}",
        f"kind: {ev['kind']}",
        f"time: {iso(ev['ts'])} (ts {ev['ts']})",
    ]
    if "current" in ev:
        state = "current" if ev["current"] else "not current"
        if ev.get("superseded_by"):
            state += f"; superseded by {', '.join(ev['superseded_by'])}"
        lines.append(f"state: {state}")
    if ev.get("supersedes"):
        lines.append(f"supersedes: {', '.join(ev['supersedes'])}")
    for name in ("valid_from", "valid_until"):
        if name in ev:
            lines.append(f"{name}: {iso(ev[name])}")
    if ev.get("properties"):
        lines.append(f"properties: {msgspec.json.encode(ev['properties']).decode()}")
    lines.append("text:")
    lines.append(ev["text"] if ev.get("text") else "(no text)")
    return "\n".join(lines)


def append_text(out: dict[str, Any]) -> str:
    """The new id, whether it was a replay, and the ids that linked to nothing."""
    if out.get("replayed"):
        text = (
            f"Already stored as {out['event_id']} (same idempotency_key); nothing new was written."
        )
    else:
        text = f"Stored as {out['event_id']}."
    if out.get("unlinked"):
        text += f" These ids name no event and were not linked: {', '.join(out['unlinked'])}."
    return text


def cypher_text(out: dict[str, Any]) -> str:
    """A header of column names, then one JSON array per row."""
    rows = out["rows"]
    enc = msgspec.json.encode
    lines = [f"columns: {enc(out['columns']).decode()}", f"{len(rows)} row(s):"]
    lines += [enc(row).decode() for row in rows[:TEXT_ROWS]]
    if len(rows) > TEXT_ROWS:
        lines.append(f"… {len(rows) - TEXT_ROWS} more row(s) in the structured result; add LIMIT.")
    return "\n".join(lines)


def delete_text(out: dict[str, Any], event_id: str) -> str:
    """What a dry run would delete, or that the delete happened."""
    if "would_delete" in out:
        ids = out["would_delete"]
        return (
            f"Dry run, nothing deleted. Deleting {event_id} would remove {len(ids)} event(s): "
            f"{', '.join(ids)}. Confirm with the user, then call again with dry_run=false."
        )
    ids = out.get("deleted_ids") or [event_id]
    done = f"Deleted {len(ids)} event(s): {', '.join(ids)}. They are unreadable now"
    if out.get("purged"):
        return done + " and their bytes have left the disk."
    if out.get("purge_pending"):
        return done + f", but their bytes are still on disk: {out.get('detail', '')}."
    return done + "; their bytes leave the disk at the next purge."


def error_text(code: str, detail: str) -> str:
    """An error as the model sees it."""
    return f"Error ({code}): {detail}"
