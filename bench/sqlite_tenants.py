"""The baseline of bench/tenants.py's cold part: a tenant as one SQLite file with sqlite-vec (cosine
knn) and FTS5 (BM25), recalled by both arms fused by reciprocal rank, as an application keeping a
file per customer would (apsw: this Python's sqlite3 cannot load extensions)."""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import apsw
import numpy as np
import sqlite_vec

SCHEMA = """
CREATE TABLE events(id INTEGER PRIMARY KEY, event_id TEXT NOT NULL, kind TEXT, ts INTEGER,
                    text TEXT);
CREATE VIRTUAL TABLE vecs USING vec0(embedding float[{dim}] distance_metric=cosine);
CREATE VIRTUAL TABLE fts USING fts5(text, content='events', content_rowid='id');
"""
RRF_K = 60  # as memspine's fusion (storage/read/recall.py)
DEPTH = 20  # hits each arm brings to the fusion


def connect(path: Path) -> apsw.Connection:
    """A connection with sqlite-vec loaded (loaded per connection, as an application would)."""
    conn = apsw.Connection(str(path))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    return conn


def build(path: Path, texts: list[str], vectors: np.ndarray) -> None:
    """One tenant's file holding these events."""
    conn = connect(path)
    conn.execute(SCHEMA.format(dim=vectors.shape[1]))
    with conn:
        for i, (text, row) in enumerate(zip(texts, vectors, strict=True), start=1):
            conn.execute(
                "INSERT INTO events(id, event_id, kind, ts, text) VALUES (?, ?, 'turn', ?, ?)",
                (i, f"e{i:08d}", i, text),
            )
            conn.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (i, text))
            conn.execute(
                "INSERT INTO vecs(rowid, embedding) VALUES (?, ?)",
                (i, np.asarray(row, dtype=np.float32).tobytes()),
            )
    conn.close()


def copies(template: Path, data: Path, names: list[str]) -> list[Path]:
    """The template's file copied under each name."""
    data.mkdir(parents=True, exist_ok=True)
    paths = [data / f"{name}.db" for name in names]
    for path in paths:
        shutil.copyfile(template, path)
    return paths


def recall(conn: apsw.Connection, text: str, vector: np.ndarray, k: int) -> list[tuple[str, str]]:
    """Both arms, fused by reciprocal rank; the top k events' ids and texts."""
    blob = np.asarray(vector, dtype=np.float32).tobytes()
    near = conn.execute(
        "SELECT rowid FROM vecs WHERE embedding MATCH ? AND k = ? ORDER BY distance", (blob, DEPTH)
    ).fetchall()
    match = " OR ".join(f'"{w}"' for w in text.split())
    words = conn.execute(
        "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT ?", (match, DEPTH)
    ).fetchall()
    scores: dict[int, float] = {}
    for ranked in (near, words):
        for rank, (rowid,) in enumerate(ranked):
            scores[rowid] = scores.get(rowid, 0.0) + 1.0 / (RRF_K + rank + 1)
    top = sorted(scores, key=lambda r: (-scores[r], r))[:k]
    if not top:
        return []
    marks = ",".join("?" * len(top))
    rows = conn.execute(f"SELECT id, event_id, text FROM events WHERE id IN ({marks})", top)
    by_id = {r[0]: (r[1], r[2]) for r in rows}
    return [by_id[r] for r in top]


def cold(paths: list[Path], queries: list[tuple[str, np.ndarray]], requests: int) -> dict[str, Any]:
    """Round-robin recalls, each opening its tenant's file and closing it after (every one cold)."""
    latencies = []
    for i in range(requests):
        text, vector = queries[i % len(queries)]
        started = time.perf_counter()
        conn = connect(paths[i % len(paths)])
        hits = recall(conn, text, vector, 10)
        conn.close()
        latencies.append((time.perf_counter() - started) * 1000)
        assert hits
    return summary(latencies)


def warm(paths: list[Path], queries: list[tuple[str, np.ndarray]], requests: int) -> dict[str, Any]:
    """Round-robin recalls over connections kept open."""
    conns = [connect(p) for p in paths]
    latencies = []
    try:
        for i in range(requests):
            text, vector = queries[i % len(queries)]
            started = time.perf_counter()
            recall(conns[i % len(conns)], text, vector, 10)
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        for conn in conns:
            conn.close()
    return summary(latencies)


def summary(latencies: list[float]) -> dict[str, Any]:
    """Median and 99th percentile in milliseconds."""
    return {
        "requests": len(latencies),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(float(np.percentile(latencies, 99)), 3),
    }
