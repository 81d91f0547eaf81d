"""Query focus through a real memspine-server on a loopback port (docs/recall.md, "Query
focus"): a question that names a speaker ranks that speaker's turn first, over HTTP, where
both arms on their own rank another speaker's turn first; a question that names a date ranks
that day's turn first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import ServerProcess

T0 = 1_683_504_000_000_000  # 2023-05-08 00:00 UTC
DAY = 86_400_000_000
PAINT = [1.0, 0.0, 0.0, 0.0]  # the questions' vector (the tenant's dimension is 4)
TURNS = [
    # Caroline's turn has more of the words and the nearer vector: both arms rank it first.
    ("C1", "Caroline", T0, "I painted a sunset, painting and paint", [1.0, 0.1, 0.0, 0.0]),
    ("M1", "Melanie", T0 + 32 * DAY, "I painted a bird", [0.6, 0.8, 0.0, 0.0]),
    ("C2", "Caroline", T0 + 1000, "my kids paint too", [0.5, 0.0, 0.86, 0.0]),
    ("M2", "Melanie", T0 + 54 * DAY, "we went hiking", [0.0, 0.0, 0.0, 1.0]),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A real server with one tenant holding the four turns, speakers as properties."""
    server = ServerProcess(Path(tmp_path_factory.mktemp("focus")) / "data").start()
    try:
        with server.client("focus-tenant") as c:
            events = [
                {
                    "kind": "turn",
                    "ts": ts,
                    "text": text,
                    "embedding": emb,
                    "properties": {"who": who, "speaker": speaker},
                }
                for who, speaker, ts, text, emb in TURNS
            ]
            r = c.post("/v1/memory/events", json={"events": events})
            assert r.status_code == 201, r.text
            yield c
    finally:
        server.stop()


def ask(c: httpx.Client, text: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(
        "/v1/memory/recall",
        json={"text": text, "embedding": PAINT, "kind": "turn", "k": 4, "explain": True, **body},
    )
    assert r.status_code == 200, r.text
    hits: list[dict[str, Any]] = r.json()["hits"]
    return hits


def test_a_question_naming_a_speaker_ranks_their_turn_first(client: httpx.Client) -> None:
    unnamed = ask(client, "What did someone paint?")
    assert [h["properties"]["who"] for h in unnamed][:2] == ["C1", "M1"]
    named = ask(client, "What did Melanie paint?")
    assert named[0]["properties"]["who"] == "M1"
    # Neither arm alone put it first: the focus arms did.
    assert named[0]["keyword_rank"] > 1 and named[0]["vector_rank"] > 1


def test_a_question_naming_a_date_ranks_that_day_first(client: httpx.Client) -> None:
    hits = ask(client, "What did she paint on 9 June, 2023?")
    assert hits[0]["properties"]["who"] == "M1"


def test_text_only_recall_gets_the_focus_too(client: httpx.Client) -> None:
    r = client.post("/v1/memory/recall", json={"text": "What did Melanie paint?", "k": 4})
    assert r.status_code == 200, r.text
    assert r.json()["hits"][0]["properties"]["who"] == "M1"
