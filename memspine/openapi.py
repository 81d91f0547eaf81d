"""/schema/openapi.json, built from the operations' declarations (memspine/pipeline.py), and
the /schema viewer, whose script and styles come from the swagger-ui-py package: no CDN.

The document is made from the same Operations the pipeline checks requests against: paths,
parameters, bodies, answers and security cannot say one thing while the server does another.
Every status an operation can answer is listed: its own, the ones its kind of caller can
meet (keys, the admin key), and the ones every request can meet at the edge
(memspine/edge.py, memspine/connguard.py).
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath

from memspine import __version__
from memspine.examples import EXAMPLES
from memspine.pipeline import ADMIN, ANY_KEY, PROP_PREFIX, PUBLIC, READ, WRITE, Operation
from memspine.schemas import TIME_CHECK_HEADER
from storage.errors import CODES, NotFound
from storage.log import layout as enc
from storage.model import FLOAT32_MAX

REF = "#/components/schemas/{name}"
ERROR_REF = {"$ref": "#/components/schemas/Error"}
JSON = "application/json"
PATH_PARAM = re.compile(r"\{(\w+):\w+\}")

# Statuses by who may answer them: every request (the edge and the connection guard), a
# request with a tenant key, with the admin key, with a body.
EDGE_ERRORS = {
    400: "Malformed request: a bad field or parameter, an unknown or repeated parameter.",
    403: "A foreign Origin or Host (docs/api.md, the edge); for keys, a missing scope, or "
    "(quota_exceeded, on writes) a tenant at its max_events, max_bytes or max_memory.",
    408: "The headers or the body did not arrive in time; the connection is closed.",
    431: "Request line and headers over 64 KiB; the connection is closed.",
    500: "A bug: the server log has the traceback, the answer says nothing of it.",
    503: "Busy: tenant slots, connection caps or a full disk (Retry-After).",
}
KEY_ERRORS = {
    401: "No token, or one this server does not accept (one message for every cause).",
    421: "In a cluster: this node does not hold the key's tenant (send it to the proxy).",
    429: "Too many failed attempts with this key id (it backs off), or more requests than the "
    "key's requests_per_minute (Retry-After).",
}
ADMIN_ERRORS = {
    401: "Not the admin key.",
    404: "The server has no MEMSPINE_ADMIN_KEY (no such route), or no such tenant or key.",
    409: "No control database yet (memspine-admin init), a tenant name or id in use, or "
    "(legal_hold) a tenant under a legal hold.",
}
BODY_ERRORS = {413: "The body is larger than MEMSPINE_MAX_BODY_BYTES."}
OWN_ERRORS = {
    404: "No such event (unknown, deleted, or another tenant's).",
    409: "The same Idempotency-Key is still being processed (Retry-After: 1), or (legal_hold, "
    "on a delete) a legal hold keeps the event.",
    413: BODY_ERRORS[413],
    422: "The Idempotency-Key with another body, or an embedding of another length or model.",
    503: EDGE_ERRORS[503],
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "string"}}}
ANSWER_HEADERS = {
    "Idempotent-Replayed": {
        "description": "true: this is the first answer to an earlier request with this key.",
        "required": True,
        "schema": {"type": "string", "enum": ["true"]},
    },
}
ERROR_CODES = list(CODES)  # the one table: storage/errors.py
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error: a code and a sentence saying what to change.",
    "properties": {"error": {"type": "string", "enum": ERROR_CODES}, "detail": {"type": "string"}},
    "required": ["error", "detail"],
    "additionalProperties": False,
}
DESCRIPTION = (
    "A multi-tenant memory server for AI agents. Every /v1/memory route and /v1/whoami take "
    "`Authorization: Bearer <key>`; the tenant comes from the key. Errors are always "
    '`{"error": code, "detail": sentence}`. Times are integers in microseconds since the Unix '
    "epoch; a time a client sends must fall from 2000 through 9999 unless the request carries "
    f"the header `{TIME_CHECK_HEADER}: off`, which holds it only to 0-2^62 (OpenAPI cannot tie "
    "a header to a body's bounds, so the document states the checked range). "
    "The full contract is docs/api.md."
)


# What a client (and a stateful fuzzer) can do next with the id an append answers.
EVENT_LINKS = {
    name: {"operationId": name, "parameters": {"event_id": "$response.body#/event_id"}}
    for name in ("get_event", "delete_event")
}


def _path(template: str) -> str:
    """Litestar's /x/{id:str} as OpenAPI's /x/{id}."""
    return PATH_PARAM.sub(r"{\1}", template)


def _errors(op: Operation) -> dict[int, str]:
    errors = dict(EDGE_ERRORS)
    if op.scope == ADMIN:
        errors |= ADMIN_ERRORS
    elif op.scope in (READ, WRITE, ANY_KEY):
        errors |= KEY_ERRORS
    if op.body is not None:
        errors |= BODY_ERRORS
    for status in op.errors:
        errors.setdefault(status, OWN_ERRORS.get(status, ""))
    return errors


def _security(op: Operation) -> list[dict[str, list[str]]]:
    if op.scope == PUBLIC:
        return []
    return [{"adminKey": []}] if op.scope == ADMIN else [{"tenantKey": []}]


class _Schemas:
    """Component schemas from msgspec for every type the operations name."""

    def __init__(self, operations: tuple[Operation, ...], embedding_dim: int) -> None:
        types: list[Any] = [None]  # Reply(None): a body-less answer
        for op in operations:
            if op.body is not None:
                types.append(op.body)
            for reply in op.replies.values():
                types += reply.type if isinstance(reply.type, tuple) else [reply.type]
        refs, self.components = msgspec.json.schema_components(types, ref_template=REF)
        self.refs = dict(zip(map(id, types), refs, strict=True))
        # Each value within float32's range (storage/model.py check_embedding refuses 1e300).
        values = {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
        vector = {"minItems": embedding_dim, "maxItems": embedding_dim, "items": values}
        for name in ("EventIn", "RecallIn", "BatchItem"):
            self.components[name]["properties"]["embedding"]["anyOf"][0].update(vector)
        recall = self.components["RecallIn"]
        # "text, an embedding, or both": a schema can say that one of them must be there.
        recall["anyOf"] = [
            {"required": ["text"], "properties": {"text": {"type": "string", "minLength": 1}}},
            {"required": ["embedding"], "properties": {"embedding": {"type": "array"}}},
        ]
        self.components["Error"] = ERROR_SCHEMA

    def of(self, type_: Any) -> dict[str, Any]:
        """The schema of a type, or oneOf those of a tuple of types."""
        if isinstance(type_, tuple):
            return {"oneOf": [self.of(t) for t in type_]}
        schema: dict[str, Any] = self.refs[id(type_)]
        return schema


# Path parameters by name: event ids parse as any UUID (pipeline.event_id), tenant ids are
# canonical lowercase UUIDv4 (memspine_admin/records.is_tenant_id), key ids any text.
PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "event_id": {"type": "string", "format": "uuid"},
    "tenant_id": {
        "type": "string",
        "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
    },
    "key_id": {"type": "string", "minLength": 1},
    # storage/model.py's check_subject; "/" cannot travel in a path segment
    "subject": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[ -.0-~]+$"},
    "receipt_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
    "hold_id": {"type": "string", "minLength": 1},
}


def _parameters(op: Operation) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": PATH_SCHEMAS[name]}
        for name in PATH_PARAM.findall(op.path)
    ]
    for q in op.query:
        schema = {"type": "string", "minLength": 1} | q.schema
        params.append(
            {"name": q.name, "in": "query", "schema": schema, "description": q.description}
        )
    if op.props:
        # OpenAPI cannot name a family of parameters; an exploded form object can: each key is
        # sent as its own parameter, so {"prop.topic": "billing"} is ?prop.topic=billing.
        name = (
            f"^{re.escape(PROP_PREFIX)}[A-Za-z][A-Za-z0-9_]{{0,{enc.MAX_FILTER_NAME_BYTES - 1}}}$"
        )
        params.append(
            {
                "name": "prop",
                "in": "query",
                "style": "form",
                "explode": True,
                "description": "prop.NAME=VALUE: only events whose filterable property NAME "
                "equals VALUE, as a string and, if it reads as one, as a JSON number or boolean.",
                "schema": {
                    "type": "object",
                    "propertyNames": {"pattern": name},
                    "additionalProperties": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": enc.MAX_FILTER_STRING_BYTES,
                    },
                },
            }
        )
    for h in op.headers:
        params.append(
            {"name": h.name, "in": "header", "schema": h.schema, "description": h.description}
        )
    return params


def _operation(op: Operation, schemas: _Schemas) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, reply in sorted(op.replies.items()):
        answer: dict[str, Any] = {"description": reply.description}
        if reply.type is not None or reply.media_type != JSON:
            answer["content"] = {reply.media_type: {"schema": schemas.of(reply.type)}}
        if reply.headers:
            answer["headers"] = {h: ANSWER_HEADERS[h] for h in reply.headers}
        if op.name == "append_event":
            answer["links"] = EVENT_LINKS
        responses[str(status)] = answer
    for status, why in sorted(_errors(op).items()):
        error: dict[str, Any] = {"description": why, "content": {JSON: {"schema": ERROR_REF}}}
        if status in (409, 429, 503):
            error["headers"] = RETRY_AFTER
        responses[str(status)] = error
    out: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "tags": [op.tag],
        "security": _security(op),
        "responses": responses,
    }
    if op.description:
        out["description"] = op.description
    params = _parameters(op)
    if params:
        out["parameters"] = params
    if op.body is not None:
        media: dict[str, Any] = {"schema": schemas.of(op.body)}
        if op.name in EXAMPLES:
            media["example"] = EXAMPLES[op.name]
        out["requestBody"] = {"required": True, "content": {JSON: media}}
    return out


JSON_RPC = {
    "type": "object",
    "description": "A JSON-RPC 2.0 message of the Model Context Protocol.",
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["integer", "string"]},
        "method": {"type": "string", "examples": ["initialize", "tools/list", "tools/call"]},
        "params": {"type": "object"},
    },
    "required": ["jsonrpc"],
}
MCP_ERRORS = {
    str(s): {"description": why, "content": {JSON: {"schema": ERROR_REF}}}
    for s, why in sorted((EDGE_ERRORS | KEY_ERRORS | BODY_ERRORS).items())
}
MCP_ERRORS["401"]["headers"] = {
    "WWW-Authenticate": {
        "required": True,
        "schema": {"type": "string", "const": 'Bearer realm="memspine"'},
    }
}
MCP_ERRORS["400"] = {
    "description": "The MCP SDK refuses the message: a JSON-RPC error object, or (a wrong "
    "Content-Type) a line of text.",
    "content": {JSON: {"schema": JSON_RPC}, "text/plain": {"schema": {"type": "string"}}},
}
MCP_ERRORS["406"] = {"description": "Accept lists neither application/json nor text/event-stream."}
MCP_PATH = {
    "post": {
        "operationId": "mcp",
        "summary": "MCP over Streamable HTTP, stateless, JSON answers (docs/mcp.md)",
        "description": "JSON-RPC 2.0 messages of the Model Context Protocol, sent with "
        "`Content-Type: application/json` and `Accept: application/json, text/event-stream`. "
        "The key's scopes decide which memory tools are listed and may be called. OpenAPI "
        "describes the transport only: the methods are MCP's, the tools and their arguments "
        "are in tools/list.",
        "tags": ["mcp"],
        "security": [{"tenantKey": []}],
        "requestBody": {"required": True, "content": {JSON: {"schema": JSON_RPC}}},
        "responses": {
            "200": {"description": "The JSON-RPC answer.", "content": {JSON: {"schema": JSON_RPC}}},
            "202": {"description": "A notification or response, accepted; no body."},
            **MCP_ERRORS,
        },
    },
    "get": {
        "operationId": "mcp_get",
        "summary": "Refused: the endpoint is stateless, there is no event stream to GET",
        "tags": ["mcp"],
        "security": [],
        "responses": {
            "405": {"description": "POST only.", "content": {JSON: {"schema": ERROR_REF}}}
        },
    },
    "delete": {
        "operationId": "mcp_delete",
        "summary": "Refused: the endpoint is stateless, there is no session to DELETE",
        "tags": ["mcp"],
        "security": [],
        "responses": {
            "405": {"description": "POST only.", "content": {JSON: {"schema": ERROR_REF}}}
        },
    },
    "options": {
        "operationId": "mcp_preflight",
        "summary": "A browser's CORS preflight (granted to allowed origins only)",
        "tags": ["mcp"],
        "security": [],
        "responses": {"204": {"description": "Allowed methods and headers."}},
    },
}


def _static(operation_id: str, summary: str, missing: str) -> dict[str, Any]:
    """A GET of a file the server hands out as it is (the console's, memspine/routes/ui.py)."""
    errors = {s: why for s, why in EDGE_ERRORS.items() if s != 400} | {404: missing}
    files = {"text/html", "text/css", "text/javascript", "image/svg+xml"}
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            "tags": ["console"],
            "security": [],
            "responses": {
                "200": {
                    "description": "The file.",
                    "content": {t: {"schema": {"type": "string"}} for t in sorted(files)},
                },
                **{
                    str(s): {"description": why, "content": {JSON: {"schema": ERROR_REF}}}
                    for s, why in sorted(errors.items())
                },
            },
        }
    }


UI_PATHS = {
    "/ui": _static("console", "The web console's page (docs/console.md)", "MEMSPINE_UI=0."),
    "/ui/{name}": _static("console_file", "One of the console's files", "No such file."),
}
UI_PATHS["/ui/{name}"]["get"]["parameters"] = [
    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
]


def document(
    operations: tuple[Operation, ...], embedding_dim: int, *, ui: bool = True
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of these operations, of /mcp and (when served) of /ui."""
    schemas = _Schemas(operations, embedding_dim)
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(_path(op.path), {})[op.method.lower()] = _operation(op, schemas)
    paths["/mcp"] = MCP_PATH
    if ui:
        paths |= UI_PATHS
    return {
        "openapi": "3.1.0",
        "info": {"title": "memspine", "version": __version__, "description": DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "securitySchemes": {
                "tenantKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An issued key (smk_live_...), or in local mode the tenant id.",
                },
                "adminKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "MEMSPINE_ADMIN_KEY; never a tenant key.",
                },
            },
        },
    }


# The viewer: Swagger UI from the swagger-ui-py package, served here, started by a script of ours.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}
START = (
    'window.onload = () => { window.ui = SwaggerUIBundle({url: "/schema/openapi.json", '
    'dom_id: "#swagger-ui", deepLinking: true, validatorUrl: null}); };'
)
VIEWER = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>memspine API</title>
<link rel="icon" type="image/png" href="/schema/assets/favicon-32x32.png">
<link rel="stylesheet" href="/schema/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/schema/assets/swagger-ui-bundle.js"></script>
<script src="/schema/assets/start.js"></script>
</body>
</html>
"""


def _assets_dir() -> Path:
    """swagger-ui-py's static files, found without importing the package (it loads jinja2)."""
    spec = importlib.util.find_spec("swagger_ui")
    assert spec is not None and spec.submodule_search_locations is not None
    return Path(next(iter(spec.submodule_search_locations))) / "static"


@cache
def _asset(name: str) -> bytes:
    return (_assets_dir() / name).read_bytes()


def schema_routes(
    operations: tuple[Operation, ...], embedding_dim: int, *, ui: bool = True
) -> list[HTTPRouteHandler]:
    """GET /schema (the viewer), /schema/openapi.json and the viewer's assets."""
    body = msgspec.json.encode(document(operations, embedding_dim, ui=ui))

    @get("/schema/openapi.json", include_in_schema=False)
    async def openapi_json() -> Response[bytes]:
        return Response(body, media_type=JSON)

    @get(["/schema", "/schema/swagger"], include_in_schema=False)
    async def viewer() -> Response[str]:
        return Response(VIEWER, media_type="text/html")

    @get("/schema/assets/{name:str}", include_in_schema=False)
    async def asset(name: FromPath[str]) -> Response[bytes]:
        if name == "start.js":
            return Response(START.encode(), media_type="text/javascript")
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound("no such route")
        return Response(_asset(name), media_type=media_type)

    return [openapi_json, viewer, asset]
