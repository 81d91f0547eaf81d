"""One table of error codes (storage/errors.py ERRORS): the OpenAPI document's Error schema,
the Python client's exception classes and docs/api.md's table each list exactly its codes and
statuses, so a code added to the table and missed by any of them fails here."""

from __future__ import annotations

import re
from pathlib import Path

from memspine import openapi
from memspine.client import errors as client_errors
from memspine.errors import HTTP_CODES
from storage.errors import CODES, ERRORS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TABLE = {(cls.status, cls.code) for cls in ERRORS}
ROW = re.compile(r"^\| (\d{3}) \| `([a-z_]+)` \|", re.MULTILINE)


def test_the_table_holds_every_code_once_per_status() -> None:
    assert len(TABLE) == len(ERRORS)
    assert {"misdirected", "legal_hold", "internal", "request_timeout"} <= set(CODES)
    assert (421, "misdirected") in TABLE and (409, "legal_hold") in TABLE


def test_the_openapi_error_schema_lists_every_code() -> None:
    schema = openapi.ERROR_SCHEMA["properties"]
    assert isinstance(schema, dict)
    assert sorted(schema["error"]["enum"]) == sorted(CODES)


def test_the_client_has_a_class_for_every_code_and_status() -> None:
    assert {(cls.status, cls.code) for cls in client_errors.CLASSES} == TABLE
    for code in CODES:
        assert client_errors.BY_CODE[code].code == code


def test_docs_api_md_tables_every_code_and_status() -> None:
    assert set(ROW.findall(DOCS.read_text())) == {(str(s), c) for s, c in TABLE}


def test_litestars_own_errors_speak_codes_of_the_table() -> None:
    assert {code for code, _ in HTTP_CODES.values()} <= set(CODES)
