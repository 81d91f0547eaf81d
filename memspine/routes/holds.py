"""The legal-hold routes under /v1/admin/tenants/{id}/holds, behind MEMSPINE_ADMIN_KEY: place,
list and lift the holds that stop every deletion of what they keep (docs/erasure.md)."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
import msgspec

from memspine.pipeline import Call, Outcome, Reply
from memspine.routes.admin import ACTOR, _admin, _control
from memspine.schemas import doc
from memspine_admin.records import HoldRecord
from memspine_admin.retention import MAX_REASON_BYTES, MAX_SUBJECT_BYTES
from storage.errors import NotFound

HOLDS = "/v1/admin/tenants/{tenant_id:str}/holds"

# memspine_admin/retention.check_reason: something besides whitespace, no control character
# but newlines.
_OK, _SEEN = r"[^\x00-\x09\x0b-\x1f\x7f-\x9f]", r"[^\s\x00-\x1f\x7f-\x9f]"
Reason = Annotated[
    str,
    doc(
        "Why the hold is placed (a case, a dispute).",
        minLength=1,
        maxLength=MAX_REASON_BYTES,
        pattern=f"^{_OK}*{_SEEN}{_OK}*$",
    ),
]
Subject = Annotated[
    str,
    doc(
        "Hold only the events about this data subject (their `subjects`); absent: the tenant.",
        minLength=1,
        maxLength=MAX_SUBJECT_BYTES,
        pattern="^[^\\x00-\\x1f\\x7f]+$",
    ),
]


class HoldIn(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/admin/tenants/{id}/holds."""

    reason: Reason
    subject: Subject | None = None


class HoldList(msgspec.Struct):
    """GET /v1/admin/tenants/{id}/holds: the holds standing, oldest first."""

    holds: list[HoldRecord]


class HoldLifted(msgspec.Struct):
    """A hold lifted: what it kept may be deleted again."""

    hold_id: str
    tenant_id: str
    lifted: bool


async def _place(call: Call) -> Outcome:
    """Place a hold on the tenant or on one data subject's events."""
    control, body = _control(call), call.body
    hold = await anyio.to_thread.run_sync(
        lambda: control.place_hold(call.path["tenant_id"], body.reason, body.subject, actor=ACTOR)
    )
    return Outcome(201, hold)


async def _list(call: Call) -> Outcome:
    """The tenant's holds; 404 for an unknown tenant."""
    control, tenant_id = _control(call), call.path["tenant_id"]
    if await anyio.to_thread.run_sync(control.get_tenant, tenant_id) is None:
        raise NotFound("no tenant with that id")
    return Outcome(200, HoldList(await anyio.to_thread.run_sync(control.list_holds, tenant_id)))


async def _lift(call: Call) -> Outcome:
    """Lift a hold; retention, erasure and deletes reach what it kept again."""
    control, path = _control(call), call.path
    hold = await anyio.to_thread.run_sync(
        lambda: control.lift_hold(path["tenant_id"], path["hold_id"], actor=ACTOR)
    )
    return Outcome(200, HoldLifted(hold_id=hold.hold_id, tenant_id=hold.tenant_id, lifted=True))


OPERATIONS = (
    _admin(
        "place_hold",
        "POST",
        HOLDS,
        _place,
        "Place a legal hold on a tenant, or on one data subject's events",
        body=HoldIn,
        replies={201: Reply(HoldRecord, "The hold, with its hold_id.")},
        errors=(413,),
    ),
    _admin(
        "list_holds",
        "GET",
        HOLDS,
        _list,
        "The tenant's legal holds, oldest first",
        replies={200: Reply(HoldList, "The holds standing.")},
    ),
    _admin(
        "lift_hold",
        "DELETE",
        HOLDS + "/{hold_id:str}",
        _lift,
        "Lift a legal hold",
        replies={200: Reply(HoldLifted, "Lifted.")},
    ),
)
