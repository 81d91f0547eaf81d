"""Why a query did not parse, as a sentence: the write refusal, or where the syntax broke."""

from __future__ import annotations

import re
from collections.abc import Iterable

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import TerminalDef

from storage.errors import CypherSyntaxError

READ_ONLY_MESSAGE = (
    "only read queries are accepted (MATCH, WITH, RETURN); write through POST /v1/memory/event"
)
WRITE_KEYWORDS = ("CREATE", "MERGE", "SET", "DELETE", "DETACH", "REMOVE", "CALL", "LOAD", "FOREACH")

# Strings, quoted names and comments are blanked before looking for write keywords, so a
# keyword inside a literal (`a.text CONTAINS 'delete'`) or after a dot (`a.set`) is not one.
_NOT_CODE = re.compile(
    r"'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|`[^`]*`?|//[^\n]*|/\*.*?(?:\*/|$)", re.S
)
_WRITE_WORD = re.compile(r"(?<![\w.$:])\b(" + "|".join(WRITE_KEYWORDS) + r")\b", re.I)

# How lark's terminal names read in "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "PARAM": "a $parameter",
    "INTEGER": "a number",
    "STRING": "a string",
    "$END": "the end of the query",
}
_HIDDEN_TERMINALS = {"QUOTED_NAME", "FLOAT"}  # already covered by "a name", "a number"


def without_text(query: str) -> str:
    """Query with its strings, quoted names and comments blanked: only the code is left."""
    return _NOT_CODE.sub(" ", query)


def is_write_attempt(query: str) -> bool:
    """Whether a query that failed to parse uses a write clause keyword outside strings,
    comments and property names: such a query is refused, not reported as a syntax error."""
    return _WRITE_WORD.search(without_text(query)) is not None


def syntax_error(
    err: UnexpectedInput, query: str, terminals: Iterable[TerminalDef]
) -> CypherSyntaxError:
    """The CypherSyntaxError for lark's err, naming what was found and what would have fit."""
    line, col = err.line, err.column
    if isinstance(err, UnexpectedCharacters):
        # no "expected" list here: the lexer's view of what may follow is too coarse to help
        what = f"unexpected character {query[err.pos_in_stream or 0]!r}"
        expected: set[str] = set()
    elif isinstance(err, UnexpectedToken) and err.token.type == "$END":
        lines = query.split("\n")
        line, col = len(lines), len(lines[-1]) + 1
        expected = _accepted(err)
        if "RETURN" in expected:
            return CypherSyntaxError("expected RETURN", line=line, col=col, query=query)
        what = "unexpected end of query"
    elif isinstance(err, UnexpectedToken):
        what = f"unexpected {err.token.value!r}"
        expected = _accepted(err)
    else:  # pragma: no cover - LALR raises only the two kinds above
        what, expected = "unexpected input", set()
    message = what + _expected_text(expected, terminals)
    return CypherSyntaxError(message, line=max(line, 1), col=max(col, 1), query=query)


def _accepted(err: UnexpectedToken) -> set[str]:
    # accepts replays the parser, so it is exact where LALR's merged lookaheads are not
    return set(err.accepts or err.expected)


def _expected_text(names: set[str], terminals: Iterable[TerminalDef]) -> str:
    by_name = {t.name: t for t in terminals}
    words = set()
    for name in names - _HIDDEN_TERMINALS:
        term = by_name.get(name)
        if name in _TERMINAL_WORDS or term is None:
            words.add(_TERMINAL_WORDS.get(name, name))
        elif term.pattern.type == "str":
            words.add(term.pattern.value.upper())
        else:
            words.add(name)  # keywords: the terminal is named after its word
    if not words:
        return ""
    shown = sorted(words, key=lambda w: (not w[:1].isalpha(), w))
    more = ", …" if len(shown) > 10 else ""
    return "; expected " + ", ".join(shown[:10]) + more
