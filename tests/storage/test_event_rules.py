"""The event's rules (storage/model.py) are one set for every door: the API's append body, a
batch's event, the MCP tools (through the same operation) and an import's event line refuse the
same values with the same sentence."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memspine.batch import BatchIn, to_new_events
from memspine.schemas import EventIn, to_new_event
from storage import model
from storage.errors import InvalidRequest
from storage.model import FIELD_RULES, check_event, new_event
from storage.transfer import format as fmt
from storage.transfer.landing import import_tenant

T0 = 1_791_208_939_000_000
ID = "00000000-0000-4000-8000-000000000001"

# (field, value, words of the sentence) for each rule; every field of FIELD_RULES has one.
BAD: list[tuple[str, Any, str]] = [
    ("kind", "k" * 65, "kind must be 1 to 64 bytes of printable text"),
    ("kind", "turn\x07", "kind must be 1 to 64 bytes of printable text"),
    ("text", "x" * 100_001, "text may be at most 100000 characters"),
    ("embedding", [0.5, 1e300], "embedding[1] is 1e+300, beyond what a float32 vector holds"),
    ("embedding", [-3.5e38], "embedding[0] is -3.5e+38, beyond what a float32 vector holds"),
    ("embedding", [0.5] * 4097, "embedding may hold at most 4096 values"),
    ("embedding", [], "embedding must not be empty"),
    ("embedding_model", "m" * 201, "embedding_model must be 1 to 200 characters"),
    ("properties_raw", b"[1]", "properties must be a JSON object"),
    ("properties_raw", b'{"a": 1e400}', "properties hold a number no JSON reader can hold"),
    ("properties_raw", b'{"a":' * 33 + b"1" + b"}" * 33, "nest at most 32 levels"),
    ("ts", 2**62, "ts must be microseconds since the Unix epoch, from 0 to 2^62"),
    ("valid_from", -1, "valid_from must be microseconds since the Unix epoch"),
    ("valid_until", 2**62, "valid_until must be microseconds since the Unix epoch"),
    ("supersedes", ["x"] * 1001, "supersedes may name at most 1000 events"),
]


def test_every_rule_of_the_table_has_a_case() -> None:
    assert set(FIELD_RULES) == {field for field, _, _ in BAD}
    assert set(FIELD_RULES) <= set(model.StoredEvent.__struct_fields__)
    assert set(FIELD_RULES) <= set(model.NewEvent.__struct_fields__)


@pytest.mark.parametrize(("field", "value", "words"), BAD)
def test_storage_refuses_each_bad_value(field: str, value: Any, words: str) -> None:
    with pytest.raises(InvalidRequest, match=_re(words)):
        check_event({"kind": "turn", "ts": T0, field: value})


def test_a_good_event_passes_and_its_sources_come_from_its_properties() -> None:
    raw = json.dumps({"source_event_ids": [ID], "topic": "x"}).encode()
    ev = new_event(kind="fact", ts=T0, text="hi", embedding=[0.5, -3e38], properties_raw=raw)
    assert ev.source_ids == (ID,) and ev.properties_raw == raw
    with pytest.raises(InvalidRequest, match=r"properties\.source_event_ids must be a list"):
        new_event(kind="fact", ts=T0, properties_raw=b'{"source_event_ids": "x"}')
    with pytest.raises(InvalidRequest, match="valid_from must be earlier than valid_until"):
        new_event(kind="fact", ts=T0, valid_from=T0, valid_until=T0)


def _body(field: str, value: Any) -> dict[str, Any]:
    """The append body that carries `value` in `field` (properties as JSON)."""
    if field == "properties_raw":
        return {"kind": "turn", "properties": msgspec.Raw(value)}
    if field == "supersedes":
        return {"kind": "turn", "supersedes": value}
    return {"kind": "turn", field: value}


API_CASES = [c for c in BAD if c[0] not in ("ts", "valid_from", "valid_until")]


@pytest.mark.parametrize(("field", "value", "words"), API_CASES)
def test_the_api_and_a_batch_refuse_what_storage_refuses(
    field: str, value: Any, words: str
) -> None:
    body = msgspec.json.encode(_body(field, value))
    event = msgspec.json.decode(body, type=EventIn)
    with pytest.raises(InvalidRequest, match=_re(words)):
        to_new_event(event, tenant_id="t", idempotency_key=None)
    batch = msgspec.json.decode(b'{"events": [' + body + b"]}", type=BatchIn)
    with pytest.raises(InvalidRequest, match=r"events\[0\]: .*" + _re(words)):
        to_new_events(batch, tenant_id="t", idempotency_key=None)


IMPORT_CASES = [c for c in BAD if c[0] not in ("embedding", "supersedes")] + [
    ("embedding", [1e300], "embedding[0] is 1e+300"),
    ("kind", "k" * 255, "kind must be 1 to 64 bytes"),
    ("ts", -1, "ts must be microseconds since the Unix epoch"),
]


@pytest.mark.parametrize(("field", "value", "words"), IMPORT_CASES)
def test_an_import_refuses_what_storage_refuses(
    tmp_path: Path, field: str, value: Any, words: str
) -> None:
    dim = len(value) if field == "embedding" else 4
    head = fmt.Header(
        format=fmt.FORMAT,
        version=fmt.FORMAT_VERSION,
        tenant_id="x",
        embedding_dim=dim,
        embedding_model=None,
        exported_at=0,
        events=1,
    )
    line: dict[str, Any] = {"type": "event", "event_id": ID, "kind": "k", "ts": 1}
    if field == "properties_raw":
        line["properties"] = msgspec.Raw(value)
    else:
        line[field] = value
    raw = fmt.header_line(head) + msgspec.json.encode(line) + b"\n"
    with pytest.raises(InvalidRequest, match="line 2: .*" + _re(words)):
        import_tenant(tmp_path / "data", "x", io.BytesIO(raw))


def test_an_import_header_with_a_longer_dimension_than_any_tenant_is_refused(
    tmp_path: Path,
) -> None:
    head = fmt.Header(
        format=fmt.FORMAT,
        version=fmt.FORMAT_VERSION,
        tenant_id="x",
        embedding_dim=65536,
        embedding_model=None,
        exported_at=0,
        events=0,
    )
    with pytest.raises(InvalidRequest, match="embedding_dim must be from 1 to 4096"):
        import_tenant(tmp_path / "data", "x", io.BytesIO(fmt.header_line(head)))


def _re(words: str) -> str:
    import re

    return re.escape(words)
