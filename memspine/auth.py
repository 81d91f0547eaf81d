"""Who is calling: issued keys when a control database exists, the tenant id itself in local mode."""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import anyio
import anyio.to_thread
from argon2 import PasswordHasher

from memspine.cluster import NodeGate
from memspine.config import Settings
from memspine.shares import FairShares
from memspine.verifier import (
    UNAUTHORIZED_DETAIL,
    KeyVerifier,
    Principal,
    Refused,
    token_digest,
)
from memspine_admin import keys
from memspine_admin.backoff import FREE_FAILURES, MAX_BACKOFF_SECS, Backoff
from memspine_admin.control import NO_CONTROL_DB
from memspine_admin.placement import NodeFigures
from memspine_admin.plane import ControlPlane, control_exists, open_control
from memspine_admin.records import LOCAL_TENANT, UUID
from storage.errors import Conflict, NotFound, TooManyRequests, Unauthorized

LOCAL_TOKEN_DETAIL = (
    "in local mode the bearer token is the tenant id: 1 to 64 characters from A-Z, a-z, 0-9, "
    "'_' and '-', starting with a letter or a digit, or a UUID"
)
MAX_TOKEN_CHARS = 512
# How long a "no control database" answer is trusted before the disk is looked at again.
CONTROL_RECHECK_SECS = 1.0
LOCAL_KEY_ID = "local"
HASH_SLOTS = 4


class AuthLimits(NamedTuple):
    """How much argon2 work the server does at once, and how failed attempts back off."""

    # argon2 verifications at once (64 MiB each with the default profile); the keys of one
    # tenant (and dummy verifications together) get at most half, so others always find one.
    hash_slots: int = HASH_SLOTS
    free_failures: int = FREE_FAILURES  # failed attempts in a row per key id before back-off
    max_backoff_secs: float = MAX_BACKOFF_SECS

    @classmethod
    def of(cls, settings: Settings) -> AuthLimits:
        """The limits the server's settings ask for (MEMSPINE_AUTH_*)."""
        return cls(
            settings.auth_hash_slots, settings.auth_free_failures, settings.auth_max_backoff_secs
        )

    @property
    def per_tenant(self) -> int:
        """argon2 slots one tenant may hold at once."""
        return max(1, self.hash_slots // 2)


def _unauthorized() -> Unauthorized:
    return Unauthorized(UNAUTHORIZED_DETAIL)


def _bytes(token: str) -> bytes:
    # Any str encodes, even with lone surrogates; a key's ASCII bytes are unchanged.
    return token.encode("utf-8", "surrogatepass")


class _Cold(NamedTuple):
    """A well-formed issued key that this server must verify (argon2) before it is trusted."""

    parsed: keys.ParsedKey
    digest: bytes


class Authenticator:
    """Turns a bearer token into a Principal; switches to issued keys once `memspine-admin init` ran.

    A key the verifier has accepted is remembered with the control database's generation at
    that moment, so later requests with it are answered on the event loop (one LMDB read of
    the generation; one of the key's row after a change to tenants or keys), never behind
    argon2 work. Any other well-formed key waits for a fair share of the argon2 slots (per
    tenant: memspine/shares.py), then is verified in a thread.
    """

    def __init__(
        self,
        data_dir: Path,
        admin_key: str | None,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
        limits: AuthLimits | None = None,
        control_url: str | None = None,
        node: str | None = None,
        node_url: str | None = None,
        figures: Callable[[], NodeFigures] | None = None,
    ) -> None:
        """`hasher` and `clock` (µs) go to the control database; tests pass cheap or fake ones.

        With `control_url` (MEMSPINE_CONTROL_URL) the control plane is PostgreSQL, opened here
        (so a server that cannot reach it does not start) and `node` is this server's name,
        reachable at `node_url`, reporting `figures` for placement (memspine/cluster.py).
        """
        self.data_dir = data_dir
        self.control_url = control_url
        self.node = node
        self.node_url = node_url
        self.figures = figures
        self.gate: NodeGate | None = None  # a cluster node: which tenants it may serve
        self.admin_key = admin_key
        self.limits = limits or AuthLimits()
        self._hasher = hasher
        self._clock = clock
        self._lock = threading.Lock()
        self._control: ControlPlane | None = None
        self._verifier: KeyVerifier | None = None
        self._checked_at = -CONTROL_RECHECK_SECS
        self._shares = FairShares(self.limits.hash_slots, self.limits.per_tenant)
        self._threads: anyio.CapacityLimiter | None = None
        if control_url:
            self.control()

    def control(self) -> ControlPlane | None:
        """The control database, opened on first sight; None in local mode."""
        if self._control is not None:
            return self._control
        now = time.monotonic()
        if now - self._checked_at < CONTROL_RECHECK_SECS:
            return None
        with self._lock:
            self._checked_at = now
            if self._control is None and control_exists(self.data_dir, self.control_url):
                control = open_control(
                    self.data_dir,
                    self.control_url,
                    hasher=self._hasher,
                    clock=self._clock,
                    node=self.node,
                    watch=True,  # PostgreSQL: the generation from a listening thread
                    node_url=self.node_url,
                    figures=self.figures,
                )
                if self.node is not None:
                    self.gate = NodeGate(control, self.node)
                backoff = Backoff(self.limits.free_failures, self.limits.max_backoff_secs)
                self._verifier = KeyVerifier(
                    control, max_concurrent_hashes=self.limits.hash_slots, backoff=backoff
                )
                self._control = control
        return self._control

    def admit_tenant(self, tenant_id: str) -> None:
        """With issued keys, only a tenant the control database knows may be opened (401 otherwise)."""
        control = self.control()
        if control is not None and control.get_tenant(tenant_id) is None:
            raise _unauthorized()
        if self.gate is not None:  # nor a tenant placed on another node (moved away meanwhile)
            self.gate.check_open(tenant_id)

    def probe(self, token: str | None) -> Principal | _Cold:
        """The principal if it can be told without blocking, else the key to verify.

        Raises Unauthorized for a token that is refused without any I/O: missing, oversized,
        the admin key, not a valid local tenant id, or not a well-formed issued key.
        """
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise _unauthorized()
        if self.admin_key is not None and hmac.compare_digest(
            _bytes(token), _bytes(self.admin_key)
        ):
            raise _unauthorized()  # the admin key is never a tenant
        if self.control() is None:
            return Principal(
                tenant_id=self._local_tenant(token), key_id=LOCAL_KEY_ID, scopes=("read", "write")
            )
        verifier = self._verifier
        assert verifier is not None
        # A warm digest stands for exactly these bytes, already parsed and verified: look it up
        # before parsing (parsing and its checksum cost several times the hash).
        digest = token_digest(token)
        principal = verifier.warm(digest)
        if principal is not None:
            return principal
        parsed = keys.parse_token(token)
        if parsed is None:
            raise _unauthorized()  # junk never reaches a thread, the database or argon2
        return _Cold(parsed, digest)

    def _local_tenant(self, token: str) -> str:
        """The tenant a local-mode token names: a UUID in lower case, any other id as it is."""
        if UUID.match(token):
            canonical = token.lower()
            # A tenant written under another case of its UUID before tokens were normalised
            # keeps its directory, and that exact token keeps reaching it.
            legacy = self.data_dir / token
            if canonical != token and not (self.data_dir / canonical).exists() and legacy.is_dir():
                return token
            return canonical
        if not LOCAL_TENANT.match(token):
            raise Unauthorized(LOCAL_TOKEN_DETAIL)  # no secret in local mode: say what is wrong
        return token

    def authenticate(self, token: str | None) -> Principal:
        """The principal behind a tenant token, blocking if needed; one Unauthorized for every failure."""
        try:
            found = self.probe(token)
        except Refused as refused:
            time.sleep(refused.delay)
            raise _unauthorized() from None
        if isinstance(found, Principal):
            return self._placed(found)
        verifier = self._verifier
        assert verifier is not None and token is not None
        return self._placed(verifier.verify(token))  # its own bound on argon2 runs at once

    def _placed(self, principal: Principal) -> Principal:
        """The principal, if this node serves its tenant (421 `misdirected` otherwise)."""
        if self.gate is not None:
            self.gate.check(principal.tenant_id)
        return principal

    async def authenticate_async(self, token: str | None) -> Principal:
        """Like authenticate, but argon2 runs in a worker thread once the key's tenant has a
        fair share of the slots free; a refusal known without argon2 waits as long as one
        would take, without holding a slot; 429 while the key id backs off."""
        try:
            found = self.probe(token)
            if isinstance(found, Principal):
                return self._placed(found)
            verifier = self._verifier
            assert verifier is not None
            attempt = verifier.begin(found.parsed, found.digest)  # 429 here costs no slot
        except Refused as refused:
            await asyncio.sleep(refused.delay)
            raise _unauthorized() from None
        except TooManyRequests:
            # Paced like any other refusal: a flood's connection gets one answer per
            # verification's time, not as many as the event loop can render (no CPU, no slot).
            verifier = self._verifier  # a KeyVerifier has a length (its cache): test for None
            await asyncio.sleep(verifier.refusal_delay() if verifier is not None else 0.0)
            raise
        async with self._shares.slot(attempt.owner):
            if self._threads is None:  # made here: it belongs to the running event loop
                self._threads = anyio.CapacityLimiter(self.limits.hash_slots)
            principal = await anyio.to_thread.run_sync(
                verifier.finish, attempt, limiter=self._threads
            )
        return self._placed(principal)

    def check_admin(self, token: str | None) -> ControlPlane:
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

    def close(self) -> None:
        """Close the control database if it was opened."""
        if self._control is not None:
            self._control.close()
