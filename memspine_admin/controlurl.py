"""MEMSPINE_CONTROL_URL's value: whether it names a PostgreSQL control plane, and the URL
without its password for messages. Both backends and the choice between them use it
(memspine_admin/plane.py, memspine_admin/control_pg.py), so it is a module of its own."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

CONTROL_URL_SCHEMES = ("postgresql://", "postgres://")


def redact(url: str) -> str:
    """A control URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "postgresql://…"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def is_control_url(value: str) -> bool:
    """True if `value` names a PostgreSQL control plane (a libpq URL)."""
    return value.startswith(CONTROL_URL_SCHEMES)
