"""Local embedder: throughput on LoCoMo turns, one-query latency, cosine against the reference.

Fixed inputs: the turns of LoCoMo conversations 0-4 in file order (2,760 texts; `--quick`
takes the first 300) and their questions. In the same run, the baseline: a plain numpy
float32 forward pass over the same weights, one text at a time (no padding), on a sample.

Then the server's form (storage/embedders/child.py): int8 on 2 threads in a child process,
its start, its throughput over the pipes, and one query's latency made in this process (as the
server does) against through the child, idle and while another thread keeps the child busy with
calls of CALL_SIZE (as the background embedder does).

    python bench/embed.py [--quick] [--child-only] [--out bench/out/embed.json]

--child-only measures the server's form and, beside it, int8 on 2 threads in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The numpy baseline runs one small text at a time: BLAS threads only spin on matrices that
# small (on a busy machine they made it 30x slower), so it gets one core, like one worker.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, parse_args, percentile, write_json

from storage.embedders.child import ChildEmbedder
from storage.embedders.local import MAX_TOKENS, LocalEmbedder
from storage.embedders.weights import model_dir, read_safetensors

# shared/ beside the checkout, as bench/quality.py reads it, or at /work/shared from a worktree.
DATA = next(
    (
        p / "shared" / "data" / "locomo10-minilm.npz"
        for p in (Path(__file__).resolve().parents[2], Path("/work"))
        if (p / "shared" / "data" / "locomo10-minilm.npz").exists()
    ),
    Path("/work/shared/data/locomo10-minilm.npz"),
)
CONVERSATIONS = range(5)
CALL_SIZE = 256  # texts per embed() call, as a background embedder hands over a batch
RUNS = 3


def load_inputs(quick: bool) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """Turn texts and question texts with their reference vectors (unit length, float32)."""
    z = np.load(DATA)
    texts = [str(t) for c in CONVERSATIONS for t in z[f"turn_texts_{c}"]]
    vecs = np.concatenate([z[f"turn_emb_{c}"] for c in CONVERSATIONS]).astype(np.float32)
    questions = [str(q) for c in CONVERSATIONS for q in z[f"q_texts_{c}"]]
    qvecs = np.concatenate([z[f"q_emb_{c}"] for c in CONVERSATIONS]).astype(np.float32)
    n = 300 if quick else len(texts)
    norm = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    return texts[:n], norm(vecs[:n]), questions, norm(qvecs)


def numpy_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The baseline: all-MiniLM-L6-v2 in float32 numpy for one text, mean-pooled, normalised."""
    s = len(ids)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * w[p + ".weight"] + w[p + ".bias"]

    def dense(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    e = "embeddings."
    x = w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][:s]
    x = ln(x + w[e + "token_type_embeddings.weight"][0], e + "LayerNorm")
    for i in range(6):
        p = f"encoder.layer.{i}."
        q, k, v = (
            dense(x, p + f"attention.self.{n}").reshape(s, 12, 32).transpose(1, 0, 2)
            for n in ("query", "key", "value")
        )
        a = q @ k.transpose(0, 2, 1) / np.sqrt(32.0)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        c = (a @ v).transpose(1, 0, 2).reshape(s, 384)
        x = ln(dense(c, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = dense(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))
        x = ln(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def baseline(texts: list[str], ref: np.ndarray, tokenizer: Any) -> dict[str, Any]:
    """Texts per second of the numpy float32 forward pass on one core (tanh GELU)."""
    w = {
        k: v.astype(np.float32)
        for k, v in read_safetensors(model_dir() / "model.safetensors").items()
    }
    sample = texts[:: max(1, len(texts) // 100)][:100]
    ids = [e.ids for e in tokenizer.encode_batch(sample)]
    rates, out = [], []
    for _ in range(RUNS):
        start = time.perf_counter()
        out = [numpy_forward(w, i) for i in ids]
        rates.append(len(ids) / (time.perf_counter() - start))
    idx = [texts.index(t) for t in sample]
    cos = (np.array(out) * ref[idx]).sum(1)
    return {
        "texts": len(ids),
        "texts_per_s": round(median(rates), 1),
        "runs": [round(r, 1) for r in rates],
        "cos_min": round(float(cos.min()), 5),
    }


def throughput(
    emb: LocalEmbedder | ChildEmbedder, texts: list[str]
) -> tuple[list[float], list[float], np.ndarray]:
    """Texts per second (wall) and per CPU-second, over every text in calls of CALL_SIZE."""
    rates, cpu_rates, out = [], [], np.zeros((0, 384), np.float32)
    for _ in range(RUNS):
        start, cpu = time.perf_counter(), time.process_time()
        out = np.concatenate(
            [emb.embed(texts[i : i + CALL_SIZE]) for i in range(0, len(texts), CALL_SIZE)]
        )
        rates.append(len(texts) / (time.perf_counter() - start))
        cpu_rates.append(len(texts) / (time.process_time() - cpu))
    return rates, cpu_rates, out


def latency(emb: LocalEmbedder, questions: list[str]) -> dict[str, float]:
    """One short query at a time: uncached (distinct questions) and cached, in ms."""
    emb.queries.clear()
    uncached, cached = [], []
    for q in questions[:300]:
        start = time.perf_counter()
        emb.embed_query(q)
        uncached.append((time.perf_counter() - start) * 1000)
    for q in questions[:300]:
        start = time.perf_counter()
        emb.embed_query(q)
        cached.append((time.perf_counter() - start) * 1000)
    return {
        "p50_ms": round(median(uncached), 2),
        "p99_ms": round(percentile(uncached, 99), 2),
        "cached_p50_ms": round(median(cached), 4),
    }


def cosines(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """How close the vectors are to the reference model's."""
    cos = (got * ref).sum(1)
    return {
        "cos_min": round(float(cos.min()), 5),
        "cos_p1": round(float(np.percentile(cos, 1)), 5),
        "cos_mean": round(float(cos.mean()), 6),
    }


def variant(
    precision: str,
    threads: int,
    texts: list[str],
    ref: np.ndarray,
    questions: list[str],
    qref: np.ndarray,
) -> dict[str, Any]:
    """One configuration of the local embedder, measured."""
    emb = LocalEmbedder(precision=precision, threads=threads)
    start = time.perf_counter()
    emb.load()
    load_secs = time.perf_counter() - start
    emb.embed(texts[:64])  # warm the session's buffers
    rates, cpu_rates, got = throughput(emb, texts)
    qgot = emb.embed(questions)
    row = {
        "precision": precision,
        "threads": threads,
        "load_s": round(load_secs, 2),
        "texts_per_s": round(median(rates), 1),
        "runs": [round(r, 1) for r in rates],
        # CPU time is shared less than wall time on a busy machine: per core, all threads summed.
        "texts_per_cpu_s": round(median(cpu_rates), 1),
        **cosines(got, ref),
        "questions": cosines(qgot, qref),
        "query": latency(emb, questions),
    }
    emb.close()
    print(row, flush=True)
    return row


def query_times(embed: Any, questions: list[str]) -> dict[str, float]:
    """p50/p99 in ms of one distinct question at a time through `embed`."""
    times = []
    for q in questions:
        start = time.perf_counter()
        embed(q)
        times.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": round(median(times), 2), "p99_ms": round(percentile(times, 99), 2)}


def child_variant(texts: list[str], ref: np.ndarray, questions: list[str]) -> dict[str, Any]:
    """The server's local embedder: the model in a child process; queries both ways."""
    emb = ChildEmbedder(threads=os.cpu_count() or 1)
    emb.load()
    start_s = emb.start_secs or 0.0
    emb.embed(texts[:64])
    rates, _cpu, got = throughput(emb, texts)
    emb.embed_query("warm up the in-process query model")
    here = lambda q: emb.queries.get(q, emb._embed_here)  # noqa: E731
    child = lambda q: emb.embed([q])[0]  # noqa: E731
    idle = {
        "in_process": query_times(here, questions[:150]),
        "via_child": query_times(child, questions[150:300]),
    }
    stop = threading.Event()

    def busy() -> None:
        i = 0
        while not stop.is_set():
            emb.embed(texts[i : i + CALL_SIZE] or texts[:CALL_SIZE])
            i = (i + CALL_SIZE) % len(texts)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        loaded = {
            "in_process": query_times(here, questions[300:450]),
            "via_child": query_times(child, questions[450:470]),
        }
    finally:
        stop.set()
        worker.join()
    emb.close()
    row = {
        "start_s": round(start_s, 2),
        "model_load_in_child_s": round(emb.load_secs or 0.0, 2),
        "texts_per_s": round(median(rates), 1),
        "runs": [round(r, 1) for r in rates],
        **cosines(got, ref),
        "query_idle": idle,
        "query_while_batches_run": loaded,
    }
    print({"child": row}, flush=True)
    return row


def main() -> None:
    """Measure, print and write the JSON."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--child-only", action="store_true")
    known, rest = extra.parse_known_args()
    args = parse_args(__doc__ or "", rest)
    texts, ref, questions, qref = load_inputs(args.quick)
    load_before = os.getloadavg()
    if known.child_only:  # the server's form beside the same model in this process
        cpus = os.cpu_count() or 1
        here = variant("int8", cpus, texts, ref, questions, qref)
        row = child_variant(texts, ref, questions)
        row["in_process_int8"] = {k: here[k] for k in ("texts_per_s", "runs", "query")}
        after = [round(x, 2) for x in os.getloadavg()]
        before = [round(x, 2) for x in load_before]
        write_json(
            "embed", {"child": row, "loadavg_before": before, "loadavg_after": after}, args.out
        )
        return
    probe = LocalEmbedder(threads=1)
    probe.load()
    tokens = [len(e.ids) for e in probe._tokenizer.encode_batch(texts)]
    base = baseline(texts, ref, probe._tokenizer)
    probe.close()
    print({"baseline": base}, flush=True)
    cpus = os.cpu_count() or 1
    rows = [
        variant(p, t, texts, ref, questions, qref)
        for p in ("int8", "fp32")
        for t in sorted({1, cpus})
    ]
    child = child_variant(texts, ref, questions)
    write_json(
        "embed",
        {
            "child": child,
            "texts": len(texts),
            "questions": len(questions),
            "tokens_mean": round(float(np.mean(tokens)), 1),
            "tokens_max": int(max(tokens)),
            "max_tokens": MAX_TOKENS,
            "call_size": CALL_SIZE,
            "runs": RUNS,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "baseline_numpy": base,
            "variants": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
