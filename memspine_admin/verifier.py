"""Bearer token → Principal, with a bounded cache that the control database's generation guards."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

import msgspec
from argon2 import PasswordHasher

from memspine_admin import keys
from memspine_admin.control import ControlDB
from memspine_admin.records import KeyRecord
from storage.errors import Forbidden, Unauthorized

UNAUTHORIZED_DETAIL = "invalid or expired api key"


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who a verified key speaks for: the tenant always comes from here."""

    tenant_id: str
    key_id: str
    scopes: tuple[str, ...]
    expires_at: int | None = None

    def has(self, scope: str) -> bool:
        """True if the key carries `scope`."""
        return scope in self.scopes

    def require(self, scope: str) -> None:
        """Raise Forbidden (403) unless the key carries `scope`."""
        if scope not in self.scopes:
            raise Forbidden(f"api key is missing the '{scope}' scope")


class _Entry:
    """A cached verification: the principal and the generation it was last confirmed at."""

    __slots__ = ("generation", "principal")

    def __init__(self, principal: Principal, generation: int) -> None:
        self.principal = principal
        self.generation = generation


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
    )


class KeyVerifier:
    """Verifies bearer tokens against a ControlDB; blocking, call it off the event loop."""

    def __init__(
        self,
        db: ControlDB,
        *,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], int] | None = None,
        max_entries: int = 10_000,
        max_concurrent_hashes: int = 4,
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

    def __len__(self) -> int:
        """Number of cached tokens."""
        return len(self._cache)

    def clear(self) -> None:
        """Drop every cached verification."""
        with self._lock:
            self._cache.clear()

    def verify(self, token: object) -> Principal:
        """Return the key's Principal, or raise Unauthorized for every kind of failure."""
        parsed = keys.parse_token(token)
        if parsed is None:
            raise _unauthorized()  # junk never reaches the database or argon2
        assert isinstance(token, str)
        digest = hashlib.sha256(token.encode("ascii")).digest()
        # Read the generation before the key row: a change committed after this read
        # leaves the entry at an older generation, so the next call re-checks the row.
        generation = self._db.generation()
        now = self._clock()
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
        if entry is not None:
            return self._confirm(digest, entry, parsed.key_id, generation, now)
        record = self._db.get_key_record(parsed.key_id)
        if not _usable(record, now):
            raise _unauthorized()
        assert record is not None
        with self._hash_slots:
            ok = keys.verify_secret(self._hasher, record.secret_hash, parsed.secret)
            if ok and keys.needs_rehash(self._hasher, record.secret_hash):
                new_hash = keys.hash_secret(self._hasher, parsed.secret)
                self._db.update_hash(record.key_id, record.secret_hash, new_hash)
        if not ok:
            raise _unauthorized()
        principal = _principal(record)
        self._store(digest, _Entry(principal, generation))
        return principal

    def _confirm(
        self, digest: bytes, entry: _Entry, key_id: str, generation: int, now: int
    ) -> Principal:
        principal = entry.principal
        expired = principal.expires_at is not None and now >= principal.expires_at
        if not expired and entry.generation == generation:
            return principal
        if not expired:
            # Something changed somewhere: re-read this key's row (cheap), not argon2 again —
            # a secret never changes under its key id, only revocation and expiry do.
            record = self._db.get_key_record(key_id)
            if _usable(record, now):
                assert record is not None
                entry.principal = _principal(record)
                entry.generation = generation
                return entry.principal
        with self._lock:
            self._cache.pop(digest, None)
        raise _unauthorized()

    def _store(self, digest: bytes, entry: _Entry) -> None:
        with self._lock:
            self._cache[digest] = entry
            self._cache.move_to_end(digest)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
