"""The MEMSPINE_EMBEDDER* settings, checked in one place: for the server's settings
(memspine/config.py) and for `memspine-admin reembed`, which makes the embedder they name.
A refusal is ValueError with a sentence the caller prefixes with the setting's name."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from storage.embedders.base import Embedder
from storage.embedders.factory import KINDS, make_embedder


def check_kind(value: str) -> str:
    """MEMSPINE_EMBEDDER: local, openai or none, in any case."""
    kind = value.lower()
    if kind not in KINDS:
        raise ValueError(f"expected local, openai or none, got {value!r}")
    return kind


def check_url(value: str) -> str | None:
    """MEMSPINE_EMBEDDER_URL: an http(s) URL with a host (a base such as
    http://127.0.0.1:11434/v1, or …/embeddings); empty for none."""
    if not value:
        return None
    # The value is not echoed: a URL may carry a password.
    bad = ValueError("expected an http:// or https:// URL with a host")
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad
    if parts.query or parts.fragment:
        raise ValueError("expected a URL without a query or fragment")
    return value


def check_together(kind: str, url: str | None, model: str | None, api_key: str | None) -> None:
    """The settings agree with each other: an endpoint is named only for openai, and openai
    needs its URL and model."""
    if kind == "openai":
        if not url or not model:
            raise ValueError(
                "MEMSPINE_EMBEDDER=openai needs MEMSPINE_EMBEDDER_URL and MEMSPINE_EMBEDDER_MODEL"
            )
        return
    for name, value in (
        ("MEMSPINE_EMBEDDER_URL", url),
        ("MEMSPINE_EMBEDDER_MODEL", model),
        ("MEMSPINE_EMBEDDER_API_KEY", api_key),
    ):
        if value:
            raise ValueError(
                f"{name} is set but MEMSPINE_EMBEDDER is {kind!r}; "
                "set MEMSPINE_EMBEDDER=openai to use an endpoint"
            )


def embedder_from_env(env: Mapping[str, str]) -> Embedder | None:
    """The embedder the environment's MEMSPINE_EMBEDDER* settings name (None for none), as the
    server would make it; ValueError naming the setting that is wrong."""
    raw_kind = env.get("MEMSPINE_EMBEDDER", "local").strip()
    try:
        kind = check_kind(raw_kind)
    except ValueError as exc:
        raise ValueError(f"MEMSPINE_EMBEDDER: {exc}") from None
    try:
        url = check_url(env.get("MEMSPINE_EMBEDDER_URL", "").strip())
    except ValueError as exc:
        raise ValueError(f"MEMSPINE_EMBEDDER_URL: {exc}") from None
    model = env.get("MEMSPINE_EMBEDDER_MODEL", "").strip() or None
    api_key = env.get("MEMSPINE_EMBEDDER_API_KEY", "").strip() or None
    check_together(kind, url, model, api_key)
    return make_embedder(kind, url, model, api_key)
