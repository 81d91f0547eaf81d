"""Cypher text to AST: lark parses with grammar.lark, a Transformer builds frozen AST nodes."""

from __future__ import annotations

import math
import re
from functools import cache
from importlib import resources
from itertools import accumulate
from typing import Any

import msgspec
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError

from storage.cypher import ast
from storage.cypher.bounds import INT_MAX, INT_MIN, MAX_QUERY_CHARS, UNMETERED, Meter
from storage.cypher.diagnostics import (
    READ_ONLY_MESSAGE,
    is_write_attempt,
    syntax_error,
    without_text,
)
from storage.cypher.functions import check_call
from storage.cypher.graph import LABEL, REL_TYPES
from storage.errors import CypherSyntaxError, InvalidRequest

MAX_HOPS = 5
# Deeper expressions are refused: the transformer, the planner and the evaluator recurse, and
# a query should fail with a sentence, not with Python's recursion limit.
MAX_DEPTH = 200
_TOO_DEEP = f"the query nests expressions more than {MAX_DEPTH} deep; split it into simpler parts"
# Clauses in one query: the projection and the executor chain them by recursion, and no query
# a person or an agent writes needs more (a chain of 600 WITH would exhaust the stack).
MAX_CLAUSES = 100
_TOO_LONG = f"the query has more than {MAX_CLAUSES} clauses; split it into simpler queries"


@cache
def _lark() -> Lark:
    grammar = resources.files("storage.cypher").joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


@cache
def _keywords() -> frozenset[str]:
    """The grammar's keywords: its terminals named after their own word."""
    return frozenset(t.name for t in _lark().terminals if t.pattern.value == rf"{t.name}\b")


def parse(query: str, meter: Meter = UNMETERED) -> ast.Query:
    """The AST of query; CypherSyntaxError (line, column) or InvalidRequest if it has none.
    Parsing counts against meter's clock: lark takes tens of microseconds per character."""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"query may be at most {MAX_QUERY_CHARS} characters")
    if _bracket_depth(query) > MAX_DEPTH:
        raise InvalidRequest(_TOO_DEEP)  # before lark spends time on what will be refused
    tree = _tree(query, meter)
    try:
        result: ast.Query = _ToAst(query, meter).transform(tree)
    except VisitError as err:
        raise err.orig_exc from None
    except RecursionError:
        raise InvalidRequest(_TOO_DEEP) from None
    if len(result.clauses) > MAX_CLAUSES:
        raise InvalidRequest(_TOO_LONG)
    _check_tree(result, meter)
    return result


def _tree(query: str, meter: Meter) -> Tree[Token]:
    """Lark's tree for query, fed one token at a time so the clock is read as it goes."""
    parser = _lark().parse_interactive(query)
    last: Token | None = None
    try:
        for n, token in enumerate(parser.iter_parse()):
            if not n % _TOKENS_PER_TICK:
                meter.tick()
            last = token
        tree: Tree[Token] = parser.feed_eof(last)  # type: ignore[no-untyped-call]
    except UnexpectedInput as err:
        if is_write_attempt(query):
            raise InvalidRequest(READ_ONLY_MESSAGE) from None
        # as Lark.parse does: the parser state lets the error list what would have fit
        err.interactive_parser = parser
        raise syntax_error(err, query, _lark().terminals) from None
    return tree


_TOKENS_PER_TICK = 32

_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _bracket_depth(query: str) -> int:
    """How deep lists and maps nest in the query's code, strings and comments left out
    (parentheses are not counted: they add no depth to the tree). C loops only: a regex, a
    filter and itertools, so a 20,000-character query costs about a millisecond."""
    code = without_text(query)
    brackets = "".join(filter(_STEP.__contains__, code))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _check_tree(node: Any, meter: Meter) -> None:
    """Refuse a tree deeper than MAX_DEPTH or an integer literal beyond 64 bits (iteratively:
    the point is to avoid recursion)."""
    stack = [(node, 1)]
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            raise InvalidRequest(_TOO_DEEP)
        if isinstance(item, ast.Literal):
            if type(item.value) is int and not INT_MIN <= item.value <= INT_MAX:
                raise InvalidRequest(_out_of_range(str(item.value)))
        elif isinstance(item, msgspec.Struct):
            stack.extend((getattr(item, f), level + 1) for f in item.__struct_fields__)
        elif isinstance(item, tuple):
            stack.extend((child, level) for child in item)
        meter.step(1)


def _out_of_range(digits: str) -> str:
    shown = digits if len(digits) <= 24 else f"{digits[:20]}… ({len(digits)} digits)"
    return f"the integer {shown} is outside the 64-bit integer range"


def _error_at(meta: Any, message: str, query: str) -> CypherSyntaxError:
    return CypherSyntaxError(message, line=meta.line, col=meta.column, query=query)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)


def _unescape(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if len(code) == 1:
            return _ESCAPES.get(code, code)
        point = int(code[1:], 16)
        if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
            raise InvalidRequest(f"the escape \\{code} in a string is not a unicode character")
        return chr(point)

    return _ESCAPE.sub(one, body)


def _present(items: Any) -> list[Any]:
    """Children without lark's placeholders for absent optional parts."""
    return [item for item in items if item is not None]


@v_args(inline=True)
class _ToAst(Transformer[Token, Any]):
    """lark tree -> AST. Keyword tokens arrive as children and are skipped by position."""

    def __init__(self, query: str, meter: Meter) -> None:
        super().__init__()
        self.query = query
        self.meter = meter
        self.calls = 0

    def _call_userfunc(self, tree: Any, new_children: Any = None) -> Any:
        # every node of the tree passes here: the clock is read every few dozen of them
        self.calls += 1
        if not self.calls % _TOKENS_PER_TICK:
            self.meter.tick()
        return super()._call_userfunc(tree, new_children)  # type: ignore[no-untyped-call]

    # ---- clauses ------------------------------------------------------------------------

    def start(self, *clauses: Any) -> ast.Query:
        return ast.Query(tuple(clauses))

    def match_clause(self, optional: Any, _match: Token, *rest: Any) -> ast.Match:
        *patterns, where = rest
        return ast.Match(tuple(patterns), where, optional is not None)

    def unwind_clause(self, _unwind: Token, expr: Any, _as: Token, alias: str) -> ast.Unwind:
        return ast.Unwind(expr, alias)

    def with_clause(self, _with: Token, projection: ast.Projection, where: Any) -> ast.With:
        return ast.With(projection, where)

    def return_clause(self, _return: Token, projection: ast.Projection) -> ast.Return:
        return ast.Return(projection)

    def where_clause(self, _where: Token, expr: Any) -> Any:
        return expr

    def projection_body(
        self, distinct: Any, items: Any, order: Any, skip: Any, limit: Any
    ) -> ast.Projection:
        star, projected = items
        return ast.Projection(projected, star, distinct is not None, order or (), skip, limit)

    def projection_items(self, *items: Any) -> tuple[bool, tuple[ast.ProjectionItem, ...]]:
        star = bool(items) and items[0] == "*"
        return star, tuple(items[1:] if star else items)

    def star(self) -> str:
        return "*"

    @v_args(meta=True)
    def projection_item(self, meta: Any, children: list[Any]) -> ast.ProjectionItem:
        expr, _as, alias = children
        if alias is not None:
            return ast.ProjectionItem(expr, alias, aliased=True)
        return ast.ProjectionItem(expr, self.query[meta.start_pos : meta.end_pos])

    def order_clause(self, _order: Token, _by: Token, *items: ast.SortItem) -> tuple[Any, ...]:
        return items

    def sort_item(self, expr: Any, descending: Any) -> ast.SortItem:
        return ast.SortItem(expr, bool(descending))

    def sort_direction(self, token: Token) -> bool:
        return token.type.startswith("DESC")

    def skip_clause(self, _skip: Token, expr: Any) -> Any:
        return expr

    limit_clause = skip_clause

    # ---- patterns -----------------------------------------------------------------------

    def pattern(self, *parts: Any) -> ast.PatternPath:
        return ast.PatternPath(tuple(parts[0::2]), tuple(parts[1::2]))

    @v_args(meta=True)
    def node_pattern(self, meta: Any, children: list[Any]) -> ast.NodePattern:
        var, labels, properties = children
        for label in labels or ():
            if label != LABEL:
                raise _error_at(
                    meta, f"unknown label :{label}; every node is an :{LABEL}", self.query
                )
        return ast.NodePattern(var, tuple(labels or ()), properties)

    def node_labels(self, *names: str) -> tuple[str, ...]:
        return names

    def rel_out(self, detail: Any) -> ast.RelPattern:
        return _relationship("out", detail)

    def rel_in(self, detail: Any) -> ast.RelPattern:
        return _relationship("in", detail)

    def rel_both(self, detail: Any) -> ast.RelPattern:
        return _relationship("both", detail)

    @v_args(meta=True)
    def rel_detail(self, meta: Any, children: list[Any]) -> dict[str, Any]:
        var, types, hops, properties = children
        for name in types or ():
            if name not in REL_TYPES:
                known = " and ".join(f":{t}" for t in REL_TYPES)
                raise _error_at(
                    meta, f"unknown relationship type :{name}; the graph has {known}", self.query
                )
        if properties is not None:
            message = "relationships have no properties; filter on the nodes instead"
            raise _error_at(meta, message, self.query)
        detail: dict[str, Any] = {"var": var, "types": tuple(types or ())}
        if hops is not None:
            _check_hops(meta, hops, self.query)
            detail.update(variable_length=True, min_hops=hops[0], max_hops=hops[1])
        return detail

    def rel_types(self, *names: Any) -> tuple[str, ...]:
        return tuple(_present(names))

    def range_literal(self, low: Any, dots: Any, high: Any) -> tuple[int, int | None]:
        lo = 1 if low is None else _hops(low)
        if dots is None:
            return lo, None if low is None else lo  # `*` alone is unbounded, `*3` is exactly 3
        return lo, None if high is None else _hops(high)

    # ---- expressions --------------------------------------------------------------------

    def or_op(self, left: Any, _op: Token, right: Any) -> ast.Binary:
        return ast.Binary("OR", left, right)

    def xor_op(self, left: Any, _op: Token, right: Any) -> ast.Binary:
        return ast.Binary("XOR", left, right)

    def and_op(self, left: Any, _op: Token, right: Any) -> ast.Binary:
        return ast.Binary("AND", left, right)

    def not_op(self, _not: Token, operand: Any) -> ast.Unary:
        return ast.Unary("NOT", operand)

    def comparison(self, *parts: Any) -> Any:
        # a < b <= c means (a < b) AND (b <= c)
        links = [ast.Binary(parts[i], parts[i - 1], parts[i + 1]) for i in range(1, len(parts), 2)]
        result: Any = links[0]
        for link in links[1:]:
            result = ast.Binary("AND", result, link)
        return result

    def comp_op(self, token: Token) -> str:
        return str(token)

    add_op = mul_op = pow_op = sign = comp_op

    def starts_with(self, left: Any, _s: Token, _w: Token, right: Any) -> ast.Binary:
        return ast.Binary("STARTS WITH", left, right)

    def ends_with(self, left: Any, _e: Token, _w: Token, right: Any) -> ast.Binary:
        return ast.Binary("ENDS WITH", left, right)

    def contains(self, left: Any, _c: Token, right: Any) -> ast.Binary:
        return ast.Binary("CONTAINS", left, right)

    def in_list(self, left: Any, _in: Token, right: Any) -> ast.Binary:
        return ast.Binary("IN", left, right)

    def is_null(self, operand: Any, _is: Token, _null: Token) -> ast.IsNull:
        return ast.IsNull(operand)

    def is_not_null(self, operand: Any, _is: Token, _not: Token, _null: Token) -> ast.IsNull:
        return ast.IsNull(operand, negated=True)

    def arithmetic(self, left: Any, op: str, right: Any) -> ast.Binary:
        return ast.Binary(op, left, right)

    def unary(self, op: str, operand: Any) -> Any:
        if isinstance(operand, ast.Literal) and type(operand.value) in (int, float):
            return ast.literal(-operand.value if op == "-" else operand.value)
        return ast.Unary(op, operand)

    def property(self, subject: Any, key: str) -> ast.Property:
        return ast.Property(subject, key)

    def index(self, subject: Any, index: Any) -> ast.Index:
        return ast.Index(subject, index)

    def slice(self, subject: Any, start: Any, _dots: Token, end: Any) -> ast.Slice:
        return ast.Slice(subject, start, end)

    @v_args(meta=True)
    def function_call(self, meta: Any, children: list[Any]) -> ast.FunctionCall:
        name, distinct, *args = children
        args = _present(args)
        if name.upper() in _keywords():
            # e.g. `a CONTAINS NOT (b)`: where no keyword fits, lark reads NOT as a name
            message = f"{name} cannot start an operand here; put the expression in parentheses"
            raise _error_at(meta, message, self.query)
        try:
            key = check_call(name, len(args), distinct=distinct is not None, star=False)
        except InvalidRequest as err:
            raise _error_at(meta, err.detail, self.query) from None
        return ast.FunctionCall(key, tuple(args), distinct is not None)

    @v_args(meta=True)
    def star_call(self, meta: Any, children: list[Any]) -> ast.FunctionCall:
        try:
            key = check_call(children[0], 0, distinct=False, star=True)
        except InvalidRequest as err:
            raise _error_at(meta, err.detail, self.query) from None
        return ast.FunctionCall(key, star=True)

    def variable(self, name: str) -> ast.Variable:
        return ast.Variable(name)

    def parameter(self, token: Token) -> ast.Parameter:
        return ast.Parameter(token[1:])

    def list_literal(self, *items: Any) -> ast.ListExpr:
        return ast.ListExpr(tuple(_present(items)))

    @v_args(meta=True)
    def map_literal(self, meta: Any, children: list[Any]) -> ast.MapExpr:
        entries = tuple(_present(children))
        keys = [key for key, _ in entries]
        duplicate = next((k for k in keys if keys.count(k) > 1), None)
        if duplicate is not None:
            raise _error_at(meta, f"the key {duplicate!r} appears twice in a map", self.query)
        return ast.MapExpr(entries)

    def map_entry(self, key: str, value: Any) -> tuple[str, Any]:
        return key, value

    def integer(self, token: Token) -> ast.Literal:
        # 2**63 itself may stand: `-9223372036854775808` is the literal negated (see unary);
        # _check_tree refuses what is still out of range. Longer digit strings are refused
        # before int() (which would take quadratic time, and refuses past 4,300 digits).
        digits = token.lstrip("0") or "0"
        if len(digits) > 19:
            raise _literal_error(token, _out_of_range(digits))
        return ast.literal(int(digits))

    def float(self, token: Token) -> ast.Literal:
        value = float(token)
        if math.isinf(value):
            raise _literal_error(token, f"the number {_short(token)} is too large for a float")
        return ast.literal(value)

    def string(self, token: Token) -> ast.Literal:
        return ast.literal(_unescape(token[1:-1]))

    def true(self, _token: Token) -> ast.Literal:
        return ast.literal(True)

    def false(self, _token: Token) -> ast.Literal:
        return ast.literal(False)

    def null(self, _token: Token) -> ast.Literal:
        return ast.literal(None)

    def symbolic_name(self, token: Token) -> str:
        if token.type == "QUOTED_NAME":
            return token[1:-1].replace("``", "`")
        return str(token)


def _hops(token: Token) -> int:
    """A hop count; any count of more than six digits is far past MAX_HOPS, and stays there."""
    digits = token.lstrip("0") or "0"
    return int(digits) if len(digits) <= 6 else 1_000_000


def _literal_error(token: Token, message: str) -> CypherSyntaxError:
    # without the query: the line would repeat the whole literal
    return CypherSyntaxError(message, line=token.line or 1, col=token.column or 1)


def _short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:20]}… ({len(text)} characters)"


def _relationship(direction: str, detail: dict[str, Any] | None) -> ast.RelPattern:
    return ast.RelPattern(direction, **(detail or {}))


def _check_hops(meta: Any, hops: tuple[int, int | None], query: str) -> None:
    low, high = hops
    if high is None or high > MAX_HOPS:
        message = f"variable-length relationships need an upper bound of at most {MAX_HOPS}"
        raise _error_at(meta, f"{message}, e.g. *1..{MAX_HOPS}", query)
    if low > high:
        raise _error_at(meta, f"the lower bound {low} is above the upper bound {high}", query)
