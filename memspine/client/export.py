"""An export read as it streams: its bytes cut into lines, each counted and hashed, the trailer
checked against them, as storage/transfer/format.py writes them (docs/api.md, Export format).

The sync and async clients feed it the chunks they receive and hand on what it returns; a
stream cut short, changed, or with lines missing or added raises BrokenExport, at the latest
when the stream ends. The client must not import the server's storage package
(tests/storage/test_import_rule.py), so this is the reading side of the format's trailer rule
only: counts and SHA-256; `memspine-admin import` checks every field (Reader in
storage/transfer/format.py), and tests/server/test_client.py holds both to the same files.
"""

from __future__ import annotations

import hashlib
from typing import NoReturn

import msgspec

from memspine.client import models as m
from memspine.client.errors import BrokenExport, ConnectionFailed

FORMAT = "memspine-export"


class _Tag(msgspec.Struct):
    type: str


_tag = msgspec.json.Decoder(_Tag).decode
_line = msgspec.json.Decoder(m.ExportLine).decode
_end = msgspec.json.Decoder(m.ExportEnd).decode
_properties = msgspec.json.Decoder(dict).decode


class ExportCheck:
    """One export's lines as they come: each chunk to `lines` (the lines as received, newline
    included) or `records` (each line as its Struct), then `finish` at the end of the stream."""

    def __init__(self) -> None:
        self.line = 0
        self.events = 0
        self.idempotency = 0
        self.header: m.ExportHeader | None = None
        self.end: m.ExportEnd | None = None
        self._hash = hashlib.sha256()
        self._rest = b""

    def lines(self, chunk: bytes) -> list[bytes]:
        """The whole lines this chunk completes, each checked, as they came."""
        lines = self._split(chunk)
        for raw in lines:
            self._check(raw, typed=False)
        return lines

    def records(self, chunk: bytes) -> list[m.ExportLine]:
        """The whole lines this chunk completes, each checked, as Structs (an event's
        `properties` decoded from whichever form the line holds them in)."""
        out = [self._check(raw, typed=True) for raw in self._split(chunk)]
        return [v for v in out if v is not None]

    def _split(self, chunk: bytes) -> list[bytes]:
        data = self._rest + chunk if self._rest else chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        return [line + b"\n" for line in data[: cut - 1].split(b"\n")] if cut else []

    def finish(self) -> m.ExportEnd:
        """At the end of the stream: its trailer, or BrokenExport saying why there is none."""
        if self._rest:
            self._broken(f"line {self.line + 1}: the export ends in the middle of a line")
        if self.end is None:
            self._broken(f"the export ends after line {self.line} without its end line")
        return self.end

    def _check(self, raw: bytes, *, typed: bool) -> m.ExportLine | None:
        self.line += 1
        n = self.line
        if self.end is not None:
            self._broken(f"line {n}: the export goes on after its end line")
        try:
            kind = _tag(raw).type
            if kind == "end":
                return self._close(_end(raw))
            value = _line(raw) if typed and kind in _KNOWN else None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._broken(f"line {n}: not a line of a memspine export: {exc}")
        self._hash.update(raw)
        if kind == "header":
            if n != 1:
                self._broken(f"line {n}: a header line that is not the first line")
            header = value if isinstance(value, m.ExportHeader) else None
            self.header = header or msgspec.json.decode(raw, type=m.ExportHeader)
            if self.header.format != FORMAT:
                self._broken(f"line {n}: not a memspine export (format {self.header.format!r})")
        elif self.header is None:
            self._broken(f"line {n}: the export does not start with a header line")
        elif kind == "event":
            self.events += 1
        elif kind == "idempotency":
            self.idempotency += 1
        # A line type of a later version of the format is counted by no trailer field: hashed
        # above, handed on as it came, left out of the typed lines.
        if isinstance(value, m.ExportEvent) and value.properties_text is not None:
            value = msgspec.structs.replace(value, properties=_properties(value.properties_text))
        return value

    def _close(self, end: m.ExportEnd) -> m.ExportEnd:
        n = self.line
        if self.header is None:
            self._broken(f"line {n}: the export does not start with a header line")
        held = (self.events, self.idempotency)
        if (end.events, end.idempotency) != held or end.events != self.header.events:
            self._broken(
                f"line {n}: the end line counts {end.events} events and {end.idempotency} "
                f"idempotency records (the header {self.header.events} events), the export "
                f"holds {held[0]} and {held[1]}"
            )
        if end.sha256 != self._hash.hexdigest():
            self._broken(f"line {n}: the checksum does not match the lines before it")
        self.end = end
        return end

    def _broken(self, detail: str) -> NoReturn:
        raise BrokenExport(detail + ": what came is not a whole export")


_KNOWN = frozenset({"header", "event", "idempotency"})


def broken_off(check: ExportCheck, exc: Exception) -> ConnectionFailed:
    """The connection broke while the export streamed: nothing to resume, say where it stopped."""
    why = str(exc) or type(exc).__name__
    return ConnectionFailed(
        f"the export broke off after line {check.line}: {why}; export again", attempts=1
    )
