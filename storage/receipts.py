"""Receipts: what an erasure by subject or a retention run did, signed by the server (Ed25519),
kept per tenant under the data directory, and checked by `memspine-admin receipt verify`
(docs/erasure.md, "The receipt"). Each kind names itself in its `type` field.

The signing key is made in DATA_DIR/_receipts/ on first use (mode 0600; `_` keeps the
directory out of every tenant listing). A receipt file is the signed envelope: the receipt,
the signature of its canonical JSON (keys sorted, no spaces) and the public key that made it.
A receipt holds ids, counts, times and SHA-256 digests, never a subject or an identifier in
clear, never any erased text.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import time
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from storage.errors import NotFound
from storage.fsync import fsync_dir, fsync_file, replace_durably

DIR = "_receipts"
KEY_FILE = "signing.ed25519"  # the private key's 32 raw bytes
ALGORITHM = "Ed25519"
NO_RECEIPT = "no receipt with that id"


class Found(msgspec.Struct, frozen=True):
    """Where a scan found one needle after the purge: files (or log databases); [] for nowhere."""

    sha256: str  # of the identifier; for an event id, the id itself (ids are not personal)
    found_in: list[str]


class Copy(msgspec.Struct, frozen=True):
    """A copy of the tenant memspine knows of, taken before the erasure (it may hold the events)."""

    kind: str  # "backup" or "export"
    at: int  # microseconds since the epoch
    where: str | None = None  # the backup's directory, if known


class Receipt(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="erasure"):
    """What one erasure by subject did."""

    receipt_id: str
    request_id: str
    tenant_id: str
    subject_sha256: str
    identifiers_sha256: list[str]
    key_id: str  # the API key that asked ("admin" for the admin key)
    started_at: int
    completed_at: int
    event_ids: list[str]
    counts: dict[str, int]  # events by reason: subject, derived, identifier
    stores_purged: list[str]
    scan_identifiers: list[Found]
    scan_event_ids: list[Found]
    clean: bool  # the scan found no identifier and no event id anywhere
    copies_before: list[Copy]


class RunReceipt(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="retention"):
    """What one retention run did to a tenant: when, under which windows, the ids it deleted,
    how many due events holds kept, how many deleted events' bytes its purge removed (and
    whether that purge is still pending)."""

    receipt_id: str
    tenant_id: str
    started_at: int
    finished_at: int
    windows: dict[str, int]
    deleted: int
    deleted_ids: list[str]
    held: int
    purged: int
    purge_pending: bool = False


AnyReceipt = Receipt | RunReceipt
RUNS = "runs.txt"  # the ids of the tenant's retention receipts, newest first
KEEP_RUNS = 100  # retention receipts kept per tenant, newest (erasure receipts are all kept)


class Signed(msgspec.Struct, frozen=True):
    """A receipt file: the receipt, its signature and the public key (base64) that verifies it."""

    receipt: AnyReceipt
    algorithm: str
    public_key: str
    signature: str


class PublicKey(msgspec.Struct, frozen=True):
    """GET /v1/receipts/key."""

    algorithm: str
    public_key: str  # base64 of the 32 raw bytes
    key_id: str  # the first 16 hex digits of its SHA-256


def digest(text: str) -> str:
    """SHA-256 of a string's UTF-8 bytes, in hex."""
    return hashlib.sha256(text.encode()).hexdigest()


def canonical(receipt: AnyReceipt) -> bytes:
    """The bytes a signature covers: the receipt's JSON, keys sorted."""
    return msgspec.json.encode(msgspec.to_builtins(receipt), order="sorted")


def signing_key(data_dir: Path) -> Ed25519PrivateKey:
    """The server's receipt key, made on first use (0600, durable; a race makes one)."""
    folder = data_dir / DIR
    path = folder / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return Ed25519PrivateKey.from_private_bytes(path.read_bytes())
    folder.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    tmp = folder / f".{KEY_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key.private_bytes_raw())
    finally:
        os.close(fd)
    fsync_file(tmp)
    try:
        os.link(tmp, path)  # never replaces a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    fsync_dir(folder)
    return Ed25519PrivateKey.from_private_bytes(path.read_bytes())


def public_key(data_dir: Path) -> PublicKey:
    """The public half of the server's receipt key."""
    raw = signing_key(data_dir).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return PublicKey(
        ALGORITHM, base64.b64encode(raw).decode(), hashlib.sha256(raw).hexdigest()[:16]
    )


def sign(data_dir: Path, receipt: AnyReceipt) -> Signed:
    """The receipt signed with the server's key."""
    key = signing_key(data_dir)
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    signature = key.sign(canonical(receipt))
    return Signed(
        receipt, ALGORITHM, base64.b64encode(raw).decode(), base64.b64encode(signature).decode()
    )


def verify(body: bytes, trusted: bytes | None = None) -> AnyReceipt | None:
    """The receipt a file holds if its signature is good (and made by `trusted`, the raw public
    key, when given); None for anything else: a changed byte, another key, not a receipt."""
    try:
        signed = msgspec.json.decode(body, type=Signed)
        raw = base64.b64decode(signed.public_key, validate=True)
        signature = base64.b64decode(signed.signature, validate=True)
        if signed.algorithm != ALGORITHM or (trusted is not None and raw != trusted):
            return None
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, canonical(signed.receipt))
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, InvalidSignature):
        return None
    # The bytes must be what the server wrote: a file re-encoded around the same receipt (a
    # field reordered, a space added) is not the one the server handed over.
    return signed.receipt if msgspec.json.encode(signed) == body.rstrip(b"\n") else None


def store(data_dir: Path, signed: Signed) -> bytes:
    """Keep a signed receipt under its tenant (durable before the erasure or the run answers);
    its bytes. Past KEEP_RUNS retention receipts, the oldest go."""
    folder = data_dir / DIR / signed.receipt.tenant_id
    folder.mkdir(parents=True, exist_ok=True)
    body = msgspec.json.encode(signed)
    replace_durably(folder / f"{signed.receipt.receipt_id}.json", lambda f: f.write(body))
    if isinstance(signed.receipt, RunReceipt):
        new = signed.receipt.receipt_id
        runs = [new, *(i for i in _run_ids(data_dir, signed.receipt.tenant_id) if i != new)]
        kept = "".join(f"{i}\n" for i in runs[:KEEP_RUNS]).encode()
        replace_durably(folder / RUNS, lambda f: f.write(kept))
        for old in runs[KEEP_RUNS:]:
            (folder / f"{old}.json").unlink(missing_ok=True)
        fsync_dir(folder)
    return body


def _run_ids(data_dir: Path, tenant_id: str) -> list[str]:
    """The tenant's retention receipts' ids, newest first: from its list of runs, or (a data
    directory without one: older, or restored) from decoding every receipt once."""
    try:
        ids = (data_dir / DIR / tenant_id / RUNS).read_text().split()
    except (FileNotFoundError, UnicodeDecodeError):
        ids = None
    if ids is not None and all(_plain_id(i) for i in ids):
        return ids
    return [r.receipt_id for r in listing(data_dir, tenant_id) if isinstance(r, RunReceipt)]


def load(data_dir: Path, tenant_id: str, receipt_id: str) -> bytes:
    """The bytes of one of the tenant's receipts, as stored (NotFound if none)."""
    if not _plain_id(receipt_id):
        raise NotFound(NO_RECEIPT)
    try:
        return (data_dir / DIR / tenant_id / f"{receipt_id}.json").read_bytes()
    except FileNotFoundError:
        raise NotFound(NO_RECEIPT) from None


def listing(data_dir: Path, tenant_id: str) -> list[AnyReceipt]:
    """The tenant's receipts of both kinds, newest first."""
    folder = data_dir / DIR / tenant_id
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in folder.glob("*.json"):
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                found.append(msgspec.json.decode(path.read_bytes(), type=Signed).receipt)
    return sorted(found, key=lambda r: (finished(r), r.receipt_id), reverse=True)


def finished(receipt: AnyReceipt) -> int:
    """When the erasure or the run the receipt tells of ended (microseconds since the epoch)."""
    return receipt.completed_at if isinstance(receipt, Receipt) else receipt.finished_at


def last_run(data_dir: Path, tenant_id: str) -> RunReceipt | None:
    """The tenant's newest retention receipt, or None (read through the list of runs: a tenant
    may hold thousands of erasure receipts, and the retention page asks on every view)."""
    for receipt_id in _run_ids(data_dir, tenant_id):
        with contextlib.suppress(NotFound, msgspec.DecodeError, msgspec.ValidationError):
            found = msgspec.json.decode(load(data_dir, tenant_id, receipt_id), type=Signed).receipt
            if isinstance(found, RunReceipt):
                return found
    return None


def _plain_id(value: str) -> bool:
    """Whether a receipt id is one this server makes (32 hex digits): never a path."""
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


# -- copies memspine made of tenants: what a receipt lists as possibly still holding events ----

COPIES = "copies.ndjson"


class CopyRecord(msgspec.Struct, frozen=True):
    """One line of the record of copies: a tenant's export served, or a backup of them all."""

    kind: str  # "export" or "backup"
    at: int
    tenant_id: str | None = None  # None: every tenant (a backup)
    where: str | None = None


def record_copy(data_dir: Path, kind: str, tenant_id: str | None, where: str | None = None) -> None:
    """Note a copy made now (one appended line, synced; a failure to note it never fails the copy)."""
    line = msgspec.json.encode(CopyRecord(kind, time.time_ns() // 1000, tenant_id, where)) + b"\n"
    if not data_dir.is_dir():
        return
    try:
        (data_dir / DIR).mkdir(exist_ok=True)
        fd = os.open(data_dir / DIR / COPIES, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        fsync_file(data_dir / DIR / COPIES)
    except OSError:
        pass


def copies_before(data_dir: Path, tenant_id: str, before: int) -> list[Copy]:
    """The copies of this tenant memspine made before `before` (µs), oldest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for line in (data_dir / DIR / COPIES).read_bytes().splitlines():
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                rec = msgspec.json.decode(line, type=CopyRecord)
                if rec.at < before and rec.tenant_id in (None, tenant_id):
                    found.append(Copy(rec.kind, rec.at, rec.where))
    return found
