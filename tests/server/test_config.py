"""Settings: parsed and validated once, every setting documented (tests/e2e/test_server_start.py:
a bad value stops the server)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memspine.config import IGNORED, PARSERS, Settings, SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]
CONFIG_DOC = REPO / "docs" / "configuration.md"


def test_defaults_without_environment() -> None:
    s = load_settings({})
    assert (s.host, s.port, s.data_dir) == ("127.0.0.1", 7781, Path("./data"))
    assert s.admin_key is None
    assert (s.embedding_dim, s.max_body_bytes) == (384, 1_048_576)
    assert (s.tenant_idle_secs, s.purge_interval_secs) == (3600.0, 60.0)
    assert s.max_open_tenants >= 1
    assert (s.metrics_per_tenant, s.log_level) == (False, "INFO")


def test_every_variable_is_parsed(tmp_path: Path) -> None:
    s = load_settings(
        {
            "MEMSPINE_BIND": " [::1]:8000 ",
            "MEMSPINE_DATA_DIR": str(tmp_path / "new" / "dir"),
            "MEMSPINE_ADMIN_KEY": "a-long-enough-admin-key",
            "MEMSPINE_EMBEDDING_DIM": "4",
            "MEMSPINE_MAX_OPEN_TENANTS": "7",
            "MEMSPINE_TENANT_IDLE_SECS": "0.5",
            "MEMSPINE_PURGE_INTERVAL_SECS": "30",
            "MEMSPINE_MAX_BODY_BYTES": "2048",
            "MEMSPINE_CYPHER_TIMEOUT_MS": "100",
            "MEMSPINE_CYPHER_MAX_ROWS": "50",
            "MEMSPINE_METRICS_PER_TENANT": "yes",
            "MEMSPINE_LOG_LEVEL": "debug",
            "MEMSPINE_MCP_ALLOWED_ORIGINS": " https://Agent.Example.com:443, http://10.0.0.5:3000/,",
            "MEMSPINE_URL": "http://client-side-only",
        }
    )
    assert s == Settings(
        host="::1",
        port=8000,
        data_dir=tmp_path / "new" / "dir",
        admin_key="a-long-enough-admin-key",
        embedding_dim=4,
        max_open_tenants=7,
        tenant_idle_secs=0.5,
        purge_interval_secs=30.0,
        max_body_bytes=2048,
        cypher_timeout_ms=100,
        cypher_max_rows=50,
        metrics_per_tenant=True,
        log_level="DEBUG",
        mcp_allowed_origins=frozenset({"https://agent.example.com", "http://10.0.0.5:3000"}),
    )
    assert not (tmp_path / "new").exists()  # validating a directory does not create it


BAD = [
    ("MEMSPINE_BIND", "7781", "host:port"),
    ("MEMSPINE_BIND", "localhost:http", "expected an integer"),
    ("MEMSPINE_BIND", "localhost:70000", "from 1 to 65535"),
    ("MEMSPINE_DATA_DIR", "", "empty"),
    ("MEMSPINE_DATA_DIR", "{file}", "not a directory"),
    ("MEMSPINE_DATA_DIR", "{file}/data", "not a writable directory"),
    ("MEMSPINE_ADMIN_KEY", "short", "at least 16"),
    ("MEMSPINE_EMBEDDING_DIM", "abc", "expected an integer"),
    ("MEMSPINE_EMBEDDING_DIM", "0", "from 1 to 4096"),
    ("MEMSPINE_MAX_OPEN_TENANTS", "-3", "from 1 to"),
    ("MEMSPINE_TENANT_IDLE_SECS", "0", "positive"),
    ("MEMSPINE_TENANT_IDLE_SECS", "nan", "positive"),
    ("MEMSPINE_PURGE_INTERVAL_SECS", "soon", "number of seconds"),
    ("MEMSPINE_MAX_BODY_BYTES", "1k", "expected an integer"),
    ("MEMSPINE_MAX_BODY_BYTES", "10", "from 1024"),
    ("MEMSPINE_CYPHER_TIMEOUT_MS", "1", "from 10"),
    ("MEMSPINE_CYPHER_MAX_ROWS", "0", "from 1"),
    ("MEMSPINE_METRICS_PER_TENANT", "maybe", "expected 1 or 0"),
    ("MEMSPINE_LOG_LEVEL", "loud", "DEBUG, INFO"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "agent.example.com", "such as https://"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "https://ok.example, *", "got '*'"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "https://a.example/app", "such as https://"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "ftp://a.example", "such as https://"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "https://*.example.com", "wildcards are not supported"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "https://ok.example,http://*:3000", "got 'http://*:3000'"),
    ("MEMSPINE_MCP_ALLOWED_ORIGINS", "https://*", "list each origin in full"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_names_the_variable_and_the_fix(
    tmp_path: Path, name: str, value: str, words: str
) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(SettingsError) as err:
        load_settings({name: value.format(file=tmp_path / "file")})
    assert str(err.value).startswith(f"{name}: ")
    assert str(err.value).count(name) == 1  # named once, by load_settings
    assert words in str(err.value)


def test_an_unknown_memspine_variable_is_refused() -> None:
    with pytest.raises(SettingsError, match="unknown setting MEMSPINE_DATADIR"):
        load_settings({"MEMSPINE_DATADIR": "/tmp/x"})
    assert load_settings({"HOME": "/root", "OTHER_THING": "1"}).port == 7781


def _documented_variables() -> set[str]:
    """The variables named in the first column of the settings table of docs/configuration.md."""
    return set(re.findall(r"^\| `(MEMSPINE_[A-Z_]+)` \|", CONFIG_DOC.read_text(), re.MULTILINE))


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_setting_is_documented(name: str) -> None:
    assert name in _documented_variables(), f"{name} is missing from docs/configuration.md"


def test_every_documented_setting_exists() -> None:
    assert _documented_variables() - set(PARSERS) == set()
    text = CONFIG_DOC.read_text()
    assert all(name in text for name in IGNORED)
