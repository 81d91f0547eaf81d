"""Retrieval quality on LoCoMo with server-side embeddings: text-only turns and questions.

Each conversation is appended as its own tenant through storage's real stores (LMDB log, Tantivy,
hnswlib) in a scratch directory: every turn a `kind: turn` event whose text is the turn as the
client sends it (`f"{speaker}: {text}"` plus the image caption, the texts of
`locomo10-minilm.npz`), its `speaker` a property, its `ts` the session's date and time plus a
minute a turn, its vector
made as the server makes it (`storage.embedders`' local all-MiniLM-L6-v2, then `server_vectors`).
Every question (categories 1-4 with evidence) is asked with its text only; its vector is the
same embedder's vector of the question, and recall runs as the engine runs it (validate, then
`storage.read.recall.recall`) with the procedure's feedback.

Procedures, each end to end through the stores:
  client      the npz's reference vectors sent by a client, with the feedback the server gives
              them (bench/quality.py's fused figure)
  server      the server embeds each turn's text and each question as they are (target: equal
              to client within 0.01)
  chosen      what docs/recall.md specifies: each turn's vector carries its previous turn's
              (CONTEXT), and the query vector moves toward the first keyword hits (FEEDBACK)
  served      (--http) the same through a real memspine-server that embeds (MEMSPINE_EMBEDDER=
              local): text-only batch appends and text-only recalls over HTTP; equal to
              `chosen` up to BM25 ties if the server does what docs/recall.md says

`--sweep` also runs every variant tried (turn texts, turn-vector context, question rephrasings,
fusion, pseudo-relevance feedback, keyword expansion) in process: the keyword arm from the same
stores, the vector arm by exact cosine (what storage does for tenants this small), fused as
storage.read.recall fuses; checked against the end-to-end figure of `chosen` in the same run.
`--interleaved` also writes the conversations round robin into one tenant (each turn with its
`conversation` and `speaker` properties), vectors chained per tenant and per conversation by
storage's own `chain`, and asks each question inside its conversation (`filter`).
`--cost` measures what feedback adds to one fused recall at 100,000 events (bench/recall.py's
corpus) and what embedding a query costs.

Nothing is random (no seed to fix) except --cost's corpus, which uses bench/recall.py's seed.
Embeddings of each distinct list of texts are cached in bench/out/embed-cache/ (not committed).
Conversations 0-4 are for development; `--held-out` runs 5-9 once, to report, never to choose.
LoCoMo is CC BY-NC 4.0, used here to evaluate only.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
from common import (  # noqa: E402  (plain files)
    OUT,
    median,
    percentile,
    scratch_dir,
    start_memspine,
    write_json,
)

from storage.embedders import Embedder, make_embedder  # noqa: E402
from storage.index.keyword import STOP_WORDS, query_terms  # noqa: E402
from storage.model import AppendResult, FilterValue, NewEvent, StoredEvent  # noqa: E402
from storage.read.recall import Feedback, RecallQuery, recall, validate  # noqa: E402
from storage.tenants.embedding import chain  # noqa: E402
from storage.tenants.tenant import Tenant  # noqa: E402

# shared/ beside the checkout, as bench/quality.py reads it, or at /work/shared from a worktree.
SHARED = next(
    (
        p / "shared" / "data"
        for p in (BENCH.parents[1], Path("/work"))
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
MINUTE = 60_000_000  # µs
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}

# The chosen procedure (docs/recall.md, "Server-embedded recall"). A turn's stored vector is
# unit(own + CONTEXT * stored vector of the tenant's previous event of its kind), when that
# event came at most CONTEXT_GAP before it; the query moves toward the first keyword hits.
CONTEXT = 0.7
CONTEXT_GAP = 30 * MINUTE
FEEDBACK = Feedback(hits=2, weight=0.5)


# -- the data ---------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One turn as a client appends it."""

    dia_id: str
    text: str  # the event's text: f"{speaker}: {text}" plus the caption, as in the npz
    ts: int  # µs: the session's date and time, plus a minute a turn
    session: int

    @property
    def speaker(self) -> str:
        """Who said it, as an application sends it beside the text (the `speaker` property)."""
        return self.text.split(": ", 1)[0]


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
        ts = int(start.timestamp()) * 1_000_000 + n * MINUTE
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
        embedder = make_embedder("local")
        assert embedder is not None
        self.embedder: Embedder = embedder
        self.cache = cache
        self.seconds = 0.0  # spent embedding (cache misses only)
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        """(n, 384) unit vectors of texts, from the cache when these texts were embedded before."""
        key = hashlib.sha256("\x00".join([self.embedder.name, *texts]).encode()).hexdigest()
        path = self.cache / f"{key[:24]}.npy"
        if path.exists():
            return np.asarray(np.load(path), dtype=np.float32)
        started = time.perf_counter()
        vecs = self.embedder.embed(texts)
        self.seconds += time.perf_counter() - started
        self.texts += len(texts)
        self.cache.mkdir(parents=True, exist_ok=True)
        np.save(path, vecs)
        return vecs


# -- what the server embeds -------------------------------------------------------------------------


def date_of(turn: Turn) -> str:
    """The turn's day as words ('8 May 2023'), from its ts."""
    return datetime.fromtimestamp(turn.ts / 1e6).strftime("%-d %B %Y")


def _near(turns: list[Turn], i: int, j: int) -> bool:
    """Whether turn j is i's neighbour in the server's sense: within CONTEXT_GAP of it."""
    return 0 <= j < len(turns) and abs(turns[i].ts - turns[j].ts) <= CONTEXT_GAP


def _window(turns: list[Turn], i: int, before: int, after: int) -> str:
    """Turn i's text with up to `before` previous and `after` next neighbours, one a line."""
    lo = i
    while lo > i - before and _near(turns, i, lo - 1):
        lo -= 1
    hi = i
    while hi < i + after and _near(turns, i, hi + 1):
        hi += 1
    return "\n".join(t.text for t in turns[lo : hi + 1])


# The texts a turn could be embedded as (the event's text is always the turn as sent).
TURN_TEXTS: dict[str, Callable[[list[Turn], int], str]] = {
    "as sent": lambda turns, i: turns[i].text,
    "date first": lambda turns, i: f"{date_of(turns[i])}: {turns[i].text}",
    "no speaker": lambda turns, i: turns[i].text.split(": ", 1)[1],
    "previous turn + turn": lambda turns, i: _window(turns, i, 1, 0),
    "turn + next turn": lambda turns, i: _window(turns, i, 0, 1),
    "previous + turn + next": lambda turns, i: _window(turns, i, 1, 1),
}

_WH = re.compile(
    r"^\s*(when|what|where|who|whom|whose|which|why|how(\s+(many|much|long|often|old|far))?)\s+"
    r"((did|does|do|is|are|was|were|has|have|had|will|would|can|could|should|might)\s+)?",
    re.IGNORECASE,
)


def _declarative(q: str) -> str:
    s = _WH.sub("", q).rstrip(" ?")
    return s[:1].upper() + s[1:] if s else q


# The texts a question could be embedded as (the keyword arm always gets the question as asked).
QUERY_TEXTS: dict[str, Callable[[str], str]] = {
    "as asked": lambda q: q,
    "no question mark": lambda q: q.rstrip(" ?"),
    "question word dropped": _declarative,
    "keyword terms only": lambda q: " ".join(query_terms(q)),
}


@dataclass(frozen=True)
class Context:
    """How a turn's stored vector mixes in its neighbours' (0: its text's vector alone).

    chain: unit(own + prev * the previous turn's *stored* vector) — what the server can do
    with the vector it stored a moment ago; else unit(own + prev * previous own + next * next
    own), from the neighbours' text vectors. across: ignore CONTEXT_GAP (sessions run on)."""

    prev: float = 0.0
    next: float = 0.0
    chain: bool = False
    across: bool = False


def server_vectors(turns: list[Turn], own: np.ndarray, ctx: Context) -> np.ndarray:
    """The vectors the server stores for turns in append order, from their text vectors."""
    if ctx.prev == 0 and ctx.next == 0:
        return own
    out = own.copy()
    for i in range(len(turns)):
        v = own[i].copy()
        if i > 0 and (ctx.across or _near(turns, i, i - 1)):
            v += ctx.prev * (out[i - 1] if ctx.chain else own[i - 1])
        if ctx.next and i + 1 < len(turns) and (ctx.across or _near(turns, i, i + 1)):
            v += ctx.next * own[i + 1]
        out[i] = v / np.linalg.norm(v)
    return out


@dataclass(frozen=True)
class Procedure:
    """Everything the server chooses: turn text and context, question text, feedback."""

    turn_text: str = "as sent"
    context: Context = Context()
    query_text: str = "as asked"
    feedback: Feedback | None = None
    people_out: bool = False  # the question less the people it names (asked_texts)


PROCEDURES = {
    "server": Procedure(),
    "chosen": Procedure(
        context=Context(prev=CONTEXT, chain=True), feedback=FEEDBACK, people_out=True
    ),
}


def asked_texts(tenant: Tenant, questions: list[str]) -> list[str]:
    """What a server that embeds makes each question's vector from in this tenant: the text
    less the people it names (storage/tenants/serving.py, Tenant.embedded_question)."""
    return [tenant.embedded_question(RecallQuery(text=q)) for q in questions]


# -- the stores -------------------------------------------------------------------------------------


def build_tenant(root: Path, conv: Conversation, vectors: np.ndarray | None) -> Tenant:
    """A fresh tenant holding every turn (with its vector, if given), 16 a group commit, in order."""
    tenant = Tenant.open(f"locomo-{conv.index}", root, embedding_dim=DIM)
    model = "sentence-transformers/all-MiniLM-L6-v2"
    for start in range(0, len(conv.turns), 16):
        batch = []
        for i in range(start, min(start + 16, len(conv.turns))):
            turn = conv.turns[i]
            batch.append(
                NewEvent(
                    kind="turn",
                    ts=turn.ts,
                    text=turn.text,
                    embedding=None if vectors is None else vectors[i].tolist(),
                    embedding_model=None if vectors is None else model,
                    properties_raw=msgspec.json.encode(
                        {"dia_id": turn.dia_id, "speaker": turn.speaker}
                    ),
                )
            )
        results = tenant.submit_append(batch).result()
        assert all(isinstance(r, AppendResult) for r in results), results
    return tenant


def ask(
    tenant: Tenant,
    text: str,
    vector: np.ndarray | None,
    *,
    k: int = K,
    feedback: Feedback | None = None,
    filters: dict[str, FilterValue] | None = None,
) -> list[str]:
    """One recall as the engine runs it (validate, then recall); dia_ids ranked."""
    q = RecallQuery(
        text=text,
        embedding=None if vector is None else vector.tolist(),
        kind="turn",
        k=k,
        filters=filters or {},
    )
    with tenant.log.reader() as r:
        validate(q, tenant.dim, r.meta_str("model"))
        result = recall(r, tenant.keyword, tenant.vectors, q, embeddings=False, feedback=feedback)
    return [msgspec.json.decode(h.event.properties_raw or b"{}")["dia_id"] for h in result.hits]


Row = tuple[float, float, int]  # nDCG@10, recall@10, category


def end_to_end(
    work: Path, convs: list[Conversation], emb: Embeddings, name: str
) -> tuple[list[Row], dict[str, list[list[str]]], dict[str, float]]:
    """One procedure through the real stores: rows, rankings per conversation, query timings."""
    rows: list[Row] = []
    rankings: dict[str, list[list[str]]] = {}
    times: list[float] = []
    for conv in convs:
        feedback: Feedback | None
        if name == "client":  # feedback as the server gives a client's vector (serving.py)
            turn_vecs, q_vecs, feedback = conv.ref_turns, conv.ref_questions, FEEDBACK
        else:
            proc = PROCEDURES[name]
            own = emb.embed(
                [TURN_TEXTS[proc.turn_text](conv.turns, i) for i in range(len(conv.turns))]
            )
            turn_vecs = server_vectors(conv.turns, own, proc.context)
            q_vecs = emb.embed([QUERY_TEXTS[proc.query_text](q) for q in conv.questions])
            feedback = proc.feedback
        tenant = build_tenant(work / f"{name}-{conv.index}", conv, turn_vecs)
        try:
            if name != "client" and PROCEDURES[name].people_out:
                q_vecs = emb.embed(asked_texts(tenant, conv.questions))
            ranked = []
            for i, question in enumerate(conv.questions):
                started = time.perf_counter()
                ranked.append(ask(tenant, question, q_vecs[i], feedback=feedback))
                times.append(time.perf_counter() - started)
                rows.append((*metrics(ranked[-1], conv.evidence[i]), conv.categories[i]))
            rankings[str(conv.index)] = ranked
        finally:
            tenant.close()
    ms = [t * 1000 for t in times]
    return rows, rankings, {"p50_ms": round(median(ms), 3), "p99_ms": round(percentile(ms, 99), 3)}


def over_http(convs: list[Conversation]) -> tuple[list[Row], dict[str, float]]:
    """`served`: a real memspine-server embeds (MEMSPINE_EMBEDDER=local); each conversation is
    its own tenant, its turns appended as text only (batches of 100, in order), its questions
    asked as text only once every vector is written; rows and HTTP recall timings."""
    import httpx

    server = start_memspine(scratch_dir("quality-http"), {"MEMSPINE_EMBEDDER": "local"})
    rows: list[Row] = []
    times: list[float] = []
    try:
        for conv in convs:
            auth = {"Authorization": f"Bearer locomo-{conv.index}"}
            base = f"http://127.0.0.1:{server.port}"
            with httpx.Client(base_url=base, headers=auth, timeout=120) as c:
                for start in range(0, len(conv.turns), 100):
                    batch = [
                        {
                            "kind": "turn",
                            "ts": t.ts,
                            "text": t.text,
                            "properties": {"dia_id": t.dia_id, "speaker": t.speaker},
                        }
                        for t in conv.turns[start : start + 100]
                    ]
                    r = c.post("/v1/memory/events", json={"events": batch})
                    assert r.status_code == 201, r.text
                while c.get("/v1/whoami").json()["vector_space"]["unembedded"]:
                    time.sleep(0.2)
                for i, question in enumerate(conv.questions):
                    started = time.perf_counter()
                    r = c.post("/v1/memory/recall", json={"text": question, "kind": "turn", "k": K})
                    times.append(time.perf_counter() - started)
                    assert r.status_code == 200, r.text
                    ranked = [h["properties"]["dia_id"] for h in r.json()["hits"]]
                    rows.append((*metrics(ranked, conv.evidence[i]), conv.categories[i]))
    finally:
        server.stop()
    ms = [t * 1000 for t in times]
    return rows, {"p50_ms": round(median(ms), 3), "p99_ms": round(percentile(ms, 99), 3)}


def interleaved(work: Path, convs: list[Conversation], emb: Embeddings, keyed: bool) -> list[Row]:
    """The conversations written at once into one tenant (`--interleaved`): their turns
    appended round robin (one of each in turn, as concurrent chats arrive), each with its
    `conversation` and `speaker` properties and its own session's ts; each turn's vector made
    by storage's own chain (storage/tenants/embedding.py) in that append order, keyed on the
    conversation (keyed) or, as before the chain was per conversation, on the tenant alone.
    Each question is asked text-only with the server's feedback, filtered to its conversation
    as an application would ask about one chat."""
    order = [
        (c, i)
        for i in range(max(len(conv.turns) for conv in convs))
        for c, conv in enumerate(convs)
        if i < len(conv.turns)
    ]
    own = {c: emb.embed([t.text for t in conv.turns]) for c, conv in enumerate(convs)}
    stand_ins = [
        StoredEvent(
            event_id=f"{c}:{i}",
            seq=n + 1,
            kind="turn",
            ts=convs[c].turns[i].ts,
            filterable={"conversation": str(convs[c].index)} if keyed else {},
        )
        for n, (c, i) in enumerate(order)
    ]
    vectors = chain(stand_ins, np.asarray([own[c][i] for c, i in order]), None)
    tenant = Tenant.open("interleaved", work / f"interleaved-{keyed}", embedding_dim=DIM)
    try:
        for start in range(0, len(order), 16):
            batch = []
            for n in range(start, min(start + 16, len(order))):
                c, i = order[n]
                turn = convs[c].turns[i]
                props = {
                    "dia_id": f"{convs[c].index}:{turn.dia_id}",
                    "speaker": turn.speaker,
                    "conversation": str(convs[c].index),
                }
                batch.append(
                    NewEvent(
                        kind="turn",
                        ts=turn.ts,
                        text=turn.text,
                        embedding=vectors[n].tolist(),
                        embedding_model="sentence-transformers/all-MiniLM-L6-v2",
                        properties_raw=msgspec.json.encode(props),
                    )
                )
            results = tenant.submit_append(batch).result()
            assert all(isinstance(r, AppendResult) for r in results), results
        rows: list[Row] = []
        for conv in convs:
            q_vecs = emb.embed(asked_texts(tenant, conv.questions))
            where: dict[str, FilterValue] = {"conversation": str(conv.index)}
            for i, question in enumerate(conv.questions):
                ranked = ask(tenant, question, q_vecs[i], feedback=FEEDBACK, filters=where)
                evidence = {f"{conv.index}:{e}" for e in conv.evidence[i]}
                rows.append((*metrics(ranked, evidence), conv.categories[i]))
        return rows
    finally:
        tenant.close()


# -- the sweep, in process --------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One row of the sweep: a procedure plus fusion and expansion settings storage does not use."""

    group: str
    label: str
    proc: Procedure = Procedure()
    rrf_k: int = 60
    weights: tuple[float, float] = (1.0, 1.0)  # keyword, vector
    depths: tuple[int, int] = (K, K)  # each arm's candidates before fusion
    feedback_from: str = "keyword"  # or "fused", "vector": whose first hits feedback reads
    arms: str = "fused"  # or "keyword", "vector": one arm alone
    expand_terms: tuple[int, int] | None = None  # keyword expansion: (hits read, terms added)


class Sweep:
    """Per conversation: a tenant for the keyword arm, each question's keyword ranking."""

    def __init__(self, work: Path, convs: list[Conversation], emb: Embeddings) -> None:
        self.convs = convs
        self.emb = emb
        self.tenants = [build_tenant(work / f"sweep-{c.index}", c, None) for c in convs]
        self.where = [{t.dia_id: i for i, t in enumerate(c.turns)} for c in convs]
        self.keyword = [
            [self._keyword(n, q) for q in conv.questions] for n, conv in enumerate(convs)
        ]

    def _keyword(self, n: int, text: str) -> list[int]:
        """The keyword arm 100 deep (a text-only recall keeps that arm's order), as turn indices."""
        return [self.where[n][d] for d in ask(self.tenants[n], text, None, k=100)]

    def close(self) -> None:
        """Close every tenant."""
        for t in self.tenants:
            t.close()

    def run(self, v: Variant) -> list[Row]:
        """Every question of every conversation ranked as v says."""
        rows: list[Row] = []
        for n, conv in enumerate(self.convs):
            p = v.proc
            own = self.emb.embed(
                [TURN_TEXTS[p.turn_text](conv.turns, i) for i in range(len(conv.turns))]
            )
            vecs = server_vectors(conv.turns, own, p.context)
            qs = self.emb.embed([QUERY_TEXTS[p.query_text](q) for q in conv.questions])
            for i, question in enumerate(conv.questions):
                kw = self.keyword[n][i]
                if v.expand_terms is not None:
                    kw = self._expanded(n, question, kw, *v.expand_terms)
                q = qs[i]
                if p.feedback is not None:
                    source = {"keyword": kw, "vector": _cosine(vecs, q)}.get(v.feedback_from)
                    if source is None:
                        source = self._fuse(v, kw, _cosine(vecs, q))
                    top = source[: p.feedback.hits]
                    if top:
                        q = _unit(q + p.feedback.weight * vecs[top].mean(axis=0))
                if v.arms == "keyword":
                    ranked = kw[:K]
                elif v.arms == "vector":
                    ranked = _cosine(vecs, q)[:K]
                else:
                    ranked = self._fuse(v, kw, _cosine(vecs, q))
                dia = [conv.turns[j].dia_id for j in ranked]
                rows.append((*metrics(dia, conv.evidence[i]), conv.categories[i]))
        return rows

    def _fuse(self, v: Variant, kw: list[int], vec: list[int]) -> list[int]:
        """storage.read.recall's fusion with v's k, weights and depths (deeper x4 while < K hits)."""
        grow = 1
        while True:
            scores: dict[int, float] = {}
            for ranking, w, d in zip((kw, vec), v.weights, v.depths, strict=True):
                for r, j in enumerate(ranking[: d * grow], start=1):
                    scores[j] = scores.get(j, 0.0) + w / (v.rrf_k + r)
            order = sorted(scores, key=lambda j: -scores[j])  # stable: keyword's first
            if len(order) >= K or grow >= 64:
                return order[:K]
            grow *= 4

    def _expanded(self, n: int, question: str, kw: list[int], hits: int, terms: int) -> list[int]:
        """The keyword arm for the question plus the commonest new words of its first hits."""
        asked = set(query_terms(question))
        counts: Counter[str] = Counter()
        for j in kw[:hits]:
            words = {w.lower() for w in re.findall(r"[^\W_]+", self.convs[n].turns[j].text)}
            counts.update(w for w in words if w not in STOP_WORDS and w not in asked and len(w) > 2)
        # Ties by the word itself: a set's order changes with each run's string hashing.
        extra = sorted(counts, key=lambda w: (-counts[w], w))[:terms]
        return self._keyword(n, question + " " + " ".join(extra)) if extra else kw


def _cosine(vecs: np.ndarray, q: np.ndarray) -> list[int]:
    """Exact cosine ranking, 100 deep, ties by append order."""
    return np.argsort(-(vecs @ q), kind="stable")[:100].tolist()


def variants() -> list[Variant]:
    """Every variant tried, in the order of bench/RESULTS.md's table."""
    chosen = PROCEDURES["chosen"]
    ctx = chosen.context
    fb = FEEDBACK
    out = [
        Variant("arms", "keyword arm alone", arms="keyword"),
        Variant("arms", "vector arm alone, turns as sent", arms="vector"),
        Variant("arms", "fused, turns as sent (server)"),
        Variant(
            "arms", "vector arm alone, chosen turn vectors", Procedure(context=ctx), arms="vector"
        ),
    ]
    for name in list(TURN_TEXTS)[1:]:
        out.append(Variant("turn text", f"turn embedded as: {name}", Procedure(turn_text=name)))
    for label, c in (
        ("previous turn's text vector x 0.25", Context(prev=0.25)),
        ("previous turn's text vector x 0.5", Context(prev=0.5)),
        ("previous turn's text vector x 1", Context(prev=1.0)),
        ("next turn's text vector x 0.5", Context(next=0.5)),
        ("previous and next x 0.25", Context(prev=0.25, next=0.25)),
        ("previous turn's stored vector x 0.3 (chain)", Context(prev=0.3, chain=True)),
        ("previous turn's stored vector x 0.5 (chain)", Context(prev=0.5, chain=True)),
        ("previous turn's stored vector x 0.7 (chain)", Context(prev=0.7, chain=True)),
        ("previous turn's stored vector x 1 (chain)", Context(prev=1.0, chain=True)),
        ("chain x 0.7, across sessions too", Context(prev=0.7, chain=True, across=True)),
    ):
        out.append(Variant("turn context", label, Procedure(context=c)))
    for name in list(QUERY_TEXTS)[1:]:
        out.append(
            Variant("question text", f"question embedded as: {name}", Procedure(query_text=name))
        )
    for rrf in (1, 10, 100):
        out.append(Variant("fusion", f"RRF k = {rrf}", rrf_k=rrf))
    for w in (0.9, 1.1):
        out.append(Variant("fusion", f"vector arm weight {w}", weights=(1.0, w)))
    for d in ((10, 5), (5, 10), (10, 20), (20, 10), (20, 20), (50, 50)):
        out.append(Variant("fusion", f"arm depths keyword {d[0]}, vector {d[1]}", depths=d))
    for source in ("keyword", "fused", "vector"):
        for hits, weight in ((1, 0.5), (2, 0.5), (2, 1.0), (3, 0.5)):
            out.append(
                Variant(
                    "feedback",
                    f"query + {weight} x mean of first {hits} {source} hits",
                    Procedure(feedback=Feedback(hits=hits, weight=weight)),
                    feedback_from=source,
                )
            )
    for e in ((2, 3), (3, 5), (5, 5)):
        out.append(
            Variant("keyword expansion", f"+{e[1]} words of first {e[0]} hits", expand_terms=e)
        )
    out.append(Variant("chosen", "chain x 0.7 alone", Procedure(context=ctx)))
    out.append(Variant("chosen", "feedback alone", Procedure(feedback=fb)))
    out.append(Variant("chosen", "chosen: chain x 0.7 + feedback (2 keyword hits, 0.5)", chosen))
    for c in (0.5, 1.0):
        out.append(
            Variant(
                "chosen",
                f"chosen with chain x {c}",
                replace(chosen, context=Context(prev=c, chain=True)),
            )
        )
    for hits, weight in ((1, 0.3), (2, 0.3), (2, 0.7), (2, 1.0), (3, 0.5)):
        out.append(
            Variant(
                "chosen",
                f"chosen with feedback {hits} hits x {weight}",
                replace(chosen, feedback=Feedback(hits=hits, weight=weight)),
            )
        )
    out.append(Variant("chosen", "chosen, feedback from fused hits", chosen, feedback_from="fused"))
    for name in list(QUERY_TEXTS)[1:]:
        out.append(
            Variant("chosen", f"chosen, question as: {name}", replace(chosen, query_text=name))
        )
    out.append(Variant("chosen", "chosen, RRF k = 1", chosen, rrf_k=1))
    for w in (0.9, 1.1):
        out.append(Variant("chosen", f"chosen, vector weight {w}", chosen, weights=(1.0, w)))
    for d in ((10, 15), (10, 20), (5, 10)):
        out.append(Variant("chosen", f"chosen, depths {d[0]}/{d[1]}", chosen, depths=d))
    out.append(Variant("chosen", "chosen, keyword expansion +5 of 5", chosen, expand_terms=(5, 5)))
    out.append(
        Variant("chosen", "chosen, turns date first", replace(chosen, turn_text="date first"))
    )
    return out


# -- cost -------------------------------------------------------------------------------------------


def cost(emb: Embeddings, quick: bool) -> dict[str, Any]:
    """Feedback's cost in one fused recall at 100,000 events (2,000 with --quick), in process,
    alternating with and without; reading the people out of a question before it is embedded
    (Tenant.embedded_question); and one uncached query's embedding."""
    spec = importlib.util.spec_from_file_location("bench_recall", BENCH / "recall.py")
    assert spec is not None and spec.loader is not None
    bench_recall = importlib.util.module_from_spec(spec)
    sys.modules["bench_recall"] = bench_recall  # its dataclasses look their module up
    spec.loader.exec_module(bench_recall)
    bench_recall.DATA = NPZ
    corpus = bench_recall.load_corpus()
    size = 2_000 if quick else 100_000
    events, _vectors = bench_recall.make_events(corpus, size)
    root = scratch_dir("quality-cost") / "tenant"
    built = bench_recall.build(root, events)
    tenant = Tenant.open(bench_recall.TENANT, root, embedding_dim=DIM)
    plain: list[float] = []
    fed: list[float] = []
    asked: list[float] = []  # reading the people out of the text before it is embedded
    n = 200 if quick else 1000
    try:
        for i in range(n):
            q = RecallQuery(
                text=corpus.q_texts[i % len(corpus.q_texts)],
                embedding=corpus.q_vectors[i % len(corpus.q_texts)].tolist(),
                k=K,
            )
            for feedback, into in ((None, plain), (FEEDBACK, fed))[:: 1 if i % 2 else -1]:
                started = time.perf_counter()
                with tenant.log.reader() as r:
                    recall(
                        r, tenant.keyword, tenant.vectors, q, embeddings=False, feedback=feedback
                    )
                into.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            tenant.embedded_question(q)
            asked.append((time.perf_counter() - started) * 1000)
    finally:
        tenant.close()
        shutil.rmtree(root.parent, ignore_errors=True)
    emb.embedder.embed(["the model loads before the clock starts"])
    embed_ms = []
    for text in corpus.q_texts[: 50 if quick else 300]:
        started = time.perf_counter()
        emb.embedder.embed([text])  # embed, not embed_query: never the LRU
        embed_ms.append((time.perf_counter() - started) * 1000)
    return {
        "events": size,
        "build": built,
        "queries": n,
        "fused_p50_ms": round(median(plain), 3),
        "fused_feedback_p50_ms": round(median(fed), 3),
        "fused_p99_ms": round(percentile(plain, 99), 3),
        "fused_feedback_p99_ms": round(percentile(fed, 99), 3),
        "embedded_question_p50_ms": round(median(asked), 4),
        "embedded_question_p99_ms": round(percentile(asked, 99), 4),
        "query_embed_p50_ms": round(median(embed_ms), 2),
        "query_embed_p99_ms": round(percentile(embed_ms, 99), 2),
    }


# -- the report -------------------------------------------------------------------------------------


def summarise(rows: list[Row]) -> dict[str, Any]:
    """Mean nDCG@10 and recall@10, overall and by question category."""
    arr = np.asarray(rows)
    out: dict[str, Any] = {
        "ndcg@10": round(float(arr[:, 0].mean()), 4),
        "recall@10": round(float(arr[:, 1].mean()), 4),
        "questions": len(rows),
        "recall@10_by_category": {},
        "questions_by_category": {},
    }
    for cat, name in CATEGORIES.items():
        sel = arr[arr[:, 2] == cat]
        if len(sel):
            out["recall@10_by_category"][name] = round(float(sel[:, 1].mean()), 4)
            out["questions_by_category"][name] = len(sel)
    return out


def line(label: str, s: dict[str, Any]) -> str:
    """One table row: nDCG, recall, recall by category."""
    cats = " ".join(
        f"{s['recall@10_by_category'].get(n, float('nan')):.3f}" for n in CATEGORIES.values()
    )
    return f"{label[:62]:62s} {s['ndcg@10']:.4f} {s['recall@10']:.4f}  {cats}"


HEADER = f"{'':62s} nDCG   recall  mh    tmp   od    sh"


def main(argv: list[str] | None = None) -> int:
    """Run the procedures end to end (and the sweep, the cost) and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="conversation 0 only")
    parser.add_argument("--held-out", action="store_true", help="conversations 5-9: report only")
    parser.add_argument("--sweep", action="store_true", help="every variant tried, in process")
    parser.add_argument("--cost", action="store_true", help="feedback's cost at 100,000 events")
    parser.add_argument(
        "--http", action="store_true", help="also `served`: through a real server that embeds"
    )
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="also the conversations written at once into one tenant, chain per tenant and per conversation",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON (bench/out/quality-server.json)"
    )
    args = parser.parse_args(argv)
    if args.held_out and args.sweep:
        raise SystemExit("the sweep chooses; it never runs on the held-out conversations")
    if not NPZ.exists() or not JSON.exists():
        raise SystemExit(f"bench/quality_server.py needs {NPZ} and {JSON}")
    chosen = list(HELD_OUT if args.held_out else DEV)[: 1 if args.quick else None]
    z = np.load(NPZ)
    raw = json.loads(JSON.read_text())
    convs = [load(z, raw, c) for c in chosen]
    emb = Embeddings()
    work = scratch_dir("quality-server")
    started = time.perf_counter()
    doc: dict[str, Any] = {
        "config": {
            "conversations": chosen,
            "k": K,
            "context": CONTEXT,
            "context_gap_us": CONTEXT_GAP,
            "feedback": {"hits": FEEDBACK.hits, "weight": FEEDBACK.weight},
            "embedder": emb.embedder.name,
        }
    }
    try:
        print(HEADER)
        results: dict[str, Any] = {}
        rankings: dict[str, Any] = {}
        for name in ("client", "server", "chosen"):
            rows, ranked, timing = end_to_end(work, convs, emb, name)
            results[name] = {**summarise(rows), "in_process_recall": timing}
            rankings[name] = ranked
            print(line(name, results[name]), flush=True)
        if args.interleaved:
            for keyed, label in ((False, "tenant-wide chain"), (True, "chain per conversation")):
                rows = interleaved(work, convs, emb, keyed)
                name = f"interleaved, {label}"
                results[name] = summarise(rows)
                print(line(name, results[name]), flush=True)
        if args.http:
            rows, timing = over_http(convs)
            results["served"] = {**summarise(rows), "http_recall": timing}
            print(line("served (a real server embeds, over HTTP)", results["served"]), flush=True)
        doc["procedures"] = results
        doc["target_1"] = {
            m: round(abs(results["server"][m] - results["client"][m]), 4)
            for m in ("ndcg@10", "recall@10")
        }
        if args.sweep:
            sweep = Sweep(work, convs, emb)
            try:
                table = []
                for v in variants():
                    s = summarise(sweep.run(v))
                    table.append({"group": v.group, "variant": v.label, **s})
                    print(line(f"[{v.group}] {v.label}", s), flush=True)
                    if v.proc == PROCEDURES["chosen"] and v == Variant(v.group, v.label, v.proc):
                        # Equal up to BM25 ties, which fall with how each tenant's keyword
                        # segments were committed.
                        doc["sweep_minus_end_to_end"] = {
                            m: round(s[m] - results["chosen"][m], 4)
                            for m in ("ndcg@10", "recall@10")
                        }
                doc["sweep"] = table
            finally:
                sweep.close()
        if args.cost:
            doc["cost"] = cost(emb, args.quick)
            print(json.dumps(doc["cost"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["embedding"] = {"texts_embedded": emb.texts, "seconds": round(emb.seconds, 1)}
    doc["seconds"] = round(time.perf_counter() - started, 1)
    name = "quality-server-held-out" if args.held_out else "quality-server"
    out = write_json(name, doc, args.out)
    print(f"target 1 (server vs client, |difference|): {doc['target_1']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
