"""Reading a whole request body from ASGI, bounded by MEMSPINE_MAX_BODY_BYTES."""

from __future__ import annotations

from typing import cast

from litestar.types import Receive

from memspine.errors import HTTP_CODES
from storage.errors import PayloadTooLarge

TOO_LARGE = HTTP_CODES[413][1]


class ClientGone(Exception):
    """The client disconnected before its body arrived: there is no one to answer."""


async def read_body(
    receive: Receive, limit: int, declared: bytes | str | None, too_large: str = TOO_LARGE
) -> bytes:
    """The whole request body, refused with 413 (detail: too_large) as soon as it is known to
    exceed limit."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(too_large)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = cast(bytes, message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(too_large)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
