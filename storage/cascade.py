"""Cascading deletes: an event together with every event derived from it over SOURCE_FROM."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

import lmdb

from storage.model import SOURCE_FROM
from storage.reader import LogReader

if TYPE_CHECKING:
    from storage.tenant import Tenant


def derived_closure(r: LogReader, event_id: str) -> list[str]:
    """The event, then every live event that reaches it over SOURCE_FROM, breadth first in link
    (append) order; empty if the event does not exist. SUPERSEDES is not followed."""
    if not r.exists(event_id):
        return []
    order = [event_id]
    seen = {event_id}
    i = 0
    while i < len(order):
        for derived in r.links_in(order[i], SOURCE_FROM):
            if derived not in seen:
                seen.add(derived)
                order.append(derived)
        i += 1
    return order


def delete_derived(tenant: Tenant, event_id: str) -> Future[list[str]]:
    """Delete the event and everything derived from it in one transaction on the tenant's writer,
    so an event derived meanwhile cannot escape; resolves to the ids deleted, the event first."""

    def run() -> list[str]:
        log = tenant.log

        def apply(txn: lmdb.Transaction) -> list[str]:
            return log.delete_in(txn, derived_closure(LogReader(txn, log.dbs), event_id))

        tenant.mark_before_delete([event_id])  # the closure is empty unless the event is live
        deleted = log.write(apply)
        tenant.catch_up()
        return deleted

    return tenant.call(run)
