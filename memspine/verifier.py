"""Bearer token → Principal, with a bounded cache that the control database's generation guards.

Every refusal of a well-formed key takes as long as an argon2 verification, so its time tells
nothing: a key with a row is verified against its hash; a refusal known without argon2 (an
unknown key id, or a token verified before whose key is now revoked or expired) waits for the
duration of a recent verification instead, costing no CPU. Failed attempts are limited per key
id (memspine_admin/backoff.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import msgspec
from argon2 import PasswordHasher

from memspine_admin import keys
from memspine_admin.backoff import Backoff
from memspine_admin.plane import ControlPlane
from memspine_admin.records import KeyRecord
from storage.errors import Forbidden, Unauthorized

UNAUTHORIZED_DETAIL = "invalid or expired api key"
# Whose share of the argon2 slots a dummy verification (for a key id without a row) uses.
UNKNOWN_KEY_IDS = "(unknown key ids)"
# A refusal known without argon2 waits as long as the latest verification took; one older than
# this no longer stands for the machine's load, and one dummy verification (at most one at a
# time) measures it again while the others wait as long as that older one took.
FRESH_SECS = 10.0


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who a verified key speaks for: the tenant always comes from here."""

    tenant_id: str
    key_id: str
    scopes: tuple[str, ...]
    expires_at: int | None = None
    requests_per_minute: int | None = None  # the key's own rate (None: the server's default)

    def has(self, scope: str) -> bool:
        """True if the key carries `scope`."""
        return scope in self.scopes

    def require(self, scope: str) -> None:
        """Raise Forbidden (403) unless the key carries `scope`."""
        if scope not in self.scopes:
            raise Forbidden(f"api key is missing the '{scope}' scope")


class _Entry:
    """A token verified here: its principal, whether its key is revoked, and the generation
    that was last confirmed at."""

    __slots__ = ("generation", "principal", "revoked")

    def __init__(self, principal: Principal, generation: int, revoked: bool = False) -> None:
        self.principal = principal
        self.generation = generation
        self.revoked = revoked


class Attempt(NamedTuple):
    """A well-formed key on its way to argon2: what `begin` read, for `finish` to verify."""

    key_id: str
    secret: str
    digest: bytes
    generation: int  # read before the row: a change committed after it leaves the entry stale
    record: KeyRecord | None

    @property
    def owner(self) -> str:
        """Whose fair share of argon2 slots this attempt takes: its key's tenant."""
        return self.record.tenant_id if self.record is not None else UNKNOWN_KEY_IDS


class Refused(Unauthorized):
    """A 401 decided without argon2: answer it only after `delay` seconds, what a verification takes."""

    def __init__(self, delay: float) -> None:
        super().__init__(UNAUTHORIZED_DETAIL)
        self.delay = delay


def _unauthorized() -> Unauthorized:
    # One message for every cause, so a caller cannot probe which keys exist.
    return Unauthorized(UNAUTHORIZED_DETAIL)


def _usable(record: KeyRecord | None, now: int) -> bool:
    if record is None or record.revoked_at is not None:
        return False
    return record.expires_at is None or now < record.expires_at


def _principal(record: KeyRecord) -> Principal:
    return Principal(
        tenant_id=record.tenant_id,
        key_id=record.key_id,
        scopes=record.scopes,
        expires_at=record.expires_at,
        requests_per_minute=record.requests_per_minute,
    )


def token_digest(token: str) -> bytes:
    """The cache key of a token: SHA-256 of its bytes (any str encodes, even lone surrogates)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class KeyVerifier:
    """Verifies bearer tokens against a control plane; blocking, call it off the event loop.

    `verify` does it all. The server splits it (memspine/auth.py): `warm` and `begin` are cheap
    (LMDB reads, no argon2) and run on the event loop; `finish` is the argon2 run, in a thread,
    once the key's tenant has a fair share of the slots.
    """

    def __init__(
        self,
        db: ControlPlane,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
        max_entries: int = 10_000,
        max_concurrent_hashes: int = 4,
        backoff: Backoff | None = None,
    ) -> None:
        """Use `db`'s hasher and clock unless given; cache at most `max_entries` tokens."""
        if max_entries < 1 or max_concurrent_hashes < 1:
            raise ValueError("max_entries and max_concurrent_hashes must be positive")
        self._db = db
        self._hasher = hasher or db.hasher
        self._clock = clock or db.now
        self._max_entries = max_entries
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        # Each argon2 run takes 64 MiB with the default profile: bound how many run at once,
        # so a flood of wrong secrets for a known key id cannot exhaust memory.
        self._hash_slots = threading.BoundedSemaphore(max_concurrent_hashes)
        self.backoff = backoff if backoff is not None else Backoff()  # empty is falsy
        self._dummy_hash: str | None = None
        self._latest: tuple[float, float] | None = None  # (when, seconds) of a verification
        self._calibrating_since: float | None = None

    def __len__(self) -> int:
        """Number of cached tokens."""
        return len(self._cache)

    def clear(self) -> None:
        """Drop every cached verification."""
        with self._lock:
            self._cache.clear()

    def verify(self, token: object) -> Principal:
        """Return the key's Principal, or raise Unauthorized for every kind of failure.

        TooManyRequests (429) while the key id is backing off after failed attempts.
        """
        parsed = keys.parse_token(token)
        if parsed is None:
            raise _unauthorized()  # junk never reaches the database or argon2
        assert isinstance(token, str)
        digest = token_digest(token)
        try:
            principal = self.warm(digest)
            if principal is not None:
                return principal
            attempt = self.begin(parsed, digest)
        except Refused as refused:
            time.sleep(refused.delay)
            raise _unauthorized() from None
        with self._hash_slots:
            return self.finish(attempt)

    def warm(self, digest: bytes) -> Principal | None:
        """The principal of a token this verifier accepted before, if its key is still usable.

        No argon2 run: one LMDB read of the generation, and one of the key's row after any
        change to tenants or keys (a secret never changes under its key id, only revocation
        and expiry do). None for a token not verified here; Refused for one whose key is not
        usable now (the token is genuine, so this is no failed attempt).
        """
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
        if entry is None:
            return None
        # Read the generation before the key row: a change committed after this read
        # leaves the entry at an older generation, so the next call re-checks the row.
        generation = self._db.generation()
        if entry.generation != generation and not entry.revoked:
            record = self._db.get_key_record(entry.principal.key_id)
            if record is None:  # rows are never removed; a damaged database is no key
                with self._lock:
                    self._cache.pop(digest, None)
                return None
            entry.principal = _principal(record)
            entry.revoked = record.revoked_at is not None
            entry.generation = generation
        principal = entry.principal
        expired = principal.expires_at is not None and self._clock() >= principal.expires_at
        if entry.revoked or expired:
            raise Refused(self._delay(claim=False) or 0.0)
        return principal

    def begin(self, parsed: keys.ParsedKey, digest: bytes) -> Attempt:
        """Check the key id's back-off (429) and read its row; no argon2 run.

        An unknown key id counts as a failed attempt and is Refused here, unless the refusal
        delay must be measured again: then the attempt goes on to a dummy verification.
        """
        self.backoff.check(parsed.key_id)
        generation = self._db.generation()
        record = self._db.get_key_record(parsed.key_id)
        if record is None:
            delay = self._delay(claim=True)
            if delay is not None:
                self.backoff.failed(parsed.key_id)
                raise Refused(delay)
        return Attempt(parsed.key_id, parsed.secret, digest, generation, record)

    def finish(self, attempt: Attempt) -> Principal:
        """One argon2 verification of the attempt's secret; blocking. Unauthorized if refused.

        A secret that does not match its key's hash (an unknown key id never matches) counts
        as a failed attempt for that key id. The right secret of a revoked or expired key is
        refused too, and remembered, so its next attempts cost no argon2 run.
        """
        record = attempt.record
        try:
            self.backoff.check(attempt.key_id)  # it may have begun while this attempt waited
            secret_hash = record.secret_hash if record is not None else self._dummy()
            started = time.monotonic()
            ok = keys.verify_secret(self._hasher, secret_hash, attempt.secret)
            self._sample(time.monotonic() - started)
        finally:
            if record is None:
                self._calibrating_since = None
        if record is None or not ok:
            self.backoff.failed(attempt.key_id)
            raise _unauthorized()
        self.backoff.succeeded(attempt.key_id)
        principal = _principal(record)
        entry = _Entry(principal, attempt.generation, revoked=record.revoked_at is not None)
        self._store(attempt.digest, entry)
        if not _usable(record, self._clock()):
            raise _unauthorized()
        if keys.needs_rehash(self._hasher, record.secret_hash):
            new_hash = keys.hash_secret(self._hasher, attempt.secret)
            self._db.update_hash(record.key_id, record.secret_hash, new_hash)
        return principal

    def refusal_delay(self) -> float:
        """How long a refusal known without argon2 waits (0 before any verification ran)."""
        return self._delay(claim=False) or 0.0

    def _sample(self, secs: float) -> None:
        with self._lock:
            self._latest = (time.monotonic(), secs)

    def _delay(self, *, claim: bool) -> float | None:
        """How long a refusal known without argon2 waits: what the latest verification took;
        None when the caller (`claim`) is to measure one (the latest is not fresh)."""
        with self._lock:
            now = time.monotonic()
            latest = self._latest
            if latest is not None and now - latest[0] < FRESH_SECS:
                return latest[1]
            since = self._calibrating_since
            if claim and (since is None or now - since > FRESH_SECS or latest is None):
                self._calibrating_since = now  # a claim whose attempt never ran expires
                return None
            return latest[1] if latest is not None else None

    def _dummy(self) -> str:
        """A hash of a secret no one knows, made once with this verifier's parameters."""
        if self._dummy_hash is None:
            made = keys.hash_secret(self._hasher, keys.random_base62(keys.SECRET_LEN))
            with self._lock:
                if self._dummy_hash is None:
                    self._dummy_hash = made
        return self._dummy_hash

    def _store(self, digest: bytes, entry: _Entry) -> None:
        with self._lock:
            self._cache[digest] = entry
            self._cache.move_to_end(digest)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
