"""`memspine`: the command for agent hosts; `memspine mcp` serves one tenant's memory over stdio."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import anyio

from memspine import __version__
from memspine.auth import LOCAL_TENANT, UUID
from memspine.config import SettingsError, load_settings
from storage.errors import MemspineError

USAGE_ERROR = 2


def parser() -> argparse.ArgumentParser:
    """The argument parser of the memspine command."""
    top = argparse.ArgumentParser(prog="memspine", description="memspine for agent hosts.")
    top.add_argument("--version", action="version", version=f"memspine {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    mcp = sub.add_parser(
        "mcp",
        help="serve one tenant's memory as MCP tools over stdio",
        description="Serve one tenant's memory as MCP tools over stdin/stdout (logs on stderr). "
        "Either embedded on a data directory (--data-dir, --tenant) or as a client of a running "
        "server (--url, with the key in MEMSPINE_API_KEY).",
    )
    mcp.add_argument("--url", help="base URL of a running memspine server (default: $MEMSPINE_URL)")
    mcp.add_argument(
        "--data-dir", type=Path, help="data directory to open (default: $MEMSPINE_DATA_DIR)"
    )
    mcp.add_argument("--tenant", help="tenant id to serve when embedded")
    mcp.add_argument("--read-only", action="store_true", help="embedded: offer only the read tools")
    return top


def _fail(message: str, code: int = USAGE_ERROR) -> int:
    print(f"memspine mcp: {message}", file=sys.stderr)
    return code


def run_mcp(args: argparse.Namespace) -> int:
    """Pick embedded or client mode from the arguments and the environment, then serve."""
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        return _fail(str(exc))
    logging.basicConfig(level=settings.log_level, stream=sys.stderr, format="%(message)s")
    if settings.log_level != "DEBUG":
        logging.getLogger("mcp").setLevel(logging.WARNING)
    url = args.url or os.environ.get("MEMSPINE_URL")
    if url:
        if args.data_dir or args.tenant or args.read_only:
            return _fail(
                "--url serves through a server; --data-dir, --tenant and --read-only are for embedded use"
            )
        key = os.environ.get("MEMSPINE_API_KEY", "").strip()
        if not key:
            return _fail(
                "set MEMSPINE_API_KEY to the key (or, in local mode, the tenant id) to use with --url"
            )
        from memspine.mcp import stdio  # the SDK loads once the arguments are known to be good

        return _serve(partial(stdio.serve_remote, url, key))
    if not args.tenant:
        return _fail("give --url (a running server) or --tenant with --data-dir (embedded)")
    if not (LOCAL_TENANT.match(args.tenant) or UUID.match(args.tenant)):
        return _fail(
            "--tenant must be letters, digits, - and _ (at most 64, starting with a letter or digit) or a UUID"
        )
    data_dir = args.data_dir or (
        Path(os.environ["MEMSPINE_DATA_DIR"]) if "MEMSPINE_DATA_DIR" in os.environ else None
    )
    if data_dir is None:
        return _fail("give --data-dir (or set MEMSPINE_DATA_DIR) for embedded use")
    from memspine.mcp import stdio  # the SDK and the engine load once the arguments are good

    embedded = stdio.embedded_settings(settings, data_dir)
    return _serve(partial(stdio.serve_embedded, embedded, args.tenant, read_only=args.read_only))


def _serve(serve: Callable[[], Awaitable[None]]) -> int:
    try:
        anyio.run(serve)
    except MemspineError as exc:
        return _fail(f"{exc.code}: {exc.detail}", 1)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the memspine console script."""
    args = parser().parse_args(argv)
    if args.command == "mcp":
        return run_mcp(args)
    return USAGE_ERROR  # argparse refuses unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
