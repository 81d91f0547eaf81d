"""Integral numbers where the API takes integers: `2.0` and `1e3` are integers to JSON Schema
(and to the OpenAPI document), so an integer field of a body, an MCP tool's arguments or a query
parameter takes them; `2.5` stays refused with the decoder's sentence.

msgspec reads the JSON text strictly (`2.0` is a float, refused for an `int` field). Its lax
mode takes integral floats but also strings and 0/1 where numbers and booleans go, so it is used
only after `fits` has checked that an integral float at an integer's place is the one thing a
strict decoder would refuse.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

T = TypeVar("T")

# A float beyond 2^53 may not be the integer its text spelled (1791208939000000123.0 reads as
# ...000000000): such a value is refused as a float rather than taken as another integer.
EXACT = 2**53
# What a strict decoder says of a float where an integer goes (`int`, or `int | null`).
INT_WORDS = re.compile(r"Expected `int\b[^`]*`, got `float`")


def decode(body: bytes, type_: type[T]) -> T | None:
    """The body as `type_` with integral floats taken as integers, or None if that is not the
    only thing a strict decode refuses."""
    try:
        value = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not fits(value, mi.type_info(type_)):
        return None
    try:
        return msgspec.json.decode(body, type=type_, strict=False)
    except msgspec.ValidationError:
        return None


def convert(values: Any, type_: type[T]) -> T | None:
    """Python values (an MCP tool's arguments) as `type_`, as `decode` reads a body."""
    if not fits(values, mi.type_info(type_)):
        return None
    try:
        return msgspec.convert(values, type=type_, strict=False)
    except msgspec.ValidationError:
        return None


def fits(value: Any, t: mi.Type) -> bool:
    """Whether a decoded JSON value fits type `t` strictly, but for integral floats (within
    ±2^53) where an integer goes."""
    t = _bare(t)
    types = t.types if isinstance(t, mi.UnionType) else (t,)
    return any(_fits_one(value, _bare(one)) for one in types)


def _bare(t: mi.Type) -> mi.Type:
    """A type without its Annotated metadata (descriptions, schema keywords)."""
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _fits_one(value: Any, t: mi.Type) -> bool:
    if isinstance(t, mi.AnyType | mi.RawType):
        return True
    if isinstance(t, mi.StructType):
        return isinstance(value, dict) and _fits_fields(value, t)
    if isinstance(value, dict):
        return isinstance(t, mi.DictType) and all(fits(v, t.value_type) for v in value.values())
    if isinstance(value, list):
        return isinstance(t, mi.ListType) and all(fits(v, t.item_type) for v in value)
    return _fits_scalar(value, t)


def _fits_fields(value: dict[str, Any], t: mi.StructType) -> bool:
    """A struct's known fields each fit (an unknown field is the strict decoder's to refuse)."""
    fields = {f.encode_name: f.type for f in t.fields}
    return all(name not in fields or fits(v, fields[name]) for name, v in value.items())


def _fits_scalar(value: Any, t: mi.Type) -> bool:
    if value is None:
        return isinstance(t, mi.NoneType)
    if isinstance(value, bool):
        return isinstance(t, mi.BoolType)
    if isinstance(value, int):
        return isinstance(t, mi.IntType | mi.FloatType)
    if isinstance(value, float):
        integral = value.is_integer() and abs(value) <= EXACT
        return isinstance(t, mi.FloatType) or (integral and isinstance(t, mi.IntType))
    if isinstance(value, str):
        return isinstance(t, mi.StrType)
    return False


def parse(raw: str) -> int:
    """A query parameter's integer: `2`, or an integral decimal such as `2.0` or `2e0`;
    ValueError for anything else (`2.5`, `two`)."""
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        number = Decimal(raw)
    except InvalidOperation:
        raise ValueError(raw) from None
    # Bounded before any arithmetic: 1e999999999 would make an integer of a billion digits.
    if not number.is_finite() or number.adjusted() > 19:
        raise ValueError(raw)
    if number != number.to_integral_value():
        raise ValueError(raw)
    return int(number)
