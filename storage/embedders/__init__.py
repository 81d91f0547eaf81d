"""Embedders: texts to L2-normalised float32 vectors, chosen by MEMSPINE_EMBEDDER.

Importing this package loads no model and no onnxruntime; `make_embedder` returns an object
that loads what it needs on first use.
"""

from __future__ import annotations

from storage.embedders.base import Embedder, EmbedderError, QueryCache, normalise
from storage.embedders.factory import KINDS, describe, make_embedder

__all__ = [
    "KINDS",
    "Embedder",
    "EmbedderError",
    "QueryCache",
    "describe",
    "make_embedder",
    "normalise",
]
