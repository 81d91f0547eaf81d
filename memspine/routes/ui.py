"""GET /ui: the web console's static files (memspine/ui/), read once, sent with a strict policy.

The console is a page of plain JavaScript modules that calls the same /v1 routes a client does,
with the key its user types; the server only hands out the files. Nothing here runs on the hot
routes (memspine/hot.py passes every GET straight on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler

from memspine.config import Settings
from storage.errors import NotFound

ASSETS = Path(__file__).resolve().parent.parent / "ui"
INDEX = "index.html"
TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
}
# Event texts and properties are customer data and the page renders them as text only; the
# policy makes any markup that slipped through inert anyway: no inline script or style, nothing
# loaded or sent anywhere but this server, no native form submission (a key must never end up
# in a URL), and no framing (the page holds a key: clickjacking).
POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
    "Cache-Control": "no-cache",
}
NO_FILE = "the console has no such file"


def load_assets(root: Path = ASSETS) -> dict[str, tuple[bytes, str]]:
    """Every console file by its name under /ui/, with its media type (a few kilobytes in all)."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), TYPES[path.suffix])
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in TYPES
    }


def routes(settings: Settings) -> list[HTTPRouteHandler]:
    """The console's route, or none when MEMSPINE_UI=0."""
    if not settings.ui:
        return []
    assets = load_assets()

    # The page is HTML and holds a key: it is always sent from here, never from another path.
    @get(["/ui", "/ui/{name:path}"], include_in_schema=False, sync_to_thread=False)
    def console(request: Request[Any, Any, Any]) -> Response[bytes]:
        """The console page at /ui and its files at /ui/NAME."""
        name = str(request.path_params.get("name", ""))
        found = assets.get(name.lstrip("/") or INDEX)
        if found is None:
            raise NotFound(NO_FILE)
        body, media_type = found
        return Response(body, media_type=media_type, headers=HEADERS)

    return [console]
