"""Schemathesis hooks for tests/server/test_contract.py and tests/e2e/test_contract_e2e.py (loaded
by the schemathesis CLI from schemathesis.toml, not by pytest)."""

from __future__ import annotations

import re
from typing import Any

import schemathesis

# Beyond 2^53 a float may not be the integer its text spelled: memspine/integers.py takes an
# integral float for an integer only within ±2^53.
EXACT = 2**53


def whole_numbers_as_integers(value: Any) -> Any:
    """1e17 as 100000000000000000, everywhere in a JSON value: whole numbers beyond 2^53.

    JSON Schema's "integer" is a value (10.0 is one), and memspine takes `10.0` where an
    integer goes (memspine/integers.py), but only within ±2^53, where a float is exactly the
    integer its text spelled; beyond, `1e17` is refused as a float naming the field (docs/api.md,
    Conventions). No schema can say so; this spells those numbers as integers. Every number
    field of the API takes an integer where it takes a float.
    """
    if isinstance(value, float) and value.is_integer() and EXACT < abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers_as_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers_as_integers(v) for v in value]
    return value


@schemathesis.hook
def map_body(_context: Any, body: Any) -> Any:
    """Whole numbers beyond 2^53 in a JSON body as integers."""
    return whole_numbers_as_integers(body)


# Bounds between two fields, which docs/api.md states and JSON Schema cannot (it has no
# comparison of one field with another): a request that breaks one is 400 with this sentence.
# Such a refusal of a generated request is no disagreement with the document; any other is.
ORDERS = (
    ("query", "since", "until", False, "since must not be later than until"),
    ("body", "valid_from", "valid_until", True, "valid_from must be earlier than valid_until"),
)


def _number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# An event of a batch (POST /v1/memory/events) that breaks an order refuses the batch, its
# index first: "events[N]: <sentence>; the batch stored nothing".
IN_BATCH = re.compile(r"^events\[(\d+)\]: (.*); the batch stored nothing\Z")


def broken_order(case: Any, status: int, detail: str) -> bool:
    """Whether a 400 answers a request that puts two ordered fields out of order."""
    if status != 400:
        return False
    batch = IN_BATCH.match(detail)
    for part, low, high, strict, sentence in ORDERS:
        values, said = getattr(case, part, None), detail
        if batch is not None and part == "body" and isinstance(values, dict):
            events, index = values.get("events"), int(batch.group(1))
            if isinstance(events, list) and index < len(events):
                values, said = events[index], batch.group(2)
        if said != sentence or not isinstance(values, dict):
            continue
        lo, hi = _number(values.get(low)), _number(values.get(high))
        if lo is not None and hi is not None and (lo > hi or (strict and lo == hi)):
            return True
    return False


# DELETE /v1/memory/event/{id}?dry_run=true answers 200 and deletes nothing (docs/api.md): the
# stateful phase takes any 2xx DELETE for a deletion, so a later GET answering 200 looks like
# a use after free. The paths of dry runs and of real deletes are kept to tell the two apart.
DRY_RUNS: set[str] = set()
DELETED: set[str] = set()
FLAG_TRUE = ("true", "1")


@schemathesis.hook
def after_call(_context: Any, case: Any, response: Any) -> None:
    """Remember which successful DELETEs of events were dry runs."""
    if case.method.upper() != "DELETE" or not 200 <= response.status_code < 300:
        return
    path = case.formatted_path
    dry = str((case.query or {}).get("dry_run", "false")).lower() in FLAG_TRUE
    (DRY_RUNS if dry else DELETED).add(path)


def only_dry_run(failure: Any) -> bool:
    """Whether a use-after-free failure names a path that was only ever dry-run deleted."""
    if type(failure).__name__ != "UseAfterFree":
        return False
    path = str(failure.free).partition(" ")[2]
    return path in DRY_RUNS and path not in DELETED


@schemathesis.hook
def filter_failure(_context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but the 400s that ordered fields explain and dry runs."""
    if only_dry_run(failure):
        return False
    try:
        detail = str(response.json().get("detail", ""))
    except Exception:  # not JSON: nothing to explain it
        return True
    return not broken_order(case, response.status_code, detail)
