"""Event ids: a UUID's text and its 16 raw bytes, which every index key of the log ends with
(storage/log/layout.py) and Cypher's nodes carry (storage/cypher)."""

from __future__ import annotations

import uuid

ID_BYTES = 16  # an event id is a UUID, stored as its 16 bytes


def id_bytes(event_id: str) -> bytes:
    """The 16 raw bytes of a UUID string."""
    # Every lookup and scan step converts ids: the canonical form is read directly (faster than
    # uuid.UUID); anything else, junk included, gets exactly uuid.UUID's answer.
    e = event_id
    if len(e) == 36 and e[8] == e[13] == e[18] == e[23] == "-":
        try:
            raw = bytes.fromhex(e[:8] + e[9:13] + e[14:18] + e[19:23] + e[24:])
        except ValueError:
            raw = b""
        if (
            len(raw) == ID_BYTES
        ):  # 32 hex digits; fromhex skips spaces, so fewer bytes is not a UUID
            return raw
    return uuid.UUID(event_id).bytes


def id_str(raw: bytes) -> str:
    """The canonical UUID string of 16 raw bytes."""
    h = bytes(raw).hex()  # faster than str(uuid.UUID(bytes=raw)), the same text
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
