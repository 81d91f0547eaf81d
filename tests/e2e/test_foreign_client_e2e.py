"""Imports from other servers against a real memspine-server: the Python client posting a
conversion's batches (the same ids as import-from, a resend stores nothing), and import-from
into a new tenant while the server serves the directory."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memspine.client import Memspine
from storage.transfer.foreign import batches, convert, event_id
from tests.support import foreign_files as ff
from tests.support.servers import ServerProcess

ADMIN = [sys.executable, "-m", "memspine_admin.cli"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("foreign") / "data"
    served = ServerProcess(data_dir, {"MEMSPINE_EMBEDDER": "none"}).start()
    yield served
    served.stop()


def test_the_client_posts_a_conversion_with_the_ids_an_import_gives(server: ServerProcess) -> None:
    conv = convert("mem0", ff.mem0_file())
    with Memspine(server.url, "alice") as m:
        sent = [m.append_batch(b) for b in batches(conv, "alice")]
        ids = [i for answer in sent for i in answer.event_ids]
        assert ids == [event_id("alice", r.key) for r in conv.records]
        again = [m.append_batch(b) for b in batches(conv, "alice")]
        assert [i for a in again for i in a.replayed] == list(range(len(ids)))
        hits = m.recall("roast coffee").hits
        assert [h.text for h in hits] == ["Likes dark roast coffee"]


def test_import_from_runs_beside_the_server_into_a_new_tenant(
    server: ServerProcess, tmp_path: Path
) -> None:
    path = tmp_path / "graph.json"
    path.write_bytes(ff.zep_file())
    done = subprocess.run(
        [
            *ADMIN,
            "--data-dir",
            str(server.data_dir),
            "import-from",
            "zep",
            str(path),
            "--tenant",
            "zep1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with Memspine(server.url, "zep1") as m:
        hits = m.recall("Alice works").hits
        assert hits[0].event_id == event_id("zep1", f"zep:{ff.E_GLOBEX}")
        assert event_id("zep1", f"zep:{ff.E_ACME}") not in {h.event_id for h in hits}
    again = subprocess.run(
        [
            *ADMIN,
            "--data-dir",
            str(server.data_dir),
            "import-from",
            "zep",
            str(path),
            "--tenant",
            "zep1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        again.returncode == 1 and "serves" in again.stderr
    )  # a tenant with a directory: stop it first
