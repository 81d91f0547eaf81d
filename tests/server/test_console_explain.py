"""Recall's opt-in `explain` (the console's recall page shows it): each ranked hit's keyword and
vector ranks are the ranks its fused score was made of; without explain nothing changes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from memspine.app import create_app
from memspine.config import load_settings
from storage.model import NewEvent
from storage.read.recall import RRF_K
from storage.tenants.tenant import Tenant
from tests.support.recall import add, ev, run


def _fused(ranks: tuple[int | None, int | None]) -> float:
    return sum(1 / (RRF_K + r) for r in ranks if r is not None)


def test_ranks_are_each_arms_own_order_and_make_the_score(tenant: Tenant) -> None:
    ids = add(
        tenant,
        ev("invoice ledger invoice ledger", [0.0, 1.0, 0, 0]),
        ev("nothing in common", [1.0, 0.0, 0, 0]),
        ev("the invoice", [0.9, 0.1, 0, 0]),
        ev("ledger", [0.5, 0.5, 0, 0]),
    )
    query: dict[str, Any] = {"text": "invoice ledger", "embedding": [1.0, 0, 0, 0], "k": 4}
    explained = run(tenant, explain=True, **query)
    by_text = [h.event.event_id for h in run(tenant, text=query["text"], k=4).hits]
    by_vector = [h.event.event_id for h in run(tenant, embedding=query["embedding"], k=4).hits]
    for hit in explained.hits:
        assert hit.ranks is not None
        keyword, vector = hit.ranks
        e = hit.event.event_id
        assert keyword == (by_text.index(e) + 1 if e in by_text else None)
        assert vector == (by_vector.index(e) + 1 if e in by_vector else None)
        assert hit.score == pytest.approx(_fused(hit.ranks))
    assert {h.event.event_id for h in explained.hits} == set(ids)
    plain = run(tenant, **query)
    assert [(h.event.event_id, h.score) for h in plain.hits] == [
        (h.event.event_id, h.score) for h in explained.hits
    ]
    assert all(h.ranks is None for h in plain.hits)


def test_one_arm_leaves_the_other_rank_empty_and_walked_hits_have_none(tenant: Tenant) -> None:
    [source] = add(tenant, ev("track_parcel -> delivered"))
    [reply] = add(tenant, ev("signed for at number 16", sources=(source,)))
    result = run(tenant, text="number 16", k=2, hops=1, explain=True)
    ranked, walked = result.hits
    assert (ranked.event.event_id, ranked.ranks) == (reply, (1, None))
    assert (walked.event.event_id, walked.via, walked.ranks) == (source, reply, None)


def test_a_substituted_head_carries_the_ranks_its_score_came_from(tenant: Tenant) -> None:
    [old] = add(tenant, ev("cutover planned for saturday the tenth", [1.0, 0, 0, 0], kind="fact"))
    new = NewEvent(kind="fact", ts=2_000, text="moved a week", supersedes=(old,))
    [head] = add(tenant, new)
    result = run(tenant, text="cutover saturday", embedding=[1.0, 0, 0, 0], k=1, explain=True)
    [hit] = result.hits
    assert (hit.event.event_id, hit.replaces) == (head, [old])
    assert hit.ranks == (1, 1)  # the old version's, both arms: the head has no text or vector match
    assert hit.score == pytest.approx(_fused(hit.ranks))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient[Any]]:
    """The whole app in process (hot routes in front), 4-dimensional embeddings."""
    settings = load_settings(
        {"MEMSPINE_DATA_DIR": str(tmp_path / "data"), "MEMSPINE_EMBEDDING_DIM": "4"}
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1:7781") as c:
        c.headers["Authorization"] = "Bearer acme"
        yield c


def test_over_http_explain_adds_the_ranks_to_ranked_hits_only(client: TestClient[Any]) -> None:
    events = [
        {"kind": "turn", "ts": 1_791_208_939_000_000 + i, "text": text, "embedding": emb}
        for i, (text, emb) in enumerate(
            [("parcel signed for", [1.0, 0, 0, 0]), ("parcel lost", [0.0, 1.0, 0, 0])]
        )
    ]
    ids = [client.post("/v1/memory/event", json=e).json()["event_id"] for e in events]
    body = {"text": "signed parcel", "embedding": [0.0, 1.0, 0, 0], "k": 2}
    plain = client.post("/v1/memory/recall", json=body)
    explained = client.post("/v1/memory/recall", json=body | {"explain": True})
    assert plain.status_code == explained.status_code == 200
    hits = explained.json()["hits"]
    assert [(h["event_id"], h["keyword_rank"], h["vector_rank"]) for h in hits] == [
        (ids[0], 1, 2),
        (ids[1], 2, 1),
    ]
    assert all(h["arm_ranks"] == {} for h in hits)  # no focus, time or reply arm ran
    strip = [{k: v for k, v in h.items() if not k.endswith(("_rank", "_ranks"))} for h in hits]
    assert {"hits": strip} == plain.json()
    assert all("keyword_rank" not in h for h in plain.json()["hits"])
    explicit_off = client.post("/v1/memory/recall", json=body | {"explain": False})
    assert explicit_off.content == plain.content


def test_explain_must_be_a_boolean(client: TestClient[Any]) -> None:
    r = client.post("/v1/memory/recall", json={"text": "x", "explain": "yes"})
    assert r.status_code == 400
    assert r.json() == {
        "error": "invalid_request",
        "detail": "invalid request body: Expected `bool`, got `str` - at `explain`",
    }
    assert msgspec.json.decode(r.content)["error"] == "invalid_request"


def test_over_http_explain_names_the_focus_and_the_arms_that_ranked_each_hit(
    client: TestClient[Any],
) -> None:
    t0 = 1_683_504_000_000_000  # 2023-05-08 00:00 UTC
    turns = [
        ("Caroline: I painted a sunset, painting and paint", [1.0, 0.1, 0, 0], "Caroline", t0),
        ("Melanie: I painted a bird", [0.6, 0.8, 0, 0], "Melanie", t0 + 86_400_000_000),
    ]
    for text, emb, speaker, ts in turns:
        body = {"kind": "turn", "ts": ts, "text": text, "embedding": emb}
        r = client.post("/v1/memory/event", json=body | {"properties": {"speaker": speaker}})
        assert r.status_code == 201, r.text
    body = {"text": "When did Melanie paint?", "embedding": [1.0, 0, 0, 0], "k": 2}
    answer = client.post("/v1/memory/recall", json=body | {"explain": True}).json()
    assert answer["focus"] == {
        "people": [{"property": "speaker", "value": "Melanie"}],
        "dates": [],
        "asks_when": True,
    }
    first = answer["hits"][0]
    assert first["text"].startswith("Melanie")
    assert first["arm_ranks"] == {"person.keyword": 1, "person.vector": 1}
    ranks = [first["keyword_rank"], first["vector_rank"], *first["arm_ranks"].values()]
    assert first["score"] == pytest.approx(sum(1 / (RRF_K + r) for r in ranks if r is not None))
    assert "focus" not in client.post("/v1/memory/recall", json=body).json()
