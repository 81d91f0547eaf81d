"""Retrieval quality on LoCoMo: fused recall through memspine-server against an in-process baseline.

Each conversation is loaded through a real memspine-server (MEMSPINE_EMBEDDING_DIM=384) as its own
tenant: every turn a `kind: turn` event with the exact text that was embedded, its MiniLM vector
and its `dia_id` as a property. Every question (categories 1-4 with evidence) is then asked as
`{"text", "embedding", "kind": "turn", "k": 10}`, and, for the record, with text only and with
the embedding only. Each turn carries its session's date as `ts` and its speaker as a property.
In the same run, the baseline the team measured (`../shared/data/README.md`):
Tantivy BM25 (default tokenizer) top 50 and exact cosine top 50, fused by RRF (k = 60).

Metrics, as the team defines them: nDCG@10 with binary gains (ideal DCG over
min(10, |evidence|)) and recall@10 = |top 10 ∩ evidence| / |evidence|, averaged over questions.

Conversations 0-4 are for development (the default). 5-9 are held out: `--held-out` runs them,
once, to report; never tune on them. LoCoMo is CC BY-NC 4.0, used here to evaluate only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tantivy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Process, serve_memspine, write_json

# shared/ beside the checkout, or at /work/shared from a worktree (as bench/quality_server.py).
SHARED = next(
    (
        p / "shared" / "data"
        for p in (Path(__file__).resolve().parents[2], Path("/work"))
        if (p / "shared" / "data" / "locomo10.json").exists()
    ),
    Path("/work/shared/data"),
)
DATA = SHARED / "locomo10-minilm.npz"
JSON = SHARED / "locomo10.json"
DEV, HELD_OUT = range(0, 5), range(5, 10)
K = 10
BASELINE_DEPTH = 50


class Conversation:
    """One LoCoMo conversation's turns and questions, vectors unit length; each turn's ts its
    session's date and time plus a minute a turn (as bench/quality_server.py), its speaker the
    name its text starts with."""

    def __init__(self, z: Any, c: int, sessions: dict[str, Any]) -> None:
        self.index = c
        self.ids = [str(x) for x in z[f"turn_ids_{c}"]]
        self.texts = [str(x) for x in z[f"turn_texts_{c}"]]
        self.speakers = [t.split(": ", 1)[0] for t in self.texts]
        self.ts = _times(self.ids, sessions)
        self.vectors = _unit(z[f"turn_emb_{c}"].astype(np.float32))
        self.questions = [str(x) for x in z[f"q_texts_{c}"]]
        self.q_vectors = _unit(z[f"q_emb_{c}"].astype(np.float32))
        self.evidence = [{e.strip() for e in json.loads(str(x))} for x in z[f"q_evidence_{c}"]]
        self.categories = [int(x) for x in z[f"q_category_{c}"]]


def _times(ids: list[str], sessions: dict[str, Any]) -> list[int]:
    """µs: the turn's session start ('1:56 pm on 8 May, 2023') plus a minute per earlier turn."""
    out: list[int] = []
    position: dict[int, int] = {}
    for dia_id in ids:
        session = int(dia_id[1:].split(":")[0])
        n = position[session] = position.get(session, -1) + 1
        start = datetime.strptime(
            sessions[f"session_{session}_date_time"].strip(), "%I:%M %p on %d %B, %Y"
        )
        out.append(int(start.timestamp()) * 1_000_000 + n * 60_000_000)
    return out


def _unit(m: np.ndarray) -> np.ndarray:
    return np.asarray(m / np.linalg.norm(m, axis=1, keepdims=True), dtype=np.float32)


def metrics(ranked: list[str], evidence: set[str]) -> tuple[float, float]:
    """(nDCG@10, recall@10) of one ranked list of dia_ids."""
    top = ranked[:K]
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(top) if d in evidence)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(K, len(evidence))))
    return dcg / ideal, len(set(top) & evidence) / len(evidence)


# -- the baseline, in process ----------------------------------------------------------------------


def baseline(conv: Conversation) -> list[list[str]]:
    """BM25 top 50 (Tantivy, default tokenizer, query words OR-ed) + exact cosine top 50, RRF 60."""
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("i", stored=True)
    builder.add_text_field("text", stored=False)
    index = tantivy.Index(builder.build())
    writer = index.writer()
    for i, text in enumerate(conv.texts):
        doc = tantivy.Document()
        doc.add_integer("i", i)
        doc.add_text("text", text)
        writer.add_document(doc)
    writer.commit()
    index.reload()
    searcher = index.searcher()
    out = []
    for question, qv in zip(conv.questions, conv.q_vectors, strict=True):
        words = re.findall(r"[^\W_]+", question.lower())
        query, _errors = index.parse_query_lenient(" ".join(words), ["text"])
        bm25 = [searcher.doc(a)["i"][0] for _s, a in searcher.search(query, BASELINE_DEPTH).hits]
        cosine = np.argsort(-(conv.vectors @ qv), kind="stable")[:BASELINE_DEPTH].tolist()
        scores: dict[int, float] = {}
        for ranking in (bm25, cosine):
            for rank, i in enumerate(ranking, start=1):
                scores[i] = scores.get(i, 0.0) + 1 / (60 + rank)
        best = sorted(scores, key=lambda i: -scores[i])[:K]
        out.append([conv.ids[i] for i in best])
    return out


# -- memspine, over HTTP ---------------------------------------------------------------------------


def serve(data: Path) -> Process:
    """memspine-server in local mode on data, 384-float embeddings."""
    return serve_memspine(data, {"MEMSPINE_EMBEDDING_DIM": "384"})


def load_turns(client: httpx.Client, conv: Conversation) -> dict[str, str]:
    """Append every turn (16 at a time, so group commit batches them); event id -> dia_id."""

    def append(i: int) -> tuple[str, str]:
        body = {
            "kind": "turn",
            "ts": conv.ts[i],
            "text": conv.texts[i],
            "embedding": [round(float(x), 7) for x in conv.vectors[i]],
            "properties": {"dia_id": conv.ids[i], "speaker": conv.speakers[i]},
        }
        resp = client.post("/v1/memory/event", json=body)
        resp.raise_for_status()
        return str(resp.json()["event_id"]), conv.ids[i]

    with ThreadPoolExecutor(16) as pool:
        return dict(pool.map(append, range(len(conv.ids))))


def ask(client: httpx.Client, conv: Conversation, shape: str) -> list[list[str]]:
    """Every question as one recall of this shape (fused, text or embedding); dia_ids ranked."""
    out = []
    for question, qv in zip(conv.questions, conv.q_vectors, strict=True):
        body: dict[str, Any] = {"kind": "turn", "k": K}
        if shape in ("fused", "text"):
            body["text"] = question
        if shape in ("fused", "embedding"):
            body["embedding"] = [round(float(x), 7) for x in qv]
        resp = client.post("/v1/memory/recall", json=body)
        resp.raise_for_status()
        out.append([h["properties"]["dia_id"] for h in resp.json()["hits"]])
    return out


def evaluate(server: Process, conv: Conversation) -> dict[str, list[list[str]]]:
    """Load one conversation as a tenant and rank every question each way, plus the baseline."""
    url = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer locomo-{conv.index}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        load_turns(client, conv)
        runs = {shape: ask(client, conv, shape) for shape in ("fused", "text", "embedding")}
    runs["baseline"] = baseline(conv)
    return runs


def summarise(per_question: dict[str, list[tuple[float, float, int]]]) -> dict[str, Any]:
    """Mean nDCG@10 and recall@10 per method, overall and by question category."""
    out: dict[str, Any] = {}
    for name, rows in per_question.items():
        arr = np.asarray([(n, r) for n, r, _c in rows])
        by_cat = {}
        for cat in sorted({c for _n, _r, c in rows}):
            sel = np.asarray([(n, r) for n, r, c in rows if c == cat])
            by_cat[str(cat)] = {
                "ndcg@10": round(float(sel[:, 0].mean()), 4),
                "recall@10": round(float(sel[:, 1].mean()), 4),
                "n": len(sel),
            }
        out[name] = {
            "ndcg@10": round(float(arr[:, 0].mean()), 4),
            "recall@10": round(float(arr[:, 1].mean()), 4),
            "questions": len(rows),
            "by_category": by_cat,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Evaluate the chosen conversations and write bench/out/quality.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="conversation 0 only")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON output (bench/out/quality.json)"
    )
    parser.add_argument("--held-out", action="store_true", help="conversations 5-9: report only")
    args = parser.parse_args(argv)
    if not DATA.exists():
        raise SystemExit(f"bench/quality.py needs {DATA} (LoCoMo with MiniLM vectors)")
    chosen = list(HELD_OUT if args.held_out else DEV)[: 1 if args.quick else None]
    z = np.load(DATA)
    raw = json.loads(JSON.read_text())
    per_question: dict[str, list[tuple[float, float, int]]] = {}
    per_conversation: dict[str, Any] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        server = serve(Path(tmp) / "data")
        try:
            for c in chosen:
                conv = Conversation(z, c, raw[c]["conversation"])
                runs = evaluate(server, conv)
                rows: dict[str, list[tuple[float, float, int]]] = {}
                for name, ranked in runs.items():
                    rows[name] = [
                        (*metrics(r, e), cat)
                        for r, e, cat in zip(ranked, conv.evidence, conv.categories, strict=True)
                    ]
                    per_question.setdefault(name, []).extend(rows[name])
                per_conversation[str(c)] = {
                    name: {m: v[m] for m in ("ndcg@10", "recall@10", "questions")}
                    for name, v in summarise(rows).items()
                }
                print(c, json.dumps(per_conversation[str(c)]), flush=True)
        finally:
            server.stop()
    result = summarise(per_question)
    doc = {
        "config": {"conversations": chosen, "k": K, "baseline_depth": BASELINE_DEPTH},
        "summary": {
            n: {m: v[m] for m in ("ndcg@10", "recall@10", "questions")} for n, v in result.items()
        },
        "methods": result,
        "conversations": per_conversation,
        "seconds": round(time.perf_counter() - started, 1),
    }
    out = write_json("quality-held-out" if args.held_out else "quality", doc, args.out)
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
