"""A listing followed page by page, without sending anything: the sync and async iterators ask it
for the next Call, send it, and hand it the answer; it says what the page holds and when to stop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

from memspine.client import models as m
from memspine.client import routes
from memspine.client.routes import Call, Scalar


class Page(Protocol):
    """An answer with the cursor of the next page (None on the last)."""

    @property
    def next_cursor(self) -> str | None:
        """The next page's cursor."""
        ...


P = TypeVar("P", bound=Page)
X = TypeVar("X")


class Pages(Generic[P, X]):
    """`call(cursor)` builds a page's request, `items(page)` takes its items out."""

    def __init__(self, call: Callable[[str | None], Call[P]], items: Callable[[P], list[X]]):
        self._call = call
        self._items = items
        self._cursor: str | None = None
        self._done = False

    def next(self) -> Call[P] | None:
        """The request of the next page, or None after the last."""
        return None if self._done else self._call(self._cursor)

    def take(self, page: P) -> list[X]:
        """The items of the page just answered; the one after it is asked for next."""
        self._cursor = page.next_cursor
        self._done = self._cursor is None
        return self._items(page)


def event_pages(
    *,
    kind: str | None,
    since: int | None,
    until: int | None,
    filter: Mapping[str, Scalar] | None,
    current: bool | None,
    as_of: int | None,
    page_size: int,
) -> Pages[m.EventPage, m.Event]:
    """GET /v1/memory/events page after page, newest first."""

    def call(cursor: str | None) -> Call[m.EventPage]:
        return routes.list_events(
            kind=kind,
            since=since,
            until=until,
            limit=page_size,
            cursor=cursor,
            filter=filter,
            current=current,
            as_of=as_of,
        )

    return Pages(call, lambda page: page.events)


def audit_pages(*, tenant_id: str | None, page_size: int) -> Pages[m.AuditPage, m.AuditEntry]:
    """GET /v1/admin/audit page after page, oldest first."""

    def call(cursor: str | None) -> Call[m.AuditPage]:
        return routes.audit(limit=page_size, cursor=cursor, tenant_id=tenant_id)

    return Pages(call, lambda page: page.entries)
