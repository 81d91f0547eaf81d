"""Server settings: one frozen Struct loaded once from the MEMSPINE_* environment."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

FD_RESERVE = 64
FDS_PER_TENANT = 12


class SettingsError(ValueError):
    """A setting has a value the server cannot start with."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the server reads from its environment."""

    host: str = "127.0.0.1"
    port: int = 7781
    data_dir: Path = Path("./data")
    admin_key: str | None = None
    embedding_dim: int = 384
    max_open_tenants: int = 80
    tenant_idle_secs: float = 3600.0
    purge_interval_secs: float = 60.0
    max_body_bytes: int = 1_048_576
    cypher_timeout_ms: int = 2000
    cypher_max_rows: int = 10_000
    metrics_per_tenant: bool = False
    log_level: str = "INFO"
    mcp_allowed_origins: frozenset[str] = frozenset()  # normalised: scheme://host[:port]
    embedder: str = "local"  # storage.embedders.KINDS
    embedder_url: str | None = None
    embedder_model: str | None = None
    embedder_api_key: str | None = None


def default_max_open_tenants() -> int:
    """(soft fd limit − 64) / 12, as the seed's original computed it (at least 1)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1_048_576
    return max(1, (soft - FD_RESERVE) // FDS_PER_TENANT)


def _bind(value: str) -> dict[str, Any]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise SettingsError(f"MEMSPINE_BIND must be host:port, got {value!r}")
    return {"host": host.strip("[]"), "port": _int_in(1, 65535)(port)}


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise SettingsError(f"expected an integer, got {value!r}") from None
        if not lo <= n <= hi:
            raise SettingsError(f"expected an integer from {lo} to {hi}, got {n}")
        return n

    return parse


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise SettingsError(f"expected a number of seconds, got {value!r}") from None
    if not x > 0 or x != x or x == float("inf"):
        raise SettingsError(f"expected a positive number of seconds, got {value!r}")
    return x


def _flag(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"expected 1 or 0, got {value!r}")


def _data_dir(value: str) -> dict[str, Any]:
    """A directory that exists, or whose nearest existing ancestor is a writable directory."""
    if not value:
        raise SettingsError("expected a directory path, got an empty value")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise SettingsError(f"{value!r} exists and is not a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SettingsError(
            f"{value!r} cannot be created: {str(probe)!r} is not a writable directory"
        )
    return {"data_dir": path}


def _admin_key(value: str) -> str | None:
    if not value:
        return None
    if len(value) < 16:
        raise SettingsError("MEMSPINE_ADMIN_KEY must be at least 16 characters")
    return value


def _log_level(value: str) -> str:
    level = value.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"expected DEBUG, INFO, WARNING or ERROR, got {value!r}")
    return level


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_key(origin: str) -> str | None:
    """An http(s) origin as browsers send it (lower case, no default port), or None if the
    text is not one: a scheme and a host, nothing else."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in _DEFAULT_PORTS or not host or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if ":" in host:  # IPv6: bracketed again, as in a URL
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port not in (None, _DEFAULT_PORTS[scheme]) else "")


def _origins(value: str) -> dict[str, Any]:
    """Comma-separated origins, each scheme://host[:port]."""
    keys = set()
    for item in value.split(","):
        if not item.strip():
            continue
        key = origin_key(item)
        if key is None:
            raise SettingsError(
                f"expected origins such as https://agent.example.com, got {item.strip()!r}"
            )
        keys.add(key)
    return {"mcp_allowed_origins": frozenset(keys)}


EMBEDDERS = ("local", "openai", "none")  # storage.embedders.KINDS, without importing it here


def _embedder(value: str) -> dict[str, Any]:
    kind = value.lower()
    if kind not in EMBEDDERS:
        raise SettingsError(f"expected local, openai or none, got {value!r}")
    return {"embedder": kind}


def _embedder_url(value: str) -> dict[str, Any]:
    """An http(s) URL with a host: a base such as http://127.0.0.1:11434/v1, or …/embeddings."""
    if not value:
        return {"embedder_url": None}
    # The value is not echoed: a URL may carry a password.
    bad = SettingsError("expected an http:// or https:// URL with a host")
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError:
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad
    if parts.query or parts.fragment:
        raise SettingsError("expected a URL without a query or fragment")
    return {"embedder_url": value}


def _check_embedder(s: Settings) -> None:
    """The embedder settings agree with each other: an endpoint is named only for openai."""
    if s.embedder == "openai":
        if not s.embedder_url or not s.embedder_model:
            raise SettingsError(
                "MEMSPINE_EMBEDDER=openai needs MEMSPINE_EMBEDDER_URL and MEMSPINE_EMBEDDER_MODEL"
            )
        return
    for name, value in (
        ("MEMSPINE_EMBEDDER_URL", s.embedder_url),
        ("MEMSPINE_EMBEDDER_MODEL", s.embedder_model),
        ("MEMSPINE_EMBEDDER_API_KEY", s.embedder_api_key),
    ):
        if value:
            raise SettingsError(
                f"{name} is set but MEMSPINE_EMBEDDER is {s.embedder!r}; "
                "set MEMSPINE_EMBEDDER=openai to use an endpoint"
            )


# Every documented variable: name -> (parser, how its result enters Settings).
PARSERS: dict[str, Callable[[str], Any]] = {
    "MEMSPINE_BIND": _bind,
    "MEMSPINE_DATA_DIR": _data_dir,
    "MEMSPINE_ADMIN_KEY": lambda v: {"admin_key": _admin_key(v)},
    "MEMSPINE_EMBEDDING_DIM": lambda v: {"embedding_dim": _int_in(1, 4096)(v)},
    "MEMSPINE_MAX_OPEN_TENANTS": lambda v: {"max_open_tenants": _int_in(1, 1_000_000)(v)},
    "MEMSPINE_TENANT_IDLE_SECS": lambda v: {"tenant_idle_secs": _positive_float(v)},
    "MEMSPINE_PURGE_INTERVAL_SECS": lambda v: {"purge_interval_secs": _positive_float(v)},
    "MEMSPINE_MAX_BODY_BYTES": lambda v: {"max_body_bytes": _int_in(1024, 64 << 20)(v)},
    "MEMSPINE_CYPHER_TIMEOUT_MS": lambda v: {"cypher_timeout_ms": _int_in(10, 600_000)(v)},
    "MEMSPINE_CYPHER_MAX_ROWS": lambda v: {"cypher_max_rows": _int_in(1, 1_000_000)(v)},
    "MEMSPINE_METRICS_PER_TENANT": lambda v: {"metrics_per_tenant": _flag(v)},
    "MEMSPINE_LOG_LEVEL": lambda v: {"log_level": _log_level(v)},
    "MEMSPINE_MCP_ALLOWED_ORIGINS": _origins,
    "MEMSPINE_EMBEDDER": _embedder,
    "MEMSPINE_EMBEDDER_URL": _embedder_url,
    "MEMSPINE_EMBEDDER_MODEL": lambda v: {"embedder_model": v or None},
    "MEMSPINE_EMBEDDER_API_KEY": lambda v: {"embedder_api_key": v or None},
}


def load_settings(env: Mapping[str, str]) -> Settings:
    """Parse and validate every MEMSPINE_* variable; raises SettingsError naming the bad one."""
    values: dict[str, Any] = {"max_open_tenants": default_max_open_tenants()}
    for name, parse in PARSERS.items():
        raw = env.get(name)
        if raw is None:
            continue
        try:
            values.update(parse(raw.strip()))
        except SettingsError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    unknown = sorted(k for k in env if k.startswith("MEMSPINE_") and k not in PARSERS)
    unknown = [k for k in unknown if k not in IGNORED]
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]}; see docs/configuration.md")
    settings = Settings(**values)
    _check_embedder(settings)
    return settings


# Variables read by other tools (the MCP stdio client, tests), not by the server.
IGNORED = frozenset({"MEMSPINE_API_KEY", "MEMSPINE_URL"})
