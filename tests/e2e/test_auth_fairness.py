"""Fair shares under attack: argon2 slots and read threads per tenant, back-off per key id, equal
cost for every refusal, and local-mode tokens; a real server with the default argon2 profile."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from argon2 import PasswordHasher
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.auth import Authenticator
from memspine.config import Settings
from memspine.engine import ReadThreads
from memspine.shares import FairShares
from memspine.verifier import UNAUTHORIZED_DETAIL, KeyVerifier
from memspine_admin import keys
from memspine_admin.backoff import Backoff
from memspine_admin.control import ControlDB
from storage.errors import TooManyRequests, Unauthorized
from storage.model import NewEvent
from storage.tenants.tenant import Tenant
from tests.support import auth
from tests.support.servers import ServerProcess

# Bounds on time (floods, latency, timeouts): run alone, after the rest (see Makefile).
pytestmark = pytest.mark.timing

ADMIN_KEY = "fairness-admin-key-41c9d2"
FLOOD_CONNECTIONS = 100
# One argon2id run of the default profile takes 0.25 s on an idle 2-core machine and up to
# about 1 s on a busy one: a first use may wait for one run ahead of it and then pay its own.
COLD_BOUND_SECS = 4.0
# A warm key after a control change needs one row read, never an argon2 run.
WARM_BOUND_SECS = 1.0
CYPHER_TIMEOUT_MS = 5000
SLOW_QUERY = "MATCH (a), (b), (c), (d), (e) RETURN count(*)"


class Flood:
    """`conns` keep-alive connections in a thread of their own, each sending its next request as
    soon as the last one is answered; `statuses` counts the answers."""

    def __init__(self, port: int, request: Callable[[], bytes], conns: int) -> None:
        self.port = port
        self.request = request
        self.conns = conns
        self.statuses: Counter[int] = Counter()
        self._loop = asyncio.new_event_loop()
        self._main: asyncio.Task[Any] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        def stop() -> None:
            if self._main is not None:
                self._main.cancel()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        async def main() -> None:
            await asyncio.gather(*(self._connection() for _ in range(self.conns)))

        self._main = self._loop.create_task(main())
        try:
            self._loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        finally:
            self._loop.close()

    async def _connection(self) -> None:
        while True:
            try:
                # From an address of its own, as an attacker's host would be: the victim's
                # requests from 127.0.0.1 keep their own share of connections.
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(FLOOD_ADDRESS, 0)
                )
            except OSError:
                await asyncio.sleep(0.05)
                continue
            try:
                while True:
                    writer.write(self.request())
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    await reader.readexactly(length)
                    self.statuses[int(head[9:12])] += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):
                continue  # the server closed the connection: open another
            finally:
                writer.close()


FLOOD_ADDRESS = "127.0.0.2"


def whoami_request(port: int, token: str) -> bytes:
    """The raw bytes of GET /v1/whoami with a bearer token."""
    return (
        f"GET /v1/whoami HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    ).encode()


def wrong_secret(key_id: str) -> str:
    """A well-formed token for `key_id` with a random (wrong) secret."""
    return keys.format_token(key_id, keys.random_base62(keys.SECRET_LEN))


class Issued(auth.Issued):
    """The module's issued-key server, an admin client, its helpers and a timed request."""

    def timed(
        self, token: str, path: str = "/v1/whoami", timeout: float = 30
    ) -> tuple[float, httpx.Response]:
        """One request on a new connection: (seconds, response)."""
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=self.server.url, headers=auth, timeout=timeout) as client:
            start = time.perf_counter()
            r = client.get(path)
            return time.perf_counter() - start, r


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issued]:
    """One issued-key server (default argon2id profile) for the module."""
    data_dir = tmp_path_factory.mktemp("fairness") / "data"
    ControlDB.init(data_dir, actor="test")
    env = {"MEMSPINE_ADMIN_KEY": ADMIN_KEY, "MEMSPINE_CYPHER_TIMEOUT_MS": str(CYPHER_TIMEOUT_MS)}
    server = ServerProcess(data_dir, env).start()
    yield Issued(server, ADMIN_KEY)
    # The flooders' requests still queued would take their turns first: nothing here to keep.
    server.stop(signal.SIGKILL)


def _within(issued: Issued, token: str, bound: float, what: str) -> None:
    try:
        secs, r = issued.timed(token, timeout=bound * 2)
    except httpx.TimeoutException:
        pytest.fail(f"{what}: no answer within {bound * 2:.0f} s")
    assert r.status_code == 200, (what, r.text)
    assert secs < bound, f"{what} took {secs:.2f} s (bound {bound} s)"


def test_a_wrong_secret_flood_on_one_key_id_stalls_no_other_tenant(issued: Issued) -> None:
    a_tenant, b_tenant = issued.tenant("flood-a"), issued.tenant("flood-b")
    a_key = issued.key(a_tenant)
    b_first, b_warm = issued.key(b_tenant), issued.key(b_tenant)
    _within(issued, a_key["api_key"], 10, "A's key before the flood")
    _within(issued, b_warm["api_key"], 10, "B's key before the flood")
    port = issued.server.port
    wrong = [wrong_secret(a_key["key_id"]) for _ in range(500)]
    turn = iter(range(1 << 62))

    def request() -> bytes:
        return whoami_request(port, wrong[next(turn) % len(wrong)])

    with Flood(port, request, FLOOD_CONNECTIONS) as flood:
        time.sleep(1.0)  # every connection has a request queued or refused by now
        _within(issued, b_first["api_key"], COLD_BOUND_SECS, "B's new key, first use")
        # The owner's own warm key is never locked out by the flood on its key id.
        _within(issued, a_key["api_key"], WARM_BOUND_SECS, "A's warm key during the flood")
        issued.tenant("flood-control-change")  # moves the control database's generation
        _within(issued, b_warm["api_key"], WARM_BOUND_SECS, "B's warm key after a control change")
        _within(issued, a_key["api_key"], WARM_BOUND_SECS, "A's warm key after a control change")
        b_new = issued.key(b_tenant)
        _within(issued, b_new["api_key"], COLD_BOUND_SECS, "B's key made during the flood")
        seen = dict(flood.statuses)
    # 503: connections past the flooding client's share (MEMSPINE_MAX_CONNECTIONS_PER_CLIENT).
    assert seen and set(seen) <= {401, 429, 503}, seen
    assert seen.get(429, 0) > seen.get(401, 0), seen  # the back-off answers most of the flood


def test_unknown_key_ids_cannot_take_every_argon2_slot(issued: Issued) -> None:
    b_tenant = issued.tenant("unknown-b")
    b_first = issued.key(b_tenant)
    port = issued.server.port

    def request() -> bytes:
        return whoami_request(port, keys.generate_key().token)  # a new unknown key id each time

    with Flood(port, request, FLOOD_CONNECTIONS) as flood:
        time.sleep(1.0)
        _within(issued, b_first["api_key"], COLD_BOUND_SECS, "B's key under an unknown-id flood")
        deadline = time.monotonic() + 20
        # Each refusal waits as long as a verification took (a while, loaded), and 503s for
        # the connections past the share come first: wait for the refusals themselves.
        while not flood.statuses.get(401) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = dict(flood.statuses)
    assert seen and set(seen) <= {401, 503}, seen  # 503: past the client's connection share
    assert seen.get(401, 0) > 0, seen


def test_unknown_revoked_expired_and_wrong_secret_keys_cost_the_same(issued: Issued) -> None:
    tenant = issued.tenant("timing")
    wrong_ids = [issued.key(tenant)["key_id"] for _ in range(4)]
    revoked = issued.key(tenant)
    r = issued.admin.delete(f"/v1/admin/keys/{revoked['key_id']}")
    assert r.status_code == 200
    expired = issued.key(tenant, ttl_secs=1)
    time.sleep(1.1)
    kinds: dict[str, Callable[[int], str]] = {
        "unknown": lambda _i: keys.generate_key().token,
        "revoked": lambda _i: revoked["api_key"],
        "expired": lambda _i: expired["api_key"],
        "wrong secret": lambda i: wrong_secret(wrong_ids[i]),
    }
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with issued.server.client() as client:
        for i in range(4):  # interleaved: load on the machine slows every kind alike
            for kind, token in kinds.items():
                start = time.perf_counter()
                r = client.get("/v1/whoami", headers={"Authorization": f"Bearer {token(i)}"})
                times[kind].append(time.perf_counter() - start)
                assert r.status_code == 401, (kind, r.text)
                assert r.json() == {"error": "unauthorized", "detail": UNAUTHORIZED_DETAIL}
    medians = {kind: statistics.median(t) for kind, t in times.items()}
    assert max(medians.values()) / min(medians.values()) < 2.0, medians
    assert min(medians.values()) > 0.02, medians  # each paid for one argon2id verification


def test_repeated_failures_back_off_then_429_and_the_owner_gets_in_after(issued: Issued) -> None:
    tenant = issued.tenant("backoff")
    key = issued.key(tenant)
    bad = {"Authorization": f"Bearer {wrong_secret(key['key_id'])}"}
    mcp = {**bad, "Accept": "application/json, text/event-stream"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with issued.server.client() as client:
        # The first /mcp request (any, this one has no key) loads the SDK.
        client.post("/mcp", json=ping, headers={"Accept": mcp["Accept"]})
        verifications = []
        for _ in range(5):
            started = time.perf_counter()
            r = client.get("/v1/whoami", headers=bad)
            verifications.append(time.perf_counter() - started)
            assert r.status_code == 401, r.text
        started = time.perf_counter()
        r = client.get("/v1/whoami", headers=bad)
        paced = time.perf_counter() - started
        assert r.status_code == 429, r.text
        assert r.json()["error"] == "too_many_requests"
        # A 429 is paced like a refusal: a flood's connection gets one answer per
        # verification's time, not as many as the event loop can render.
        assert paced > 0.5 * min(verifications), (paced, verifications)
        assert r.headers["retry-after"] == "1"
        time.sleep(1.1)
        r = client.get("/v1/whoami", headers=bad)  # verified again: wrong, so it waits longer
        assert r.status_code == 401, r.text
        r = client.get("/v1/whoami", headers=bad)
        assert r.status_code == 429 and r.headers["retry-after"] == "2", r.text
        # Once more, so the three paced answers below fit in the back-off even on a loaded
        # machine (each takes a verification's time: 0.7 s at load 9 outlasted a 2 s window).
        time.sleep(2.1)
        r = client.get("/v1/whoami", headers=bad)
        assert r.status_code == 401, r.text
        r = client.get("/v1/whoami", headers=bad)
        assert r.status_code == 429 and r.headers["retry-after"] == "4", r.text
        # Every door answers the same way: a hot route and /mcp.
        r = client.post("/v1/memory/recall", json={"text": "x"}, headers=bad)
        assert r.status_code == 429 and r.headers["retry-after"], r.text
        r = client.post("/mcp", json=ping, headers=mcp)
        assert r.status_code == 429 and r.json()["error"] == "too_many_requests", r.text
        # The correct secret waits out the back-off too (it is not yet known to this server)...
        good = {"Authorization": f"Bearer {key['api_key']}"}
        r = client.get("/v1/whoami", headers=good)
        assert r.status_code == 429, r.text
        # ...and gets in once the back-off allows.
        time.sleep(int(r.headers["retry-after"]) + 0.1)
        r = client.get("/v1/whoami", headers=good)
        assert r.status_code == 200, r.text
        # Success forgets the failures: the next wrong secret is a plain 401 again.
        r = client.get("/v1/whoami", headers=bad)
        assert r.status_code == 401, r.text


def test_one_tenants_slow_reads_leave_read_threads_for_the_others(issued: Issued) -> None:
    a_tenant, b_tenant = issued.tenant("reads-a"), issued.tenant("reads-b")
    a_key, b_key = issued.key(a_tenant)["api_key"], issued.key(b_tenant)["api_key"]
    with issued.server.client(a_key) as a:
        for i in range(30):
            r = a.post(
                "/v1/memory/event",
                json={"kind": "turn", "ts": 1791208900000000 + i, "text": f"a{i}"},
            )
            assert r.status_code == 201, r.text
    with issued.server.client(b_key) as b:
        r = b.post("/v1/memory/event", json={"kind": "turn", "ts": 1791208900000000, "text": "b"})
        assert r.status_code == 201, r.text
        b_event = r.json()["event_id"]
        assert b.get(f"/v1/memory/event/{b_event}").status_code == 200
    port = issued.server.port
    body = json.dumps({"query": SLOW_QUERY}).encode()
    slow = (
        f"POST /v1/memory/cypher HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {a_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    with Flood(port, lambda: slow, 60) as flood:
        time.sleep(1.0)  # 60 slow queries of A in flight: more than the pool has threads
        secs, r = issued.timed(
            b_key, f"/v1/memory/event/{b_event}", timeout=CYPHER_TIMEOUT_MS / 1000 * 3
        )
        seen = dict(flood.statuses)
    assert r.status_code == 200, r.text
    assert secs < 2.0, f"B's read took {secs:.2f} s while A's slow reads ran ({seen})"


# -- the read pool itself, in-process ---------------------------------------------------------


def test_read_threads_give_each_owner_a_share() -> None:
    pool = ReadThreads(limit=8, per_owner=2)
    lock = threading.Lock()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    def sleep(job: tuple[str, float]) -> str:
        owner, secs = job
        with lock:
            running[owner] += 1
            peak[owner] = max(peak[owner], running[owner])
        time.sleep(secs)
        with lock:
            running[owner] -= 1
        return owner

    async def main() -> float:
        hog = [asyncio.ensure_future(pool.run(sleep, ("a", 0.3), "a")) for _ in range(20)]
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        assert await pool.run(sleep, ("b", 0.0), "b") == "b"
        quick = time.perf_counter() - start
        assert set(await asyncio.gather(*hog)) == {"a"}
        return quick

    try:
        quick = asyncio.run(main())
    finally:
        pool.close()
    assert peak["a"] == 2  # never more than its share, however many it queued
    assert quick < 0.2, quick


# -- the pieces, in-process -------------------------------------------------------------------


class SlowHasher(PasswordHasher):
    """A cheap argon2id whose verify takes a fixed 50 ms more, or waits for `gate` when closed."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.gate = threading.Event()
        self.gate.set()

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.gate.wait(30)
        time.sleep(0.05)
        return super().verify(hash, password)


def test_backoff_doubles_up_to_its_cap_and_a_success_forgets() -> None:
    now = [1000.0]
    backoff = Backoff(3, 8.0, clock=lambda: now[0])
    for _ in range(2):
        backoff.failed("k")
        backoff.check("k")  # free failures: no wait
    waits = []
    for _ in range(6):
        backoff.failed("k")
        waits.append(backoff.retry_after("k"))
        with pytest.raises(TooManyRequests) as info:
            backoff.check("k")
        assert info.value.status == 429 and info.value.headers["Retry-After"] == str(
            math.ceil(waits[-1])
        )
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    backoff.check("other")  # per key id
    now[0] += 8.0
    backoff.check("k")  # the wait is over: the next attempt is verified
    backoff.succeeded("k")
    backoff.failed("k")
    backoff.check("k")  # counting starts again


def test_fair_shares_take_turns_between_owners() -> None:
    shares = FairShares(limit=1, per_owner=1)
    granted: list[str] = []

    async def one(name: str) -> None:
        async with shares.slot(name[0]):
            granted.append(name)
            await asyncio.sleep(0.01)

    async def main() -> None:
        await shares.acquire("a")
        tasks = [asyncio.ensure_future(one(n)) for n in ("a1", "a2", "a3", "b1", "b2")]
        gone = asyncio.ensure_future(one("c1"))
        await asyncio.sleep(0.01)
        gone.cancel()  # a waiter that goes away gives its turn to the next
        shares.release("a")
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert granted == ["a1", "b1", "a2", "b2", "a3"]
    assert shares.waiting() == 0 and shares.held("a") == 0


def test_a_warm_key_is_rechecked_while_every_argon2_slot_is_busy(tmp_path: Path) -> None:
    hasher = SlowHasher()
    with ControlDB.open(tmp_path, create=True, hasher=hasher) as db:
        tenants = [db.create_tenant(f"t{i}", actor="test").tenant_id for i in range(3)]
        warm = db.create_key(tenants[0], "warm", actor="test")
        cold = [db.create_key(t, "cold", actor="test") for t in tenants[1:] for _ in range(4)]
    auth = Authenticator(tmp_path, None, hasher=hasher)

    async def main() -> float:
        await auth.authenticate_async(warm.api_key)
        hasher.gate.clear()  # every verification from here on holds its slot
        stuck = [asyncio.ensure_future(auth.authenticate_async(k.api_key)) for k in cold]
        await asyncio.sleep(0.2)
        control = auth.control()
        assert control is not None
        control.create_tenant("a change", actor="test")  # the warm entry is now stale
        start = time.perf_counter()
        who = await asyncio.wait_for(auth.authenticate_async(warm.api_key), 5)
        took = time.perf_counter() - start
        assert who.key_id == warm.key_id
        hasher.gate.set()
        assert {p.tenant_id for p in await asyncio.gather(*stuck)} == set(tenants[1:])
        return took

    try:
        took = asyncio.run(main())
    finally:
        hasher.gate.set()
        auth.close()
    assert took < 0.1, took


def test_every_refusal_costs_a_verification_and_only_guesses_count(tmp_path: Path) -> None:
    hasher = SlowHasher()
    with ControlDB.open(tmp_path, create=True, hasher=hasher) as db:
        tenant = db.create_tenant("t", actor="test").tenant_id
        live = db.create_key(tenant, "live", actor="test")
        dead = db.create_key(tenant, "dead", actor="test")
        db.revoke_key(dead.key_id, actor="test")
        verifier = KeyVerifier(db, backoff=Backoff(3, 60.0))
        verifier.verify(live.api_key)  # one verification measured: 50 ms and a little

        def refused(token: str) -> float:
            start = time.perf_counter()
            with pytest.raises(Unauthorized) as info:
                verifier.verify(token)
            assert info.value.status == 401 and info.value.detail == UNAUTHORIZED_DETAIL
            return time.perf_counter() - start

        for _ in range(6):  # the genuine secret of a revoked key is no guess: never 429
            assert refused(dead.api_key) >= 0.05
        for _ in range(3):
            assert refused(keys.generate_key().token) >= 0.05  # unknown: no argon2, same wait
        guess = keys.format_token(live.key_id, keys.random_base62(keys.SECRET_LEN))
        for _ in range(3):
            assert refused(guess) >= 0.05
        with pytest.raises(TooManyRequests):
            verifier.verify(guess)
        with pytest.raises(TooManyRequests):  # a cold correct secret waits its turn too...
            KeyVerifier(db, backoff=verifier.backoff).verify(live.api_key)
        assert verifier.verify(live.api_key).key_id == live.key_id  # ...a warm one never does


# -- local mode tokens ------------------------------------------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> Iterator[TestClient[Any]]:
    """The app in local mode, in-process."""
    settings = Settings(data_dir=tmp_path / "data", embedding_dim=4)
    with TestClient(create_app(settings)) as client:
        yield client


def test_local_mode_uuid_tokens_are_one_tenant_in_any_case(local: TestClient[Any]) -> None:
    token = str(uuid.uuid4())
    r = local.post(
        "/v1/memory/event",
        json={"kind": "note", "text": "case"},
        headers={"Authorization": f"Bearer {token.upper()}"},
    )
    assert r.status_code == 201, r.text
    event_id = r.json()["event_id"]
    for form in (token, token.upper(), token[:8].upper() + token[8:]):
        headers = {"Authorization": f"Bearer {form}"}
        assert local.get(f"/v1/memory/event/{event_id}", headers=headers).status_code == 200
        assert local.get("/v1/whoami", headers=headers).json()["tenant_id"] == token


def test_local_mode_keeps_a_tenant_written_under_an_upper_case_uuid(tmp_path: Path) -> None:
    token = str(uuid.uuid4()).upper()
    data = tmp_path / "data"
    legacy = Tenant.open(token, data / token, embedding_dim=4)
    legacy.submit_append([NewEvent(kind="note", ts=1791208900000000, text="legacy")]).result()
    legacy.close()
    settings = Settings(data_dir=data, embedding_dim=4)
    with TestClient(create_app(settings)) as client:
        r = client.get("/v1/memory/events", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        assert [e["text"] for e in r.json()["events"]] == ["legacy"]


@pytest.mark.parametrize("token", ["my tenant", "acme.corp", "a/b", "-lead", "x" * 65])
def test_local_mode_names_the_allowed_characters(local: TestClient[Any], token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    for r in (
        local.get("/v1/whoami", headers=headers),
        local.post("/v1/memory/recall", json={"text": "x"}, headers=headers),
    ):
        assert r.status_code == 401, r.text
        detail = r.json()["detail"]
        assert r.json()["error"] == "unauthorized"
        assert "A-Z, a-z, 0-9" in detail and "64" in detail and "UUID" in detail, detail
