"""A tenant's limits as the server's settings give them by default (MEMSPINE_DEFAULT_MAX_EVENTS,
_BYTES and _MEMORY): one parser for the server's settings (memspine/config.py) and for the
offline commands that hold an import or a restore to a tenant's quota (memspine_admin/quotas.py)."""

from __future__ import annotations

from collections.abc import Mapping

from memspine_admin.records import LIMITS, MAX_QUOTA, TenantRecord

BINARY_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# Each limit's setting, and whether it takes K, M, G or T.
DEFAULT_LIMIT_SETTINGS = {
    "max_events": ("MEMSPINE_DEFAULT_MAX_EVENTS", False),
    "max_bytes": ("MEMSPINE_DEFAULT_MAX_BYTES", True),
    "max_memory": ("MEMSPINE_DEFAULT_MAX_MEMORY", True),
}


def parse_limit(value: str, hi: int, *, units: bool = False) -> int | None:
    """A limit: empty or 0 for none, else a whole number up to hi (with units: an optional K,
    M, G or T, powers of 1024); ValueError with a sentence otherwise."""
    text = value.strip().lower()
    if text in ("", "0"):
        return None
    unit = ""
    if units:
        text = text.removesuffix("ib").removesuffix("b")
        unit = text[-1:] if text[-1:] in BINARY_UNITS else ""
        text = text[: len(text) - len(unit)].strip()
    if not text.isdigit():
        example = "10000000, 512M or 0 for none" if units else "1000, or 0 for none"
        raise ValueError(f"expected a whole number such as {example}, got {value!r}")
    n = int(text) * BINARY_UNITS[unit]
    if n > hi:
        raise ValueError(f"expected at most {hi}, got {value!r}")
    return n


def default_limits(env: Mapping[str, str]) -> dict[str, int | None]:
    """The server's default of each limit, read from env (ValueError naming a bad setting)."""
    limits: dict[str, int | None] = {}
    for name, (setting, units) in DEFAULT_LIMIT_SETTINGS.items():
        try:
            limits[name] = parse_limit(env.get(setting, ""), MAX_QUOTA, units=units)
        except ValueError as exc:
            raise ValueError(f"{setting}: {exc}") from None
    return limits


def effective_limits(
    record: TenantRecord | None, defaults: Mapping[str, int | None]
) -> dict[str, int | None]:
    """A tenant's own limits, with the defaults where it has none (or no record at all)."""
    own = {name: getattr(record, name) if record is not None else None for name in LIMITS}
    return {name: defaults[name] if value is None else value for name, value in own.items()}
