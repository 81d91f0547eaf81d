"""The local embedder: all-MiniLM-L6-v2 on onnxruntime, loaded on first use, no torch."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from storage.embedders.base import QUERY_CACHE_SIZE, EmbedderError, QueryCache, normalise

log = logging.getLogger("memspine.embedder")

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
MAX_TOKENS = 256
PRECISIONS = ("int8", "fp32")
# onnxruntime would fuse Add + LayerNormalization back into its slower SkipLayerNormalization.
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384-d, mean pooling, L2-normalised, 256 tokens) on this machine.

    Importing this module loads neither onnxruntime nor the model: the first `embed` (or
    `load`) does, once, under a lock. Texts are sorted by token count and cut into batches
    of one length each, so nothing is padded and the attention needs no mask (the graph,
    storage/embedders/bert_graph.py, takes none); batches run on `threads` worker threads,
    each a single-threaded onnxruntime run on one core.
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        precision: str = "int8",
        max_batch_tokens: int = 512,
        max_batch_rows: int = 64,
        query_cache: int = QUERY_CACHE_SIZE,
        model_dir: Path | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.threads = max(1, threads or min(os.cpu_count() or 1, 4))
        self.precision = precision
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_rows = max_batch_rows
        self.queries = QueryCache(query_cache)
        self._model_dir = model_dir
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self.load_secs: float | None = None
        self.loads = 0  # times the model was built (once, unless closed and used again)

    @property
    def name(self) -> str:
        """The model name recorded in a tenant."""
        return MODEL_NAME

    @property
    def dim(self) -> int:
        """Always 384."""
        return DIM

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self._session is not None

    def load(self) -> None:
        """Build the graph and the session now (idempotent; safe from several threads)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is None:
                self._load()

    def _load(self) -> None:
        from storage.embedders.weights import ModelFilesMissing, model_dir, read_safetensors

        start = time.perf_counter()
        self.loads += 1
        try:
            path = model_dir(self._model_dir)
            # tokenizers would run encode_batch on its own pool of threads (rayon's), made once
            # per process by the first call at that thread's priority: a query a request embeds
            # first (nice 0) would leave every later batch's tokenizing at the request threads'
            # priority, not the embedder's (storage/tenants/embedding.py nices its threads).
            # Sequential, a batch is tokenized on the thread that embeds it (bench/RESULTS.md).
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import onnxruntime as ort
            import tokenizers

            from storage.embedders.bert_graph import BertShape, build_bert

            tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
            weights = read_safetensors(path / "model.safetensors")
            model = build_bert(weights, BertShape(), int8=self.precision == "int8")
            del weights
        except (ModelFilesMissing, ImportError, OSError) as exc:
            log.error("local embedder cannot load its model: %s", exc)
            raise EmbedderError(
                "model_missing", "the local embedding model is not installed"
            ) from exc
        # The tokenizer file ships with padding to 128 and truncation at 128; the model's own
        # configuration (sentence_bert_config.json) says 256, and batches pad to their longest.
        tok.no_padding()
        tok.enable_truncation(MAX_TOKENS)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        session = ort.InferenceSession(
            model,
            opts,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=DISABLED_OPTIMIZERS,
        )
        self._tokenizer = tok
        if self.threads > 1:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="embedder")
        self._session = session  # last: load()'s unlocked check sees a finished load or none
        self.load_secs = time.perf_counter() - start
        log.info(
            "local embedder loaded",
            extra={
                "model": MODEL_NAME,
                "precision": self.precision,
                "secs": round(self.load_secs, 3),
            },
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts`, (n, 384) float32, unit length, in the order given."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        self.load()
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        order = np.argsort(lengths, kind="stable")
        batches = self._batches(order, lengths)
        out = np.empty((len(texts), DIM), dtype=np.float32)

        def run(rows: np.ndarray) -> None:
            out[rows] = self._run([encodings[i].ids for i in rows])

        if self._pool is None or len(batches) == 1:
            for rows in batches:
                run(rows)
        else:
            # Largest first: the small batches then even out the workers' last rounds, where
            # shortest first left one worker running the largest batch alone.
            batches.sort(key=lambda rows: len(rows) * int(lengths[rows[0]]), reverse=True)
            for done in [self._pool.submit(run, rows) for rows in batches]:
                done.result()
        return normalise(out)

    def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, (384,), cached by text."""
        return self.queries.get(text, lambda t: self.embed([t])[0])

    def _batches(self, order: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        """Runs of `order` (shortest first) of one token count each, within the batch limits."""
        batches: list[np.ndarray] = []
        start = 0
        for end in range(1, len(order) + 1):
            if end < len(order):
                length = int(lengths[order[end]])
                if (
                    length == lengths[order[start]]
                    and end - start < self.max_batch_rows
                    and (end - start + 1) * length <= self.max_batch_tokens
                ):
                    continue
            batches.append(order[start:end])
            start = end
        return batches

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        """Token sums of one batch, every row the same length."""
        input_ids = np.array(ids, dtype=np.int32)
        (pooled,) = self._session.run(None, {"input_ids": input_ids})
        return np.asarray(pooled, dtype=np.float32)

    def close(self) -> None:
        """Drop the session and the worker threads; the next `embed` loads again.

        Not to be called while another thread is inside `embed`.
        """
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._session = None
            self._tokenizer = None
