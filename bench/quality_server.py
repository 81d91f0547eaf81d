"""Retrieval quality on LoCoMo with server-side embeddings: text-only turns and questions.

Each conversation is appended as its own tenant through storage's real stores (LMDB log, Tantivy,
hnswlib) in a scratch directory, every turn a `kind: turn` event with text only; the vectors are
made as the server makes them (storage.embedders' `local` all-MiniLM-L6-v2) from the embedding
text the procedure chooses, and every question is asked with its text only, its vector made by
the same embedder from the question.

Embeddings of each distinct text list are cached in bench/out/embed-cache/ (not committed): a
variant's turns take a minute or more to embed on a busy machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import OUT, scratch_dir, write_json  # noqa: E402  (plain-file scripts)

from storage.embedders import make_embedder  # noqa: E402
from storage.model import AppendResult, NewEvent  # noqa: E402
from storage.recall import RecallQuery, recall, validate  # noqa: E402
from storage.tenant import Tenant  # noqa: E402

# shared/ beside the checkout, as bench/quality.py reads it, or at /work/shared from a worktree.
SHARED = next(
    (
        p / "shared" / "data"
        for p in (Path(__file__).resolve().parents[2], Path("/work"))
        if (p / "shared" / "data" / "locomo10.json").exists()
    ),
    Path("/work/shared/data"),
)
NPZ = SHARED / "locomo10-minilm.npz"
JSON = SHARED / "locomo10.json"
CACHE = OUT / "embed-cache"
DEV, HELD_OUT = range(0, 5), range(5, 10)
K = 10
DIM = 384


# -- the data ---------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One turn as a client appends it, and what the server knows beside its text."""

    dia_id: str
    text: str  # the event's text: f"{speaker}: {text}" plus the caption, as in the npz
    ts: int  # µs: the session's date and time, plus a minute a turn
    session: int


@dataclass
class Conversation:
    """One LoCoMo conversation: its turns in order and its questions (categories 1-4)."""

    index: int
    turns: list[Turn]
    questions: list[str]
    evidence: list[set[str]]
    categories: list[int]
    ref_turns: np.ndarray = field(repr=False)  # the npz's reference vectors, unit length
    ref_questions: np.ndarray = field(repr=False)


def session_start(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' as a datetime."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")


def load(z: Any, raw: list[dict[str, Any]], c: int) -> Conversation:
    """Conversation c from the npz (texts, questions, evidence) and the JSON (session dates)."""
    ids = [str(x) for x in z[f"turn_ids_{c}"]]
    texts = [str(x) for x in z[f"turn_texts_{c}"]]
    conv = raw[c]["conversation"]
    turns = []
    position: dict[int, int] = {}
    for dia_id, text in zip(ids, texts, strict=True):
        session = int(dia_id[1:].split(":")[0])
        n = position.get(session, 0)
        position[session] = n + 1
        start = session_start(conv[f"session_{session}_date_time"])
        ts = int(start.timestamp()) * 1_000_000 + n * 60_000_000
        turns.append(Turn(dia_id=dia_id, text=text, ts=ts, session=session))
    return Conversation(
        index=c,
        turns=turns,
        questions=[str(x) for x in z[f"q_texts_{c}"]],
        evidence=[{e.strip() for e in json.loads(str(x))} for x in z[f"q_evidence_{c}"]],
        categories=[int(x) for x in z[f"q_category_{c}"]],
        ref_turns=_unit(z[f"turn_emb_{c}"].astype(np.float32)),
        ref_questions=_unit(z[f"q_emb_{c}"].astype(np.float32)),
    )


def _unit(m: np.ndarray) -> np.ndarray:
    return np.asarray(m / np.linalg.norm(m, axis=-1, keepdims=True), dtype=np.float32)


def metrics(ranked: Sequence[str], evidence: set[str]) -> tuple[float, float]:
    """(nDCG@10, recall@10) of one ranked list of dia_ids, as bench/quality.py computes them."""
    top = list(ranked)[:K]
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(top) if d in evidence)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(K, len(evidence))))
    return dcg / ideal, len(set(top) & evidence) / len(evidence)


# -- embeddings, cached -----------------------------------------------------------------------------


class Embeddings:
    """storage.embedders' local embedder with a disk cache keyed by the exact texts."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.embedder = make_embedder("local")
        assert self.embedder is not None
        self.cache = cache
        self.seconds = 0.0  # spent embedding (cache misses only)
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        """(n, 384) unit vectors of texts, from the cache when these texts were embedded before."""
        key = hashlib.sha256(
            (self.embedder.name + "\x00" + "\x00".join(texts)).encode()
        ).hexdigest()[:24]
        path = self.cache / f"{key}.npy"
        if path.exists():
            return np.load(path)
        started = time.perf_counter()
        vecs = self.embedder.embed(texts)
        self.seconds += time.perf_counter() - started
        self.texts += len(texts)
        self.cache.mkdir(parents=True, exist_ok=True)
        np.save(path, vecs)
        return vecs


# -- the stores -------------------------------------------------------------------------------------


def build_tenant(root: Path, conv: Conversation, vectors: np.ndarray, model: str) -> Tenant:
    """A fresh tenant holding every turn with its vector, appended 16 at a time in order."""
    tenant = Tenant.open(f"locomo-{conv.index}", root, embedding_dim=DIM)
    for start in range(0, len(conv.turns), 16):
        batch = []
        for i in range(start, min(start + 16, len(conv.turns))):
            turn = conv.turns[i]
            batch.append(
                NewEvent(
                    kind="turn",
                    ts=turn.ts,
                    text=turn.text,
                    embedding=vectors[i].tolist(),
                    embedding_model=model,
                    properties_raw=msgspec.json.encode({"dia_id": turn.dia_id}),
                )
            )
        results = tenant.submit_append(batch).result()
        assert all(isinstance(r, AppendResult) for r in results), results
    return tenant


def ask(tenant: Tenant, text: str, vector: np.ndarray | None, **options: Any) -> list[str]:
    """One fused recall as the engine runs it (validate, then recall); dia_ids ranked."""
    q = RecallQuery(
        text=text,
        embedding=None if vector is None else vector.tolist(),
        kind="turn",
        k=K,
        **options,
    )
    with tenant.log.reader() as r:
        validate(q, tenant.dim, r.meta_str("model"))
        result = recall(r, tenant.keyword, tenant.vectors, q, embeddings=False)
    return [msgspec.json.decode(h.event.properties_raw or b"{}")["dia_id"] for h in result.hits]
