"""Who is calling: issued keys when a control database exists, the tenant id itself in local mode."""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from argon2 import PasswordHasher
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from memspine_admin import keys
from memspine_admin.control import NO_CONTROL_DB, ControlDB
from memspine_admin.verifier import UNAUTHORIZED_DETAIL, KeyVerifier, Principal
from storage.errors import Conflict, NotFound, Unauthorized

LOCAL_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
MAX_TOKEN_CHARS = 512
# How long a "no control database" answer is trusted before the disk is looked at again.
CONTROL_RECHECK_SECS = 1.0
MAX_WARM_KEYS = 10_000
# Verifications in worker threads at once (the verifier runs at most 4 argon2 hashes at once):
# a flood of wrong secrets then waits here instead of holding every thread the store needs.
MAX_VERIFY_THREADS = 4
LOCAL_KEY_ID = "local"


def _unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_DETAIL)


def _bytes(token: str) -> bytes:
    # Any str encodes, even with lone surrogates; a key's ASCII bytes are unchanged.
    return token.encode("utf-8", "surrogatepass")


def _digest(token: str) -> bytes:
    return hashlib.sha256(_bytes(token)).digest()


class Authenticator:
    """Turns a bearer token into a Principal; switches to issued keys once `memspine-admin init` ran.

    A key the verifier has accepted is remembered with the control database's generation at
    that moment, so later requests with it are answered on the event loop (one LMDB read of
    the generation, no thread and no argon2). Any change to tenants or keys moves the
    generation, and the next request with each key is verified again in a thread.
    """

    def __init__(
        self,
        data_dir: Path,
        admin_key: str | None,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """`hasher` and `clock` (µs) go to the control database; tests pass cheap or fake ones."""
        self.data_dir = data_dir
        self.admin_key = admin_key
        self._hasher = hasher
        self._clock = clock
        self._lock = threading.Lock()
        self._control: ControlDB | None = None
        self._verifier: KeyVerifier | None = None
        self._checked_at = -CONTROL_RECHECK_SECS
        self._warm: OrderedDict[bytes, tuple[Principal, int]] = OrderedDict()
        self._verify_limiter: anyio.CapacityLimiter | None = None

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
                control = ControlDB.open(self.data_dir, hasher=self._hasher, clock=self._clock)
                self._verifier = KeyVerifier(control)
                self._control = control
        return self._control

    def admit_tenant(self, tenant_id: str) -> None:
        """With issued keys, only a tenant the control database knows may be opened (401 otherwise)."""
        control = self.control()
        if control is not None and control.get_tenant(tenant_id) is None:
            raise _unauthorized()

    def probe(self, token: str | None) -> Principal | None:
        """The principal if it can be told without blocking, None if the key must be verified.

        Raises Unauthorized for a token that is refused without any I/O: missing, oversized,
        the admin key, not a valid local tenant id, or not a well-formed issued key.
        """
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise _unauthorized()
        if self.admin_key is not None and hmac.compare_digest(
            _bytes(token), _bytes(self.admin_key)
        ):
            raise _unauthorized()  # the admin key is never a tenant
        control = self.control()
        if control is None:
            if not (LOCAL_TENANT.match(token) or UUID.match(token)):
                raise _unauthorized()
            return Principal(tenant_id=token, key_id=LOCAL_KEY_ID, scopes=("read", "write"))
        # A warm digest stands for exactly these bytes, already parsed and verified: look it up
        # before parsing (parsing and its checksum cost several times the hash).
        digest = _digest(token)
        with self._lock:
            warm = self._warm.get(digest)
            if warm is not None:
                self._warm.move_to_end(digest)
        if warm is None:
            if keys.parse_token(token) is None:
                raise _unauthorized()  # junk never reaches a thread, the database or argon2
            return None
        principal, generation = warm
        if generation != control.generation():
            return None
        if principal.expires_at is not None and control.now() >= principal.expires_at:
            self._forget(digest)
            raise _unauthorized()
        return principal

    def verify(self, token: str) -> Principal:
        """Verify an issued key against the control database; blocking (argon2 on a cold key)."""
        control = self.control()
        verifier = self._verifier
        if control is None or verifier is None:
            raise _unauthorized()
        digest = _digest(token)
        # Read before verifying: a change committed meanwhile leaves this entry stale.
        generation = control.generation()
        try:
            principal = verifier.verify(token)
        except Unauthorized:
            self._forget(digest)
            raise
        with self._lock:
            self._warm[digest] = (principal, generation)
            self._warm.move_to_end(digest)
            while len(self._warm) > MAX_WARM_KEYS:
                self._warm.popitem(last=False)
        return principal

    def authenticate(self, token: str | None) -> Principal:
        """The principal behind a tenant token, blocking if needed; one Unauthorized for every failure."""
        principal = self.probe(token)
        if principal is not None:
            return principal
        assert token is not None
        return self.verify(token)

    async def authenticate_async(self, token: str | None) -> Principal:
        """Like authenticate, but verification that may block runs in a worker thread."""
        principal = self.probe(token)
        if principal is not None:
            return principal
        assert token is not None
        if self._verify_limiter is None:  # made here: it belongs to the running event loop
            self._verify_limiter = anyio.CapacityLimiter(MAX_VERIFY_THREADS)
        return await anyio.to_thread.run_sync(self.verify, token, limiter=self._verify_limiter)

    def check_admin(self, token: str | None) -> ControlDB:
        """The control database for an admin request; 404 without an admin key, 401 for a wrong one."""
        if self.admin_key is None:
            raise NotFound("no such route")
        if not hmac.compare_digest(_bytes(token or ""), _bytes(self.admin_key)):
            raise _unauthorized()
        self._checked_at = -CONTROL_RECHECK_SECS  # an admin may just have run init: look again
        control = self.control()
        if control is None:
            raise Conflict(NO_CONTROL_DB)
        return control

    def _forget(self, digest: bytes) -> None:
        with self._lock:
            self._warm.pop(digest, None)

    def close(self) -> None:
        """Close the control database if it was opened."""
        if self._control is not None:
            self._control.close()


def bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The token of an `Authorization: Bearer` header, or None."""
    return bearer_token(connection.headers.get("authorization"))


def bearer_token(header: str | None) -> str | None:
    """The token of an Authorization header value of the Bearer scheme, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def tenant_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Authenticate a tenant request and check the scope the route declares in opt["scope"].

    A route that declares `opt={"scope": None}` takes any valid key (whoami).
    """
    auth: Authenticator = connection.app.state.auth
    principal = await auth.authenticate_async(bearer(connection))
    scope = handler.opt.get("scope", "read")
    if scope is not None:
        principal.require(scope)
    connection.state.principal = principal


async def admin_guard(
    connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler
) -> None:
    """Admin routes take MEMSPINE_ADMIN_KEY, compared in constant time."""
    auth: Authenticator = connection.app.state.auth
    connection.state.control = auth.check_admin(bearer(connection))
