"""Who is calling: issued keys when a control database exists, the tenant id itself in local mode."""

from __future__ import annotations

import hmac
import re
import threading
import time
from pathlib import Path
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from memspine_admin.control import ControlDB
from memspine_admin.verifier import KeyVerifier, Principal
from storage.errors import Conflict, NotFound, Unauthorized

LOCAL_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
UNAUTHORIZED = "invalid or expired api key"
MAX_TOKEN_CHARS = 512
# How long a "no control database" answer is trusted before the disk is looked at again.
CONTROL_RECHECK_SECS = 1.0


class Authenticator:
    """Turns a bearer token into a Principal; switches to issued keys once `memspine-admin init` ran."""

    def __init__(self, data_dir: Path, admin_key: str | None) -> None:
        self.data_dir = data_dir
        self.admin_key = admin_key
        self._lock = threading.Lock()
        self._control: ControlDB | None = None
        self._verifier: KeyVerifier | None = None
        self._checked_at = 0.0

    def control(self) -> ControlDB | None:
        """The control database, opened on first sight; None in local mode."""
        if self._control is not None:
            return self._control
        now = time.monotonic()
        if now - self._checked_at < CONTROL_RECHECK_SECS:
            return None
        with self._lock:
            self._checked_at = now
            if self._control is None and ControlDB.exists(self.data_dir):
                self._control = ControlDB.open(self.data_dir)
                self._verifier = KeyVerifier(self._control)
        return self._control

    def authenticate(self, token: str | None) -> Principal:
        """The principal behind a tenant token; one Unauthorized for every failure."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise Unauthorized(UNAUTHORIZED)
        if self.control() is not None:
            assert self._verifier is not None
            return self._verifier.verify(token)
        if self.admin_key is not None and hmac.compare_digest(token.encode(), self.admin_key.encode()):
            raise Unauthorized(UNAUTHORIZED)  # the admin key is never a tenant
        if not (LOCAL_TENANT.match(token) or UUID.match(token)):
            raise Unauthorized(UNAUTHORIZED)
        return Principal(tenant_id=token, key_id="local", scopes=("read", "write"), expires_at=None)

    def check_admin(self, token: str | None) -> ControlDB:
        """The control database for an admin request; 404 without an admin key, 401 for a wrong one."""
        if self.admin_key is None:
            raise NotFound("no such route")
        given = (token or "").encode()
        if not hmac.compare_digest(given, self.admin_key.encode()):
            raise Unauthorized(UNAUTHORIZED)
        self._checked_at = 0.0  # an admin may just have run init: look again
        control = self.control()
        if control is None:
            raise Conflict("no control database: run memspine-admin init")
        return control

    def close(self) -> None:
        """Close the control database if it was opened."""
        if self._control is not None:
            self._control.close()


def bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The token of an `Authorization: Bearer` header, or None."""
    header = connection.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def tenant_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Authenticate a /v1/memory request and check the scope the route declares in opt["scope"]."""
    auth: Authenticator = connection.app.state.auth
    principal = auth.authenticate(bearer(connection))
    principal.require(handler.opt.get("scope", "read"))
    connection.state.principal = principal


def admin_guard(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    """Admin routes take MEMSPINE_ADMIN_KEY, compared in constant time."""
    auth: Authenticator = connection.app.state.auth
    connection.state.control = auth.check_admin(bearer(connection))
