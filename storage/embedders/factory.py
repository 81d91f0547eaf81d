"""make_embedder: the embedder a MEMSPINE_EMBEDDER setting names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
