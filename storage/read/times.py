"""Questions that ask when, and events that say a time (docs/recall.md, "Replies and times").
"When did Melanie run a charity race?" is answered by a turn such as "I ran a charity race
last Saturday": its words match, and it says a time. Such a question gets arms of its own, the
main arms' own hits that say a time, so those go before the turns that only match."""

from __future__ import annotations

import re

from storage.model import StoredEvent

_ASKS_WHEN = re.compile(r"^\s*(?:when|how\s+long|what\s+(?:day|date|time|year|month))\b", re.I)
# Words and numbers that place an event in time: relative days and periods, weekdays, months
# and years. Deliberately loose ("last", "may"): a question that asks when ranks only the
# main arms' own hits by it, and measured so on LoCoMo (bench/RESULTS.md).
_SAYS_TIME = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago|last|next|week|weekend|month|year|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"\d{4}|since|recently|lately|soon)\b",
    re.I,
)


def asks_when(text: str) -> bool:
    """Whether a recall's text asks when ("When did…", "How long…", "What day…")."""
    return _ASKS_WHEN.search(text) is not None


def says_time(ev: StoredEvent) -> bool:
    """Whether an event's text names a time (a relative day or period, a weekday, a month, a
    year)."""
    return ev.text is not None and _SAYS_TIME.search(ev.text) is not None
