"""The process's one read-log writer: a thread that appends every tenant's read records in
group commits, from a queue per tenant.

Not a thread per tenant: reads of many tenants land in their own queues and one thread writes
them, each tenant's batch one write; with a round journal (storage/readlog/journal.py, what the
server uses) the round's batches are then synced together by one write and one fdatasync of
the journal, and each log is synced at the next checkpoint (every `head_interval`, and before
it is closed); without one, each batch is synced by itself. Buffered, it wakes every `interval`
(a crash loses at most that much); durable, it wakes on every submit and the caller waits for
the future (what arrives during a sync rides the next commit). The backlog is bounded in all
and per tenant, so one tenant's reads never fill another's room: `submit` raises Backlogged
and the caller waits or refuses. Every `head_interval` the heads of the chains that moved are
handed to `on_head` (the control plane keeps them); a retention cut runs here too, between
commits, so nothing else ever holds the file.

On a full disk, buffered, a tenant's records that could not be made durable (their append
refused, or the round's journal and the log's own sync both refused, the append then cut off
again) go back to the head of its queue, still counted in the bounds, and are tried again
after RETRY_FIRST_SECS, doubling to RETRY_MAX_SECS (a job, such as `flush`, tries at once);
while they are held, `stuck` names the tenant, so its reads past the bound are refused at once
rather than after a wait. Durable, the read waiting for them is refused instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

from storage.readlog.format import Read
from storage.readlog.journal import Entry, Journal
from storage.readlog.logfile import Appender, Mark, Written, cut, take_carried
from storage.space import names_full_disk

log = logging.getLogger("storage.readlog")

MAX_PENDING = 50_000  # weight (records, and 1 per 16 event ids) held for all tenants at once
MAX_PENDING_PER_TENANT = 10_000
IDLE_CLOSE_SECS = 60.0  # a tenant's file is closed after this long without a record
MAX_OPEN = 256  # files held open at most (the least recently written closes first)
RETRY_FIRST_SECS = 0.25  # a full disk: held records tried again after this, doubling
RETRY_MAX_SECS = 2.0


class Backlogged(Exception):
    """The writer holds as many records as it may (in all, or for this tenant): wait, or refuse."""


def weight(read: Read) -> int:
    """What a record counts against the backlog's bounds."""
    return 1 + len(read.event_ids) // 16


class _Queue:
    """One tenant's records awaiting the writer."""

    __slots__ = ("items", "root", "weight")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.items: deque[tuple[Read, Future[None] | None]] = deque()
        self.weight = 0


class _Done(NamedTuple):
    """One tenant's part of a round: its queue, what was appended (unsynced with a journal),
    the error if it failed."""

    tenant_id: str
    q: _Queue
    appended: tuple[Appender, Written] | None
    error: BaseException | None


class ReadLogWriter:
    """Appends read records for every tenant of a data directory on one thread."""

    def __init__(
        self,
        *,
        durable: bool,
        interval: float = 0.1,
        head_interval: float = 5.0,
        on_head: Callable[[str, Mark], None] | None = None,
        max_pending: int = MAX_PENDING,
        max_pending_per_tenant: int = MAX_PENDING_PER_TENANT,
        journal: Path | None = None,
    ) -> None:
        """journal: the round journal's path (what it holds from before is written again
        here); None: every tenant's batch synced by itself."""
        self.durable = durable
        # Opened here, its leftovers written again before anything new is.
        self._journal = Journal(journal) if journal is not None else None
        self._interval = interval
        self._head_interval = head_interval
        self.on_head = on_head
        self._max = max_pending
        self._max_tenant = max_pending_per_tenant
        self._cond = threading.Condition()
        self._queues: dict[str, _Queue] = {}
        self._jobs: list[Callable[[], None]] = []
        self._weight = 0
        # Per tenant, what it has queued and what the writer is writing of it: the bound counts
        # both, or a tenant could hold its bound again while a failing write holds the first.
        self._held: dict[str, int] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._files: dict[str, tuple[Appender, float]] = {}  # writer thread only
        self._moved: dict[str, Mark] = {}  # heads not yet handed to on_head (writer thread)
        self._unpublished: dict[str, Mark] = {}  # heads on_head refused, to try again (_cond)
        self._checkpointing: threading.Thread | None = None  # a checkpoint's syncs under way
        self._published = time.monotonic()
        self.failing: BaseException | None = None  # the last write failure, until one succeeds
        # Tenants whose records are held for a full disk: the failure, when to try again, the
        # delay after that (writer thread; `stuck` reads the keys from request threads).
        self._stuck: dict[str, tuple[BaseException, float, float]] = {}

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="read-log", daemon=True)
        self._thread.start()

    def submit(self, tenant_id: str, root: Path, read: Read) -> Future[None] | None:
        """Queue one record; durable: a future resolved once it is synced (or failed), else
        None. Backlogged when the bounds are reached."""
        w = weight(read)
        done: Future[None] | None = Future() if self.durable else None
        with self._cond:
            q = self._queues.get(tenant_id)
            mine = self._held.get(tenant_id, 0)
            # A lone record over a bound passes: an export of many ids is one record per chunk.
            if (self._weight and self._weight + w > self._max) or (
                mine and mine + w > self._max_tenant
            ):
                raise Backlogged
            if q is None:
                q = self._queues[tenant_id] = _Queue(root)
            q.items.append((read, done))
            q.weight += w
            self._weight += w
            self._held[tenant_id] = mine + w
            if self.durable:
                self._cond.notify()
        return done

    def stuck(self, tenant_id: str) -> bool:
        """Whether the tenant's records are held in memory for a full disk (buffered)."""
        return tenant_id in self._stuck

    @property
    def native_id(self) -> int | None:
        """The writer thread's OS id, once started (bench/readaudit.py reads its CPU time)."""
        return None if self._thread is None else self._thread.native_id

    def pending(self) -> int:
        """The backlog's weight now."""
        return self._weight

    def flush(self) -> Future[None]:
        """A future resolved once every record queued before is written (or failed, or held
        again for a full disk: it is tried at once, not after its back-off) and the heads are
        handed to on_head."""
        done: Future[None] = Future()

        def job() -> None:
            self._publish()
            done.set_result(None)

        self._add_job(job)
        return done

    def cut(
        self, tenant_id: str, root: Path, before_ts: int, publish: Callable[[Mark], None]
    ) -> Future[int]:
        """Drop the tenant's records older than before_ts (storage/readlog/logfile.py's cut),
        after writing what is queued for it; the future holds how many were dropped."""
        done: Future[int] = Future()

        def job() -> None:
            self._close(tenant_id)
            try:
                done.set_result(cut(root, before_ts, publish))
            except BaseException as exc:
                done.set_exception(exc)

        self._add_job(job)
        return done

    def carry(self, tenant_id: str, root: Path, carried: bytes) -> Future[Mark]:
        """Put the tenant's read log carried from its former node in place, this node's own
        records of it chained after (storage/readlog/logfile.py's take_carried); the future
        holds the chain's head, handed to on_head with the next ones."""
        done: Future[Mark] = Future()

        def job() -> None:
            self._close(tenant_id)
            try:
                mark = take_carried(root, carried)
            except BaseException as exc:
                done.set_exception(exc)
                return
            self._moved[tenant_id] = mark
            done.set_result(mark)

        self._add_job(job)
        return done

    def forget(self, tenant_id: str) -> None:
        """Close the tenant's file and drop its head not yet handed over (its directory is
        being erased or replaced, or its records carried to another node)."""

        def job() -> None:
            self._close(tenant_id)
            self._moved.pop(tenant_id, None)
            with self._cond:
                self._unpublished.pop(tenant_id, None)

        self._add_job(job)

    def stop(self) -> None:
        """Write what is queued, hand over the heads, end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        if self._checkpointing is not None:
            self._checkpointing.join()
        for tenant_id in list(self._files):
            self._close(tenant_id)
        with self._cond:
            lost = {t: len(q.items) for t, q in self._queues.items() if q.items}
        for tenant_id, n in lost.items():  # held for a full disk that was never freed
            log.error(
                "tenant %s: %d read records not written at stop: %s",
                tenant_id,
                n,
                self._stuck.get(tenant_id, (self.failing,))[0],
            )
        if self._journal is not None:
            self._journal.close()  # every log it covers was synced by the closes
            self._journal = None

    def _add_job(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()
        if self._thread is None:  # not started (tests, tools): run here
            self._round()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not (self._stopping or self._jobs or (self.durable and self._weight)):
                    self._cond.wait(self._interval if not self.durable else self._head_interval)
                stopping = self._stopping
            self._round()
            if stopping:
                self._publish()
                return

    def _round(self) -> None:
        """Write every queue, run the jobs asked for, hand over heads that are due."""
        with self._cond:
            queues, self._queues = self._queues, {}
            jobs, self._jobs = self._jobs, []
            at_once = bool(jobs) or self._stopping
        now = time.monotonic()
        written = []
        for tenant_id, q in queues.items():
            stuck = self._stuck.get(tenant_id)
            if stuck is not None and now < stuck[1] and not at_once:
                self._requeue(tenant_id, q)  # a full disk: not yet time to try again
                continue
            done = self._write(tenant_id, q)
            if done is not None:
                written.append(done)
        for tenant_id, q, _f, error in self._sync(written):
            self._settle(tenant_id, q, error)
        for job in jobs:
            try:
                job()
            except Exception:  # a job reports through its own future
                log.exception("read log job failed")
        now = time.monotonic()
        if now - self._published >= self._head_interval:
            self._publish(wait=False)  # the syncs run beside the next rounds
        self._close_idle(now)

    def _write(self, tenant_id: str, q: _Queue) -> _Done | None:
        """Append one tenant's records (synced here without a journal); None when they went
        back to the queue (a full disk, buffered)."""
        reads = [r for r, _ in q.items]
        error: BaseException | None = None
        f: Appender | None = None
        written: Written | None = None
        try:
            f = self._file(tenant_id, q.root, reads[0].ts)
            if f is not None:
                written = f.append(reads, sync=self._journal is None)
                self._moved[tenant_id] = f.mark()
        except Exception as exc:
            error = exc
        if error is not None:
            if self._held_back(tenant_id, q, error):
                return None  # the file as it was (append cuts off what it wrote): kept open
            self._close(tenant_id)
        appended = (f, written) if f is not None and written is not None else None
        return _Done(tenant_id, q, appended, error)

    def _sync(self, written: list[_Done]) -> list[_Done]:
        """Make the round's unsynced appends durable: one journal commit, or (the journal
        failing) each log's own fdatasync; an append neither made durable is cut off its log
        again (storage/readlog/logfile.py's take_back) and, on a full disk in buffered mode,
        its records held. What is left to settle."""
        if self._journal is None:
            return written
        pending = [d.appended for d in written if d.appended is not None]
        if not pending:
            return written
        entries = [Entry(str(f.path), f.inode, f.header, w.offset, w.data) for f, w in pending]
        try:
            self._journal.commit(entries)
            return written
        except Exception as exc:
            log.warning("read-log journal not written (%s): syncing each log", exc)
        out = []
        for d in written:
            left = self._sync_one(d) if d.appended is not None else d
            if left is not None:
                out.append(left)
        return out

    def _sync_one(self, d: _Done) -> _Done | None:
        """One log's own fdatasync, the journal having failed; None if its records were held."""
        assert d.appended is not None
        f, w = d.appended
        try:
            f.sync()
            return d
        except Exception as exc:
            error: BaseException = exc
        if f.take_back(w):  # the tail as before: the same records go again, same links
            self._moved[d.tenant_id] = w.before
            if self._held_back(d.tenant_id, d.q, error):
                return None
        else:
            self._close(d.tenant_id)
        return d._replace(error=error)

    def _held_back(self, tenant_id: str, q: _Queue, error: BaseException) -> bool:
        """On a full disk in buffered mode the records go back (before anything queued
        meanwhile); True if they did."""
        if self.durable or not names_full_disk(error):
            return False
        self.failing = error
        before = self._stuck.get(tenant_id)
        delay = RETRY_FIRST_SECS if before is None else min(before[2] * 2, RETRY_MAX_SECS)
        self._stuck[tenant_id] = (error, time.monotonic() + delay, delay)
        if before is None:
            log.error(
                "tenant %s: %d read records held in memory, the disk is full: %s",
                tenant_id,
                len(q.items),
                error,
            )
        self._requeue(tenant_id, q)
        return True

    def _requeue(self, tenant_id: str, q: _Queue) -> None:
        """Put records taken for a round back, in order, before anything queued meanwhile."""
        with self._cond:
            later = self._queues.get(tenant_id)
            if later is not None:
                q.items.extend(later.items)
                q.weight += later.weight
            self._queues[tenant_id] = q

    def _settle(self, tenant_id: str, q: _Queue, error: BaseException | None) -> None:
        """The records are written (or failed): free their room, answer their futures."""
        if error is None:
            self.failing = None
            if self._stuck.pop(tenant_id, None) is not None:
                log.warning("tenant %s: read records written again, the disk has room", tenant_id)
        else:
            self._stuck.pop(tenant_id, None)
            self.failing = error
            log.error("tenant %s: %d read records not written: %s", tenant_id, len(q.items), error)
        with self._cond:
            self._weight -= q.weight
            left = self._held.pop(tenant_id, 0) - q.weight
            if left > 0:
                self._held[tenant_id] = left
        for _, done in q.items:
            if done is not None:
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    def _file(self, tenant_id: str, root: Path, first_ts: int) -> Appender | None:
        """The tenant's open file (reopened if replaced); None if its directory is gone."""
        held = self._files.get(tenant_id)
        if held is not None and held[0].current():
            f = held[0]
        else:
            self._close(tenant_id)
            if not root.is_dir():
                log.warning("tenant %s: read records dropped, its directory is gone", tenant_id)
                return None
            f = Appender(root, first_ts)
            while len(self._files) >= MAX_OPEN:
                oldest = min(self._files, key=lambda t: self._files[t][1])
                self._close(oldest)
        self._files[tenant_id] = (f, time.monotonic())
        return f

    def _close(self, tenant_id: str) -> None:
        held = self._files.pop(tenant_id, None)
        if held is not None:
            try:
                held[0].close()  # synced: the journal's entries for it are no longer needed
            except OSError as exc:
                log.error("tenant %s: read log not synced on close: %s", tenant_id, exc)

    def _close_idle(self, now: float) -> None:
        for tenant_id, (_f, used) in list(self._files.items()):
            if now - used > IDLE_CLOSE_SECS:
                self._close(tenant_id)

    def _checkpoint(self, wait: bool) -> bool:
        """Start a checkpoint: the journal moves on to a new file, and the logs written so far
        are synced off this thread (with `wait`, here), then the file ended is removed and the
        heads that moved are handed to on_head: a head recorded in the control plane names
        synced records. False if one is still running (not waiting): the next goes then."""
        running = self._checkpointing
        if running is not None and running.is_alive():
            if not wait:
                return False
            running.join()
        moved, self._moved = self._moved, {}
        with self._cond:
            for tenant_id, mark in self._unpublished.items():
                moved.setdefault(tenant_id, mark)
            self._unpublished = {}
        ended = self._journal.rotate() if self._journal is not None else None
        due = [(f, f.size) for f, _used in self._files.values() if f.size > f.synced]

        def run() -> None:
            synced = True
            for f, size in due:
                try:
                    f.sync_to(size)
                except Exception as exc:
                    synced = False
                    log.error("read log %s not synced: %s", f.path, exc)
            if ended is not None and synced:  # else its entries are written again at start
                Journal.drop(ended)
            self._hand_over(moved)

        if wait or self._journal is None:
            run()
        else:
            self._checkpointing = threading.Thread(target=run, name="read-log-sync", daemon=True)
            self._checkpointing.start()
        return True

    def _hand_over(self, moved: dict[str, Mark]) -> None:
        """Hand heads to on_head (a failure is logged; they are tried at the next checkpoint)."""
        if self.on_head is None:
            return
        for tenant_id, mark in moved.items():
            try:
                self.on_head(tenant_id, mark)
            except Exception as exc:
                log.warning("tenant %s: read chain head not recorded: %s", tenant_id, exc)
                with self._cond:
                    self._unpublished.setdefault(tenant_id, mark)

    def _publish(self, wait: bool = True) -> None:
        """A checkpoint (storage/readlog/journal.py): the logs synced, the heads handed over;
        waited for, or started to run beside the next rounds."""
        if self._checkpoint(wait):
            self._published = time.monotonic()
