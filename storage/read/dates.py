"""Dates named in a recall's text, as time windows over the events' `ts` (docs/recall.md,
"Query focus"): absolute days, months and years in the common English forms, and days relative
to a reference time ("yesterday", "last week", "3 days ago"). No language model: patterns."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

DAY_US = 86_400_000_000
# A day named in a question is looked for a little beyond its own 24 hours: a conversation
# that started late in the evening carries that date on its turns after midnight too.
DAY_PAD_US = 6 * 3_600_000_000
MAX_WINDOWS = 4

MONTHS = {
    name: n
    for n, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_M = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_Y = r"(?:,?\s*(?P<year>(?:19|20)\d{2}))"
_D = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
# Each pattern with what it names; tried in this order, a span taken once.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(r"\b(?P<year>(?:19|20)\d{2})-(?P<month>[01]?\d)-(?P<day>[0-3]?\d)\b")),
    ("day", re.compile(rf"\b{_D}\s+(?:of\s+)?{_M}{_Y}?(?![\w-])", re.I)),
    ("day", re.compile(rf"\b{_M}\s+{_D}(?!\d){_Y}?(?![\w-])", re.I)),
    ("month", re.compile(rf"\b{_M}{_Y}\b", re.I)),
    (
        "month",
        re.compile(
            rf"\b(?:in|during|since|until|by|of|early|late|mid|last|this|next)\s+(?:-\s*)?{_M}\b",
            re.I,
        ),
    ),
    ("year", re.compile(r"\b(?:in|during|since|of|by|year)\s+(?P<year>(?:19|20)\d{2})\b", re.I)),
    ("relative", re.compile(r"\b(?:the\s+day\s+before\s+)?(?:yesterday|today|tonight)\b", re.I)),
    (
        "relative",
        re.compile(r"\b(?:last|this|past)\s+(?:week(?:end)?|month|year|night)\b", re.I),
    ),
    ("relative", re.compile(rf"\blast\s+(?:{'|'.join(WEEKDAYS)})\b", re.I)),
    (
        "relative",
        re.compile(
            r"\b(?P<n>\d{1,3}|"
            + "|".join(NUMBERS)
            + r")\s+(?P<unit>day|week|month|year)s?\s+ago\b",
            re.I,
        ),
    ),
]
# Months that are also common words count only beside a day or a year, or after a preposition
# (the second "month" pattern): "May I ask" names no date.
_WORDS = {"may", "march"}  # months that are also common words: capitalised to count
_BARE_MONTHS = {m.capitalize() for m in MONTHS if len(m) > 3 and m not in _WORDS}
_BARE = re.compile(r"\b(?P<month>" + "|".join(sorted(_BARE_MONTHS)) + r")\b")


# A text without a digit and without one of these words names no date: most questions, which
# then cost one scan instead of every pattern's.
_TRIGGERS = [*MONTHS, "yesterday", "today", "tonight", "last", "this", "past", "ago"]
_TRIGGER = re.compile(
    r"\d|\b(?:" + "|".join(sorted(_TRIGGERS, key=len, reverse=True)) + r")\b", re.I
)


def _may_name_a_date(text: str) -> bool:
    """Whether the text holds a digit or a word a date pattern starts from."""
    return _TRIGGER.search(text) is not None


class Found:
    """What the parse found: windows [lo, hi) in µs and the character spans it used."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int]] = []
        self.spans: list[tuple[int, int]] = []

    def free(self, start: int, end: int) -> bool:
        """Whether no earlier match took any of these characters."""
        return all(end <= a or start >= b for a, b in self.spans)


def windows(text: str, reference: Callable[[], int]) -> Found:
    """The time windows a text names (at most MAX_WINDOWS), with the spans that named them;
    `reference` (µs, called only if needed) is "now" for relative dates and for a day or month
    named without its year (the latest such before it)."""
    found = Found()
    if not _may_name_a_date(text):
        return found
    ref: list[int] = []

    def now() -> datetime:
        if not ref:
            ref.append(reference())
        return _utc(ref[0])

    for what, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if not found.free(*m.span()):
                continue
            window = _window(what, m, now)
            found.spans.append(m.span())  # taken even if no real date: "31 February" is none
            if window is not None:
                found.windows.append(window)
    for m in _BARE.finditer(text):  # "What did she do in July?" is taken above; this is "July's"
        if found.free(*m.span()):
            window = _month(None, MONTHS[m["month"].lower()], now)
            found.windows.append(window)
            found.spans.append(m.span())
    found.windows = list(dict.fromkeys(found.windows))[:MAX_WINDOWS]
    return found


def _window(what: str, m: re.Match[str], now: Callable[[], datetime]) -> tuple[int, int] | None:
    """The window one match names, None if it names no real date."""
    groups = m.groupdict()
    year = int(groups["year"]) if groups.get("year") else None
    if what == "year":
        assert year is not None
        return _us(datetime(year, 1, 1, tzinfo=UTC)), _us(datetime(year + 1, 1, 1, tzinfo=UTC))
    if what == "relative":
        return _relative(m, now())
    month = int(groups["month"]) if groups["month"].isdigit() else MONTHS[groups["month"].lower()]
    if not 1 <= month <= 12:
        return None
    if what == "month":
        if year is None and groups["month"] in _WORDS:  # "in may", lowercase: the verb
            return None
        return _month(year, month, now)
    day = int(groups["day"])
    try:
        start = datetime(year if year is not None else now().year, month, day, tzinfo=UTC)
    except ValueError:  # 31 February
        return None
    if year is None and start > now():
        start = start.replace(year=start.year - 1)
    lo = _us(start)
    return lo - DAY_PAD_US, lo + DAY_US + DAY_PAD_US


def _month(year: int | None, month: int, now: Callable[[], datetime]) -> tuple[int, int]:
    """A calendar month; without its year, the latest that began before now."""
    if year is None:
        year = now().year if month <= now().month else now().year - 1
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return _us(start), _us(end)


def _relative(m: re.Match[str], now: datetime) -> tuple[int, int]:
    """A window relative to now: the day, the week or month or year before it, N units ago."""
    phrase = m.group(0).lower()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    day = timedelta(days=1)
    if "ago" in phrase:
        n = int(m["n"]) if m["n"].isdigit() else NUMBERS[m["n"].lower()]
        span = {"day": 1, "week": 7, "month": 30, "year": 365}[m["unit"].lower()]
        at = today - n * span * day
        return _us(at - span // 2 * day), _us(at + (span // 2 + 1) * day)
    if "today" in phrase or "tonight" in phrase:
        return _us(today), _us(today + day)
    if "yesterday" in phrase:
        back = 2 if "before" in phrase else 1
        return _us(today - back * day), _us(today - (back - 1) * day)
    if phrase.endswith("night"):  # last night: yesterday evening to this morning
        return _us(today - day), _us(today + day)
    for i, name in enumerate(WEEKDAYS):
        if phrase.endswith(name):
            back = (today.weekday() - i - 1) % 7 + 1
            return _us(today - back * day), _us(today - (back - 1) * day)
    span = 7 if "week" in phrase else 31 if "month" in phrase else 366
    if phrase.startswith("this"):
        return _us(today - span * day), _us(today + day)
    return _us(today - 2 * span * day), _us(today)  # last week: up to two weeks back


def _utc(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, tz=UTC)


def _us(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000
