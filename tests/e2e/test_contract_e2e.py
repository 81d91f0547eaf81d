"""The contract over a real socket: the schemathesis CLI, every check on, against memspine-server
itself (uvicorn, httptools, the connection guard in front of the app) with a read-write key.

tests/server/test_contract.py runs the same CLI against the app in process for the three keys
with more examples; this pass holds what only a real server adds to the document's promises.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memspine_admin.control import ControlDB
from tests.support.budget import LONG
from tests.support.contract import ADMIN_KEY, ALL_PHASES, DOCUMENT, check_run, cli_args
from tests.support.servers import REPO, ServerProcess

SCRIPT = Path(sys.executable).parent / "schemathesis"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "schemathesis.cli"]
# One example per operation and phase; tests/server/test_contract.py has the many examples. Under
# make test-long every phase runs over the socket, the coverage phase too (each operation's
# bounds and malformed values: most of the run's requests); make test runs the examples and one
# fuzzed request per operation (tests/support/budget.py).
MAX_EXAMPLES = 1
PHASES = ALL_PHASES if LONG else "examples,fuzzing"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """A server with issued keys, and a read-write key of one tenant made through it."""
    data_dir = tmp_path_factory.mktemp("contract") / "data"
    ControlDB.init(data_dir, actor="test")
    server = ServerProcess(data_dir, {"MEMSPINE_ADMIN_KEY": ADMIN_KEY}).start()
    try:
        with server.client(ADMIN_KEY) as admin:
            r = admin.post("/v1/admin/tenants", json={"name": "contract"})
            assert r.status_code == 201, r.text
            body = {"tenant_id": r.json()["tenant_id"], "name": "rw", "scopes": ["read", "write"]}
            r = admin.post("/v1/admin/keys", json=body)
            assert r.status_code == 201, r.text
            key = r.json()["api_key"]
        assert server.client(key).get("/v1/whoami").status_code == 200  # warm
        yield server, key
    finally:
        server.stop()


# A bound on liveness, not on speed: the run took 225 s of a 240 s bound at load 21 (2 cores).
@pytest.mark.long
@pytest.mark.timeout(900)
def test_the_server_answers_as_its_document_says_over_a_socket(
    live: tuple[ServerProcess, str], tmp_path: Path
) -> None:
    server, key = live
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}  # tests.support.contract_hooks
    args = [*COMMAND, *cli_args(server.url + DOCUMENT, key, MAX_EXAMPLES, PHASES)]
    done = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840, check=False
    )
    check_run(done.returncode, f"{done.stdout}\n{done.stderr[-2000:]}")
