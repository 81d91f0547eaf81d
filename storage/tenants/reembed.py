"""Re-embedding: a server-space tenant's vectors made again by the current embedder (another
model, or another dimension), the new graph built beside the old one and switched in at the end.

The tenant must be closed (memspine-admin reembed holds the data directory). Until the switch
the tenant is as it was; a crash at any point leaves either the old vectors or the new ones,
never a mixture: the log's records change in one transaction, and the saved graph is removed
before that commit and the new one put in place after it (a tenant opened without a saved graph
builds it from the log, whatever the log holds).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from storage import files
from storage.embedders.base import Embedder, EmbedderError
from storage.errors import InvalidRequest
from storage.fsync import fsync_dir
from storage.index.vectors import VectorIndex
from storage.log import layout, revisions
from storage.log.eventlog import EventLog
from storage.model import CHAIN_KIND, StoredEvent, conversation_of
from storage.tenants.chains import Key
from storage.tenants.embedding import chain

BATCH = 256  # texts per embed call (the local embedder batches them by length itself)
TRIES = 3  # calls of one batch before the re-embedding gives up, the tenant left as it was
RETRY_SECS = 0.5  # the first wait before a failed batch is tried again, doubled each time
RETRY_MAX_SECS = 30.0
BESIDE = "reembed"  # the new graph's directory inside the tenant's, until the switch
CLIENT_SPACE = "this tenant's vectors are its clients' (client-space): the server cannot make them"


class ReembedStats(msgspec.Struct, frozen=True, kw_only=True):
    """What a re-embedding did."""

    events: int  # events given a new vector
    model: str
    dim: int
    previous_model: str | None
    previous_dim: int | None


def reembed(
    root: Path, embedder: Embedder, progress: Callable[[int, int], None] | None = None
) -> ReembedStats:
    """Give every live event with text of the (closed) tenant at root a vector of `embedder`,
    in append order with the chain of turns, and switch the tenant to its model and dimension."""
    log = EventLog.open(root / files.LOG)
    try:
        return _reembed(root, log, embedder, progress)
    finally:
        log.close()


def _reembed(
    root: Path, log: EventLog, embedder: Embedder, progress: Callable[[int, int], None] | None
) -> ReembedStats:
    """reembed, the log open."""
    with log.reader() as r:
        space, old_model, old_dim = r.space(), r.meta_str(layout.MODEL), r.meta_int(layout.DIM)
        if space == layout.SPACE_CLIENT:
            raise InvalidRequest(CLIENT_SPACE)
        events = [
            ev
            for _seq, op, event_id in r.ops_after(0)
            if op == layout.OP_APPEND and (ev := r.get_light(event_id)) is not None and ev.text
        ]
        last = r.last_seq()
    total = len(events)
    if progress is not None:
        progress(0, total)
    beside = root / BESIDE
    shutil.rmtree(beside, ignore_errors=True)
    beside.mkdir()
    try:
        index, vectors = _embed_all(beside, events, embedder, progress)
    except BaseException:  # the tenant is as it was: nothing of the new graph stays behind
        shutil.rmtree(beside, ignore_errors=True)
        raise
    dim = embedder.dim or old_dim or 0
    if index is None:  # nothing to embed: an empty graph of the new dimension
        index = VectorIndex.create_empty(beside / files.VECTORS, dim)
    index.save()
    index.close()
    new = np.concatenate(vectors) if vectors else np.zeros((0, dim), dtype=np.float32)
    _switch(root, log, events, new, embedder.name, dim, last)
    return ReembedStats(
        events=total, model=embedder.name, dim=dim, previous_model=old_model, previous_dim=old_dim
    )


def _embed_all(
    beside: Path,
    events: list[StoredEvent],
    embedder: Embedder,
    progress: Callable[[int, int], None] | None,
) -> tuple[VectorIndex | None, list[np.ndarray]]:
    """Every event's new vector, in append order with the chain of turns, into a graph beside."""
    total = len(events)
    vectors: list[np.ndarray] = []
    index: VectorIndex | None = None
    before: dict[Key, StoredEvent] = {}  # each conversation's last turn, with its new vector
    try:
        for start in range(0, total, BATCH):
            batch = events[start : start + BATCH]
            made = chain(batch, _embed(embedder, [ev.text or "" for ev in batch]), before)
            if index is None:
                index = VectorIndex.create_empty(beside / files.VECTORS, int(made.shape[1]))
            index.add([ev.seq for ev in batch], made.tolist())
            vectors.append(made)
            last = {conversation_of(ev): i for i, ev in enumerate(batch) if ev.kind == CHAIN_KIND}
            for key, i in last.items():
                before[key] = msgspec.structs.replace(batch[i], embedding=made[i].tolist())
            if progress is not None:
                progress(start + len(batch), total)
    except BaseException:
        if index is not None:
            index.close()  # its inserter thread with it
        raise
    return index, vectors


def _embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """The texts' vectors; a failed call tried again (a local model whose process died is
    started again by the next call; an endpoint may be back), TRIES calls in all."""
    for attempt in range(TRIES - 1):
        try:
            return embedder.embed(texts)
        except EmbedderError as exc:
            time.sleep(min(exc.retry_after or RETRY_SECS * 2**attempt, RETRY_MAX_SECS))
    return embedder.embed(texts)  # the last call: its error is the run's


def _switch(
    root: Path,
    log: EventLog,
    events: list[StoredEvent],
    vectors: np.ndarray,
    model: str,
    dim: int,
    last: int,
) -> None:
    """Write the new vectors into the records and the tenant's space, then put the new graph
    in place of the old one."""
    for name in (files.VECTORS, files.VECTORS_LIVE):
        (root / name).unlink(missing_ok=True)
    fsync_dir(root)

    given = {ev.event_id: vector for ev, vector in zip(events, vectors, strict=True)}
    log.write(lambda txn: revisions.replace_vectors(txn, log.dbs, given, model, dim, last))
    beside = root / BESIDE
    for name in (files.VECTORS, files.VECTORS_LIVE):
        (beside / name).replace(root / name)
    fsync_dir(root)
    shutil.rmtree(beside, ignore_errors=True)
