"""Read-your-writes under writes: a recall right after an append from the same client finds that
append by keyword and by vector, every time, while other clients append (the app in process:
its writer, fold and inserter threads are the real ones).

Each other client appends once per try, let go as the tried append is sent: theirs are in flight
beside it every time (the writer's batch, the keyword fold, the vector inserter), not whenever a
free-running loop happens to be there, and they cost three requests a try, not as many as three
threads can send."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from tests.support.budget import size

TRIES = size(1_000, 250)  # a soak: a share of it in make test (tests/support/budget.py)
OTHER_WRITERS = 3
T0 = 1_791_208_939_000_000  # µs in 2026
WORDS = [
    "parcel",
    "refund",
    "carrier",
    "door",
    "code",
    "delivered",
    "signed",
    "depot",
    "gate",
    "street",
    "number",
]


def unit(rng: random.Random) -> list[float]:
    """A random direction in 4 dimensions."""
    v = [rng.gauss(0.0, 1.0) for _ in range(4)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


class Pace:
    """The tries begun so far; the other clients wait on it."""

    def __init__(self) -> None:
        self.tries = 0
        self.stopped = False
        self.changed = threading.Condition()

    def tick(self) -> None:
        """One more try begins: each other client may append once more."""
        with self.changed:
            self.tries += 1
            self.changed.notify_all()

    def stop(self) -> None:
        """No more tries: the other clients stop."""
        with self.changed:
            self.stopped = True
            self.changed.notify_all()

    def wait(self, appended: int) -> bool:
        """Wait until a client that appended `appended` events may append again; False: stop."""
        with self.changed:
            self.changed.wait_for(lambda: self.stopped or self.tries > appended, timeout=30)
            return not self.stopped and self.tries > appended


class Appender(threading.Thread):
    """Appends events of common words and random vectors, one per try, until told to stop."""

    def __init__(self, server: Any, number: int, pace: Pace) -> None:
        super().__init__(daemon=True)
        self.server, self.number, self.pace = server, number, pace
        self.appended = 0
        self.failures: list[str] = []

    def run(self) -> None:
        rng = random.Random(self.number)
        deadline = time.monotonic() + 300  # bounded even if the test body dies
        with self.server.client("ryw") as c:
            while self.pace.wait(self.appended) and time.monotonic() < deadline:
                body = {
                    "kind": "turn",
                    "ts": T0 + self.appended * 1_000 + self.number,
                    "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))),
                    "embedding": unit(rng),
                }
                r = c.post("/v1/memory/event", json=body)
                if r.status_code != 201:
                    self.failures.append(r.text)
                    return
                self.appended += 1


@pytest.mark.long
def test_a_recall_right_after_an_append_finds_it_by_both_arms(server: Any) -> None:
    pace = Pace()
    others = [Appender(server, n, pace) for n in range(OTHER_WRITERS)]
    for a in others:
        a.start()
    rng = random.Random(2026)
    missed: list[tuple[int, Any]] = []
    try:
        with server.client("ryw") as c:
            for i in range(TRIES):
                word = f"ryw{i}x"  # in this event alone: the keyword arm can rank nothing else
                body: dict[str, Any] = {
                    "kind": "fact",
                    "ts": T0 + 10**9 + i,
                    "text": f"{rng.choice(WORDS)} {word} {rng.choice(WORDS)}",
                    "embedding": unit(rng),
                }
                pace.tick()
                r = c.post("/v1/memory/event", json=body)
                assert r.status_code == 201, r.text
                event_id = r.json()["event_id"]
                query = {"text": word, "embedding": body["embedding"], "k": 3, "explain": True}
                got = c.post("/v1/memory/recall", json=query)
                assert got.status_code == 200, got.text
                hit = next((h for h in got.json()["hits"] if h["event_id"] == event_id), None)
                if hit is None or hit.get("keyword_rank") != 1 or hit.get("vector_rank") is None:
                    missed.append((i, hit))
    finally:
        pace.stop()
        for a in others:
            a.join(timeout=30)
    assert not [f for a in others for f in a.failures]
    assert sum(a.appended for a in others) > TRIES, "the other clients hardly appended"
    assert not missed, (
        f"{len(missed)} of {TRIES} recalls missed the append before them: {missed[:5]}"
    )
