"""Recall's parameters are declared once, RecallIn (memspine/schemas.py); every door that
takes them is held to it here, so a field added to recall and missed by a door fails: the MCP
tool (its arguments, its JSON schema, or a reason it leaves the field out) and the Python
client (its request builder and the sync and async methods)."""

from __future__ import annotations

import inspect
from typing import Any

import msgspec

from memspine.client import routes
from memspine.client.aio import AsyncMemspine
from memspine.client.sync import Memspine
from memspine.mcp import tools
from memspine.schemas import RecallIn

FIELDS = set(RecallIn.__struct_fields__)


def _declared() -> dict[str, Any]:
    """RecallIn's JSON schema properties (bounds and all)."""
    schema = msgspec.json.schema(RecallIn)
    props: dict[str, Any] = schema["$defs"]["RecallIn"]["properties"]
    return props


def _tool_properties() -> dict[str, Any]:
    props: dict[str, Any] = tools.RECALL.input_schema["properties"]
    return props


def test_the_mcp_tool_offers_each_field_or_says_why_not() -> None:
    offered = set(tools.RecallArgs.__struct_fields__) - tools.RECALL_TOOL_ONLY
    left_out = set(tools.RECALL_LEFT_OUT)
    assert offered | left_out == FIELDS
    assert not offered & left_out
    assert set(_tool_properties()) == offered | tools.RECALL_TOOL_ONLY


def test_the_mcp_tool_has_recalls_defaults_and_bounds() -> None:
    declared = _declared()
    defaults = dict(zip(RecallIn.__struct_fields__, _defaults(RecallIn), strict=True))
    args = dict(zip(tools.RecallArgs.__struct_fields__, _defaults(tools.RecallArgs), strict=True))
    for name, prop in _tool_properties().items():
        if name in tools.RECALL_TOOL_ONLY:
            continue
        if name != "text":
            assert args[name] == defaults[name], name
        if "default" in prop:
            assert prop["default"] == defaults[name], name
        for bound in ("minimum", "maximum"):
            if bound in prop:
                assert _bound(declared[name], bound) == prop[bound], (name, bound)


def test_the_clients_signatures_take_every_field() -> None:
    for method in (routes.recall, Memspine.recall, AsyncMemspine.recall):
        names = set(inspect.signature(method).parameters) - {"self"}
        assert names == FIELDS, method.__qualname__


def test_the_client_sends_each_field_under_its_name() -> None:
    values: dict[str, Any] = {
        "text": "x",
        "embedding": [0.5],
        "embedding_model": "m",
        "kind": "fact",
        "k": 3,
        "hops": 1,
        "filter": {"a": 1},
        "current": False,
        "as_of": 5,
        "explain": True,
        "wait_for_vectors": True,
    }
    assert set(values) == FIELDS
    call = routes.recall(**values)
    body = msgspec.json.decode(call.body or b"{}")
    assert set(body) == FIELDS
    msgspec.convert(body, RecallIn)  # the server's Struct takes it


def _defaults(struct: type[msgspec.Struct]) -> list[Any]:
    return [
        None if f.default is msgspec.NODEFAULT else f.default
        for f in msgspec.structs.fields(struct)
    ]


def _bound(prop: dict[str, Any], bound: str) -> Any:
    """A bound of a RecallIn field's schema (an optional field's is under anyOf)."""
    if bound in prop:
        return prop[bound]
    return next(p[bound] for p in prop.get("anyOf", []) if bound in p)
