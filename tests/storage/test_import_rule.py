"""The import rule between the three packages: storage imports neither litestar nor memspine nor
memspine_admin (it is the layer below both); memspine_admin imports storage only through its
public modules and nothing of memspine (the server is built on it, not the other way);
memspine.client, which people install beside their own code, imports nothing of the server:
only the standard library, httpx, msgspec, anyio and itself; and no two modules of the three
packages import each other, directly or around a loop. Read from the source: every import
statement, those inside functions and under TYPE_CHECKING too."""

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
# storage.tenants.runs, for `tenant show` and `tenant retention`), and the data directory's
# lock its offline commands hold, and erasure receipts (storage.receipts: `receipt verify`, and
# the backups and exports a receipt must name). The rest of storage is the server's (memspine) to use;
# test_storage_layers.py lists what memspine itself may import.
STORAGE_PUBLIC = (
    "storage.errors",
    "storage.fsync",
    "storage.tenants.usage",
    "storage.tenants.directory",  # which directories are tenants; erasing one offline
    "storage.transfer",
    "storage.embedders",
    "storage.tenants.reembed",
    "storage.tenants.manager",  # upgrade: every tenant opened once, as the server opens it
    "storage.datalock",
    "storage.read.retention",
    "storage.tenants.runs",
    "storage.readlog",
    "storage.receipts",
    "storage.model",  # the Quota an import or a restore holds a tenant to
    "storage.space",  # a full disk named in one line by the offline commands
)
# The one known breach of the rule below, left for issue 30's follow-up: `memspine-admin subject
# erase|export` run the server's erasure by subject (memspine/subjects.py, built on the Engine)
# on a stopped data directory. The way out is that erasure's core in storage (select, delete,
# purge, scan, sign), which the Engine and this command would both call.
ADMIN_SERVER_EXCEPTIONS = ("memspine_admin/subjects.py:",)
STORAGE_FORBIDDEN = ("litestar", "memspine", "memspine_admin")
PACKAGES = ("storage", "memspine", "memspine_admin")
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


def admin_server_breaches(root: Path) -> list[str]:
    """Imports in root/memspine_admin of the server package, memspine."""
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in sorted((root / "memspine_admin").rglob("*.py"))
        for line, name in imports(path, root)
        if _top(name) == "memspine"
    ]


def module_graph(root: Path) -> dict[str, set[str]]:
    """Which module imports which, over the three packages: a name is resolved to the module
    that defines it (`from a import b` is a.b if that is a module, else a). A package's
    __init__ importing its own modules is no edge (it offers their names)."""
    known: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            known[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {_module(imported, known) for _, imported in imports(path, root)}
        edges[name] = {t for t in targets if t and t != name and not t.startswith(name + ".")}
    return edges


def _module(name: str, known: dict[str, Path]) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in known else ""


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Modules that import one another around a loop: each strongly connected component of
    more than one module (Tarjan, iterative over a sorted graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = stack[stack.index(v) :]
                del stack[stack.index(v) :]
                if len(component) > 1:
                    found.append(sorted(component))
    return found


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


def test_memspine_admin_imports_nothing_of_the_server() -> None:
    breaches = admin_server_breaches(REPO)
    known = [b for b in breaches if b.startswith(ADMIN_SERVER_EXCEPTIONS)]
    assert [b for b in breaches if b not in known] == []
    allowed = ("memspine.subjects", "memspine.config", "memspine.engine")
    assert all(b.split(" imports ")[1].startswith(allowed) for b in known), known


def test_no_modules_import_each_other_around_a_loop() -> None:
    edges = module_graph(REPO)
    assert "memspine_admin.data" in edges["memspine_admin.cli"]  # it reads the real imports
    assert cycles(edges) == []


def test_a_loop_through_a_lazy_import_is_seen(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "memspine_admin" / "a.py").write_text("from memspine_admin import b\n")
    (tmp_path / "memspine_admin" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "memspine_admin" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from memspine_admin.a import X\n"
    )
    (tmp_path / "memspine_admin" / "d.py").write_text("import memspine_admin.a\n")
    found = cycles(module_graph(tmp_path))
    assert found == [["memspine_admin.a", "memspine_admin.b", "memspine_admin.c"]]


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
        ("memspine_admin/x.py", "def f():\n    from memspine.auth import UUID\n", True),
        ("memspine_admin/x.py", "import memspine.config\n", True),
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
    found += admin_server_breaches(tmp_path)
    assert bool(found) is breach
