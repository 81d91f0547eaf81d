"""The API key format, its checksum and the argon2id hashing of secrets; the verifier over
both control-plane backends (LMDB and a real PostgreSQL)."""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import lmdb
import pytest
from argon2 import PasswordHasher
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from memspine.verifier import UNAUTHORIZED_DETAIL, KeyVerifier, Principal
from memspine_admin import keys
from memspine_admin.backoff import Backoff
from memspine_admin.control import ControlDB
from memspine_admin.control_pg import ControlUnavailable
from memspine_admin.plane import ControlPlane, open_control
from storage.errors import Conflict, Forbidden, NotFound, Unauthorized
from tests.support.budget import size
from tests.support.control import CHEAP_HASHER as WEAK
from tests.support.control import T0, Clock


class CountingHasher(PasswordHasher):
    """The weak test hasher, counting argon2 verifications."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.verifies = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.verifies += 1
        return super().verify(hash, password)


def test_generated_token_has_the_documented_shape() -> None:
    key = keys.generate_key()
    assert re.fullmatch(r"smk_live_[0-9A-Za-z]{12}_[0-9A-Za-z]{32}[0-9A-Za-z]{6}", key.token), (
        key.key_id
    )
    assert len(key.token) == keys.TOKEN_LEN == 60
    assert key.token.startswith(keys.key_prefix(key.key_id) + "_")
    assert keys.parse_token(key.token) == keys.ParsedKey(key.key_id, key.secret)


def test_secret_carries_at_least_128_bits() -> None:
    assert keys.SECRET_LEN * math.log2(len(keys.ALPHABET)) >= 128
    assert len(set(keys.ALPHABET)) == 62
    tokens = {keys.generate_key().secret for _ in range(200)}
    assert len(tokens) == 200


def test_checksum_is_fixed_width_and_covers_every_crc32() -> None:
    assert 62**keys.CHECKSUM_LEN > 2**32
    for body in ("", "smk_live_x", "a" * 100):
        assert len(keys.checksum(body)) == keys.CHECKSUM_LEN


def test_secret_scanner_pattern_finds_keys_in_text() -> None:
    key = keys.generate_key()
    text = f"export MEMSPINE_KEY={key.token}\n# end"
    match = keys.TOKEN_PATTERN.search(text)
    assert match is not None
    assert keys.parse_token(match.group(0)) is not None


@given(st.data())
def test_any_single_character_change_is_rejected(data: st.DataObject) -> None:
    token = keys.generate_key().token
    pos = data.draw(st.integers(min_value=0, max_value=len(token) - 1))
    replacement = data.draw(st.characters(codec="utf-8").filter(lambda c: c != token[pos]))
    tampered = token[:pos] + replacement + token[pos + 1 :]
    assert keys.parse_token(tampered) is None


@given(st.one_of(st.text(max_size=400), st.binary(max_size=100), st.integers(), st.none()))
def test_parse_never_raises_on_junk(value: object) -> None:
    assert keys.parse_token(value) is None


@pytest.mark.parametrize(
    "token",
    [
        "",
        "smk_live_",
        "smk_test_abcdefghijkl_" + "a" * 38,
        "Bearer smk_live_x",
        "x" * 10_000,
        "smk_live_abcdefghijkl_" + "a" * 38 + "\n",
        "smk_live_abcdefghijkl_" + "é" * 38,
        "smk_live_abcdefghijkl_" + "a" * 37 + "\x00",
        "4a2cd816-0f6f-4f89-ac26-41ef06c06e47",
    ],
)
def test_malformed_tokens_are_rejected(token: str) -> None:
    assert keys.parse_token(token) is None


def test_trailing_whitespace_and_case_changes_are_rejected() -> None:
    token = keys.generate_key().token
    assert keys.parse_token(token + " ") is None
    assert keys.parse_token(" " + token) is None
    assert keys.parse_token(token.replace("smk_live_", "SMK_LIVE_")) is None


def test_hash_is_argon2id_and_never_contains_the_secret() -> None:
    key = keys.generate_key()
    stored = keys.hash_secret(WEAK, key.secret)
    assert stored.startswith("$argon2id$")
    assert key.secret not in stored
    assert keys.verify_secret(WEAK, stored, key.secret)
    assert not keys.verify_secret(WEAK, stored, keys.generate_key().secret)
    assert not keys.verify_secret(WEAK, "not a hash", key.secret)


def test_default_hasher_asks_to_rehash_weaker_hashes() -> None:
    strong = keys.default_hasher()
    weak_hash = keys.hash_secret(WEAK, "s")
    assert keys.needs_rehash(strong, weak_hash)
    assert not keys.needs_rehash(WEAK, weak_hash)
    assert not keys.needs_rehash(strong, "garbage")


def test_with_new_key_id_keeps_the_secret() -> None:
    key = keys.generate_key()
    other = keys.with_new_key_id(key)
    assert other.secret == key.secret and other.key_id != key.key_id
    assert keys.parse_token(other.token) == keys.ParsedKey(other.key_id, key.secret)


def test_is_key_id() -> None:
    assert keys.is_key_id(keys.generate_key().key_id)
    for bad in ("", "abc", "abcdefghijk_", "abcdefghijkl\n", None, 12, "../../etc/pas"):
        assert not keys.is_key_id(bad)


# -- verification ------------------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def hasher() -> CountingHasher:
    return CountingHasher()


@pytest.fixture(params=["lmdb", "postgresql"])
def db(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock, hasher: CountingHasher
) -> Iterator[ControlPlane]:
    url = None if request.param == "lmdb" else str(request.getfixturevalue("control_url"))
    with open_control(tmp_path, url, create=True, hasher=hasher, clock=clock) as opened:
        yield opened


def _unauthorized(verifier: KeyVerifier, token: object) -> None:
    with pytest.raises(Unauthorized) as info:
        verifier.verify(token)
    assert info.value.status == 401 and info.value.code == "unauthorized"
    assert info.value.detail == UNAUTHORIZED_DETAIL


def test_verify_resolves_the_key_to_its_tenant_and_scopes(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "review", ["read"], 86_400, actor="test")
    principal = KeyVerifier(db).verify(issued.api_key)
    assert principal == Principal(
        tenant_id=tenant.tenant_id,
        key_id=issued.key_id,
        scopes=("read",),
        expires_at=issued.expires_at,
    )
    principal.require("read")
    assert principal.has("read") and not principal.has("write")
    with pytest.raises(Forbidden) as info:
        principal.require("write")
    assert info.value.status == 403 and info.value.detail == "api key is missing the 'write' scope"


def test_a_cached_key_costs_no_argon2_run(db: ControlPlane, hasher: CountingHasher) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    verifier = KeyVerifier(db)
    for _ in range(5):
        verifier.verify(issued.api_key)
    assert hasher.verifies == 1
    db.create_tenant("unrelated", actor="test")  # bumps the generation: a row re-read, no argon2
    verifier.verify(issued.api_key)
    assert hasher.verifies == 1


def test_revocation_takes_effect_on_the_next_request(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    other = db.create_key(tenant.tenant_id, "other", actor="test")
    verifier = KeyVerifier(db)
    verifier.verify(issued.api_key)
    verifier.verify(other.api_key)
    db.revoke_key(issued.key_id, actor="test")
    _unauthorized(verifier, issued.api_key)
    _unauthorized(verifier, issued.api_key)
    assert verifier.verify(other.api_key).key_id == other.key_id


def test_expiry_takes_effect_even_for_a_cached_key(db: ControlPlane, clock: Clock) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", ttl_secs=60, actor="test")
    verifier = KeyVerifier(db)
    verifier.verify(issued.api_key)
    clock.t = T0 + 60_000_000 - 1
    verifier.verify(issued.api_key)
    clock.t = T0 + 60_000_000
    _unauthorized(verifier, issued.api_key)
    clock.t = T0  # expiry is a comparison with the clock, not a state written anywhere
    assert verifier.verify(issued.api_key).key_id == issued.key_id


def test_deleting_the_tenant_stops_its_keys(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    verifier = KeyVerifier(db)
    verifier.verify(issued.api_key)
    db.delete_tenant(tenant.tenant_id, actor="test")
    _unauthorized(verifier, issued.api_key)


def test_every_bad_token_gets_the_same_401(db: ControlPlane, hasher: CountingHasher) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    parsed = keys.parse_token(issued.api_key)
    assert parsed is not None
    verifier = KeyVerifier(db)
    wrong_secret = keys.format_token(parsed.key_id, keys.random_base62(keys.SECRET_LEN))
    unknown_id = keys.generate_key().token
    for token in (
        None,
        "",
        tenant.tenant_id,
        issued.api_key[:-1] + "!",
        wrong_secret,
        unknown_id,
        "smk_live_" + "\udcff" * 51,
        "x" * 1_000_000,
        b"bytes",
        issued.api_key + "\n",
    ):
        _unauthorized(verifier, token)
    assert hasher.verifies == 1  # only the wrong secret for a known key id reached argon2
    assert len(verifier) == 0


def test_malformed_tokens_touch_neither_database_nor_argon2(
    db: ControlPlane, hasher: CountingHasher
) -> None:
    verifier = KeyVerifier(db)
    db.close()  # any database read from here on raises
    token = keys.generate_key().token
    for junk in ("smk_live_" + "a" * 51, token[:-1] + ("A" if token[-1] != "A" else "B"), "é" * 60):
        _unauthorized(verifier, junk)
    with pytest.raises((lmdb.Error, ControlUnavailable)):
        verifier.verify(token)  # a well-formed token does reach the (closed) database
    assert hasher.verifies == 0


@given(st.text(max_size=300))
@pytest.mark.long
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=size(200, 50))
def test_arbitrary_text_never_crashes_the_verifier(db: ControlPlane, token: str) -> None:
    _unauthorized(KeyVerifier(db), token)


def test_weak_hashes_are_rehashed_on_verify(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    before = db.get_key_record(issued.key_id)
    assert before is not None and "m=8,t=1,p=1" in before.secret_hash
    stronger = PasswordHasher(time_cost=2, memory_cost=16, parallelism=1)
    generation = db.generation()
    KeyVerifier(db, hasher=stronger).verify(issued.api_key)
    after = db.get_key_record(issued.key_id)
    assert after is not None and "m=16,t=2,p=1" in after.secret_hash
    assert db.generation() == generation
    assert KeyVerifier(db, hasher=stronger).verify(issued.api_key).key_id == issued.key_id


def test_the_cache_is_bounded(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    tokens = [db.create_key(tenant.tenant_id, f"k{i}", actor="test").api_key for i in range(6)]
    verifier = KeyVerifier(db, max_entries=3)
    for token in tokens:
        verifier.verify(token)
    assert len(verifier) == 3
    for token in tokens:
        assert verifier.verify(token).tenant_id == tenant.tenant_id
    assert len(verifier) == 3


def test_revocation_is_seen_by_every_thread(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    verifier = KeyVerifier(db)
    verifier.verify(issued.api_key)
    revoked = threading.Event()
    late_successes: list[int] = []

    def hammer() -> None:
        for _ in range(200):
            after_revoke = revoked.is_set()
            try:
                verifier.verify(issued.api_key)
            except Unauthorized:
                continue
            if after_revoke:
                late_successes.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    db.revoke_key(issued.key_id, actor="test")
    revoked.set()
    for thread in threads:
        thread.join()
    assert late_successes == []
    _unauthorized(verifier, issued.api_key)


# -- a state machine over tenants and keys -----------------------------------------------------


# The state machine models keys, not the back-off (tests/server/test_auth.py has that): a run
# that refuses one key id more than FREE_FAILURES times would meet 429 rather than 401.
NO_BACKOFF = Backoff(free=1_000_000)


class KeyLifecycle(RuleBasedStateMachine):
    """Tenants and keys against a plain model: a key only ever resolves to its own tenant."""

    tenants = Bundle("tenants")
    issued = Bundle("issued")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memspine-keys-"))
        self.clock = Clock()
        self.db = ControlDB.open(self.dir, create=True, hasher=WEAK, clock=self.clock)
        self.verifier = KeyVerifier(self.db, max_entries=4, backoff=NO_BACKOFF)
        self.live: dict[str, str] = {}  # tenant id -> name
        self.keys: dict[str, dict[str, Any]] = {}  # key id -> model of the key
        self.last_generation = self.db.generation()

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _valid(self, key: dict[str, Any]) -> bool:
        expired = key["expires_at"] is not None and self.clock.t >= key["expires_at"]
        return not key["revoked"] and key["tenant_id"] in self.live and not expired

    @rule(target=tenants, name=st.sampled_from(["a", "b", "c"]))
    def create_tenant(self, name: str) -> str:
        if name in self.live.values():
            with pytest.raises(Conflict):
                self.db.create_tenant(name, actor="test")
            return next(t for t, n in self.live.items() if n == name)
        tenant = self.db.create_tenant(name, actor="test")
        self.live[tenant.tenant_id] = name
        return tenant.tenant_id

    @rule(
        target=issued,
        tenant_id=tenants,
        scopes=st.sampled_from([("read",), ("write",), ("read", "write")]),
        ttl=st.none() | st.integers(min_value=1, max_value=100),
    )
    def create_key(self, tenant_id: str, scopes: tuple[str, ...], ttl: int | None) -> str:
        if tenant_id not in self.live:
            with pytest.raises(NotFound):
                self.db.create_key(tenant_id, "k", scopes, ttl, actor="test")
            return keys.generate_key().token  # a token that was never issued
        issued = self.db.create_key(tenant_id, "k", scopes, ttl, actor="test")
        expires_at = None if ttl is None else self.clock.t + ttl * 1_000_000
        self.keys[issued.key_id] = {
            "tenant_id": tenant_id,
            "scopes": scopes,
            "expires_at": expires_at,
            "revoked": False,
        }
        return issued.api_key

    @rule(token=issued)
    def revoke(self, token: str) -> None:
        parsed = keys.parse_token(token)
        assert parsed is not None
        if parsed.key_id not in self.keys:
            with pytest.raises(NotFound):
                self.db.revoke_key(parsed.key_id, actor="test")
            return
        info = self.db.revoke_key(parsed.key_id, actor="test")
        assert info.revoked_at is not None
        self.keys[parsed.key_id]["revoked"] = True

    @rule(tenant_id=tenants)
    def delete_tenant(self, tenant_id: str) -> None:
        if tenant_id not in self.live:
            with pytest.raises(NotFound):
                self.db.delete_tenant(tenant_id, actor="test")
            return
        revoked = self.db.delete_tenant(tenant_id, actor="test")
        expected = {
            k for k, v in self.keys.items() if v["tenant_id"] == tenant_id and not v["revoked"]
        }
        assert set(revoked) == expected
        for key_id in expected:
            self.keys[key_id]["revoked"] = True
        del self.live[tenant_id]

    @rule(secs=st.integers(min_value=0, max_value=60))
    def advance_clock(self, secs: int) -> None:
        self.clock.t += secs * 1_000_000

    @rule()
    def restart(self) -> None:
        self.db.close()
        self.db = ControlDB.open(self.dir, hasher=WEAK, clock=self.clock)
        self.verifier = KeyVerifier(self.db, max_entries=4, backoff=NO_BACKOFF)

    @rule(token=issued)
    def verify(self, token: str) -> None:
        parsed = keys.parse_token(token)
        assert parsed is not None
        key = self.keys.get(parsed.key_id)
        if key is None or not self._valid(key):
            with pytest.raises(Unauthorized):
                self.verifier.verify(token)
            return
        principal = self.verifier.verify(token)
        assert principal.tenant_id == key["tenant_id"]
        assert principal.key_id == parsed.key_id
        assert principal.scopes == key["scopes"]

    @rule(token=issued, pos=st.integers(min_value=0, max_value=keys.TOKEN_LEN - 1))
    def verify_tampered(self, token: str, pos: int) -> None:
        swapped = "A" if token[pos] != "A" else "B"
        with pytest.raises(Unauthorized):
            self.verifier.verify(token[:pos] + swapped + token[pos + 1 :])

    @invariant()
    def generation_never_goes_back(self) -> None:
        generation = self.db.generation()
        assert generation >= self.last_generation
        self.last_generation = generation


KeyLifecycle.TestCase.settings = settings(
    max_examples=size(60, 20), stateful_step_count=30, deadline=None
)
TestKeyLifecycle = pytest.mark.long(KeyLifecycle.TestCase)
