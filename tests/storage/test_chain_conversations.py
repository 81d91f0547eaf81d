"""The chain of turns is per conversation (storage/tenants/chains.py, docs/recall.md): a turn
carries the stored vector of the previous turn of its own `conversation`, so two conversations
written interleaved in one tenant keep separate chains, in one batch and across batches."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from storage.log import layout
from storage.model import CHAIN_WEIGHT, NewEvent, ServerSpace, StoredEvent, StoredVector
from storage.tenants.embedding import chain
from storage.tenants.tenant import Tenant
from tests.support.embedders import CountingEmbedder, unit

T0 = 1_800_000_000_000_000
MINUTE = 60_000_000
OFFER = ServerSpace(model="test/disk-model", dim=4)


def folded(own: np.ndarray, prev: np.ndarray) -> np.ndarray:
    v = own + CHAIN_WEIGHT * prev
    return np.asarray(v / np.linalg.norm(v))


def turn(i: int, conversation: str | None, minute: int) -> StoredEvent:
    props = {"conversation": conversation} if conversation is not None else {}
    return StoredEvent(
        event_id=f"e{i}", seq=i + 1, kind="turn", ts=T0 + minute * MINUTE, filterable=props
    )


def test_two_interleaved_conversations_keep_separate_chains() -> None:
    own = np.eye(4, dtype=np.float32)
    # a1 b1 a2 b2, a minute apart: a2 folds a1 (not b1), b2 folds b1 (not a2).
    events = [turn(0, "a", 0), turn(1, "b", 1), turn(2, "a", 2), turn(3, "b", 3)]
    out = chain(events, own, None)
    assert np.allclose(out[0], own[0]) and np.allclose(out[1], own[1])
    assert np.allclose(out[2], folded(own[2], out[0]))
    assert np.allclose(out[3], folded(own[3], out[1]))


def test_turns_without_a_conversation_chain_with_each_other_only() -> None:
    own = np.eye(4, dtype=np.float32)
    events = [turn(0, None, 0), turn(1, "a", 1), turn(2, None, 2), turn(3, "a", 50)]
    out = chain(events, own, None)
    assert np.allclose(out[2], folded(own[2], out[0]))
    assert np.allclose(out[3], own[3])  # 49 minutes after its conversation's turn: a new chain


def test_the_start_of_each_conversation_is_found_across_batches(tmp_path: Path) -> None:
    """Through a real tenant: the second batch's turns fold their own conversation's stored
    turn, the latest of the tenant's being the other conversation's."""
    t = Tenant.open("t", tmp_path / "t", embedding_dim=4, offer=lambda: OFFER)
    try:

        def append(conversation: str, minute: int) -> None:
            raw = msgspec.json.encode({"conversation": conversation})
            ev = NewEvent(kind="turn", ts=T0 + minute * MINUTE, text="hi", properties_raw=raw)
            assert len(t.submit_append([ev]).result()) == 1

        def own_of(ev: StoredEvent) -> np.ndarray:
            return np.asarray(np.eye(4, dtype=np.float32)[ev.seq % 4])

        def embed() -> list[tuple[StoredEvent, np.ndarray]]:
            events, before, deletes, model = t.to_embed(10)
            assert model is not None
            made = chain(events, np.asarray([own_of(ev) for ev in events]), before)
            pairs = list(zip(events, made, strict=True))
            items = [StoredVector(e.event_id, e.seq, v.tolist()) for e, v in pairs]
            assert t.store_vectors(items, model, deletes).result() == len(items)
            return pairs

        append("a", 0)
        append("b", 1)
        (_a1, a1), (_b1, b1) = embed()
        append("a", 2)
        append("b", 3)
        (a2_ev, a2), (b2_ev, b2) = embed()
        assert np.allclose(a2, folded(own_of(a2_ev), a1))
        assert np.allclose(b2, folded(own_of(b2_ev), b1))
    finally:
        t.close()


def test_reembed_keeps_each_conversations_chain_across_its_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memspine-admin reembed, two texts an embed call: the second call's turns fold their own
    conversation's turn from the first, as one call over them all would."""
    from storage.tenants import reembed as reembed_module

    monkeypatch.setattr(reembed_module, "BATCH", 2)
    root = tmp_path / "t"
    t = Tenant.open("t", root, embedding_dim=4, offer=lambda: OFFER)
    texts = ["a one", "b one", "a two", "b two", "a three"]
    events = [
        NewEvent(
            kind="turn",
            ts=T0 + i * MINUTE,
            text=text,
            properties_raw=msgspec.json.encode({"conversation": text[0]}),
        )
        for i, text in enumerate(texts)
    ]
    assert len(t.submit_append(events).result()) == len(texts)
    t.close()
    embedder = CountingEmbedder()
    reembed_module.reembed(root, embedder)
    assert embedder.calls == [2, 2, 1]
    t = Tenant.open("t", root, embedding_dim=4)
    try:
        with t.log.reader() as r:
            stored = [r.get(e) for _s, op, e in r.ops_after(0) if op == layout.OP_APPEND]
        got = np.asarray([ev.embedding for ev in stored if ev is not None], dtype=np.float32)
        light = [msgspec.structs.replace(ev, embedding=None) for ev in stored if ev is not None]
        at_once = chain(light, np.stack([unit(text) for text in texts]), None)
        assert np.allclose(got, at_once, atol=1e-6)
        assert not np.allclose(got[2], unit(texts[2]))  # a two carries a one
    finally:
        t.close()
