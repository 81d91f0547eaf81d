"""Which variables a clause may use: checks that turn a wrong query into a clear sentence."""

from __future__ import annotations

from storage.cypher import ast
from storage.cypher.functions import AGGREGATES
from storage.errors import InvalidRequest

# What a variable holds, as far as the planner can tell: a node, a link, a list of links
# (variable length) or any other value (UNWIND, WITH expressions).
NODE, REL, PATH, VALUE = "node", "relationship", "relationship list", "value"
Scope = dict[str, str]


def variables(expr: ast.Expr) -> set[str]:
    """The variable names expr reads."""
    return {node.name for node in ast.walk(expr) if isinstance(node, ast.Variable)}


def parameters(expr: ast.Expr) -> set[str]:
    """The parameter names expr reads."""
    return {node.name for node in ast.walk(expr) if isinstance(node, ast.Parameter)}


def aggregate_calls(expr: ast.Expr) -> list[ast.FunctionCall]:
    """The aggregate calls in expr, outermost first."""
    return [n for n in ast.walk(expr) if isinstance(n, ast.FunctionCall) and n.name in AGGREGATES]


def check_expr(expr: ast.Expr, scope: Scope | set[str], context: str) -> None:
    """InvalidRequest if expr reads a variable outside scope or aggregates where it may not."""
    for name in sorted(variables(expr)):
        if name not in scope:
            raise InvalidRequest(
                f"unknown variable {name!r} in {context}; bind it with MATCH, UNWIND or WITH first"
            )
    calls = aggregate_calls(expr)
    if calls:
        raise InvalidRequest(
            f"{calls[0].name}() aggregates and is not allowed in {context}; "
            "use it in a WITH or RETURN item"
        )


def check_item(expr: ast.Expr, scope: Scope, context: str) -> None:
    """InvalidRequest if a WITH or RETURN item reads an unknown variable or nests aggregates."""
    calls = aggregate_calls(expr)
    stripped = ast.replace(expr, lambda n: ast.literal(None) if n in calls else None)
    check_expr(stripped, scope, context)
    for call in calls:
        for arg in call.args:
            if aggregate_calls(arg):
                raise InvalidRequest(f"aggregate functions cannot be nested, as in {call.name}()")
            check_expr(arg, scope, context)


def check_constant(expr: ast.Expr, context: str) -> None:
    """InvalidRequest unless expr uses only literals and parameters (SKIP, LIMIT)."""
    if variables(expr) or aggregate_calls(expr):
        raise InvalidRequest(f"{context} takes a number or a $parameter, not a variable")


def bind(scope: Scope, name: str, kind: str, context: str) -> None:
    """Add a new variable to scope; InvalidRequest if the name is taken."""
    if name in scope:
        raise InvalidRequest(f"variable {name!r} is already defined; {context} needs a new name")
    scope[name] = kind
