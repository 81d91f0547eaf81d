"""Data subjects over HTTP: erasure by subject (dry run first), the access export, receipts and
the receipt key (docs/erasure.md, "Erasure by subject"); the work is memspine/subjects.py's."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import anyio.to_thread
import msgspec

from memspine.pipeline import (
    ADMIN,
    PUBLIC,
    READ,
    WRITE,
    Call,
    Operation,
    Outcome,
    Reply,
)
from memspine.routes.memory import PURPOSE
from memspine.routes.transfer import recorded, spooled
from memspine.subjects import (
    Asker,
    DryRun,
    Erased,
    EraseIn,
    access_lines,
    dry_run,
    erase,
    to_reach,
)
from storage import IDENTIFIER, MEDIA_TYPE, Reached, Tenant, check_subject, receipts, tenant_dirs
from storage.errors import InvalidRequest

SUBJECT_PATH = "/v1/memory/subjects/{subject:str}"
ADMIN_KEY_ID = "admin"


class ReceiptList(msgspec.Struct):
    """GET /v1/memory/receipts: the tenant's receipts (erasures and retention runs, each
    named by its `type`), newest first."""

    receipts: list[receipts.AnyReceipt]


class EraseAnswer(msgspec.Struct, omit_defaults=True):
    """The document's view of POST .../erase: a dry run's fields, or the real run's."""

    subject: str | None = None
    events: list[Reached] | None = None
    count: int | None = None
    receipt_id: str | None = None
    receipt: receipts.Signed | None = None
    deleted_ids: list[str] | None = None


class AdminErased(msgspec.Struct):
    """POST /v1/admin/subjects/{subject}/erase: the tenants of this data directory the subject
    reached, and per tenant a real run's receipt or (dry run) what would go."""

    receipts: list[Erased]
    dry_runs: list[DryRun]
    tenants: list[str]


def _asker(call: Call, key_id: str) -> Asker:
    return Asker(key_id=key_id, request_id=call.header(b"x-request-id"))


async def _erase(call: Call) -> Outcome:
    q = to_reach(call.path["subject"], call.body)
    engine = call.services.engine
    if call.body.dry_run:
        return Outcome(200, await dry_run(engine, call.tenant_id, q))
    assert call.principal is not None
    return Outcome(200, await erase(engine, call.tenant_id, q, _asker(call, call.principal.key_id)))


async def _admin_erase(call: Call) -> Outcome:
    """The same request in every tenant of this data directory the subject reaches; each
    confirmed id goes to the tenant whose dry run found it (one found in none is 400 before
    anything is erased)."""
    q = to_reach(call.path["subject"], call.body)
    engine = call.services.engine
    runs: list[tuple[str, DryRun]] = []
    for tenant_id in await anyio.to_thread.run_sync(tenant_dirs, call.services.settings.data_dir):
        found = await dry_run(engine, tenant_id, q)
        if found.events:
            runs.append((tenant_id, found))
    tenants = [t for t, _f in runs]
    if call.body.dry_run:
        return Outcome(200, AdminErased([], [f for _t, f in runs], tenants))
    matched = {
        t: {f.event_id for f in found.events if IDENTIFIER in f.reasons} for t, found in runs
    }
    for i, confirmed in enumerate(q.confirm_ids):
        if not any(confirmed in ids for ids in matched.values()):
            raise InvalidRequest(f"confirm_ids[{i}] is not an event the identifiers found")
    answers: list[Erased] = []
    for tenant_id, _found in runs:
        mine = tuple(c for c in q.confirm_ids if c in matched[tenant_id])
        one = msgspec.structs.replace(q, confirm_ids=mine)
        answers.append(await erase(engine, tenant_id, one, _asker(call, ADMIN_KEY_ID)))
    return Outcome(200, AdminErased(answers, [], tenants))


async def _export(call: Call) -> Outcome:
    """The subject's events and what derives from them, spooled then streamed."""
    subject, tenant_id = check_subject(call.path["subject"]), call.tenant_id
    exported: list[str] = []

    def write(t: Tenant, spool: IO[bytes]) -> int:
        lines = access_lines(t, tenant_id, subject, exported)
        for line in lines:
            spool.write(line)
        return sum(map(len, lines))

    outcome = await spooled(call, write)
    await recorded(call, outcome, exported)  # a read like any other (docs/audit.md)
    return outcome


async def _receipts(call: Call) -> Outcome:
    found = await anyio.to_thread.run_sync(
        receipts.listing, call.services.settings.data_dir, call.tenant_id
    )
    return Outcome(200, ReceiptList(found))


async def _receipt(call: Call) -> Outcome:
    data_dir: Path = call.services.settings.data_dir
    body = await anyio.to_thread.run_sync(
        receipts.load, data_dir, call.tenant_id, call.path["receipt_id"]
    )
    return Outcome(200, body)


async def _key(call: Call) -> Outcome:
    return Outcome(
        200, await anyio.to_thread.run_sync(receipts.public_key, call.services.settings.data_dir)
    )


ERASE_NOTE = (
    "dry_run (default true) answers what would go and why, changing nothing; the real run "
    "deletes every tagged event, what derives from them (cascade) and the identifier matches "
    "listed in confirm_ids, in one write, purges once, scans the tenant's files and answers a "
    "signed receipt (docs/erasure.md)."
)

OPERATIONS = (
    Operation(
        "erase_subject",
        "POST",
        SUBJECT_PATH + "/erase",
        WRITE,
        _erase,
        "Erase everything about a subject: a dry run by default, then one delete and one purge",
        body=EraseIn,
        replies={
            200: Reply(
                EraseAnswer,
                "A dry run's `subject`, `events` and `count`, or the real run's `receipt_id`, "
                "signed `receipt` and `deleted_ids`.",
            )
        },
        errors=(409, 503),
        description=ERASE_NOTE,
    ),
    Operation(
        "export_subject",
        "GET",
        SUBJECT_PATH + "/export",
        READ,
        _export,
        "Everything about a subject as NDJSON (an access request), with the export's trailer",
        replies={
            200: Reply(
                str,
                "The tenant export's lines (docs/api.md, Export format) restricted to the "
                "subject's events and those derived from them.",
                media_type=MEDIA_TYPE,
            )
        },
        errors=(503,),
        headers=(PURPOSE,),
        audited=True,
    ),
    Operation(
        "list_receipts",
        "GET",
        "/v1/memory/receipts",
        READ,
        _receipts,
        "The tenant's erasure receipts, newest first",
        replies={200: Reply(ReceiptList, "The receipts (without their signatures).")},
    ),
    Operation(
        "get_receipt",
        "GET",
        "/v1/memory/receipts/{receipt_id:str}",
        READ,
        _receipt,
        "One erasure receipt as signed: memspine-admin receipt verify checks the body",
        replies={200: Reply(receipts.Signed, "The signed receipt, byte for byte as stored.")},
        errors=(404,),
    ),
    Operation(
        "receipt_key",
        "GET",
        "/v1/receipts/key",
        PUBLIC,
        _key,
        "The public key that signs erasure receipts",
        replies={200: Reply(receipts.PublicKey, "Ed25519, base64 of its 32 raw bytes.")},
        tag="receipts",
    ),
    Operation(
        "erase_subject_everywhere",
        "POST",
        "/v1/admin/subjects/{subject:str}/erase",
        ADMIN,
        _admin_erase,
        "Erase a subject in every tenant of this data directory (dry run by default)",
        body=EraseIn,
        replies={200: Reply(AdminErased, "One dry run or receipt per tenant it reached.")},
        errors=(503,),
        tag="admin",
        description=ERASE_NOTE,
    ),
)
