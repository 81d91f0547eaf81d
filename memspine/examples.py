"""An example body for each operation that takes one, by operation name: the OpenAPI document
gives it as the body's `example` (memspine/openapi.py), which Swagger UI at /schema prefills,
so "Try it out" sends a body the server takes rather than one of nulls.
tests/server/test_examples.py sends each and checks that it is taken."""

from __future__ import annotations

from typing import Any

EXAMPLES: dict[str, dict[str, Any]] = {
    "append_event": {
        "kind": "fact",
        "text": "Billing cutover planned for 2026-10-10",
        "properties": {"topic": "cutover_date"},
    },
    "append_events": {
        "events": [
            {
                "kind": "turn",
                "text": "Lena: the billing cutover is planned for Saturday 10 October",
            },
            {
                "kind": "fact",
                "text": "Billing cutover planned for 2026-10-10",
                "properties": {"topic": "cutover_date", "source_event_ids": ["$0"]},
            },
        ]
    },
    "recall": {"text": "when is the billing cutover", "k": 5},
    "cypher": {
        "query": "MATCH (e:Event) RETURN e.kind AS kind, count(*) AS n ORDER BY n DESC LIMIT 10"
    },
    "create_tenant": {"name": "acme"},
    "set_tenant_limits": {"max_events": 100000, "max_bytes": 1073741824},
    "create_key": {
        "tenant_id": "0b5a8a3e-4f4e-4c57-9d4b-8f1e2f3a4b5c",
        "name": "agent",
        "scopes": ["read", "write"],
    },
    "place_hold": {"reason": "litigation hold, case 2026-114"},
    "erase_subject": {"dry_run": True, "identifiers": ["Ann Lee", "ann@example.com"]},
    "erase_subject_everywhere": {"dry_run": True, "identifiers": ["ann@example.com"]},
    "move_pull": {"after": 0},
    "move_take_reads": {"source": "node-a"},
}
