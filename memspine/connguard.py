"""Connection caps and read timeouts, in a subclass of uvicorn's httptools protocol.

uvicorn bounds neither the time a client may take to send its request headers or body nor
the connections one client may hold; each idle half-request holds a file descriptor, so a
few hundred of them could take the server off the network. Here:

- a connection over MEMSPINE_MAX_CONNECTIONS, or over MEMSPINE_MAX_CONNECTIONS_PER_CLIENT
  from one address, is answered 503 and closed as soon as it is accepted, before it costs
  anything more;
- request headers must be complete within MEMSPINE_HEADER_TIMEOUT_SECS of the connection
  (or of the request's first byte on a kept-alive one) and at most MAX_HEADER_BYTES long,
  or the answer is 408 / 431 and the connection closes;
- the body must be complete within MEMSPINE_BODY_TIMEOUT_SECS of the headers: the route
  reading it then answers 408 through memspine/edge.py (BODY_TIMED_OUT in the scope), and
  a body nobody is reading any more is cut off.

Each answer's head and body leave in one socket write (memspine/wire.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum
from typing import Any, ClassVar, cast

import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr
from uvicorn.server import ServerState

from memspine.config import Settings
from memspine.edge import BODY_TIMED_OUT
from memspine.wire import one_write

log = logging.getLogger("memspine.connections")

MAX_HEADER_BYTES = 64 << 10
# After a body deadline the route has this long to answer 408 before the connection is cut.
ANSWER_GRACE_SECS = 1.0
LINGER_SECS = 2.0  # how long a refused request's connection waits for the client to close
REFUSAL_LOG_SECS = 10.0  # at most one warning per period, however many connections are refused


def _raw_response(status: str, code: str, detail: str, extra: bytes = b"") -> bytes:
    """A complete HTTP/1.1 error response in the API's shape that closes the connection."""
    body = msgspec.json.encode({"error": code, "detail": detail})
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    ).encode()
    return head + extra + b"\r\n" + body


BUSY = _raw_response(
    "503 Service Unavailable",
    "unavailable",
    "too many connections from this address or in all; retry shortly",
    b"retry-after: 1\r\n",
)
HEADERS_LATE = _raw_response(
    "408 Request Timeout",
    "request_timeout",
    "the request headers did not arrive within MEMSPINE_HEADER_TIMEOUT_SECS",
)
HEADERS_TOO_LONG = _raw_response(
    "431 Request Header Fields Too Large",
    "invalid_request",
    f"the request line and headers may be at most {MAX_HEADER_BYTES} bytes",
)


class Phase(Enum):
    """Where the parser is in the current request."""

    IDLE = 0  # between requests of a kept-alive connection: uvicorn's keep-alive timeout runs
    HEADERS = 1
    BODY = 2
    DONE = 3  # the request has arrived; the route is answering


class Tally:
    """The connections open now, in all and by client address, shared by every protocol."""

    def __init__(self, total: int, per_client: int) -> None:
        self.max_total = total
        self.max_per_client = per_client
        self.total = 0
        self.by_client: dict[str, int] = {}
        self.refused = 0
        self._logged_at = 0.0

    def admit(self, client: str) -> bool:
        """Count a new connection in, or say it is over a cap."""
        held = self.by_client.get(client, 0)
        if self.total >= self.max_total or held >= self.max_per_client:
            self._note_refusal()
            return False
        self.total += 1
        self.by_client[client] = held + 1
        return True

    def release(self, client: str) -> None:
        """Count a closed connection out."""
        self.total -= 1
        held = self.by_client[client] - 1
        if held:
            self.by_client[client] = held
        else:
            del self.by_client[client]

    def _note_refusal(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSAL_LOG_SECS:
            self._logged_at = now
            log.warning(
                "connections refused over the caps",
                extra={
                    "refused": self.refused,
                    "open": self.total,
                    "max_connections": self.max_total,
                    "max_connections_per_client": self.max_per_client,
                },
            )
            self.refused = 0


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the caps and timeouts of this module."""

    tally: ClassVar[Tally]
    header_timeout: ClassVar[float]
    body_timeout: ClassVar[float]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._client_key: str | None = None  # set once counted in the tally
        self._phase = Phase.HEADERS
        self._since = 0.0  # when the current phase began (loop time)
        self._header_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase: Phase | None = None
        self._grace = False
        self._lingering = False

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Admit the connection under the caps or answer 503 and close it; start the header clock."""
        peer = get_remote_addr(transport)
        client = peer[0] if peer else ""
        if not self.tally.admit(client):
            self.transport = transport
            transport.write(BUSY)
            transport.close()
            return
        self._client_key = client
        super().connection_made(transport)
        self._since = self.loop.time()
        self._arm(Phase.HEADERS, self._since + self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        """Count the connection out and drop its timer."""
        if self._client_key is None:
            return  # refused at connection_made: uvicorn never knew it
        self.tally.release(self._client_key)
        self._client_key = None
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser, bounding header bytes, then keep the deadline of the phase it is in."""
        if self._client_key is None or self._lingering:
            return  # refused, or answered and closing: nothing more is read
        if self._phase in (Phase.IDLE, Phase.HEADERS):
            # Counted to the end of the headers when this chunk holds it, and checked before
            # the parser sees them: headers that arrive whole in one chunk are held to the
            # bound too (the parser would have finished them before a check after it).
            end = data.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else end + 4
            if self._header_bytes > MAX_HEADER_BYTES:
                self._close_with(HEADERS_TOO_LONG)
                return
        super().data_received(data)
        if self.transport.is_closing():
            return
        self._keep_deadline()

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts: its headers' clock runs from now (or from the connection, if first)."""
        super().on_message_begin()
        if self._phase is Phase.IDLE or self._phase is Phase.DONE:
            self._phase = Phase.HEADERS
            self._since = self.loop.time()

    def on_headers_complete(self) -> None:
        """The headers are in: the body's clock starts; the new cycle writes once per answer."""
        existing = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not existing:
            one_write(self.cycle)
        self._phase = Phase.BODY
        self._since = self.loop.time()
        self._header_bytes = 0

    def on_message_complete(self) -> None:
        """The whole request is in: no read deadline until the next one."""
        super().on_message_complete()
        self._phase = Phase.DONE

    def on_response_complete(self) -> None:
        """The answer is sent: uvicorn's keep-alive timeout governs the idle connection."""
        super().on_response_complete()
        if self._phase is Phase.DONE:
            self._phase = Phase.IDLE
            self._header_bytes = 0

    # -- deadlines -------------------------------------------------------------------------

    def _keep_deadline(self) -> None:
        """One timer for the phase the parser is in; none while idle or answering."""
        phase = self._phase
        if phase is Phase.HEADERS and self._timer_phase is not Phase.HEADERS:
            self._arm(phase, self._since + self.header_timeout)
        elif phase is Phase.BODY and self._timer_phase is not Phase.BODY:
            self._arm(phase, self._since + self.body_timeout)
        elif phase in (Phase.IDLE, Phase.DONE) and self._timer is not None:
            self._disarm()

    def _arm(self, phase: Phase, when: float) -> None:
        self._disarm()
        self._timer = self.loop.call_at(when, self._deadline_passed)
        self._timer_phase = phase

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_phase = None
        self._grace = False

    def _deadline_passed(self) -> None:
        """The phase's deadline: 408 for late headers; for a late body, 408 from the route."""
        phase, grace = self._timer_phase, self._grace
        self._timer = None
        self._timer_phase = None
        self._grace = False
        if self.transport.is_closing() or phase is not self._phase:
            return
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete
        if phase is Phase.HEADERS:
            if answering:  # a pipelined request waits behind one being answered: not its fault
                self._arm(phase, self.loop.time() + self.header_timeout)
            else:
                self._close_with(HEADERS_LATE)
        elif phase is Phase.BODY:
            if cycle is None or not answering or grace:
                self.transport.close()  # nobody reads this body any more, or the route ignored it
                return
            # The route may be waiting on receive(): wake it, and edge.py answers 408.
            cast(dict[str, Any], self.scope)[BODY_TIMED_OUT] = True
            cycle.message_event.set()
            self._arm(phase, self.loop.time() + ANSWER_GRACE_SECS)
            self._grace = True

    def _close_with(self, response: bytes) -> None:
        """Answer, stop writing, and close once the client has read it (or after LINGER_SECS).

        Closing at once, with the client's bytes still arriving, would make the kernel reset
        the connection, and a reset can drop the answer before the client reads it. (The
        transport closes by itself when the client closes its side: uvicorn's eof_received.)
        """
        self._disarm()
        self._lingering = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_SECS, self.transport.close)


def guarded_protocol(settings: Settings) -> type[GuardedProtocol]:
    """The protocol class for uvicorn's `http=`, with its own tally and these settings."""
    attrs = {
        "tally": Tally(settings.max_connections, settings.max_connections_per_client),
        "header_timeout": settings.header_timeout_secs,
        "body_timeout": settings.body_timeout_secs,
    }
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), attrs)
