"""Query-string parsing shared by the routes: unknown parameters are refused by name."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request

from memspine.schemas import TIME_CHECK_HEADER, check_kind, check_time, time_check
from storage.errors import InvalidRequest
from storage.log import layout as enc
from storage.model import FilterValue
from storage.read.listing import MAX_LIMIT, ListQuery

LIST_PARAMS = {"kind", "since", "until", "limit", "cursor", "current", "as_of"}
PROP_PREFIX = "prop."


def check_params(request: Request[Any, Any, Any], allowed: set[str], *, props: bool = False) -> None:
    """400 naming the first query parameter the route does not take, or one given twice.

    The edge (memspine/edge.py) already refuses repeated and empty parameters on every route;
    this keeps a handler strict wherever it is mounted.
    """
    for name in request.query_params:
        if name in allowed or (props and name.startswith(PROP_PREFIX)):
            one(request, name)
            continue
        raise InvalidRequest(f"unknown query parameter '{name}'")


def one(request: Request[Any, Any, Any], name: str) -> str | None:
    """A parameter given at most once."""
    values = request.query_params.getall(name, [])
    if len(values) > 1:
        raise InvalidRequest(f"query parameter '{name}' is given more than once")
    return values[0] if values else None


def int_param(request: Request[Any, Any, Any], name: str, lo: int, hi: int) -> int | None:
    """An integer parameter within [lo, hi], or None when absent."""
    raw = one(request, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be from {lo} to {hi}")
    return value


def prop_values(raw: str) -> list[FilterValue]:
    """A prop.NAME value matches the string as written and, if it reads as one, the JSON number or boolean."""
    values: list[FilterValue] = [raw]
    try:
        typed = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return values
    if isinstance(typed, bool | int | float):
        values.append(typed)
    return values


def prop_filter(prop: str, raw: str) -> list[FilterValue]:
    """The accepted values of prop.NAME=VALUE; 400 when no event could ever match it."""
    if not enc.PROPERTY_NAME.match(prop) or len(prop) > enc.MAX_FILTER_NAME_BYTES:
        raise InvalidRequest(
            f"query parameter 'prop.{prop}' does not name a filterable property "
            "(letters, digits and underscores, starting with a letter)"
        )
    if len(raw.encode()) > enc.MAX_FILTER_STRING_BYTES:
        raise InvalidRequest(
            f"query parameter 'prop.{prop}' is longer than {enc.MAX_FILTER_STRING_BYTES} bytes; "
            "only shorter strings are filterable"
        )
    return prop_values(raw)


def parse_list_query(request: Request[Any, Any, Any]) -> ListQuery:
    """GET /v1/memory/events parameters."""
    check_params(request, LIST_PARAMS, props=True)
    kind = one(request, "kind")
    if kind is not None:
        check_kind(kind)
    filters: dict[str, list[FilterValue]] = {}
    for name in request.query_params:
        if name.startswith(PROP_PREFIX):
            value = one(request, name)
            assert value is not None
            prop = name[len(PROP_PREFIX) :]
            filters[prop] = prop_filter(prop, value)
    limit = int_param(request, "limit", 1, MAX_LIMIT)
    current = one(request, "current")
    if current is not None and current.lower() not in ("true", "false", "1", "0"):
        raise InvalidRequest("current must be true or false")
    checked = time_check(request.headers.get(TIME_CHECK_HEADER))
    return ListQuery(
        kind=kind,
        since=check_time(int_param(request, "since", 0, 2**62), "since", checked=checked, zero=True),
        until=check_time(int_param(request, "until", 0, 2**62), "until", checked=checked),
        limit=100 if limit is None else limit,
        cursor=one(request, "cursor"),
        filters=filters,
        current=current is None or current.lower() in ("true", "1"),
        as_of=check_time(int_param(request, "as_of", 0, 2**62), "as_of", checked=checked),
    )
