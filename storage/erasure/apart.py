"""A large tenant's purge copy and erasure scan in a child process at a lower priority.

Both are Python loops over every record of the log (the copy also makes each record's keyword
document). On a thread of the server they held its GIL for tens of seconds at 100,000 events,
and every request of every other tenant waited for it at each hand-over (bench/RESULTS.md,
"Erasure by subject"); a child has a GIL of its own, as the embedder's has
(storage/embedders/child.py). A tenant under APART_FROM_RECORDS records is done on the calling
thread: starting a child costs more than its copy.

The child reads the log through its own read-only LMDB environment (LMDB serves readers in any
process) and writes only under the purge's stage (`purge.new/`), so a crash of either side
leaves what a crash of an in-process copy leaves (storage/erasure/swap.py removes the stage).
It ends when its stdin closes: the parent closed it or died (`kill -9` included). Its answer is
one JSON document on stdout; a failure with an errno (a full disk) is raised in the parent as
an OSError with the same errno, anything else as ApartError.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from storage import space
from storage.log.layout import DB_NAMES, LEGACY_EVENTS
from storage.log.reader import LogReader

# Records from which a purge's copy and an erasure's scan run in a child: a child's start (its
# imports, about 0.35 s of CPU) is about what copying 2,000 records costs.
APART_FROM_RECORDS = 20_000
NICENESS = 10  # over the server process's own, as the purge thread's (memspine/purging.py)
# The receipt's scan runs at the server's own priority, as it did on a read thread: the request
# waits for it, and at +10 on a busy machine it took two to three times as long
# (bench/RESULTS.md, "Erasure by subject").
SCAN_NICENESS = 0
ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the storage package
FAILED_WITH_ERRNO, FAILED = 3, 4  # the child's exit codes


class ApartError(RuntimeError):
    """The child failed other than with an errno (its traceback is on the server's stderr)."""


def worth_it(r: LogReader) -> bool:
    """Whether the log this snapshot reads is large enough for a child."""
    records = r.dbs.get("records")
    return records is not None and r.txn.stat(records)["entries"] >= APART_FROM_RECORDS


def run(task: str, *, niceness: int = NICENESS, **args: Any) -> Any:
    """TASKS[task](**args) in a child process `niceness` below the server's priority (it
    cannot rise above the calling thread's); its answer (JSON)."""
    me = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the process's, not this thread's
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    how = json.dumps({"task": task, "args": args, "nice": me + niceness})
    proc = subprocess.Popen(
        [sys.executable, "-m", "storage.erasure.apart", how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    try:
        assert proc.stdout is not None
        answer = proc.stdout.read()
        code = proc.wait()
    except BaseException:
        proc.kill()  # this purge is abandoned: its stage is removed by the caller
        proc.wait()
        raise
    finally:
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
    if code == FAILED_WITH_ERRNO:
        failed = json.loads(answer)
        raise OSError(failed["errno"], failed["error"])
    if code != 0:
        raise ApartError(f"the child process of {task} ended with {code}")
    return json.loads(answer)


@contextlib.contextmanager
def reading(log_path: Path) -> Iterator[LogReader]:
    """A snapshot of the log at log_path through an environment of this process, read-only."""
    env = lmdb.open(
        str(log_path), readonly=True, max_dbs=len(DB_NAMES) + 2, max_readers=256, readahead=False
    )
    try:
        with env.begin(buffers=False) as txn:
            dbs: dict[str, Any] = {}
            for name in (*DB_NAMES, LEGACY_EVENTS):
                with contextlib.suppress(lmdb.NotFoundError):
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=False)
            yield LogReader(txn, dbs)
    finally:
        env.close()


def _errno_of(exc: BaseException) -> int | None:
    """The errno the parent raises for a failure of the disk (storage/space.py recognises a
    full one from it, as from the store's own error); None for any other failure."""
    named = next((e.errno for e in space.causes(exc) if isinstance(e, OSError) and e.errno), None)
    if space.names_full_disk(exc):
        return named if named in (errno.ENOSPC, errno.EDQUOT) else errno.ENOSPC
    if space.is_io_failure(exc):
        return named or errno.EIO
    return None


# What a child may be asked to run: module and function, imported in the child only.
TASKS = {
    "copy": ("storage.erasure.purge", "copy_apart"),
    "scan": ("storage.erasure.scan", "scan_apart"),
}


def _watch_parent() -> None:
    """End this process when its stdin closes (the parent is gone or gave up on it)."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        os._exit(FAILED)

    threading.Thread(target=watch, daemon=True).start()


def _child(how: dict[str, Any]) -> int:
    """Run the task asked for; its answer on stdout."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, int(how["nice"]))
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stdout carries the answer only
    _watch_parent()
    try:
        module, name = TASKS[how["task"]]
        answer = getattr(importlib.import_module(module), name)(**how["args"])
    except Exception as exc:
        code = _errno_of(exc)
        if code is None:
            raise
        out.write(json.dumps({"errno": code, "error": str(exc)}))
        out.flush()
        return FAILED_WITH_ERRNO
    out.write(json.dumps(answer))
    out.flush()
    return 0


if __name__ == "__main__":
    # os._exit: no interpreter shutdown beside the thread watching stdin.
    try:
        status = _child(json.loads(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        status = FAILED
    sys.stderr.flush()
    os._exit(status)
