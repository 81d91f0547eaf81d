"""What every embedder offers, its error, and the small LRU of query vectors they share."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from storage.errors import Unavailable

QUERY_CACHE_SIZE = 1024
# The failure reason of an embedder call past its deadline (a hung or stopped model process):
# the background embedder tries the batch once more, then leaves its tenant keyword-only.
HUNG = "model_process_hung"


class EmbedderError(Unavailable):
    """The embedder could not produce vectors (503); `reason` is a short, bounded label.

    The detail never names the endpoint or quotes text: it may reach a client.
    """

    def __init__(self, reason: str, detail: str, *, retry_after: float | None = None) -> None:
        headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
        super().__init__(detail, headers=headers)
        self.reason = reason
        self.retry_after = retry_after


@runtime_checkable
class Embedder(Protocol):
    """Text in, one L2-normalised float32 vector per text out."""

    @property
    def name(self) -> str:
        """The model name a tenant records for vectors made by this embedder."""
        ...

    @property
    def dim(self) -> int | None:
        """Vector length; None until known (an endpoint tells it with its first answer)."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts`, shape (len(texts), dim), float32, each of unit length."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """One query's vector, shape (dim,), from a small LRU when the same text comes again."""
        ...

    def close(self) -> None:
        """Release what the embedder holds (connections, the model)."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32; a zero row is an error, not a NaN."""
    arr = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if arr.size and not np.all(np.isfinite(norms) & (norms > 0)):
        raise EmbedderError("bad_answer", "the embedder returned a zero or non-finite vector")
    unit: np.ndarray = arr / norms
    return unit


class QueryCache:
    """A thread-safe LRU from query text to its vector; vectors are stored read-only."""

    def __init__(self, size: int = QUERY_CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str, compute: Callable[[str], np.ndarray]) -> np.ndarray:
        """The cached vector of `text`, or `compute(text)` stored for next time."""
        vec = self.peek(text)
        if vec is not None:
            return vec
        with self._lock:
            self.misses += 1
        vec = compute(text)
        vec.setflags(write=False)
        if self.size > 0:
            with self._lock:
                self._items[text] = vec
                self._items.move_to_end(text)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return vec

    def peek(self, text: str) -> np.ndarray | None:
        """The cached vector of `text` (counted as a hit), or None; never computes."""
        with self._lock:
            vec = self._items.get(text)
            if vec is not None:
                self._items.move_to_end(text)
                self.hits += 1
            return vec

    def clear(self) -> None:
        """Forget every vector (after the model changed)."""
        with self._lock:
            self._items.clear()
