"""One socket write per response: the head of an answer waits for its body's first bytes
(within the same turn of the event loop).

uvicorn writes a response's status line and headers in one `transport.write` and its body in
another. uvloop makes each write a `write(2)` on the socket while holding the interpreter lock,
and on loopback that call runs the receiver's side of TCP and wakes the client, which under
load can take the core before the call returns (bench/RESULTS.md, "Recall at 10,000 and
100,000 events", for what it costs). Joined, a response costs one call and one wake-up, and
the client never reads a head without its body.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class HeldTransport:
    """A cycle's transport that can hold one write (the head) to send it with the next."""

    __slots__ = ("held", "holding", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.holding = False  # the next write is a head to hold
        self.held: bytes | None = None

    def write(self, data: bytes) -> None:
        """Hold the head; send anything else, after the head if one is held."""
        if self.holding:
            self.holding = False
            self.held = data
            # Never held past this turn of the loop: a streamed answer (an MCP event stream, an
            # export) whose first bytes come later still gets its head at once.
            asyncio.get_running_loop().call_soon(self.flush)
            return
        if self.held is not None:
            data, self.held = self.held + data, None
        self.transport.write(data)

    def flush(self) -> None:
        """Send a held head that no body write followed."""
        if self.held is not None:
            data, self.held = self.held, None
            self.transport.write(data)

    def close(self) -> None:
        """Close after sending what is held (the app failed mid-answer: the client sees a
        cut response either way, but its head first)."""
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        """Whether the connection is closing."""
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        """Anything else a cycle asks of its transport, from the transport."""
        return getattr(self.transport, name)


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, its head sent with the body's first write."""

    transport: HeldTransport  # type: ignore[assignment]

    async def send(self, message: Any) -> None:
        """As uvicorn sends it, but the head waits for the next write; a response that writes
        no body (HEAD) sends its head when it completes."""
        if not self.response_started:
            self.transport.holding = True
        try:
            await super().send(message)
        finally:
            self.transport.holding = False
            if self.response_complete or not self.response_started:
                self.transport.flush()


def one_write(cycle: RequestResponseCycle) -> None:
    """Make a cycle uvicorn just built send each head with its body (memspine/connguard.py).

    The class is swapped in place: uvicorn builds the cycle by name inside its parser callback,
    and its task has not started yet, so the cycle's first send already uses this one.
    """
    if isinstance(cycle, OneWriteCycle):
        return
    cycle.__class__ = OneWriteCycle
    cycle.transport = HeldTransport(cycle.transport)  # type: ignore[assignment]
