"""memspine: a multi-tenant memory server for AI agents."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("memspine")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
