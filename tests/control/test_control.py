"""The control plane on real LMDB and on a real PostgreSQL: one suite for both backends.

Tenants, keys, audit, generation; tenant erasure; the LMDB-only lifecycle of `_control`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from memspine_admin import keys
from memspine_admin.control import (
    NO_CONTROL_DB,
    ControlDB,
    control_path,
)
from memspine_admin.plane import ControlPlane, init_control, open_control
from memspine_admin.records import MAX_TTL_SECS, ReadMark
from storage import erase_tenant_dir, is_tenant_id
from storage.errors import Conflict, InvalidRequest, NotFound
from tests.support.control import CHEAP_HASHER as WEAK
from tests.support.control import T0, Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path, clock: Clock, url: str | None) -> Iterator[ControlPlane]:
    with open_control(tmp_path, url, create=True, actor="test", hasher=WEAK, clock=clock) as opened:
        yield opened


def stored_bytes(db: ControlPlane, data_dir: Path) -> bytes:
    """Every byte the backend keeps: LMDB's files, or every row of every PostgreSQL table."""
    if isinstance(db, ControlDB):
        return b"".join(p.read_bytes() for p in control_path(data_dir).iterdir())
    import psycopg

    with psycopg.connect(db.url) as conn:  # type: ignore[attr-defined]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
        assert {"tenants", "keys", "audit", "control_meta"} <= set(tables)
        rows = [
            str(row).encode()
            for table in tables
            for row in conn.execute(f"SELECT t::text FROM {table} t")
        ]
    return b"\n".join(rows)


# -- lifecycle ---------------------------------------------------------------------------------


def test_open_without_init_is_the_documented_conflict(tmp_path: Path) -> None:
    assert not ControlDB.exists(tmp_path)
    with pytest.raises(Conflict) as info:
        ControlDB.open(tmp_path)
    assert info.value.detail == NO_CONTROL_DB == "no control database: run memspine-admin init"
    assert info.value.status == 409
    assert not control_path(tmp_path).exists()


def test_init_is_idempotent_and_leaves_no_temporary_directory(
    tmp_path: Path, url: str | None
) -> None:
    data = tmp_path / "data"
    assert init_control(data, url, actor="test") is True
    assert init_control(data, url, actor="test") is False
    if url is None:
        assert ControlDB.exists(data)
        assert sorted(p.name for p in data.iterdir()) == ["_control"]
        assert control_path(data).stat().st_mode & 0o077 == 0  # hashes are not world-readable
    with open_control(data, url) as db:
        assert db.generation() == 1
        entries, cursor = db.audit()
    assert [(e.seq, e.action, e.actor) for e in entries] == [(1, "control.init", "test")]
    assert cursor is None


def test_changes_survive_reopening(tmp_path: Path, url: str | None) -> None:
    with open_control(tmp_path, url, create=True, hasher=WEAK) as db:
        tenant = db.create_tenant("acme", actor="test")
        issued = db.create_key(tenant.tenant_id, "agent", actor="test")
        generation = db.generation()
    with open_control(tmp_path, url, hasher=WEAK) as db:
        assert db.get_tenant(tenant.tenant_id) == tenant
        assert [k.key_id for k in db.list_keys()] == [issued.key_id]
        assert db.generation() == generation


def test_key_ids_start_with_their_tenants_route(db: ControlPlane, clock: Clock) -> None:
    one = db.create_tenant("one", actor="test")
    clock.t += 1
    two = db.create_tenant("two", actor="test")
    route_one, route_two = db.tenant_route(one.tenant_id), db.tenant_route(two.tenant_id)
    assert keys.is_route(route_one) and keys.is_route(route_two) and route_one != route_two
    assert db.get_tenant(one.tenant_id) == one and db.list_tenants() == [one, two]
    assert set(msgspec.json.decode(msgspec.json.encode(one))) == {"tenant_id", "name", "created_at"}
    assert db.tenant_route(str(uuid.uuid4())) is None
    issued = [db.create_key(t.tenant_id, "k", actor="test") for t in (one, two, one)]
    assert [keys.route_of(k.key_id) for k in issued] == [route_one, route_two, route_one]
    assert len({k.key_id for k in issued}) == 3
    for key in issued:  # still the documented 60-character shape
        assert len(key.api_key) == keys.TOKEN_LEN == 60
        assert keys.parse_token(key.api_key) == (key.key_id, key.api_key[22:54])


# -- tenants -----------------------------------------------------------------------------------


def test_create_get_list_tenants(db: ControlPlane, clock: Clock) -> None:
    first = db.create_tenant("customer-4417", actor="test")
    clock.t += 1
    second = db.create_tenant("customer-4418", actor="test")
    assert is_tenant_id(first.tenant_id) and uuid.UUID(first.tenant_id).version == 4
    assert first.created_at == T0 and first.name == "customer-4417"
    assert db.get_tenant(first.tenant_id) == first
    assert db.get_tenant(str(uuid.uuid4())) is None
    assert db.get_tenant("_control") is None
    assert db.list_tenants() == [first, second]


def test_duplicate_tenant_name_is_a_conflict_naming_the_existing_tenant(db: ControlPlane) -> None:
    tenant = db.create_tenant("customer-4417", actor="test")
    generation = db.generation()
    with pytest.raises(Conflict) as info:
        db.create_tenant("customer-4417", actor="test")
    assert tenant.tenant_id in info.value.detail
    assert db.generation() == generation
    assert len(db.list_tenants()) == 1
    db.create_tenant("Customer-4417", actor="test")  # names are compared exactly


def test_a_tenant_takes_the_id_it_is_given(db: ControlPlane) -> None:
    chosen = str(uuid.uuid4())
    tenant = db.create_tenant("moved", actor="test", tenant_id=chosen.upper())
    assert tenant.tenant_id == chosen and db.get_tenant(chosen) == tenant
    generation = db.generation()
    with pytest.raises(Conflict, match=f"a tenant with id {chosen} already exists"):
        db.create_tenant("other", actor="test", tenant_id=chosen)
    for bad in ("acme", str(uuid.uuid1()), "_control", chosen + "0"):
        with pytest.raises(InvalidRequest, match="UUIDv4"):
            db.create_tenant("other", actor="test", tenant_id=bad)
    assert db.generation() == generation and db.list_tenants() == [tenant]
    assert db.create_key(chosen, "agent", actor="test").tenant_id == chosen
    db.delete_tenant(chosen, actor="test")
    assert db.create_tenant("again", actor="test", tenant_id=chosen).tenant_id == chosen


@pytest.mark.parametrize(
    "name", ["", "   ", " padded", "padded ", "x" * 129, "é" * 65, "tab\there", "nul\x00", 7, None]
)
def test_bad_tenant_names_are_invalid_requests(db: ControlPlane, name: object) -> None:
    with pytest.raises(InvalidRequest):
        db.create_tenant(name, actor="test")  # type: ignore[arg-type]
    assert db.list_tenants() == []


def test_deleted_tenant_releases_its_name(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    db.delete_tenant(tenant.tenant_id, actor="test")
    again = db.create_tenant("acme", actor="test")
    assert again.tenant_id != tenant.tenant_id


def test_delete_tenant_revokes_its_keys_in_one_change(db: ControlPlane, clock: Clock) -> None:
    tenant = db.create_tenant("acme", actor="test")
    other = db.create_tenant("other", actor="test")
    a = db.create_key(tenant.tenant_id, "a", actor="test")
    b = db.create_key(tenant.tenant_id, "b", ttl_secs=10, actor="test")
    c = db.create_key(tenant.tenant_id, "c", actor="test")
    keep = db.create_key(other.tenant_id, "keep", actor="test")
    db.revoke_key(c.key_id, actor="test")
    generation = db.generation()
    clock.t += 5_000_000
    revoked = db.delete_tenant(tenant.tenant_id, actor="admin-api")
    assert sorted(revoked) == sorted([a.key_id, b.key_id])
    assert db.generation() == generation + 1
    assert db.get_tenant(tenant.tenant_id) is None
    for key_id in (a.key_id, b.key_id):
        info = db.get_key(key_id)
        assert info is not None and info.revoked_at == clock.t
    assert db.get_key(keep.key_id) is not None and db.get_key(keep.key_id).revoked_at is None  # type: ignore[union-attr]
    entries, _ = db.audit(tenant_id=tenant.tenant_id)
    last = entries[-1]
    assert (last.action, last.actor) == ("tenant.delete", "admin-api")
    assert sorted(last.detail["revoked_keys"]) == sorted(revoked)
    with pytest.raises(NotFound):
        db.delete_tenant(tenant.tenant_id, actor="test")
    with pytest.raises(NotFound):
        db.list_keys(tenant.tenant_id)


# Fixed values, so the test ids are the same in every run (pytest-xdist compares them).
@pytest.mark.parametrize(
    "tenant_id", ["_control", "..", "", "70c963d1-c1c1-409f-9016-1555edf4764f", "x" * 10_000]
)
def test_delete_unknown_tenant_is_not_found(db: ControlPlane, tenant_id: str) -> None:
    generation = db.generation()
    with pytest.raises(NotFound):
        db.delete_tenant(tenant_id, actor="test")
    assert db.generation() == generation


# -- keys --------------------------------------------------------------------------------------


def test_create_key_returns_the_plaintext_once(db: ControlPlane, clock: Clock) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(
        tenant.tenant_id, "reviewer", ["write", "read", "read"], 86_400, actor="t"
    )
    assert issued.scopes == ("read", "write")
    assert issued.expires_at == T0 + 86_400 * 1_000_000
    parsed = keys.parse_token(issued.api_key)
    assert parsed is not None and parsed.key_id == issued.key_id
    assert issued.api_key not in repr(issued) and parsed.secret not in repr(issued)
    record = db.get_key_record(issued.key_id)
    assert record is not None
    assert record.secret_hash.startswith("$argon2id$") and parsed.secret not in record.secret_hash
    assert "argon2" not in repr(record)
    info = db.get_key(issued.key_id)
    assert info is not None and info.status(clock.t) == "active"
    assert info.status(issued.expires_at) == "expired"


def test_default_scopes_and_no_expiry(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    assert issued.scopes == ("read", "write") and issued.expires_at is None


def test_audit_keys_purpose_keys_and_read_chain_marks(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test").tenant_id
    issued = db.create_key(tenant, "auditor", ["audit"], actor="test", require_purpose=True)
    assert issued.scopes == ("audit",) and issued.require_purpose
    record = db.get_key_record(issued.key_id)
    assert record is not None and record.require_purpose and record.scopes == ("audit",)
    plain = db.create_key(tenant, "agent", actor="test")
    assert not plain.require_purpose and "audit" not in plain.scopes  # not a default scope
    assert db.read_marks(tenant) == (None, None)
    db.keep_read_mark(tenant, ReadMark(seq=5, hash=b"h" * 32))
    db.keep_read_mark(tenant, ReadMark(seq=2, hash=b"c" * 32), cut=True)
    db.keep_read_mark(tenant, ReadMark(seq=9, hash=b"i" * 32))
    assert db.read_marks(tenant) == (
        ReadMark(seq=9, hash=b"i" * 32),
        ReadMark(seq=2, hash=b"c" * 32),
    )
    db.delete_tenant(tenant, actor="test")  # the marks go with the tenant
    assert db.read_marks(tenant) == (None, None)


def test_key_for_unknown_tenant_is_not_found(db: ControlPlane) -> None:
    for tenant_id in (str(uuid.uuid4()), "_control", "../etc", ""):
        with pytest.raises(NotFound) as info:
            db.create_key(tenant_id, "agent", actor="test")
        assert info.value.status == 404
    assert db.list_keys() == []


@pytest.mark.parametrize(
    ("scopes", "fragment"),
    [(["read", "admin"], "'admin'"), ([], "empty"), ("read", "list"), ([None], "None")],
)
def test_bad_scopes_are_invalid_requests(db: ControlPlane, scopes: object, fragment: str) -> None:
    tenant = db.create_tenant("acme", actor="test")
    with pytest.raises(InvalidRequest) as info:
        db.create_key(tenant.tenant_id, "agent", scopes, actor="test")  # type: ignore[arg-type]
    assert fragment in info.value.detail and info.value.status == 400


@pytest.mark.parametrize("ttl", [0, -1, MAX_TTL_SECS + 1, 10**30, True, 1.5, "60"])
def test_bad_ttl_is_an_invalid_request(db: ControlPlane, ttl: object) -> None:
    tenant = db.create_tenant("acme", actor="test")
    with pytest.raises(InvalidRequest) as info:
        db.create_key(tenant.tenant_id, "agent", ttl_secs=ttl, actor="test")  # type: ignore[arg-type]
    assert "ttl_secs" in info.value.detail


def test_ttl_bounds_are_inclusive(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    assert db.create_key(tenant.tenant_id, "a", ttl_secs=1, actor="t").expires_at == T0 + 1_000_000
    longest = db.create_key(tenant.tenant_id, "b", ttl_secs=MAX_TTL_SECS, actor="t")
    assert longest.expires_at == T0 + MAX_TTL_SECS * 1_000_000


def test_list_keys_shows_no_secret_and_no_hash(db: ControlPlane) -> None:
    one = db.create_tenant("one", actor="test")
    two = db.create_tenant("two", actor="test")
    a = db.create_key(one.tenant_id, "a", actor="test")
    b = db.create_key(two.tenant_id, "b", ["read"], actor="test")
    listed = db.list_keys()
    assert {k.key_id for k in listed} == {a.key_id, b.key_id}
    encoded = msgspec.json.encode(listed).decode()
    assert "argon2" not in encoded and "hash" not in encoded
    assert a.api_key not in encoded and b.api_key not in encoded
    assert [k.key_id for k in db.list_keys(two.tenant_id)] == [b.key_id]


def test_revoke_key(db: ControlPlane, clock: Clock) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    generation = db.generation()
    clock.t += 7
    info = db.revoke_key(issued.key_id, actor="cli:alice")
    assert info.revoked_at == T0 + 7 and info.status(clock.t) == "revoked"
    assert db.generation() == generation + 1
    assert db.revoke_key(issued.key_id, actor="cli:alice") == info  # idempotent, no new change
    assert db.generation() == generation + 1
    entries, _ = db.audit()
    assert [e.action for e in entries].count("key.revoke") == 1
    for unknown in ("abcdefghijkl", "nope", "../../x"):
        with pytest.raises(NotFound):
            db.revoke_key(unknown, actor="test")


def test_update_hash_only_replaces_the_expected_hash(db: ControlPlane) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    record = db.get_key_record(issued.key_id)
    assert record is not None
    generation = db.generation()
    assert not db.update_hash(issued.key_id, "$argon2id$other", "$argon2id$new")
    assert db.update_hash(issued.key_id, record.secret_hash, "$argon2id$new")
    assert db.get_key_record(issued.key_id).secret_hash == "$argon2id$new"  # type: ignore[union-attr]
    assert db.generation() == generation  # a rehash changes nobody's access
    assert not db.update_hash("abcdefghijkl", "a", "b")


def test_every_change_bumps_the_generation_and_reads_do_not(db: ControlPlane) -> None:
    seen = [db.generation()]
    tenant = db.create_tenant("acme", actor="test")
    seen.append(db.generation())
    issued = db.create_key(tenant.tenant_id, "agent", actor="test")
    seen.append(db.generation())
    db.list_keys()
    db.list_tenants()
    db.audit()
    seen.append(db.generation())
    db.revoke_key(issued.key_id, actor="test")
    seen.append(db.generation())
    db.delete_tenant(tenant.tenant_id, actor="test")
    seen.append(db.generation())
    assert seen == [1, 2, 3, 3, 4, 5]


def test_no_file_holds_a_secret(db: ControlPlane, tmp_path: Path) -> None:
    tenant = db.create_tenant("acme", actor="test")
    issued = [db.create_key(tenant.tenant_id, f"k{i}", actor="test") for i in range(5)]
    db.revoke_key(issued[0].key_id, actor="test")
    db.delete_tenant(tenant.tenant_id, actor="test")
    blobs = stored_bytes(db, tmp_path)
    assert tenant.tenant_id.encode() in blobs  # the search does see the records
    for key in issued:
        parsed = keys.parse_token(key.api_key)
        assert parsed is not None
        assert parsed.secret.encode() not in blobs
        assert key.api_key.encode() not in blobs


# -- audit -------------------------------------------------------------------------------------


def test_audit_pages_with_a_cursor(db: ControlPlane) -> None:
    tenants = [db.create_tenant(f"t{i}", actor="cli:bob") for i in range(24)]
    seqs: list[int] = []
    cursor: int | None = None
    pages = 0
    while True:
        entries, cursor = db.audit(cursor, 10)
        seqs += [e.seq for e in entries]
        pages += 1
        if cursor is None:
            break
    assert seqs == list(range(1, 26)) and pages == 3
    only, more = db.audit(tenant_id=tenants[3].tenant_id)
    assert [(e.action, e.detail) for e in only] == [("tenant.create", {"name": "t3"})]
    assert more is None
    assert db.audit(25, 10) == ([], None)
    assert db.audit(10**30, 10) == ([], None)  # a huge cursor is clamped, never raises


@pytest.mark.parametrize(("after", "limit"), [(None, 0), (None, 1001), (-1, 10), (None, True)])
def test_audit_rejects_bad_paging(db: ControlPlane, after: object, limit: object) -> None:
    with pytest.raises(InvalidRequest):
        db.audit(after, limit)  # type: ignore[arg-type]


# -- tenant directories ------------------------------------------------------------------------


def test_erase_tenant_dir_removes_the_directory(tmp_path: Path) -> None:
    tenant_id = str(uuid.uuid4())
    tenant_dir = tmp_path / tenant_id
    (tenant_dir / "events").mkdir(parents=True)
    (tenant_dir / "events" / "data.mdb").write_bytes(b"door code 4471")
    assert erase_tenant_dir(tmp_path, tenant_id) is True
    assert not tenant_dir.exists()
    assert list(tmp_path.iterdir()) == []
    assert erase_tenant_dir(tmp_path, tenant_id) is False


def test_erase_tenant_dir_never_follows_symlinks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    linked = str(uuid.uuid4())
    os.symlink(outside, data / linked)
    assert erase_tenant_dir(data, linked) is True
    assert (outside / "precious").read_text() == "keep me"
    assert not os.path.lexists(data / linked)
    nested = str(uuid.uuid4())
    (data / nested).mkdir()
    os.symlink(outside, data / nested / "escape")
    assert erase_tenant_dir(data, nested) is True
    assert (outside / "precious").read_text() == "keep me"


@pytest.mark.parametrize(
    "tenant_id",
    [
        "_control",
        "..",
        ".",
        "",
        "../outside",
        "0EAB439C-C963-4EF7-B9E1-05E02C8B3111",
        "bb7f097e-eda2-11f1-8e2d-02fc00000001",
    ],
)
def test_erase_tenant_dir_refuses_anything_but_a_tenant_id(tmp_path: Path, tenant_id: str) -> None:
    ControlDB.init(tmp_path / "data", actor="test")
    (tmp_path / "outside").mkdir()
    with pytest.raises(InvalidRequest):
        erase_tenant_dir(tmp_path / "data", tenant_id)
    assert ControlDB.exists(tmp_path / "data") and (tmp_path / "outside").is_dir()


# -- tenants and keys made before routes existed (LMDB) ----------------------------------------


def test_a_tenant_from_before_routes_gets_one_with_its_next_key(tmp_path: Path) -> None:
    """A record written by the previous version (no route) and its random key id keep
    working; the tenant's next key starts with a route it keeps from then on."""
    from memspine.verifier import KeyVerifier

    with ControlDB.open(tmp_path, create=True, actor="test", hasher=WEAK) as db:
        tenant = db.create_tenant("old", actor="test")
        legacy = keys.generate_key()  # a random 12-character id, as issued before routes
        record = {"tenant_id": tenant.tenant_id, "name": "old", "created_at": tenant.created_at}
        env = db._env
        with env.begin(write=True) as txn:  # the tenant as the previous version stored it
            txn.put(tenant.tenant_id.encode(), msgspec.msgpack.encode(record), db=db._tenants)
            key_row = {
                "key_id": legacy.key_id,
                "tenant_id": tenant.tenant_id,
                "name": "legacy",
                "scopes": ["read", "write"],
                "created_at": tenant.created_at,
                "secret_hash": keys.hash_secret(WEAK, legacy.secret),
            }
            txn.put(legacy.key_id.encode(), msgspec.msgpack.encode(key_row), db=db._keys)
            txn.put(f"{tenant.tenant_id}/{legacy.key_id}".encode(), b"", db=db._tenant_keys)
        assert (
            db.tenant_route(tenant.tenant_id) is None and db.get_tenant(tenant.tenant_id) == tenant
        )
        assert KeyVerifier(db).verify(legacy.token).tenant_id == tenant.tenant_id
        first = db.create_key(tenant.tenant_id, "new", actor="test")
        route = db.tenant_route(tenant.tenant_id)
        assert route is not None and first.key_id.startswith(route)
        second = db.create_key(tenant.tenant_id, "newer", actor="test")
        assert second.key_id.startswith(route) and db.tenant_route(tenant.tenant_id) == route
        assert db.get_tenant(tenant.tenant_id) == tenant
        assert KeyVerifier(db).verify(legacy.token).key_id == legacy.key_id
