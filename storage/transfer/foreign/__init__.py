"""Imports from other memory servers' files: AutoMem, Mem0, Zep/Graphiti.

Each converter (automem.py, mem0.py, zep.py) reads the whole file and checks it before anything
is written, making `Record`s keyed by the source's ids and a `Report` (records.py); lines.py
writes them as memspine's own export and loads that through memspine's own import
(storage/transfer/landing.py), merging into the tenant, so a second run stores nothing twice.
"""

from __future__ import annotations

from storage.errors import InvalidRequest
from storage.transfer.foreign import automem, mem0, zep
from storage.transfer.foreign.bodies import batches
from storage.transfer.foreign.lines import land, present
from storage.transfer.foreign.records import Conversion, Report, event_id

SOURCES = ("automem", "mem0", "zep")
__all__ = [
    "SOURCES",
    "Conversion",
    "Report",
    "batches",
    "convert",
    "event_id",
    "land",
    "present",
]


def convert(
    source: str,
    raw: bytes,
    *,
    name: str = "file",
    embedding_model: str | None = None,
    user: str | None = None,
    subjects: bool = False,
) -> Conversion:
    """The records of another server's file (InvalidRequest naming the place of a fault);
    `subjects` (mem0): each memory's user_id becomes its events' subject."""
    if user is not None and source != "mem0":
        raise InvalidRequest("--user is for mem0 files, whose memories carry a user_id")
    if subjects and source != "mem0":
        raise InvalidRequest("--subjects is for mem0 files, whose memories carry a user_id")
    if source == "automem":
        return automem.convert(raw, embedding_model=embedding_model, name=name)
    if source == "mem0":
        if embedding_model is not None:
            raise InvalidRequest(
                "a mem0 export holds no embeddings; --embedding-model is for automem and zep"
            )
        return mem0.convert(raw, user=user, name=name, subjects=subjects)
    if source == "zep":
        return zep.convert(raw, embedding_model=embedding_model, name=name)
    raise InvalidRequest(f"no import from {source!r}; the sources are {', '.join(SOURCES)}")
