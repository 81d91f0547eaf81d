"""Fixtures for every test: a tenant on tmp_path, and a real memspine-server process on a free
loopback port (tests/server/conftest.py replaces the server fixtures with the in-process app).

The layout: tests/storage (the storage package directly), tests/server (the app in process:
real Litestar and stores, no socket), tests/e2e (server and CLI subprocesses, sockets, kill -9).

Servers run with MEMSPINE_EMBEDDER=none unless a test asks for an embedder (tests/support/servers.py's
DIM_ENV): the default, `local`, would load the model and embed text-only events in the background,
which no existing test asked for, at a CPU cost and a timing no test should depend on. The tests
of server vectors set `local` (or an endpoint) themselves: tests/server/test_server_embedding.py,
tests/e2e/test_embedding_e2e.py, tests/storage/test_server_vectors.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from storage.tenants.tenant import Tenant
from tests.support.servers import REPO, ServerProcess, free_port  # noqa: F401  (re-exported for test modules)

# Fixtures of tests/support for every test: a real PostgreSQL, a small file system to fill.
pytest_plugins = ["tests.support.pgcluster", "tests.support.disk_full"]

LAYOUT = ("storage", "server", "e2e", "control")

# Hypothesis counts what an example did, never how long it took: its default 200 ms deadline and
# its too-slow health check fail a test when the machine is busy (docs/architecture.md, "How the
# suite holds under load"). A test that bounds time says so itself, and is marked `timing`.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test file not yet in the layout may bound time as tests/e2e's `timing` files do: it
    runs alone with them (make test). The files of tests/support/slow_files.txt go first."""
    for item in items:
        path = item.path.resolve()
        where = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
        if len(where) < 2 or where[0] not in LAYOUT:
            item.add_marker(pytest.mark.timing)
    # The longest files first, each file's tests kept together and in order (a stable sort): a
    # long file dealt last to an xdist worker would run alone at the end while the other worker
    # idles (make test-e2e turns off xdist's own reordering, which puts files of many tests first).
    rank = slow_files()
    items.sort(key=lambda item: rank.get(item.path.resolve(), len(rank)))


def slow_files() -> dict[Path, int]:
    """tests/support/slow_files.txt: a test file's place in the list, the longest first."""
    lines = (TESTS / "support" / "slow_files.txt").read_text().splitlines()
    names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {(TESTS.parent / name).resolve(): i for i, name in enumerate(names)}


@pytest.fixture(autouse=True)
def priority_kept() -> Iterator[None]:
    """The worker's CPU priority as it was before the test: a command run in process lowers
    its own (memspine_admin/data.py, beside_the_server), and every later test of this worker
    would otherwise run at nice 19 behind the rest of the suite."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    yield
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        with contextlib.suppress(PermissionError):  # raising it back needs root
            os.setpriority(os.PRIO_PROCESS, 0, nice)


@pytest.fixture(scope="session", autouse=True)
def one_model_build_per_process() -> Iterator[None]:
    """The local embedder's graph built once per process for the same weights and options.

    Building it from the weights (storage/embedders/bert_graph.py) is deterministic and costs
    more CPU than everything else a test of server vectors does; a test process builds it for
    each LocalEmbedder it loads, a server process once. The built bytes are the same either way.
    """
    from storage.embedders import bert_graph

    build = bert_graph.build_bert
    built: dict[tuple[Any, ...], bytes] = {}

    def build_once(weights: Mapping[str, Any], *args: Any, **kwargs: Any) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(weights):  # names, shapes and each array's ends: hashing 90 MB costs
            raw = memoryview(weights[name]).cast("B")
            digest.update(f"{name}{weights[name].shape}".encode())
            digest.update(raw[:256])
            digest.update(raw[-256:])
        key = (digest.digest(), repr(args), repr(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(weights, *args, **kwargs)
        return built[key]

    bert_graph.build_bert = build_once  # type: ignore[assignment]
    yield
    bert_graph.build_bert = build


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """A factory of running ServerProcess on tmp_path/data (start_server(env=...)); all stop at teardown."""
    started: list[ServerProcess] = []

    def start(env: dict[str, str] | None = None, data_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / "data", env).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server: Any) -> ServerProcess:
    """A running server in local mode (the bearer token is the tenant id), embedding dimension 4."""
    return start_server()  # type: ignore[no-any-return]


@pytest.fixture
def tenant(tmp_path: Path) -> Iterator[Tenant]:
    """An open tenant on tmp_path with 4-dimensional embeddings."""
    t = Tenant.open("t1", tmp_path / "t1", embedding_dim=4)
    yield t
    t.close()
