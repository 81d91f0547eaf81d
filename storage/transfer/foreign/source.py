"""Reading another server's file: gzip and tar unwrapped, JSON decoded with the position of
whatever is wrong, so a damaged or truncated file is refused before anything is written."""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zlib
from typing import Any, TypeVar

import msgspec

from storage.errors import InvalidRequest

T = TypeVar("T")
GZIP_MAGIC = b"\x1f\x8b"
_BYTE = re.compile(r"\(byte (\d+)\)")


def gunzip(raw: bytes, name: str) -> bytes:
    """The bytes, unzipped if they are gzip; a truncated or damaged stream is refused."""
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except EOFError:
        raise InvalidRequest(
            f"{name}: the gzip stream ends early, after {len(raw)} compressed bytes (truncated)"
        ) from None
    except (OSError, zlib.error) as exc:
        raise InvalidRequest(f"{name}: not a readable gzip stream ({exc})") from None


def tar_members(raw: bytes, name: str) -> dict[str, bytes] | None:
    """The regular files of a tar archive by name, or None if raw is not one."""
    if len(raw) < 512 or raw[257:262] != b"ustar":
        return None
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if info.isfile():
                    data = tar.extractfile(info)
                    assert data is not None
                    members[info.name] = data.read()
                    if len(members[info.name]) != info.size:
                        raise tarfile.ReadError("unexpected end of data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InvalidRequest(f"{name}: the tar archive is damaged or truncated ({exc})") from None
    return members


def decode(raw: bytes, into: type[T], name: str) -> T:
    """JSON into the given type; a refusal names the place: the byte, line and column of a
    syntax error, the path of a value of the wrong type."""
    try:
        return msgspec.json.decode(raw, type=into)
    except msgspec.ValidationError as exc:
        path = str(exc).replace("`$.", "`").replace("`$`", "the document")
        raise InvalidRequest(f"{name}: {path}") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"{name}: {_where(raw, str(exc))}") from None
    except RecursionError:
        raise InvalidRequest(f"{name}: JSON nested too deeply") from None


def _where(raw: bytes, message: str) -> str:
    """A decoder's message with its byte offset as a line and column too."""
    if "truncated" in message:
        line, col = _line_col(raw, len(raw))
        return f"the JSON ends early at byte {len(raw)} (line {line}, column {col}): truncated"
    found = _BYTE.search(message)
    if found is None:
        return message
    offset = int(found.group(1))
    line, col = _line_col(raw, offset)
    return f"{message} (line {line}, column {col})"


def _line_col(raw: bytes, offset: int) -> tuple[int, int]:
    """The 1-based line and column of a byte offset."""
    line = raw.count(b"\n", 0, offset) + 1
    return line, offset - (raw.rfind(b"\n", 0, offset) + 1) + 1


def text(value: Any, where: str) -> str | None:
    """A string field, or None; anything else is refused with its place."""
    if value is None or isinstance(value, str):
        return value
    raise InvalidRequest(f"{where}: expected a string, got {type(value).__name__}")


def number(value: Any, where: str) -> float | None:
    """A number field, or None."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise InvalidRequest(f"{where}: expected a number, got {type(value).__name__}")


def vector(value: Any, where: str) -> list[float] | None:
    """A list of finite numbers, or None."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < float("inf")
        for v in value
    ):
        raise InvalidRequest(f"{where}: expected a list of finite numbers")
    return [float(v) for v in value]
