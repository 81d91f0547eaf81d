"""The hot routes (memspine/hot.py) answer exactly as the Litestar handlers they stand in for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.config import load_settings
from memspine.engine import Engine

MAX_BODY = 4096
EVENT = "/v1/memory/event"
RECALL = "/v1/memory/recall"


def _client(root: Path, *, hot: bool) -> TestClient[Any]:
    settings = load_settings(
        {
            "MEMSPINE_DATA_DIR": str(root),
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_MAX_BODY_BYTES": str(MAX_BODY),
        }
    )
    return TestClient(create_app(settings, hot_routes=hot))


@pytest.fixture(scope="module")
def clients(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TestClient[Any], TestClient[Any]]]:
    """Litestar alone, and the same app with the hot routes in front, on separate data.

    One pair for the module: every request goes to both, in the same order, so the two tenants
    hold the same events whatever cases ran before (and on which test worker).
    """
    root = tmp_path_factory.mktemp("hot-routes")
    with (
        _client(root / "plain", hot=False) as plain,
        _client(root / "hot", hot=True) as hot,
    ):
        yield plain, hot


def _event(i: int, **extra: Any) -> dict[str, Any]:
    body = {
        "kind": "turn",
        "ts": 1_700_000_000_000_000 + i,
        "text": f"parcel {i} signed for at number {i + 10}",
        "embedding": [1.0, float(i), 0.5, -0.25],
        "properties": {"speaker": "customer"},
    }
    return body | extra


AUTH = {"Authorization": "Bearer acme"}
# (method, path, query, headers, body): every request runs against both apps in this order, so
# idempotent appends give both tenants the same ids and the same recall answers.
CASES: list[tuple[str, str, str, dict[str, str], bytes]] = [
    *(
        ("POST", EVENT, "", AUTH | {"Idempotency-Key": f"k{i}"}, msgspec.json.encode(_event(i)))
        for i in range(6)
    ),
    ("POST", EVENT, "", AUTH | {"Idempotency-Key": "k1"}, msgspec.json.encode(_event(1))),
    ("POST", EVENT, "", AUTH | {"Idempotency-Key": "k1"}, msgspec.json.encode(_event(2))),
    ("POST", EVENT, "", AUTH | {"Idempotency-Key": "bad key!"}, msgspec.json.encode(_event(7))),
    ("POST", EVENT, "", AUTH, b"{not json"),
    ("POST", EVENT, "", AUTH, b""),
    ("POST", EVENT, "", AUTH, msgspec.json.encode({"text": "no kind"})),
    ("POST", EVENT, "", AUTH, msgspec.json.encode(_event(8, embedding=[1.0, 2.0]))),
    ("POST", EVENT, "", AUTH, msgspec.json.encode(_event(9, text="x" * MAX_BODY))),
    ("POST", EVENT, "dry=1&x", AUTH, msgspec.json.encode(_event(9))),
    ("POST", EVENT, "", {}, msgspec.json.encode(_event(9))),
    ("POST", EVENT, "", {"Authorization": "Basic acme"}, msgspec.json.encode(_event(9))),
    ("POST", EVENT, "", {"Authorization": "Bearer ../etc"}, msgspec.json.encode(_event(9))),
    ("POST", RECALL, "", AUTH, msgspec.json.encode({"text": "signed for at number 13", "k": 3})),
    ("POST", RECALL, "", AUTH, msgspec.json.encode({"embedding": [1.0, 2.0, 0.5, -0.25]})),
    (
        "POST",
        RECALL,
        "",
        AUTH,
        msgspec.json.encode({"text": "parcel", "embedding": [1, 0, 0, 0], "k": 4, "hops": 1}),
    ),
    ("POST", RECALL, "", AUTH, msgspec.json.encode({"text": "parcel", "k": 101})),
    ("POST", RECALL, "", AUTH, msgspec.json.encode({"embedding": [1.0]})),
    ("POST", RECALL, "", AUTH, msgspec.json.encode({"text": "parcel", "filter": {"x": {}}})),
    ("POST", RECALL, "k=3", AUTH, msgspec.json.encode({"text": "parcel"})),
    ("POST", RECALL, "", {}, msgspec.json.encode({"text": "parcel"})),
    ("GET", RECALL, "", AUTH, b""),
    ("POST", EVENT + "/", "", AUTH | {"Idempotency-Key": "k10"}, msgspec.json.encode(_event(10))),
]


def _answer(client: TestClient[Any], case: tuple[str, str, str, dict[str, str], bytes]) -> Any:
    method, path, query, headers, body = case
    url = f"{path}?{query}" if query else path
    r = client.request(method, url, headers=headers, content=body)
    kept = {k: v for k, v in r.headers.items() if k in ("content-type", "idempotent-replayed")}
    return r.status_code, kept, r.json()


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]} {c[1]}?{c[2]} #{i}" for i, c in enumerate(CASES)]
)
def test_a_hot_route_answers_like_litestar(
    clients: tuple[TestClient[Any], TestClient[Any]],
    case: tuple[str, str, str, dict[str, str], bytes],
) -> None:
    plain, hot = clients
    for setup in CASES[:6]:  # the same six events in both tenants
        assert _answer(plain, setup) == _answer(hot, setup)
    assert _answer(hot, case) == _answer(plain, case)


def test_the_hot_routes_log_and_count_under_their_route(tmp_path: Path) -> None:
    with _client(tmp_path, hot=True) as client:
        r = client.post(EVENT, headers=AUTH, content=msgspec.json.encode(_event(1)))
        assert r.status_code == 201 and r.headers["x-request-id"]
        r = client.post(RECALL + "?x=1", headers=AUTH, content=b"{}")
        assert r.status_code == 400
        metrics = client.get("/metrics").text
    assert 'method="POST",route="/v1/memory/event",status="201"' in metrics
    assert 'method="POST",route="/v1/memory/recall",status="400"' in metrics


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (OSError(28, "No space left on device", "/data/acme/events/data.mdb"), 503, "unavailable"),
        (RuntimeError("secret detail /data/acme"), 500, "internal"),
    ],
)
def test_a_failure_inside_a_hot_route_is_answered_like_litestar_without_details(
    clients: tuple[TestClient[Any], TestClient[Any]],
    monkeypatch: pytest.MonkeyPatch,
    failure: Exception,
    status: int,
    code: str,
) -> None:
    # Fault injection at the engine boundary: the stores are never reached.
    async def fail(*_args: Any) -> Any:
        raise failure

    monkeypatch.setattr(Engine, "append", fail)
    answers = []
    for client in clients:
        r = client.post(EVENT, headers=AUTH, content=msgspec.json.encode(_event(1)))
        answers.append((r.status_code, r.headers.get("retry-after"), r.json()))
    assert answers[0] == answers[1]
    got_status, retry_after, body = answers[1]
    assert (got_status, body["error"]) == (status, code)
    assert (retry_after is not None) == (status == 503)
    assert "/data" not in body["detail"] and "secret" not in body["detail"]
