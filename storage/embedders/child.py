"""The local model in a child process: texts in, float32 vectors out over its pipes.

The server's background embedder asks `ChildEmbedder.embed` for a batch's vectors; the model
(storage/embedders/local.py: tokenizing, onnxruntime, pooling, normalising) runs in a process of
its own at a lower priority, with its own GIL, so none of its Python holds the server's GIL on
a low-priority thread that a request thread would then wait for (docs/embeddings.md). A query's
vector is made in the server's process by a one-thread copy of the model, on the request's own
thread: a query through the child would wait behind the batch the child is running.

Frames on the child's stdin: a little-endian u32 length and a JSON list of texts. Frames on its
stdout: a header (status u8, rows u32, dim u32, payload length u32) and the payload: rows x dim
float32 (status OK), the reason and the detail on two lines of UTF-8 (ERROR), the model's load
time as text (READY, sent once, before any answer). The child ends when its stdin closes (the
server closed it, or the server's process ended); a child that dies is started again by the
next call. A call past its deadline (a child stopped or hung) kills the child: the call fails
with HUNG and the next call starts another (docs/embeddings.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from storage.embedders.base import HUNG, QUERY_CACHE_SIZE, EmbedderError, QueryCache

log = logging.getLogger("memspine.embedder")

# storage/embedders/local.py's; repeated so that importing this module loads nothing heavy.
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
NICENESS = 10  # the child's nice value over the server process's own
OK, ERROR, READY = 0, 1, 2
HEADER = struct.Struct("<BIII")
LENGTH = struct.Struct("<I")
CLOSE_TIMEOUT_SECS = 10.0
ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the storage package
T = TypeVar("T")
DIED = "model_process_died"  # the failure reason (memspine_embedder_failures) of a dead child
# A call that takes longer has a hung or stopped child: it is killed. Far above a batch of 256
# texts on a loaded machine (bench/embed.py), which takes seconds.
CALL_TIMEOUT_SECS = 60.0
# A start (the child's imports and its model's build) that takes longer is killed. Its own
# deadline, not a call's: a niced child loading its model on a busy machine gets a small share
# of the cores for a while, and a start cut short by a call's deadline would never finish.
START_TIMEOUT_SECS = 300.0


class ChildEmbedder:
    """all-MiniLM-L6-v2 (storage/embedders/local.py) run by a child process, one call at a time.

    The child starts on the first `embed` (or `load`), not before; `close` ends it and waits for
    it. `options` are LocalEmbedder's (threads, precision, batch limits, model_dir).
    """

    def __init__(
        self,
        *,
        query_cache: int = QUERY_CACHE_SIZE,
        niceness: int = NICENESS,
        call_timeout: float = CALL_TIMEOUT_SECS,
        start_timeout: float = START_TIMEOUT_SECS,
        **options: Any,
    ) -> None:
        self._options = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
        self.niceness = niceness
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.queries = QueryCache(query_cache)
        self._lock = threading.Lock()  # one exchange with the child at a time
        self._proc: subprocess.Popen[bytes] | None = None
        self._query_lock = threading.Lock()
        self._query_model: Any = None  # a one-thread LocalEmbedder, made on the first query
        self.starts = 0  # children started
        self.deaths = 0  # children found dead
        self.hangs = 0  # children killed for a start or a call past its deadline
        self._overdue: subprocess.Popen[bytes] | None = None  # the child the watchdog killed
        self._starting: subprocess.Popen[bytes] | None = None  # a child loading its model
        self._expired = False  # the watchdog fired for the call under way
        self.start_secs: float | None = None  # the last child's start, to its model loaded
        self.load_secs: float | None = None  # of that, the model's build inside the child

    @property
    def name(self) -> str:
        """The model name recorded in a tenant."""
        return MODEL_NAME

    @property
    def dim(self) -> int:
        """Always 384."""
        return DIM

    @property
    def loaded(self) -> bool:
        """Whether a child is running."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The running child's process id, or None."""
        return self._proc.pid if self.loaded and self._proc is not None else None

    def load(self) -> None:
        """Start the child and wait for its model, unless it runs already."""
        with self._lock:
            self._ensure()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of `texts`, (n, 384) float32, unit length, in the order given."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        body = json.dumps(list(texts), ensure_ascii=False).encode()
        with self._lock:
            proc = self._watched(self.start_timeout, self._ensure)
            status, rows, dim, payload = self._watched(
                self.call_timeout, lambda: self._ask(proc, body)
            )
        if status == ERROR:
            reason, _, detail = payload.decode().partition("\n")
            raise EmbedderError(reason, detail)
        if status != OK or rows != len(texts) or dim != DIM:
            raise EmbedderError("bad_answer", "the local embedding model gave a wrong answer")
        return np.frombuffer(payload, dtype=np.float32).reshape(rows, dim).copy()

    def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, (384,), cached by text; made in this process (see the module)."""
        return self.queries.get(text, self._embed_here)

    def _embed_here(self, text: str) -> np.ndarray:
        """A query's vector from the in-process one-thread model (loaded on the first query)."""
        if self._query_model is None:
            with self._query_lock:
                if self._query_model is None:
                    from storage.embedders.local import LocalEmbedder

                    options: dict[str, Any] = {
                        k: v for k, v in self._options.items() if k != "threads"
                    }
                    if "model_dir" in options:
                        options["model_dir"] = Path(options["model_dir"])
                    model = LocalEmbedder(threads=1, query_cache=0, **options)
                    model.load()
                    self._query_model = model
        vec: np.ndarray = self._query_model.embed([text])[0]
        return vec

    def close(self) -> None:
        """End the child (its stdin closed, then killed if it does not go) and wait for it."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                _end(proc)
        with self._query_lock:
            if self._query_model is not None:
                self._query_model.close()
                self._query_model = None

    # -- the child ----------------------------------------------------------------------

    def _ensure(self) -> subprocess.Popen[bytes]:
        """The running child, started (and its model loaded) if there is none; under _lock."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            raise self._died(proc)
        start = time.perf_counter()
        me = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the process's, not this thread's
        how = {"options": self._options, "nice": me + self.niceness}
        env = {
            **os.environ,
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false"),
            # numpy's BLAS would start a pool of threads at import, before the child lowers its
            # priority; the child multiplies no large matrices with it (onnxruntime does).
            "OPENBLAS_NUM_THREADS": "1",
            # The child imports this same checkout's storage package, wherever the server runs.
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "storage.embedders.child", json.dumps(how)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.starts += 1
        self._starting = proc  # the watchdog may kill it while its model loads
        if self._expired:  # the deadline passed before the child existed (a slow fork)
            self._kill_overdue()
        assert proc.stdout is not None
        try:
            status, _rows, _dim, payload = _read_frame(proc.stdout)
        except (OSError, EOFError, ValueError):
            if self._overdue is not None:  # the watchdog's kill: _watched reports it
                raise EmbedderError(HUNG, "killed at its deadline") from None
            _end(proc)
            log.error("the local embedder's process ended before its model loaded")
            raise EmbedderError(DIED, "the local embedding model could not start") from None
        if status == ERROR:
            _end(proc)
            reason, _, detail = payload.decode().partition("\n")
            raise EmbedderError(reason, detail)
        self._proc = proc
        self.load_secs = float(payload.decode() or 0)
        self.start_secs = time.perf_counter() - start
        log.info(
            "local embedder process started",
            extra={"pid": proc.pid, "secs": round(self.start_secs, 3)},
        )
        return proc

    def _watched(self, secs: float, fn: Callable[[], T]) -> T:
        """fn() under a watchdog that kills the child (starting or running) past secs; a child
        it killed is reported hung, not dead (under _lock)."""
        self._expired = False
        watchdog = threading.Timer(secs, self._kill_overdue)
        watchdog.daemon = True
        watchdog.start()
        try:
            return fn()
        except EmbedderError:
            if self._overdue is None:
                raise
            raise self._hung(secs) from None
        finally:
            watchdog.cancel()
            self._starting = None

    def _ask(self, proc: subprocess.Popen[bytes], body: bytes) -> tuple[int, int, int, bytes]:
        """Send one frame to the running child and read its answer (under _lock)."""
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(LENGTH.pack(len(body)) + body)
            proc.stdin.flush()
            return _read_frame(proc.stdout)
        except (OSError, EOFError, ValueError):
            if self._overdue is not None:  # the watchdog's kill: _watched reports it
                raise EmbedderError(HUNG, "killed at its deadline") from None
            raise self._died(proc) from None

    def _kill_overdue(self) -> None:
        """The watchdog: the call under way passed its deadline; its child (or the one it
        starts) is killed, which ends the call's wait on the pipe."""
        self._expired = True  # read by _ensure once its child exists: neither misses the other
        proc = self._starting or self._proc
        if proc is None:
            return
        self._overdue = proc
        with contextlib.suppress(OSError):
            proc.kill()  # SIGKILL ends a stopped process too

    def _hung(self, secs: float) -> EmbedderError:
        """A child killed by the watchdog: reaped, counted, logged (under _lock)."""
        proc, self._overdue = self._overdue, None
        if proc is not None:
            _end(proc)
        self._proc = None
        self.hangs += 1
        log.error(
            "the local embedder's process did not answer within %.0f s and was killed; "
            "a new one starts on the next call",
            secs,
        )
        return EmbedderError(HUNG, "the local embedding model stopped answering; restarting it")

    def _died(self, proc: subprocess.Popen[bytes]) -> EmbedderError:
        """A child found dead: logged, reaped, forgotten (the next call starts another)."""
        _end(proc)
        self._proc = None
        self.deaths += 1
        log.error(
            "the local embedder's process ended (exit code %s); a new one starts on the next call",
            proc.returncode,
        )
        return EmbedderError(DIED, "the local embedding model stopped; it is being restarted")


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    """`size` bytes of `stream`; EOFError if it ends first."""
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError
    return data


def _read_frame(stream: IO[bytes]) -> tuple[int, int, int, bytes]:
    """One frame from the child: status, rows, dim, payload."""
    status, rows, dim, size = HEADER.unpack(_read_exact(stream, HEADER.size))
    return status, rows, dim, _read_exact(stream, size) if size else b""


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Close the child's pipes, let it end, kill it if it does not; reap it."""
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    try:
        proc.wait(CLOSE_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _child(how: dict[str, Any]) -> int:
    """The child's loop: load the model, say READY, answer each frame until stdin closes."""
    # Before any thread is started here: every later thread (the model's workers) inherits it.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, int(how["nice"]))
    options = dict(how["options"])
    # stdout carries frames only: anything the libraries print goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer

    def send(status: int, rows: int, dim: int, payload: bytes) -> None:
        out.write(HEADER.pack(status, rows, dim, len(payload)) + payload)
        out.flush()

    from storage.embedders.local import LocalEmbedder

    if "model_dir" in options:
        options["model_dir"] = Path(options["model_dir"])
    model = LocalEmbedder(query_cache=0, **options)
    try:
        model.load()
    except EmbedderError as exc:
        send(ERROR, 0, 0, f"{exc.reason}\n{exc.detail}".encode())
        return 1
    send(READY, 0, DIM, f"{model.load_secs or 0:.4f}".encode())
    while True:
        try:
            (size,) = LENGTH.unpack(_read_exact(stdin, LENGTH.size))
            texts = json.loads(_read_exact(stdin, size))
        except EOFError:
            return 0
        try:
            vectors = model.embed(texts)
        except EmbedderError as exc:
            send(ERROR, 0, 0, f"{exc.reason}\n{exc.detail}".encode())
            continue
        except Exception as exc:  # one bad batch must not cost the child (and a restart loop)
            print(f"local embedder process: {type(exc).__name__}: {exc}", file=sys.stderr)
            send(ERROR, 0, 0, b"model_error\nthe local embedding model failed on a batch")
            continue
        send(OK, len(texts), DIM, np.ascontiguousarray(vectors, dtype=np.float32).tobytes())


if __name__ == "__main__":
    try:
        sys.exit(_child(json.loads(sys.argv[1])))
    except BrokenPipeError:  # the server went away mid-answer
        sys.exit(0)
