"""When a request is sent again, and after how long: one policy for the sync and async clients.

A request is sent again only when doing so cannot store anything twice:

- the connection failed before the request left (refused, connect timeout): always;
- the connection broke after it left (reset, closed before the answer, read timeout), or a
  gateway said 502 or 504: only for requests the server treats as the same request when they
  come twice (reads, and appends, which always carry an Idempotency-Key);
- 429 and 503: always; the server did nothing, and `Retry-After` says when to come back;
- 409 `conflict`: only for appends, where it means the same Idempotency-Key is still being
  written (the retry then gets the first answer).

Waits grow exponentially with jitter from `backoff`, are never shorter than the answer's
`Retry-After`, and an answer asking for more than `max_wait` is raised at once rather than
waited out. At most `attempts` sends in all.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx

from memspine.client.errors import APIError, ConnectionFailed, error_from
from memspine.client.routes import Call

log = logging.getLogger("memspine.client")

# httpx's errors raised before any byte of the request could reach the server.
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Raised once the request may have arrived: the server may have acted on it.
MAYBE_SENT = (
    httpx.ReadError,
    httpx.WriteError,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.RemoteProtocolError,
    httpx.CloseError,
)
ALWAYS = frozenset({429, 503})
IF_RESENDABLE = frozenset({502, 504})


@dataclass(frozen=True)
class Retry:
    """How many times to send a request in all, and how long to wait between sends (seconds)."""

    attempts: int = 5
    backoff: float = 0.25
    max_wait: float = 30.0

    def __post_init__(self) -> None:
        """Refuse a policy that could never send or never stop."""
        if self.attempts < 1 or self.backoff < 0 or self.max_wait < 0:
            raise ValueError("attempts must be at least 1, backoff and max_wait at least 0")

    def wait(self, attempt: int, asked: float | None) -> float:
        """The wait before send number `attempt + 1`: exponential with jitter, at least `asked`."""
        grown = min(self.max_wait, self.backoff * 2.0 ** (attempt - 1))
        return max(asked or 0.0, grown * random.uniform(0.5, 1.0))


NEVER = Retry(attempts=1)


class Attempts:
    """One request's sends: each outcome in, the wait before the next send (or a raise) out."""

    def __init__(self, policy: Retry, method: str, url: str, *, resend: bool, on_conflict: bool):
        self.policy = policy
        self.label = f"{method} {url}"
        self.resend = resend  # the server takes a second copy as the same request
        self.on_conflict = on_conflict  # 409 means "the same key is still being written"
        self.count = 0

    @classmethod
    def of(cls, policy: Retry, call: Call[Any]) -> Attempts:
        """The sends of one call under a policy."""
        return cls(policy, call.method, call.path, resend=call.resend, on_conflict=call.on_conflict)

    def failed(self, exc: httpx.TransportError) -> float:
        """The connection failed: the wait before sending again, or ConnectionFailed."""
        self.count += 1
        why = str(exc) or type(exc).__name__
        safe = isinstance(exc, UNSENT) or (self.resend and isinstance(exc, MAYBE_SENT))
        if not safe or self.count >= self.policy.attempts:
            sent = " (the request may have been served)" if isinstance(exc, MAYBE_SENT) else ""
            raise ConnectionFailed(
                f"no answer to {self.label} after {self.count} attempt"
                f"{'s' if self.count > 1 else ''}: {why}{sent}",
                attempts=self.count,
            ) from exc
        return self._next(None, why)

    def answered(self, response: httpx.Response) -> float | None:
        """An answer: None when it is the one to return, else the wait before sending again.

        An error answer that is not retried is raised as its APIError.
        """
        self.count += 1
        status = response.status_code
        if status < 400:
            return None
        error = error_from(status, response.headers, response.content)
        retried = (
            status in ALWAYS
            or (status in IF_RESENDABLE and self.resend)
            or (status == 409 and self.on_conflict and error.code == "conflict")
        )
        if not retried or self.count >= self.policy.attempts:
            raise error
        if error.retry_after is not None and error.retry_after > self.policy.max_wait:
            raise error  # waiting that long is the caller's decision, not a library's
        return self._next(error, f"{status} {error.code}")

    def _next(self, error: APIError | None, why: str) -> float:
        wait = self.policy.wait(self.count, error.retry_after if error is not None else None)
        log.info("memspine client: %s: %s; sending again in %.2f s", self.label, why, wait)
        return wait
