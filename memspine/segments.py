"""Path segments with an encoded slash: a data subject's id may hold '/', sent as %2F
(docs/api.md, "Data subjects in a path"). ASGI servers decode the path before routing, so
`/v1/memory/subjects/a%2Fb/export` would reach the router as four segments and match no route;
the Edge keeps such a segment encoded for routing, and the route's handler decodes each path
parameter from the raw path, once."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from storage.errors import InvalidRequest

# Set in the ASGI scope when the path was rewritten: its parameters are read from raw_path.
ENCODED_SLASHES = "memspine.encoded_slashes"
SUBJECT_ROUTES = ("/v1/memory/subjects/", "/v1/admin/subjects/")
SUBJECT_ROUTES_RAW = tuple(p.encode() for p in SUBJECT_ROUTES)
SUBJECT_ACTIONS = frozenset({"erase", "export"})
BARE_SLASH = (
    "a subject id holding '/' goes into the path percent-encoded, '/' as %2F "
    "(/v1/memory/subjects/a%2Fb/export)"
)


def refuse_bare_slash(path: str) -> None:
    """400 for a subject route whose subject came with a bare '/' (more segments than the
    route has): said plainly, where the router would answer only 'no such route'."""
    for prefix in SUBJECT_ROUTES:
        if path.startswith(prefix):
            parts = path[len(prefix) :].split("/")
            if len(parts) > 2 and parts[-1] in SUBJECT_ACTIONS:
                raise InvalidRequest(BARE_SLASH)


def keep_encoded_slashes(scope: dict[str, Any]) -> None:
    """Route a subject route's raw path whose segments hold %2F with those segments left
    encoded (each stays one segment); other paths are left as the server decoded them."""
    raw: bytes | None = scope.get("raw_path")
    if not raw or b"%2f" not in raw.lower():
        return
    # Only the subject routes: no other path parameter may hold '/', and ids of tenants or
    # events never reach their handlers with one (a 404 as before).
    if not raw.startswith(SUBJECT_ROUTES_RAW):
        return
    segments = raw.decode("latin-1").split("/")
    scope["path"] = "/".join(s if "%2f" in s.lower() else unquote(s) for s in segments)
    scope[ENCODED_SLASHES] = True


def path_params(template: str, scope: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The route's path parameters, each decoded from its raw segment when the Edge kept a
    segment encoded (keep_encoded_slashes); else the router's, as they are."""
    if not scope.get(ENCODED_SLASHES):
        return params
    raw = scope["raw_path"].decode("latin-1").split("/")
    out = dict(params)
    for i, part in enumerate(template.split("/")):
        if part.startswith("{") and part.endswith("}") and i < len(raw):
            name = part[1:-1].split(":")[0]
            if isinstance(out.get(name), str):
                out[name] = unquote(raw[i])
    return out
