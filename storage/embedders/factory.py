"""make_embedder: the embedder a MEMSPINE_EMBEDDER setting names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from storage.embedders.base import Embedder

KINDS = ("local", "openai", "none")


def make_embedder(
    kind: str,
    url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    *,
    on_failure: Callable[[str], None] | None = None,
    **options: Any,
) -> Embedder | None:
    """The embedder for `kind`; None for `none` (no server vectors). Loads no model yet.

    `options` go to the embedder's constructor (threads, precision, batch_size, timeout, ...).
    """
    if kind == "none":
        return None
    if kind == "local":
        if url or model:
            raise ValueError("the local embedder takes no url or model")
        from storage.embedders.child import ChildEmbedder

        return ChildEmbedder(**options)
    if kind == "openai":
        if not url or not model:
            raise ValueError("the openai embedder needs a url and a model")
        from storage.embedders.openai_compat import OpenAIEmbedder

        return OpenAIEmbedder(url, model, api_key, on_failure=on_failure, **options)
    raise ValueError(f"unknown embedder {kind!r}; expected one of {', '.join(KINDS)}")


def describe(kind: str, url: str | None, model: str | None, dim: int) -> str:
    """What the embedder `kind` does for a server whose new tenants have `dim`-number vectors,
    in a few words for its start line (no URL's password: only the endpoint's host)."""
    if kind == "none":
        return f"none (clients send embeddings of {dim} numbers)"
    if kind == "local":
        from storage.embedders.child import DIM, MODEL_NAME

        if dim != DIM:
            return (
                f"local ({MODEL_NAME}) makes {DIM} numbers, not MEMSPINE_EMBEDDING_DIM={dim}: "
                f"new tenants' clients send embeddings of {dim} numbers"
            )
        return f"local ({MODEL_NAME}: the server embeds each event's text, {dim} numbers)"
    host = urlsplit(url or "").hostname or "?"
    return f"{kind} ({model} at {host}: the server embeds each event's text)"
