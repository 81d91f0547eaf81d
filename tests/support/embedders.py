"""An embedder that counts its calls, for the background embedder's tests."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

DIM = 4


class CountingEmbedder:
    """A real Embedder (no model): deterministic vectors, and a count of the texts it was given."""

    name = "test/disk-model"
    dim = DIM

    def __init__(self) -> None:
        self.calls: list[int] = []  # texts per embed call
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One vector per text."""
        with self._lock:
            self.calls.append(len(texts))
        return np.stack([unit(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """A query's vector."""
        return unit(text)

    def close(self) -> None:
        """Nothing to release."""


def unit(text: str) -> np.ndarray:
    """The vector the test embedder gives `text`: deterministic, of unit length."""
    v = np.random.default_rng(abs(hash(text)) % (1 << 32)).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)
