"""API key format (`smk_live_<key id>_<secret><checksum>`) and argon2id hashing of the secret.

A key id issued now starts with its tenant's route (`ROUTE_LEN` characters), so a proxy can
pick the tenant's node from the token alone (deploy/haproxy/memspine.cfg); the rest is random.
Key ids issued before routes existed are random throughout and keep working everywhere.
"""

from __future__ import annotations

import re
import secrets
import zlib
from typing import NamedTuple

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from storage.errors import InvalidRequest

PREFIX = "smk_live_"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
KEY_ID_LEN = 12  # ~71 bits: ids only need to be unique, they are not secret
ROUTE_LEN = 6  # a tenant's route: the first characters of its key ids (62**6 routes)
SECRET_LEN = 32  # ~190 bits of entropy, well above the 128 the issue asks for
CHECKSUM_LEN = 6  # 62**6 > 2**32, so every CRC32 value has its own 6 characters
TOKEN_LEN = len(PREFIX) + KEY_ID_LEN + 1 + SECRET_LEN + CHECKSUM_LEN
MAX_TOKEN_LEN = 256  # anything longer is refused before it is even matched

_B62 = "[0-9A-Za-z]"
# Secret scanners can use this pattern, then confirm a hit offline with `checksum`.
TOKEN_PATTERN = re.compile(
    rf"smk_live_({_B62}{{{KEY_ID_LEN}}})_({_B62}{{{SECRET_LEN}}})({_B62}{{{CHECKSUM_LEN}}})"
)
_KEY_ID_RE = re.compile(rf"{_B62}{{{KEY_ID_LEN}}}")
_ROUTE_RE = re.compile(rf"{_B62}{{{ROUTE_LEN}}}")


class ParsedKey(NamedTuple):
    """The two parts of a well-formed token; the secret must never be logged."""

    key_id: str
    secret: str


class GeneratedKey(NamedTuple):
    """A freshly generated key: its id, its secret and the full token shown once."""

    key_id: str
    secret: str
    token: str


def random_base62(length: int) -> str:
    """Return `length` characters drawn uniformly from the base62 alphabet."""
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def checksum(body: str) -> str:
    """Return the 6-character base62 CRC32 of `body` (the token without its checksum)."""
    value = zlib.crc32(body.encode("ascii"))
    out = []
    for _ in range(CHECKSUM_LEN):
        value, digit = divmod(value, 62)
        out.append(ALPHABET[digit])
    return "".join(reversed(out))


def format_token(key_id: str, secret: str) -> str:
    """Assemble the token for a key id and secret, checksum included."""
    body = f"{PREFIX}{key_id}_{secret}"
    return body + checksum(body)


def new_route() -> str:
    """A fresh random tenant route (`ROUTE_LEN` base62 characters)."""
    return random_base62(ROUTE_LEN)


def is_route(value: object) -> bool:
    """True if `value` has the shape of a tenant route."""
    return isinstance(value, str) and _ROUTE_RE.fullmatch(value) is not None


def route_of(key_id: str) -> str:
    """The route part of a key id: its first `ROUTE_LEN` characters (random in a legacy id)."""
    return key_id[:ROUTE_LEN]


def _key_id(route: str | None) -> str:
    if route is None:
        return random_base62(KEY_ID_LEN)
    if not is_route(route):
        raise ValueError("not a tenant route")
    return route + random_base62(KEY_ID_LEN - ROUTE_LEN)


def generate_key(route: str | None = None) -> GeneratedKey:
    """Generate a new key id (starting with `route` if given) and a random secret."""
    key_id = _key_id(route)
    secret = random_base62(SECRET_LEN)
    return GeneratedKey(key_id, secret, format_token(key_id, secret))


def with_new_key_id(key: GeneratedKey, route: str | None = None) -> GeneratedKey:
    """Return the same secret under a fresh key id with the same route (after an id collision)."""
    key_id = _key_id(route)
    return GeneratedKey(key_id, key.secret, format_token(key_id, key.secret))


def is_key_id(value: object) -> bool:
    """True if `value` has the shape of a key id."""
    return isinstance(value, str) and _KEY_ID_RE.fullmatch(value) is not None


def parse_token(token: object) -> ParsedKey | None:
    """Split a token into key id and secret, or None if it is not a well-formed key.

    Pure string work: no database read and no argon2 run, so junk costs nothing.
    """
    if not isinstance(token, str) or len(token) != TOKEN_LEN or not token.isascii():
        return None
    match = TOKEN_PATTERN.fullmatch(token)
    if match is None:
        return None
    key_id, secret, check = match.groups()
    body = token[:-CHECKSUM_LEN]
    if not secrets.compare_digest(checksum(body), check):
        return None
    return ParsedKey(key_id, secret)


def key_id_from(value: str) -> str:
    """The key id in what an operator typed: the bare id or `smk_live_<id>` as listings show it.

    A whole token is refused: its id is in it, but a secret does not belong on a command line
    or in a URL (shell history, access logs).
    """
    text = value.strip()
    if parse_token(text) is not None:
        raise InvalidRequest(
            "that is a whole api key; give its id (smk_live_<id>, as key list shows it)"
        )
    return text[len(PREFIX) :] if text.startswith(PREFIX) else text


def key_prefix(key_id: str) -> str:
    """The public, non-secret start of a key, for display: `smk_live_<key id>`."""
    return f"{PREFIX}{key_id}"


def default_hasher() -> PasswordHasher:
    """argon2-cffi's defaults: argon2id with the RFC 9106 low-memory profile."""
    return PasswordHasher()


def hash_secret(hasher: PasswordHasher, secret: str) -> str:
    """Return the argon2id PHC string for a secret (salted; never contains the secret)."""
    return hasher.hash(secret)


def verify_secret(hasher: PasswordHasher, secret_hash: str, secret: str) -> bool:
    """True if `secret` matches `secret_hash`; a damaged hash counts as a mismatch."""
    try:
        return hasher.verify(secret_hash, secret)
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(hasher: PasswordHasher, secret_hash: str) -> bool:
    """True if the stored hash was made with other parameters than `hasher` uses."""
    try:
        return hasher.check_needs_rehash(secret_hash)
    except (InvalidHashError, ValueError):
        return False
