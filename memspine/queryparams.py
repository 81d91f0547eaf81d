"""Parsers of query parameter values (str in, value out, 400 saying what to send), and the
listing query they build, shared by the HTTP routes and the MCP tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from memspine import integers
from memspine.schemas import check_time
from storage.errors import InvalidRequest
from storage.log import layout as enc
from storage.model import MAX_TS, FilterValue, check_kind, check_subject
from storage.read.listing import MAX_LIMIT, ListQuery

DEFAULT_LIST_LIMIT = 100
TRUE, FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


def flag(name: str) -> Callable[[str], bool]:
    """A boolean parameter: true/false/1/0, any case."""

    def parse(raw: str) -> bool:
        value = raw.lower()
        if value in TRUE:
            return True
        if value in FALSE:
            return False
        raise InvalidRequest(f"{name} must be true or false")

    return parse


def int_range(name: str, lo: int, hi: int) -> Callable[[str], int]:
    """An integer parameter within [lo, hi]."""

    def parse(raw: str) -> int:
        try:
            value = integers.parse(raw)  # 2 or 2.0, as JSON Schema's integer; not 2.5
        except ValueError:
            raise InvalidRequest(f"{name} must be an integer") from None
        return in_range(value, name, lo, hi)

    return parse


def in_range(value: int, name: str, lo: int, hi: int) -> int:
    """An integer within [lo, hi], or 400 naming the range."""
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be from {lo} to {hi}")
    return value


def text(raw: str) -> str:
    """A parameter taken as it is (ids, cursors: the operation checks them)."""
    return raw


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


def list_query(
    *,
    kind: str | None = None,
    since: int | None = None,
    until: int | None = None,
    limit: int | None = None,
    cursor: str | None = None,
    props: Mapping[str, str] | None = None,
    current: bool = True,
    as_of: int | None = None,
    checked: bool = True,
    subject: str | None = None,
) -> ListQuery:
    """A listing's query from parsed values (GET /v1/memory/events, memory_list): kinds,
    ranges, property filters and times checked here, once for both doors."""
    if kind is not None:
        check_kind(kind)
    filters = {name: prop_filter(name, raw) for name, raw in (props or {}).items()}
    if subject is not None:
        # the subject's list first: listing walks the first filter's index (the narrowest here)
        filters = {enc.SUBJECT: [check_subject(subject)], **filters}
    return ListQuery(
        kind=kind,
        since=check_time(_bounded(since, "since"), "since", checked=checked, zero=True),
        until=check_time(_bounded(until, "until"), "until", checked=checked),
        limit=DEFAULT_LIST_LIMIT if limit is None else in_range(limit, "limit", 1, MAX_LIMIT),
        cursor=cursor,
        filters=filters,
        current=current,
        as_of=check_time(_bounded(as_of, "as_of"), "as_of", checked=checked),
    )


def _bounded(value: int | None, name: str) -> int | None:
    return None if value is None else in_range(value, name, 0, MAX_TS)
