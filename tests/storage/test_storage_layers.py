"""storage's modules import one another one way only (docs/architecture.md): each group imports
only the groups below it, no two modules import each other, directly or around a loop (not even
for type checking), and only storage/fsync.py calls fsync."""

from __future__ import annotations

import ast
from pathlib import Path

import storage

STORAGE = Path(storage.__file__).resolve().parent
ROOT = STORAGE.parent


def module_name(path: Path) -> str:
    """The dotted name of a module file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of storage by dotted name."""
    return {module_name(p): p for p in sorted(STORAGE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The storage modules a module imports, at any depth of its code (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"  # `from storage import x`: the module x
                if sub in known:
                    found.add(sub)
                elif node.module in known:
                    found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    """Storage's import graph, a package's own __init__ left out of its modules' edges (a
    package imports its modules to offer their names; that is not a loop between them)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = imports(path, known) - {name}
        edges[name] = {t for t in targets if not name.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# What each group of storage may import besides itself (docs/architecture.md, "Storage").
# "base" is storage's own top-level modules: errors, model, ids, files, fsync, space, failpoints,
# rwlock.
MAY_IMPORT = {
    "door": {
        "base",
        "log",
        "index",
        "read",
        "cypher",
        "erasure",
        "embedders",
        "tenants",
        "transfer",
        "readlog",
    },
    "base": set(),
    "log": {"base"},
    "index": {"base", "log"},
    "read": {"base", "log", "index"},
    "cypher": {"base"},
    "erasure": {"base", "log", "index"},
    "embedders": {"base"},
    "tenants": {"base", "log", "index", "read", "cypher", "erasure", "embedders"},
    "transfer": {"base", "log", "index", "read", "erasure", "tenants", "readlog"},
    "readlog": {"base"},
}


def group(module: str) -> str:
    """The group of a storage module: its subpackage, "base" for a top-level module, or "door"
    for the package itself (storage/__init__.py, the API the server uses)."""
    if module == "storage":
        return "door"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (STORAGE / parts[1]).is_dir() else "base"


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import of a group the importer's group may not import."""
    wrong = []
    for module, targets in sorted(edges.items()):
        mine = group(module)
        for target in sorted(targets):
            theirs = group(target)
            if theirs != mine and theirs not in MAY_IMPORT.get(mine, set()):
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    return wrong


def test_each_group_imports_only_the_groups_below_it() -> None:
    edges = graph()
    assert {group(m) for m in edges} <= set(MAY_IMPORT)  # every group is placed
    assert violations(edges) == []


def test_no_two_storage_modules_import_each_other() -> None:
    assert cycles(graph()) == []


def test_the_check_sees_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert "storage.tenants.tenant" in edges["storage.tenants.manager"]  # it reads real imports
    upward = {"storage.log.reader": {"storage.read.current"}, "storage.read.current": set()}
    assert violations(upward) == ["storage.log.reader (log) imports storage.read.current (read)"]


def test_only_storage_fsync_calls_fsync() -> None:
    """Durability is made in one place (storage/fsync.py): no other module calls os.fsync."""
    callers = []
    for package in ("storage", "memspine", "memspine_admin"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("fsync", "fdatasync")
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "os"
                ):
                    callers.append(str(path.relative_to(ROOT)))
    assert sorted(set(callers)) == ["storage/fsync.py"]


# What the server (memspine) may import of storage: its front door and its errors.
# storage.receipts (issue 31's signed receipts) is still used as a namespace (receipts.Signed,
# receipts.sign) by memspine/subjects.py and memspine/routes/subjects.py: the one module left to
# route through the door.
SERVER_MAY_IMPORT = {"storage", "storage.errors", "storage.receipts"}
# The modules of storage that memspine_admin may import (docs/architecture.md; its narrower
# list per command is tests/storage/test_import_rule.py's).
PUBLIC = {
    "storage.errors",
    "storage.model",
    "storage.space",
    "storage.fsync",
    "storage.heap",
    "storage.log.layout",
    "storage.read.current",
    "storage.read.listing",
    "storage.read.recall",
    "storage.read.subjects",
    "storage.read.retention",
    "storage.erasure.purge",
    "storage.erasure.scan",
    "storage.erasure.swap",
    "storage.tenants.tenant",
    "storage.tenants.manager",
    "storage.tenants.footprint",
    "storage.tenants.usage",
    "storage.tenants.directory",
    "storage.tenants.runs",
    "storage.embedders",
    "storage.tenants.reembed",
    "storage.embedders.settings",
    "storage.datalock",
    "storage.receipts",
    "storage.transfer.format",
    "storage.transfer.export",
    "storage.transfer.landing",
    "storage.transfer.backup",
    "storage.transfer.ledger",
    "storage.transfer.tail",
    "storage.readlog",
    "storage.transfer.foreign",
}


def used_by(package: str) -> dict[str, set[str]]:
    """The storage modules a package imports, each with the files that import it."""
    known = modules()
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for target in imports(path, known):
            used.setdefault(target, set()).add(str(path.relative_to(ROOT)))
    return used


def test_the_server_uses_only_storages_front_door_and_errors() -> None:
    used = used_by("memspine")
    assert {m: sorted(users) for m, users in used.items() if m not in SERVER_MAY_IMPORT} == {}
    assert "storage" in used  # the check reads real imports


def test_every_name_the_server_takes_from_the_door_is_on_its_list() -> None:
    """The type checker cannot say (storage's __getattr__ answers any name): read the imports."""
    missing = []
    for path in sorted((ROOT / "memspine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "storage" and node.level == 0:
                missing += [
                    f"{path.relative_to(ROOT)}: {alias.name}"
                    for alias in node.names
                    if alias.name not in storage.HOMES and f"storage.{alias.name}" not in modules()
                ]
    assert missing == []


def test_the_admin_uses_only_storages_public_modules() -> None:
    used = used_by("memspine_admin")
    assert {m: sorted(users) for m, users in used.items() if m not in PUBLIC | {"storage"}} == {}


def test_the_front_door_names_what_it_imports_and_each_name_loads() -> None:
    """storage/__init__.py's HOMES (what it loads) and its imports for the type checker agree,
    and every name of the API loads from its home."""
    tree = ast.parse((STORAGE / "__init__.py").read_text())
    typed = {
        alias.asname or alias.name: node.module
        if alias.asname in (None, alias.name)
        else f"{node.module}:{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("storage")
        for alias in node.names
    }
    assert typed == storage.HOMES
    assert sorted(storage.__all__) == sorted(storage.HOMES)
    for name in storage.__all__:
        assert getattr(storage, name) is not None, name
