"""memspine.client's retries: against the app in process where the server's own refusals can be
made to happen (every tenant slot held: 503; an Idempotency-Key in flight: 409; a key id backing
off: 429), and the policy itself on httpx's own errors and answers (tests/e2e/test_client_e2e.py:
a connection that really drops after the server stored the event)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from memspine.client import (
    APIError,
    Conflict,
    ConnectionFailed,
    Memspine,
    Retry,
    Unavailable,
)
from memspine.client.retry import Attempts
from memspine_admin import keys
from memspine_admin.control import ControlDB
from tests.support.servers import AppTransport, InProcessServer, cheap_hasher

RETRIED = "sending again in"


def client(server: InProcessServer, token: str, **kw: object) -> Memspine:
    assert server.runner is not None
    return Memspine(server.url, token, transport=AppTransport(server.runner, server.port), **kw)  # type: ignore[arg-type]


def retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if RETRIED in r.getMessage()]


@pytest.fixture
def crowded(start_server: object, tmp_path: Path) -> Iterator[InProcessServer]:
    """A server with two tenant slots, both held as by two requests in flight."""
    server: InProcessServer = start_server({"MEMSPINE_MAX_OPEN_TENANTS": "2"})  # type: ignore[operator]
    assert server.app is not None
    manager = server.app.state.engine.manager
    held = [manager.lease("busy1"), manager.lease("busy2")]
    for lease in held:
        lease.wait()
    server.held = held  # type: ignore[attr-defined]
    yield server
    for lease in held:
        lease.release()


def test_503_is_sent_again_after_retry_after_and_stores_once(
    crowded: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "memspine.client")
    threading.Timer(0.3, crowded.held[0].release).start()  # type: ignore[attr-defined]
    started = time.monotonic()
    with client(crowded, "third") as c:
        made = c.append("turn", "arrives once the slot is free")
        assert time.monotonic() - started >= 1.0  # Retry-After: 1, honoured
        assert not made.replayed
        assert [e.event_id for e in c.iter_events()] == [made.event_id]
    [line] = retries(caplog)
    assert "POST /v1/memory/event: 503 unavailable" in line


def test_503_beyond_the_attempts_is_raised_with_its_retry_after(
    crowded: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "memspine.client")
    with client(crowded, "third", retry=Retry(attempts=2)) as c, pytest.raises(Unavailable) as e:
        c.append("turn", "no room")  # a read of a tenant with no files needs no slot
    assert (e.value.status, e.value.retry_after) == (503, 1.0)
    assert "every open tenant slot has a request in flight" in e.value.detail
    assert len(retries(caplog)) == 1  # two sends in all


@pytest.mark.timing
def test_a_wait_longer_than_max_wait_is_raised_at_once(crowded: InProcessServer) -> None:
    started = time.monotonic()
    with client(crowded, "third", retry=Retry(max_wait=0.5)) as c, pytest.raises(Unavailable):
        c.append("turn", "x")
    assert time.monotonic() - started < 0.5


def test_409_of_a_key_in_flight_is_waited_out(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same Idempotency-Key still being written (by another process's first try, say)."""
    caplog.set_level(logging.INFO, "memspine.client")
    assert server.app is not None
    lease = server.app.state.engine.manager.lease("keyed")
    tenant = lease.wait()
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "memspine:keyed")
    in_flight = {str(uuid.uuid5(namespace, "fact-1"))}
    tenant._hold_keys(in_flight)  # as submit_append holds it while a first request is written
    threading.Timer(0.3, tenant._release_keys, [in_flight]).start()
    try:
        with client(server, "keyed") as c:
            made = c.append("fact", "written once", idempotency_key="fact-1")
            assert made.event_id in in_flight
            assert [e.text for e in c.iter_events()] == ["written once"]
    finally:
        lease.release()
    [line] = retries(caplog)
    assert "409 conflict" in line


def test_429_of_a_key_id_backing_off_is_waited_out(
    start_server: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "memspine.client")
    data_dir = tmp_path / "data"
    with ControlDB.open(data_dir, create=True, hasher=cheap_hasher()) as db:
        tenant = db.create_tenant("acme", actor="test").tenant_id
        key = db.create_key(tenant, "agent", ("read", "write"), actor="test").api_key
    server: InProcessServer = start_server(hasher=cheap_hasher())  # type: ignore[operator]
    parsed = keys.parse_token(key)
    assert parsed is not None

    def fail(times: int) -> list[int]:
        """Well-formed keys of this key id with wrong secrets: failed attempts of the key id."""
        wrong = [keys.format_token(parsed.key_id, keys.random_base62(32)) for _ in range(times)]
        with server.client() as raw:
            auth = [{"Authorization": f"Bearer {w}"} for w in wrong]
            return [raw.get("/v1/whoami", headers=h).status_code for h in auth]

    assert fail(5) == [401] * 5  # the fifth failure in a row starts a back-off of 1 s
    started = time.monotonic()
    with client(server, key) as c:
        assert c.whoami().tenant_id == tenant
    assert time.monotonic() - started >= 0.9
    assert any("429 too_many_requests" in line for line in retries(caplog))


# -- the policy on httpx's own errors and answers ----------------------------------------------

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/memory/event")


def answer(status: int, body: bytes, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, content=body, request=REQUEST)


def attempts(*, resend: bool, on_conflict: bool = False, tries: int = 3) -> Attempts:
    return Attempts(
        Retry(attempts=tries, backoff=0.01), "POST", "/x", resend=resend, on_conflict=on_conflict
    )


def test_a_request_that_never_left_is_always_sent_again() -> None:
    once = attempts(resend=False)
    assert once.failed(httpx.ConnectError("refused", request=REQUEST)) <= 0.01
    assert once.failed(httpx.ConnectTimeout("slow", request=REQUEST)) <= 0.02
    with pytest.raises(ConnectionFailed, match="after 3 attempts: refused") as caught:
        once.failed(httpx.ConnectError("refused", request=REQUEST))
    assert caught.value.attempts == 3


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadError("reset"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadTimeout("timed out"),
    ],
)
def test_a_request_that_may_have_been_served_is_resent_only_if_that_is_safe(
    exc: httpx.TransportError,
) -> None:
    with pytest.raises(ConnectionFailed, match="may have been served") as caught:
        attempts(resend=False).failed(exc)  # a delete, a new key: a second copy is not the same
    assert caught.value.attempts == 1
    assert attempts(resend=True).failed(exc) >= 0  # a read, a keyed append: it is


def test_which_answers_are_retried() -> None:
    busy = b'{"error": "unavailable", "detail": "busy"}'
    assert attempts(resend=False).answered(answer(503, busy, **{"Retry-After": "2"})) == 2.0
    assert attempts(resend=False).answered(answer(503, b"<html>no backend</html>")) is not None
    assert attempts(resend=False).answered(answer(201, b"{}")) is None
    in_flight = b'{"error": "conflict", "detail": "still being written"}'
    assert attempts(resend=True, on_conflict=True).answered(answer(409, in_flight)) is not None
    with pytest.raises(Conflict):  # an admin 409 (a name in use) is an answer, not a wait
        attempts(resend=False).answered(answer(409, in_flight))
    assert attempts(resend=True).answered(answer(502, b"bad gateway")) is not None
    with pytest.raises(APIError) as caught:
        attempts(resend=False).answered(answer(502, b"bad gateway"))
    assert (caught.value.status, caught.value.code) == (502, "http_502")
    last = attempts(resend=True, tries=1)
    with pytest.raises(Unavailable) as refused:
        last.answered(answer(503, b"<html></html>", **{"Retry-After": "1"}))
    assert refused.value.retry_after == 1.0 and "HTTP 503" in refused.value.detail


def test_retry_after_as_an_http_date_and_the_growing_waits() -> None:
    from email.utils import formatdate

    when = formatdate(time.time() + 3, usegmt=True)
    busy = answer(
        429, b'{"error": "too_many_requests", "detail": "slow down"}', **{"Retry-After": when}
    )
    assert 1.5 < attempts(resend=True).answered(busy) <= 3.0  # type: ignore[operator]
    policy = Retry(attempts=10, backoff=0.1, max_wait=0.4)
    waits = [policy.wait(n, None) for n in range(1, 8)]
    assert all(0.05 <= w <= 0.4 for w in waits) and max(waits[4:]) > 0.1
    assert policy.wait(1, 0.3) >= 0.3  # never sooner than the server asked
    with pytest.raises(ValueError):
        Retry(attempts=0)
