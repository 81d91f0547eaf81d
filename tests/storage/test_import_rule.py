"""The import rule between the three packages: storage imports neither litestar nor memspine nor
memspine_admin (it is the layer below both); memspine_admin imports storage only through its
public modules; memspine.client, which people install beside their own code, imports nothing
of the server: only the standard library, httpx, msgspec, anyio and itself. Read from the
source: every import statement, those inside functions too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What memspine_admin may import of storage: the error hierarchy its commands and the verifier
# answer with, the durable file writes of its control database, a tenant's figures read from
# its files (storage.tenants.usage, for `tenant show`), and storage.transfer, which its export,
# import, backup and restore commands run on, and the embedders with storage.tenants.reembed,
# which `reembed` runs, and a tenant's retention read from its files (storage.read.retention,
# storage.tenants.runs, for `tenant show` and `tenant retention`). The rest of storage is the server's (memspine) to use;
# test_storage_layers.py lists what memspine itself may import.
STORAGE_PUBLIC = (
    "storage.errors",
    "storage.fsync",
    "storage.tenants.usage",
    "storage.transfer",
    "storage.embedders",
    "storage.tenants.reembed",
    "storage.read.retention",
    "storage.tenants.runs",
    "storage.readlog",
)
STORAGE_FORBIDDEN = ("litestar", "memspine", "memspine_admin")
# What memspine/client may import beyond the standard library: its HTTP stack and decoder, and
# the package's version string (memspine/__init__.py imports only importlib.metadata).
CLIENT_ALLOWED = ("httpx", "msgspec", "anyio", "memspine.client", "memspine.__version__")


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything a file imports; `from a import b` is a.b, relative
    imports resolved against the file's package."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package[: len(package) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            # Each name: `from storage import errors` is storage.errors, and a name defined in
            # a package's __init__ belongs to no public module.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def storage_breaches(root: Path) -> list[str]:
    """Imports in root/storage of the server, the admin package or Litestar."""
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in sorted((root / "storage").rglob("*.py"))
        for line, name in imports(path, root)
        if _top(name) in STORAGE_FORBIDDEN
    ]


def admin_breaches(root: Path) -> list[str]:
    """Imports in root/memspine_admin of storage modules other than the public ones."""
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in sorted((root / "memspine_admin").rglob("*.py"))
        for line, name in imports(path, root)
        if _top(name) == "storage"
        and not any(name == p or name.startswith(p + ".") for p in STORAGE_PUBLIC)
    ]


def client_breaches(root: Path) -> list[str]:
    """Imports in root/memspine/client of anything but the standard library and CLIENT_ALLOWED."""
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in sorted((root / "memspine" / "client").rglob("*.py"))
        for line, name in imports(path, root)
        if _top(name) not in sys.stdlib_module_names
        and not any(name == p or name.startswith(p + ".") for p in CLIENT_ALLOWED)
    ]


def test_storage_imports_neither_the_server_nor_the_admin_package() -> None:
    assert list((REPO / "storage").rglob("*.py"))
    assert storage_breaches(REPO) == []


def test_memspine_admin_imports_storage_only_through_its_public_modules() -> None:
    assert list((REPO / "memspine_admin").rglob("*.py"))
    assert admin_breaches(REPO) == []


def test_the_client_imports_nothing_of_the_server() -> None:
    assert list((REPO / "memspine" / "client").rglob("*.py"))
    assert client_breaches(REPO) == []


@pytest.mark.parametrize(
    ("module", "code", "breach"),
    [
        ("storage/x.py", "from memspine.config import Settings\n", True),
        ("storage/x.py", "def f():\n    import litestar.types\n", True),
        ("storage/x.py", "import memspine_admin\n", True),
        ("storage/cypher/x.py", "from .. import model\nfrom ..errors import NotFound\n", False),
        ("memspine_admin/x.py", "from storage.tenant import Tenant\n", True),
        ("memspine_admin/x.py", "from storage import tenant\n", True),
        ("memspine_admin/x.py", "from storage import Tenant\n", True),
        ("memspine_admin/x.py", "import storage.log\n", True),
        ("memspine_admin/x.py", "from storage.errors import NotFound\n", False),
        ("memspine_admin/x.py", "from storage import errors\n", False),
        ("memspine_admin/x.py", "from storage.fsync import fsync_dir\n", False),
        ("memspine/client/x.py", "from storage.errors import NotFound\n", True),
        ("memspine/client/x.py", "def f():\n    import litestar\n", True),
        ("memspine/client/x.py", "from memspine.schemas import EventIn\n", True),
        ("memspine/client/x.py", "from memspine import pipeline\n", True),
        ("memspine/client/x.py", "from .. import config\n", True),
        ("memspine/client/x.py", "import lmdb\n", True),
        ("memspine/client/x.py", "from memspine import __version__\n", False),
        ("memspine/client/x.py", "from . import models\nimport httpx, msgspec, json\n", False),
    ],
)
def test_the_rule_reads_every_form_of_import(
    tmp_path: Path, module: str, code: str, breach: bool
) -> None:
    for package in ("storage", "memspine_admin", "memspine/client"):
        (tmp_path / package).mkdir(parents=True)
    path = tmp_path / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    found = storage_breaches(tmp_path) + admin_breaches(tmp_path) + client_breaches(tmp_path)
    assert bool(found) is breach
