"""`memspine`: the command for agent hosts; `memspine mcp` serves one tenant's memory over stdio."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio

from memspine import __version__
from memspine.config import SettingsError, check_data_dir, load_settings
from memspine_admin.records import LOCAL_TENANT, UUID
from storage.datalock import DataDirBusy, hold
from storage.errors import MemspineError

USAGE_ERROR = 2
MCP_PATH = "/mcp"
TOOLSETS = ("memspine", "automem", "mem0")  # memspine/mcp/toolsets/


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
    mcp.add_argument(
        "--url",
        help="base URL of a running memspine server, such as http://127.0.0.1:7781 (a trailing "
        "/mcp is fine; default: $MEMSPINE_URL)",
    )
    mcp.add_argument(
        "--data-dir", type=Path, help="data directory to open (default: $MEMSPINE_DATA_DIR)"
    )
    mcp.add_argument("--tenant", help="tenant id to serve when embedded")
    mcp.add_argument("--read-only", action="store_true", help="embedded: offer only the read tools")
    mcp.add_argument(
        "--tools",
        choices=TOOLSETS,
        default=TOOLSETS[0],
        help="the tools to serve: memspine's own (default), or AutoMem's or Mem0's under their "
        "names and arguments (docs/migrate.md)",
    )
    return top


def _fail(message: str, code: int = USAGE_ERROR) -> int:
    print(f"memspine mcp: {message}", file=sys.stderr)
    return code


def server_url(raw: str) -> str | None:
    """The server's base URL from what was given (README's /mcp endpoint included), or None.

    The bridge speaks the HTTP API under the base URL; under /mcp it would reach the MCP
    endpoint instead, whose GET is an event stream that never ends.
    """
    text = raw.strip()
    if "//" not in text:  # host:port alone
        text = "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return None
    path = parts.path.rstrip("/")
    if path.endswith(MCP_PATH):
        path = path[: -len(MCP_PATH)]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def run_mcp(args: argparse.Namespace) -> int:
    """Pick embedded or client mode from the arguments and the environment, then serve."""
    try:
        settings = load_settings(os.environ)
    except SettingsError as exc:
        return _fail(str(exc))
    logging.basicConfig(level=settings.log_level, stream=sys.stderr, format="%(message)s")
    if settings.log_level != "DEBUG":
        logging.getLogger("mcp").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
        # A line per retry (memspine/client/retry.py); what finally fails is said once.
        logging.getLogger("memspine.client").setLevel(logging.WARNING)
    url = args.url or os.environ.get("MEMSPINE_URL")
    if url:
        base = server_url(url)
        if base is None:
            return _fail(
                f"--url must be the server's address, such as http://127.0.0.1:7781, got {url!r}"
            )
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

        return _serve(partial(stdio.serve_remote, base, key, args.tools))
    if not args.tenant:
        return _fail("give --url (a running server) or --tenant with --data-dir (embedded)")
    if not (LOCAL_TENANT.match(args.tenant) or UUID.match(args.tenant)):
        return _fail(
            "--tenant must be letters, digits, - and _ (at most 64, starting with a letter or digit) or a UUID"
        )
    source = "--data-dir" if args.data_dir else "MEMSPINE_DATA_DIR"
    raw = str(args.data_dir) if args.data_dir else os.environ.get("MEMSPINE_DATA_DIR")
    if raw is None:
        return _fail("give --data-dir (or set MEMSPINE_DATA_DIR) for embedded use")
    try:
        data_dir = check_data_dir(raw)
        lock = hold(data_dir, "memspine mcp")
    except SettingsError as exc:
        return _fail(f"{source}: {exc}")
    except DataDirBusy as busy:
        return _fail(busy_sentence(busy))
    except OSError as exc:
        return _fail(f"{source}: cannot use {raw!r}: {exc.strerror}")
    try:
        problem = tenant_problem(data_dir, args.tenant)
        if problem is not None:
            return _fail(problem)
        from memspine.mcp import stdio  # the SDK and the engine load once the arguments are good

        embedded = stdio.embedded_settings(settings, data_dir)
        return _serve(
            partial(
                stdio.serve_embedded,
                embedded,
                args.tenant,
                read_only=args.read_only,
                tools=args.tools,
            )
        )
    finally:
        lock.close()


def busy_sentence(busy: DataDirBusy) -> str:
    """Why the embedded bridge will not open a directory another process serves, and what to run."""
    url = busy.url or "http://127.0.0.1:7781"
    return (
        f"{busy.data_dir.resolve()} is in use by {busy.who()}; connect through it instead of "
        f"opening its files a second time: MEMSPINE_API_KEY=<key, or in local mode the tenant id> "
        f"memspine mcp --url {url}"
    )


def tenant_problem(data_dir: Path, tenant: str) -> str | None:
    """With issued keys (a control database), the tenant must be one it knows; None if fine."""
    from memspine_admin.control import ControlDB

    if not ControlDB.exists(data_dir):
        return None
    with ControlDB.open(data_dir) as db:
        if db.get_tenant(tenant) is not None:
            return None
    return (
        f"{data_dir.resolve()} has issued keys (memspine-admin init) and no tenant {tenant}; "
        "give --tenant a TENANT ID from memspine-admin tenant list"
    )


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
