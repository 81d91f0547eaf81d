"""Server settings: one frozen Struct loaded once from the MEMSPINE_* environment."""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from memspine.limits import default_max_open_bytes, machine_memory
from memspine_admin.controlurl import is_control_url, redact
from memspine_admin.limits import BINARY_UNITS, parse_limit
from memspine_admin.placement import is_node_name
from memspine_admin.records import MAX_QUOTA, MAX_REQUESTS_PER_MINUTE
from memspine_admin.retention import MAX_DAYS
from storage import (
    MAX_EMBEDDING_DIM,
    check_embedder_kind,
    check_embedder_settings,
    check_embedder_url,
    default_writer_threads,
)

FD_RESERVE = 64
# Descriptors an open tenant holds while in use: LMDB's data file twice and its lock file, a
# fourth (Tantivy's writer lock) while a keyword fold has work, and a commit's segment files
# for a moment (tests/e2e/test_process_limits.py counts them). Idle, it holds none: its log lets
# its environment go (storage/log/held.py) and its keyword index its Tantivy index
# (storage/index/held.py). So descriptors bound the tenants in use, not the tenants open.
FDS_PER_TENANT = 12
# Memory mappings: an idle open tenant maps its vector file (one); those in use map their LMDB
# files and Tantivy segments too, at most as many as the two registries hold. The default cap
# keeps open tenants within the kernel's vm.max_map_count less this reserve for them and for
# the libraries.
MAPS_PER_TENANT = 1
MAPS_RESERVE = 20_000
MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
MAX_MAP_COUNT_FALLBACK = 65_530  # Linux's default
# Native threads an open tenant runs of its own once idle: none. Its writes go to the shared
# writer pool (storage/tenants/pool.py), its graph inserts and keyword folds to the shared
# background pool (storage/index/background.py); the Tantivy writer's threads live only while a
# fold has work, and the file watcher Tantivy starts with each index it opens only while the
# index is held, by at most HELD_MAX tenants used in the last LINGER_SECS across the process
# (storage/index/held.py; counted by tests/server/test_tenant_threads.py).
THREADS_PER_TENANT = 0
# While open tenants run threads of their own, the default cap keeps them under this
# (docs/operations.md).
MAX_TENANT_THREADS = 4_000


class SettingsError(ValueError):
    """A setting has a value the server cannot start with."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the server reads from its environment."""

    host: str = "127.0.0.1"
    port: int = 7781
    data_dir: Path = Path("./data")
    admin_key: str | None = None
    auth_hash_slots: int = 4
    auth_free_failures: int = 5
    auth_max_backoff_secs: float = 60.0
    embedding_dim: int = 384
    max_open_tenants: int = 80
    writer_threads: int = msgspec.field(default_factory=default_writer_threads)  # the writer pool
    max_open_bytes: int = msgspec.field(default_factory=default_max_open_bytes)
    tenant_idle_secs: float = 3600.0
    purge_interval_secs: float = 60.0
    erasure_ledger_days: float = 30.0  # storage/tenants/tenant.py's LEDGER_DAYS
    max_body_bytes: int = 1_048_576
    max_batch_bytes: int = 16 << 20  # POST /v1/memory/events (1,000 embedded events fit)
    cypher_timeout_ms: int = 2000
    cypher_max_rows: int = 10_000
    cypher_max_bytes: int = 64 << 20  # the defaults of storage.cypher.Limits
    cypher_max_string_chars: int = 4 << 20
    cypher_max_list_items: int = 100_000
    cypher_max_result_bytes: int = 32 << 20
    cypher_concurrency: int = 2
    metrics_per_tenant: bool = False
    log_level: str = "INFO"
    mcp_allowed_origins: frozenset[str] = frozenset()  # normalised: scheme://host[:port]
    allowed_hosts: frozenset[str] = frozenset()  # lower-case host names, no port
    header_timeout_secs: float = 10.0
    body_timeout_secs: float = 30.0
    max_connections: int = msgspec.field(default_factory=lambda: default_max_connections())
    max_connections_per_client: int = 64
    control_url: str | None = None  # PostgreSQL control plane; None: LMDB in data_dir/_control
    node: str | None = None  # this server's name in a cluster (needs control_url)
    node_url: str | None = None  # where memspine-admin reaches this node (default: from bind)
    ui: bool = True  # the web console at /ui (memspine/routes/ui.py)
    embedder: str = "local"  # storage.embedders.KINDS
    embedder_url: str | None = None
    embedder_model: str | None = None
    embedder_api_key: str | None = None
    embeddings_max_pending: int = 10_000  # events awaiting server vectors before appends wait
    # Server-wide defaults for keys and tenants without a limit of their own (None: no limit).
    default_requests_per_minute: int | None = None
    default_max_events: int | None = None
    default_max_bytes: int | None = None
    default_max_memory: int | None = None
    # Days an event of a kind no tenant window names is kept (None: kept until deleted).
    retention_days: int | None = None
    read_audit: str = "buffered"  # who read which events: buffered, durable or off (docs/audit.md)
    read_audit_days: int = 365  # read records older than this are dropped by the purger

    def __repr__(self) -> str:
        # The control URL may hold a password: keep it out of any log of the settings.
        shown = msgspec.structs.asdict(self)
        if self.control_url:
            shown["control_url"] = redact(self.control_url)
        if self.admin_key:
            shown["admin_key"] = "<hidden>"
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def default_max_open_tenants(max_open_bytes: int | None = None, embedding_dim: int = 384) -> int:
    """As many open tenants as the memory budget holds at the smallest a tenant can be
    (storage/tenants/manager.py's tenants_within, 112 KB a tenant; the default budget when
    None), held under what the kernel's map count allows (max_map_count_ceiling) and, while an
    open tenant runs threads of its own, under MAX_TENANT_THREADS of them; at least 1.
    Descriptors bind the tenants in use, not those open (FDS_PER_TENANT)."""
    from storage import tenants_within  # here: it loads the index libraries

    budget = default_max_open_bytes() if max_open_bytes is None else max_open_bytes
    cap = min(tenants_within(budget, embedding_dim), max_map_count_ceiling())
    if THREADS_PER_TENANT:
        cap = min(cap, MAX_TENANT_THREADS // THREADS_PER_TENANT)
    return max(1, cap)


def max_map_count_ceiling() -> int:
    """Open tenants the kernel's memory-mapping limit allows: (vm.max_map_count − MAPS_RESERVE)
    / MAPS_PER_TENANT, at least 1."""
    try:
        limit = int(MAX_MAP_COUNT.read_text().strip())
    except (OSError, ValueError):
        limit = MAX_MAP_COUNT_FALLBACK
    return max(1, (limit - MAPS_RESERVE) // MAPS_PER_TENANT)


def default_max_connections() -> int:
    """A quarter of the soft fd limit (the rest is for tenants' files), from 16 to 4096."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1_048_576
    return min(4096, max(16, (soft - FD_RESERVE) // 4))


def _bind(value: str) -> dict[str, Any]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise SettingsError(f"expected host:port, got {value!r}")
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


_BINARY_UNITS = BINARY_UNITS
MIN_OPEN_BYTES = 1 << 20
MAX_OPEN_BYTES = 1 << 60  # more than any machine: taken as "no budget to speak of"


def _byte_size(value: str) -> int:
    """Bytes: an integer with an optional K, M, G or T (powers of 1024, "MiB" and "MB" alike),
    or a percentage of the machine's memory such as 25%."""
    text = value.strip().lower()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise SettingsError(f"expected a percentage such as 25%, got {value!r}") from None
        if not 0 < share <= 100:
            raise SettingsError(f"expected a percentage above 0 and at most 100, got {value!r}")
        return max(MIN_OPEN_BYTES, int(machine_memory() * share / 100))
    number = text.removesuffix("ib").removesuffix("b")
    unit = number[-1:] if number[-1:] in _BINARY_UNITS else ""
    digits = number[: len(number) - len(unit)].strip()
    if not digits.isdigit():
        raise SettingsError(f"expected bytes such as 2147483648, 2G or 25%, got {value!r}")
    n = int(digits) * _BINARY_UNITS[unit]
    if n < MIN_OPEN_BYTES:
        raise SettingsError(f"expected at least 1M (1048576 bytes), got {value!r}")
    return min(n, MAX_OPEN_BYTES)


def _days(value: str) -> int | None:
    """MEMSPINE_RETENTION_DAYS: empty for none (events are kept), else 1 to MAX_DAYS days."""
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_DAYS:
        raise SettingsError(
            f"expected a whole number of days from 1 to {MAX_DAYS} (unset or empty: events "
            f"are kept until deleted), got {value!r}"
        )
    return int(value)


def _limit(hi: int, *, units: bool = False) -> Callable[[str], int | None]:
    """A limit: empty or 0 for none, else a whole number up to hi (memspine_admin/limits.py)."""

    def parse(value: str) -> int | None:
        try:
            return parse_limit(value, hi, units=units)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None

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
    return {"data_dir": check_data_dir(value)}


def check_data_dir(value: str) -> Path:
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
    return path


def _admin_key(value: str) -> str | None:
    if not value:
        return None
    if len(value) < 16:
        raise SettingsError("expected at least 16 characters")
    return value


READ_AUDIT_MODES = ("buffered", "durable", "off")


def _read_audit(value: str) -> str:
    mode = value.lower()
    if mode not in READ_AUDIT_MODES:
        raise SettingsError(f"expected buffered, durable or off, got {value!r}")
    return mode


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
        if "*" in item:  # no browser sends one: such an entry would never match anything
            raise SettingsError(
                f"wildcards are not supported, got {item.strip()!r}; list each origin in full"
            )
        key = origin_key(item)
        if key is None:
            raise SettingsError(
                f"expected origins such as https://agent.example.com, got {item.strip()!r}"
            )
        keys.add(key)
    return {"mcp_allowed_origins": frozenset(keys)}


_HOST_NAME = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\Z"
)


def _hosts(value: str) -> dict[str, Any]:
    """Comma-separated host names (no scheme, no port), compared in lower case."""
    names = set()
    for item in value.split(","):
        name = item.strip().lower()
        if not name:
            continue
        if not _HOST_NAME.match(name):
            raise SettingsError(
                f"expected host names such as memspine.internal, got {item.strip()!r}"
            )
        names.add(name)
    return {"allowed_hosts": frozenset(names)}


def _embedder(value: str) -> dict[str, Any]:
    try:
        return {"embedder": check_embedder_kind(value)}
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _embedder_url(value: str) -> dict[str, Any]:
    """An http(s) URL with a host: storage/embedders/settings.py checks it."""
    try:
        return {"embedder_url": check_embedder_url(value)}
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _check_embedder(s: Settings) -> None:
    """The embedder settings agree with each other: an endpoint is named only for openai."""
    try:
        check_embedder_settings(s.embedder, s.embedder_url, s.embedder_model, s.embedder_api_key)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _control_url(value: str) -> dict[str, Any]:
    if not value:
        return {"control_url": None}
    if not is_control_url(value):
        raise SettingsError("expected a PostgreSQL URL such as postgresql://user:pass@host/db")
    return {"control_url": value}


def _node(value: str) -> dict[str, Any]:
    if not value:
        return {"node": None}
    if not is_node_name(value):
        raise SettingsError(
            f"expected a lower-case DNS label (a-z, 0-9 and -, at most 63), got {value!r}"
        )
    return {"node": value}


def _node_url(value: str) -> dict[str, Any]:
    if not value:
        return {"node_url": None}
    if not value.startswith(("http://", "https://")) or "?" in value or "#" in value:
        raise SettingsError(f"expected an http:// or https:// URL without a query, got {value!r}")
    return {"node_url": value.rstrip("/")}


# Every documented variable: name -> (parser, how its result enters Settings).
PARSERS: dict[str, Callable[[str], Any]] = {
    "MEMSPINE_BIND": _bind,
    "MEMSPINE_DATA_DIR": _data_dir,
    "MEMSPINE_ADMIN_KEY": lambda v: {"admin_key": _admin_key(v)},
    "MEMSPINE_AUTH_HASH_SLOTS": lambda v: {"auth_hash_slots": _int_in(1, 64)(v)},
    "MEMSPINE_AUTH_FREE_FAILURES": lambda v: {"auth_free_failures": _int_in(1, 1000)(v)},
    "MEMSPINE_AUTH_MAX_BACKOFF_SECS": lambda v: {"auth_max_backoff_secs": _positive_float(v)},
    "MEMSPINE_EMBEDDING_DIM": lambda v: {"embedding_dim": _int_in(1, MAX_EMBEDDING_DIM)(v)},
    "MEMSPINE_MAX_OPEN_TENANTS": lambda v: {"max_open_tenants": _int_in(1, 1_000_000)(v)},
    "MEMSPINE_MAX_OPEN_BYTES": lambda v: {"max_open_bytes": _byte_size(v)},
    "MEMSPINE_WRITER_THREADS": lambda v: {"writer_threads": _int_in(1, 256)(v)},
    "MEMSPINE_TENANT_IDLE_SECS": lambda v: {"tenant_idle_secs": _positive_float(v)},
    "MEMSPINE_PURGE_INTERVAL_SECS": lambda v: {"purge_interval_secs": _positive_float(v)},
    "MEMSPINE_ERASURE_LEDGER_DAYS": lambda v: {"erasure_ledger_days": _positive_float(v)},
    "MEMSPINE_MAX_BODY_BYTES": lambda v: {"max_body_bytes": _int_in(1024, 64 << 20)(v)},
    "MEMSPINE_MAX_BATCH_BYTES": lambda v: {"max_batch_bytes": _int_in(1024, 256 << 20)(v)},
    "MEMSPINE_CYPHER_TIMEOUT_MS": lambda v: {"cypher_timeout_ms": _int_in(10, 600_000)(v)},
    "MEMSPINE_CYPHER_MAX_ROWS": lambda v: {"cypher_max_rows": _int_in(1, 1_000_000)(v)},
    "MEMSPINE_CYPHER_MAX_BYTES": lambda v: {"cypher_max_bytes": _int_in(1 << 20, 64 << 30)(v)},
    "MEMSPINE_CYPHER_MAX_STRING_CHARS": lambda v: {
        "cypher_max_string_chars": _int_in(1024, 1 << 30)(v)
    },
    "MEMSPINE_CYPHER_MAX_LIST_ITEMS": lambda v: {
        "cypher_max_list_items": _int_in(16, 100_000_000)(v)
    },
    "MEMSPINE_CYPHER_CONCURRENCY": lambda v: {"cypher_concurrency": _int_in(1, 64)(v)},
    "MEMSPINE_CYPHER_MAX_RESULT_BYTES": lambda v: {
        "cypher_max_result_bytes": _int_in(64 << 10, 4 << 30)(v)
    },
    "MEMSPINE_METRICS_PER_TENANT": lambda v: {"metrics_per_tenant": _flag(v)},
    "MEMSPINE_LOG_LEVEL": lambda v: {"log_level": _log_level(v)},
    "MEMSPINE_MCP_ALLOWED_ORIGINS": _origins,
    "MEMSPINE_ALLOWED_HOSTS": _hosts,
    "MEMSPINE_HEADER_TIMEOUT_SECS": lambda v: {"header_timeout_secs": _positive_float(v)},
    "MEMSPINE_BODY_TIMEOUT_SECS": lambda v: {"body_timeout_secs": _positive_float(v)},
    "MEMSPINE_MAX_CONNECTIONS": lambda v: {"max_connections": _int_in(1, 1_000_000)(v)},
    "MEMSPINE_MAX_CONNECTIONS_PER_CLIENT": lambda v: {
        "max_connections_per_client": _int_in(1, 1_000_000)(v)
    },
    "MEMSPINE_CONTROL_URL": _control_url,
    "MEMSPINE_NODE": _node,
    "MEMSPINE_NODE_URL": _node_url,
    "MEMSPINE_UI": lambda v: {"ui": _flag(v)},
    "MEMSPINE_EMBEDDER": _embedder,
    "MEMSPINE_EMBEDDER_URL": _embedder_url,
    "MEMSPINE_EMBEDDER_MODEL": lambda v: {"embedder_model": v or None},
    "MEMSPINE_EMBEDDER_API_KEY": lambda v: {"embedder_api_key": v or None},
    "MEMSPINE_EMBEDDINGS_MAX_PENDING": lambda v: {
        "embeddings_max_pending": _int_in(1, 10_000_000)(v)
    },
    "MEMSPINE_DEFAULT_REQUESTS_PER_MINUTE": lambda v: {
        "default_requests_per_minute": _limit(MAX_REQUESTS_PER_MINUTE)(v)
    },
    "MEMSPINE_READ_AUDIT": lambda v: {"read_audit": _read_audit(v)},
    "MEMSPINE_READ_AUDIT_DAYS": lambda v: {"read_audit_days": _int_in(1, 36_500)(v)},
    "MEMSPINE_DEFAULT_MAX_EVENTS": lambda v: {"default_max_events": _limit(MAX_QUOTA)(v)},
    "MEMSPINE_DEFAULT_MAX_BYTES": lambda v: {"default_max_bytes": _limit(MAX_QUOTA, units=True)(v)},
    "MEMSPINE_RETENTION_DAYS": lambda v: {"retention_days": _days(v)},
    "MEMSPINE_DEFAULT_MAX_MEMORY": lambda v: {
        "default_max_memory": _limit(MAX_QUOTA, units=True)(v)
    },
}


def load_settings(env: Mapping[str, str]) -> Settings:
    """Parse and validate every MEMSPINE_* variable; raises SettingsError naming the bad one."""
    values: dict[str, Any] = {}
    for name, parse in PARSERS.items():
        raw = env.get(name)
        if raw is None:
            continue
        try:
            values.update(parse(raw.strip()))
        except SettingsError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    if "max_open_tenants" not in values:  # from the budget as set, and the dimension
        values["max_open_tenants"] = default_max_open_tenants(
            values.get("max_open_bytes"), values.get("embedding_dim", 384)
        )
    unknown = sorted(k for k in env if k.startswith("MEMSPINE_") and k not in PARSERS)
    unknown = [k for k in unknown if k not in IGNORED]
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]}; see docs/configuration.md")
    if values.get("node") and not values.get("control_url"):
        raise SettingsError("MEMSPINE_NODE: a node name needs MEMSPINE_CONTROL_URL (a cluster)")
    settings = Settings(**values)
    _check_embedder(settings)
    return settings


# Variables read by other tools (the MCP stdio client, tests), not by the server.
IGNORED = frozenset(
    {"MEMSPINE_API_KEY", "MEMSPINE_URL", "MEMSPINE_FAILPOINTS", "MEMSPINE_FAILPOINT_GATES"}
)
