"""Retention windows and legal holds as admins send them: checked here once for both control
planes (memspine_admin/control.py, control_pg.py), the admin API and the CLI."""

from __future__ import annotations

import difflib
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping

from memspine_admin.records import HoldRecord
from storage.errors import InvalidRequest

ANY_KIND = "*"  # storage/read/retention.py: the window of every kind not named
MAX_KINDS = 64
MAX_DAYS = 36_500  # a hundred years; longer is "keep", which is no window at all
MAX_KIND_BYTES = 64  # memspine/schemas.py's bound on a kind
MAX_REASON_BYTES = 1000
MAX_SUBJECT_BYTES = 128
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]+\Z")  # memspine/schemas.py's rule for a kind
HOLD_PREFIX = "hold_"


def check_kind_name(kind: object) -> str:
    """A kind a window names: "*" or 1-64 bytes of printable text."""
    if not isinstance(kind, str) or not (
        kind == ANY_KIND or (0 < len(kind.encode()) <= MAX_KIND_BYTES and _PRINTABLE.match(kind))
    ):
        shown = repr(kind)[:40]
        raise InvalidRequest(
            f"retention: {shown} is not a kind (1 to {MAX_KIND_BYTES} bytes of printable text, "
            f'or "*" for every kind not named)'
        )
    return kind


def check_days(kind: str, days: object) -> int | None:
    """A window in whole days from 1 to MAX_DAYS, or None to remove the kind's window."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidRequest(
            f"retention of {kind!r} must be a whole number of days from 1 to {MAX_DAYS}, "
            "or null to remove it"
        )
    return days


def merge_retention(
    current: Mapping[str, int] | None, changes: Mapping[str, object] | None
) -> dict[str, int] | None:
    """The windows after a change (a kind given null loses its window, one not given keeps
    it; changes None removes them all); None when none is left. InvalidRequest for a bad kind
    or days, or more than MAX_KINDS."""
    if changes is None:
        return None
    if not isinstance(changes, Mapping):
        raise InvalidRequest("retention must be an object of kind -> days")
    merged = dict(current or {})
    for kind, days in changes.items():
        checked = check_days(check_kind_name(kind), days)
        if checked is None:
            merged.pop(kind, None)
        else:
            merged[kind] = checked
    if len(merged) > MAX_KINDS:
        raise InvalidRequest(
            f'retention may name at most {MAX_KINDS} kinds ("*" included); '
            f"this change leaves {len(merged)}"
        )
    return merged or None


def typo_warnings(named: Iterable[str], known: Iterable[str]) -> list[str]:
    """A sentence for each kind named that the tenant has no event of, but is close to one it
    has (a typo would leave that kind without the window meant for it)."""
    known = list(known)
    warnings = []
    for kind in named:
        if kind == ANY_KIND or kind in known:
            continue
        close = difflib.get_close_matches(kind, known, n=1, cutoff=0.75)
        if close:
            warnings.append(
                f"retention: the tenant has no event of kind {kind!r}, but has {close[0]!r}: "
                f'{close[0]!r} keeps the window of "*" (if any) unless it is named'
            )
    return warnings


def check_reason(reason: object) -> str:
    """A hold's reason: 1-1000 bytes, no control characters but newlines."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("reason must be a non-empty string (why the hold is placed)")
    if len(reason.encode()) > MAX_REASON_BYTES:
        raise InvalidRequest(f"reason must be at most {MAX_REASON_BYTES} bytes")
    if any(unicodedata.category(ch) == "Cc" and ch != "\n" for ch in reason):
        raise InvalidRequest("reason must not contain control characters")
    return reason


def check_subject(subject: object) -> str | None:
    """A hold's subject: None (the whole tenant) or 1-128 bytes of printable text."""
    if subject is None:
        return None
    if (
        not isinstance(subject, str)
        or not 0 < len(subject.encode()) <= MAX_SUBJECT_BYTES
        or not _PRINTABLE.match(subject)
    ):
        raise InvalidRequest(f"subject must be 1 to {MAX_SUBJECT_BYTES} bytes of printable text")
    return subject


def new_hold(
    tenant_id: str, reason: object, subject: object, *, actor: str, now: int
) -> HoldRecord:
    """A new hold, its reason and subject checked, with a fresh id."""
    return HoldRecord(
        hold_id=HOLD_PREFIX + secrets.token_hex(10),
        tenant_id=tenant_id,
        reason=check_reason(reason),
        subject=check_subject(subject),
        placed_at=now,
        placed_by=actor,
    )


def is_hold_id(value: object) -> bool:
    """Whether value has the form of a hold id (hold_ and 20 lower-case hex digits)."""
    return (
        isinstance(value, str)
        and value.startswith(HOLD_PREFIX)
        and len(value) == len(HOLD_PREFIX) + 20
        and all(c in "0123456789abcdef" for c in value[len(HOLD_PREFIX) :])
    )


def retention_audit(changes: Mapping[str, object] | None) -> dict[str, object]:
    """What the audit log keeps of a change of windows: the windows sent, or {"all": None}
    when every window was removed at once."""
    return {"all": None} if changes is None else dict(changes)


def hold_audit(hold: HoldRecord) -> dict[str, object]:
    """What the audit log keeps of a hold: its id, reason and whether it names a subject."""
    return {"hold_id": hold.hold_id, "reason": hold.reason, "subject": hold.subject}
