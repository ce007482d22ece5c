"""The journal's one writer: a thread that owns the write connection, so the event loop never waits on
SQLite, an fsync or another process's lock. Here is all of the retry policy.

Writes are queued and taken in order; whatever has queued by the time the thread is free commits in one
transaction (one fsync for several), each write in a savepoint of its own so that one failing write
rolls back only itself. A write whose transaction SQLite rolled back whole (an I/O error) fails; the
others of its round commit in the next.

Another process holding the journal's write lock (a crew runs as our uid, a backup, an operator's
``sqlite3``) makes ``BEGIN IMMEDIATE`` wait ``BUSY_TIMEOUT_MS`` inside SQLite; the thread then fails the
writes whose patience ran out with ``JournalBusy``, takes in the writes queued meanwhile and tries again.
A write without a deadline waits until it commits, logged every ``LOG_EVERY_SECONDS``. Once ``close``
(or, earlier, ``stop_waiting``) is called, every write still waiting for the lock or for space gets
``grace`` seconds more.

A full disk (``SQLITE_FULL``, or an I/O error, with less room on the disk than the journal's page ceiling still allows;
at the ceiling itself only archiving helps, and the write fails as any other) rolls the whole round
back, so nothing commits out of order: writes with a deadline (admission, archive) fail at once, and
the caller answers 507; the others (event groups, the terminal event, a worker's record: what they
record has happened) are tried again every ``FULL_RETRY_SECONDS`` until space is freed, a terminal
event without the worker's streams if they had some. Their callers wait meanwhile, so a job's relay
stops at its next checkpoint instead of dropping events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from supervisor.journal.schema import JournalError

log = logging.getLogger("crew_supervisor.journal")
T = TypeVar("T")
BUSY_TIMEOUT_MS = 50  # one wait for the lock inside SQLite, after which the thread looks at deadlines again
FULL_RETRY_SECONDS = 0.25  # a full disk is tried again this often (new writes are taken in meanwhile)
LOG_EVERY_SECONDS = 5.0


class JournalBusy(JournalError):
    """Another process held the journal's write lock for longer than the write could wait."""


class Written(Generic[T]):
    """A write handed to the writer thread: ``await`` it on an event loop, or ``wait()`` for it on a
    thread that may block (start-up, tests). It is written whether or not anybody waits for it."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self.future).__await__()

    def wait(self) -> T:
        return self.future.result()


@dataclasses.dataclass(eq=False)
class _Write:
    apply: Callable[[sqlite3.Connection], Any]  # runs on the writer thread, inside a transaction
    fallback: Callable[[sqlite3.Connection], Any] | None  # tried instead if ``apply`` fails
    durable: bool  # committed with an fsync (``synchronous=FULL``), else ``NORMAL``
    deadline: float  # monotonic; past it a write still waiting for the lock fails (inf: never)
    future: concurrent.futures.Future[Any]


class Writer:
    def __init__(self, db: sqlite3.Connection, commit_seconds: Callable[[float], None]) -> None:
        self._db = db
        self._commit_seconds = commit_seconds  # called on the writer thread
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._synchronous = db.execute("PRAGMA synchronous").fetchone()[0]
        self._directory = os.path.dirname(db.execute("PRAGMA database_list").fetchone()[2])
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()  # None: close
        self._closed = False
        self._grace = 0.0
        self._give_up_at = math.inf  # set once the close is taken in
        self._stop_waiting_at = math.inf  # set by ``stop_waiting``
        self._busy_since: float | None = None
        self._busy_logged = 0.0
        self._full_since: float | None = None
        self._full_logged = 0.0
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def submit(
        self,
        apply: Callable[[sqlite3.Connection], T],
        *,
        durable: bool = True,
        patience: float | None = None,
        fallback: Callable[[sqlite3.Connection], T] | None = None,
    ) -> concurrent.futures.Future[T]:
        """Queue a write; ``patience`` is how long it may wait for another process's lock (None: until it
        commits)."""
        if self._closed:
            raise JournalError("journal is closed")
        deadline = math.inf if patience is None else time.monotonic() + patience
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        # Running from now on, so that it cannot be cancelled: an awaiting task that is cancelled (a job's
        # timeout while its group waits for space) must neither drop the write nor make its result fail.
        future.set_running_or_notify_cancel()
        self._queue.put(_Write(apply, fallback, durable, deadline, future))
        return future

    def stop_waiting(self, grace: float) -> None:
        """Writes still waiting for another process's lock or for disk space ``grace`` seconds from now
        fail then: the supervisor is stopping, and a restart fences what they would have recorded."""
        self._stop_waiting_at = time.monotonic() + grace

    def close(self, grace: float) -> None:
        """Commit what is queued, then stop; a write still waiting for the lock after ``grace`` fails."""
        if self._closed:
            return
        self._closed = True
        self._grace = grace
        self._queue.put(None)
        self._thread.join()

    # The thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        pending: list[_Write] = []
        while True:
            if not pending and self._give_up_at < math.inf:
                return
            self._take(pending, wait=None if not pending else FULL_RETRY_SECONDS if self._full_since else 0)
            try:
                pending = self._round(pending)
            except Exception as exc:  # a bug here must not leave a waiter hanging forever
                log.exception("journal writer failed")
                if self._db.in_transaction:  # or every later BEGIN would fail
                    self._db.execute("ROLLBACK")
                _fail(pending, JournalError(f"journal write failed: {exc}"))
                pending = []

    def _take(self, pending: list[_Write], wait: float | None) -> None:
        """Everything queued now, after waiting up to ``wait`` seconds for the first (None: until it comes)."""
        try:
            item = self._queue.get(wait != 0, wait)
            while True:
                if item is None:
                    self._give_up_at = time.monotonic() + self._grace
                else:
                    pending.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass

    def _round(self, pending: list[_Write]) -> list[_Write]:
        """One transaction for ``pending``; returns the writes to try again (the lock was busy, or SQLite
        rolled back the transaction under them)."""
        self._set_synchronous(any(write.durable for write in pending))
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if not _busy(exc):
                _fail(pending, JournalError(f"journal write failed: {exc}"))
                return []
            return self._still_busy(pending)
        self._lock_taken()
        started = time.monotonic()
        results: list[tuple[_Write, Any]] = []
        failures: list[tuple[_Write, Exception]] = []
        for write in pending:
            try:
                results.append((write, self._apply(write)))
            except _RolledBack:  # its fallback goes again, with the rest
                return pending
            except (sqlite3.Error, JournalError) as exc:
                if self._out_of_disk(exc):
                    return self._disk_full(pending, failures, exc)
                failures.append((write, _journal_error(exc)))
                if not self._db.in_transaction:  # SQLite rolled back the whole round: the rest go again
                    _resolve([], failures)
                    return [other for other in pending if other is not write]
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._out_of_disk(exc):
                return self._disk_full(pending, failures, exc)
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            _resolve([], failures)
            retry = [write for write, _ in results]
            if _busy(exc):
                return retry
            _fail(retry, JournalError(f"journal commit failed: {exc}"))
            return []
        self._commit_seconds(time.monotonic() - started)
        if self._full_since is not None:
            log.warning("journal disk writable again after %.1f s", time.monotonic() - self._full_since)
            self._full_since = None
        _resolve(results, failures)
        return []

    def _apply(self, write: _Write) -> Any:
        """One write in its own savepoint; if it fails, its fallback (once) in a fresh one."""
        while True:
            self._db.execute("SAVEPOINT write")
            try:
                result = write.apply(self._db)
            except (sqlite3.Error, JournalError):
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK TO write")
                    self._db.execute("RELEASE write")
                if write.fallback is None:
                    raise
                write.apply, write.fallback = write.fallback, None
                if not self._db.in_transaction:
                    raise _RolledBack from None
                continue
            self._db.execute("RELEASE write")
            return result

    def _still_busy(self, pending: list[_Write]) -> list[_Write]:
        """Fail the writes whose patience ran out; the others wait on, and the wait is logged."""
        now = time.monotonic()
        waiting = []
        for write in pending:
            if now >= min(write.deadline, self._give_up_at, self._stop_waiting_at):
                write.future.set_exception(JournalBusy("the journal's write lock is held by another process"))
            else:
                waiting.append(write)
        if not waiting:
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = self._busy_logged = now
        elif waiting and now - self._busy_logged >= LOG_EVERY_SECONDS:
            self._busy_logged = now
            log.warning(
                "journal write lock held by another process for %.1f s; %d write(s) waiting",
                now - self._busy_since,
                len(waiting),
            )
        return waiting

    def _out_of_disk(self, exc: Exception) -> bool:
        """``SQLITE_FULL`` from the disk, not from the journal's own ceiling (``max_page_count``): the disk
        has less room than the pages SQLite would still allow."""
        # ENOSPC surfaces as SQLITE_FULL, or as an I/O error where the kernel reports it late (at fsync,
        # growing the shared-memory file): either counts when the disk is what lacks room.
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR):
            return False
        try:
            (count,), (ceiling,), (size,) = (
                self._db.execute(f"PRAGMA {name}").fetchone() for name in ("page_count", "max_page_count", "page_size")
            )
            disk = os.statvfs(self._directory)
        except (OSError, sqlite3.Error):  # cannot tell: fail the writes as any other error would
            return False
        return disk.f_bavail * disk.f_frsize < (ceiling - count) * size

    def _disk_full(
        self, pending: list[_Write], failures: list[tuple[_Write, Exception]], exc: sqlite3.Error
    ) -> list[_Write]:
        """Roll the round back; fail the writes with a deadline (and those past the close's grace), keep
        the rest, each in its smaller form if it has one, to try again once space may have been freed."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        _resolve([], failures)
        failed = {id(write) for write, _ in failures}
        error = JournalError(f"journal write failed: {exc}")
        waiting = []
        for write in pending:
            if id(write) in failed:
                continue
            if write.deadline < math.inf or time.monotonic() >= min(self._give_up_at, self._stop_waiting_at):
                write.future.set_exception(error)
                continue
            if write.fallback is not None:
                write.apply, write.fallback = write.fallback, None
            waiting.append(write)
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = self._full_logged = now
            log.error("journal disk full (%s); %d write(s) wait for space", exc, len(waiting))
        elif now - self._full_logged >= LOG_EVERY_SECONDS:
            self._full_logged = now
            log.error("journal disk full for %.1f s; %d write(s) wait for space", now - self._full_since, len(waiting))
        return waiting

    def _lock_taken(self) -> None:
        if self._busy_since is not None:
            log.warning("journal write lock free again after %.1f s", time.monotonic() - self._busy_since)
            self._busy_since = None

    def _set_synchronous(self, durable: bool) -> None:
        """FULL when any write of the round must survive a power loss; SQLite takes it outside a transaction."""
        level = 2 if durable else 1
        if level != self._synchronous:
            self._db.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level


class _RolledBack(Exception):
    """SQLite rolled back the whole transaction while a write failed; its fallback takes its place."""


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _journal_error(exc: Exception) -> JournalError:
    return exc if isinstance(exc, JournalError) else JournalError(f"journal write failed: {exc}")


def _resolve(results: list[tuple[_Write, Any]], failures: list[tuple[_Write, Exception]]) -> None:
    for write, result in results:
        write.future.set_result(result)
    for write, exc in failures:
        write.future.set_exception(exc)


def _fail(writes: list[_Write], exc: JournalError) -> None:
    for write in writes:
        if not write.future.done():
            write.future.set_exception(exc)
