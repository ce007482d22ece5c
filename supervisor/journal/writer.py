"""The journal's one writer: a thread that owns the write connection, so the event loop never waits on
SQLite, an fsync or another process's lock. Here is all of the retry policy.

Writes are queued and taken in order; whatever has queued by the time the thread is free commits in one
transaction (one fsync for several), each write in a savepoint of its own so that one failing write
rolls back only itself. A write whose transaction SQLite rolled back whole (an I/O error) fails; the
others of its round commit in the next.

Events are group-committed here too: queued one by one, they wait in the thread's group, which is written
(in one statement: a statement per event was most of the supervisor's CPU per relayed event) when an event
ends it (a checkpoint, a ``started``), when any other write comes (so everything commits in the order it
was queued), or ``GROUP_SECONDS`` after its first event: the thread's own timed wait, so no caller ever
flushes. A write nobody waits for and whose loss a reader would take for the truth (a call's end: ``grouped``)
waits in the group alike, applied with its events. After each commit ``on_commit`` is called, on this thread, with
the jobs whose events it wrote.

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
import functools
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, NamedTuple, TypeVar

from supervisor.enums import EventName
from supervisor.journal.errors import JournalError
from supervisor.journal.waits import Waits, Write

log = logging.getLogger("crew_supervisor.journal")
T = TypeVar("T")
BUSY_TIMEOUT_MS = 50  # one wait for the lock inside SQLite, after which the thread looks at deadlines again
FULL_RETRY_SECONDS = 0.25  # a full disk is tried again this often (new writes are taken in meanwhile)
GROUP_SECONDS = 0.05  # how long an event may wait in its group before readers can see it


class Written(Generic[T]):
    """A write handed to the writer thread: ``await`` it on an event loop, or ``wait()`` for it on a
    thread that may block. It is written whether or not anybody waits for it."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self.future).__await__()

    def wait(self) -> T:
        return self.future.result()


class _Event(NamedTuple):
    """A non-terminal event, queued for the group; ``ends`` (a future) ends the group, committed at once."""

    action_id: str
    event: EventName
    data: bytes  # compact JSON
    ends: concurrent.futures.Future[None] | None
    at: float  # monotonic, when it was appended: its group is due GROUP_SECONDS after its first event's


class _Grouped(NamedTuple):
    """A write that waits in the group (``Writer.grouped``)."""

    apply: Callable[[sqlite3.Connection], None]
    at: float  # monotonic, as an event's


class Writer:
    def __init__(
        self,
        db: sqlite3.Connection,
        on_commit: Callable[[frozenset[str]], None],
        commit_seconds: Callable[[float], None],
    ) -> None:
        self._db = db
        self._on_commit = on_commit  # both called on the writer thread
        self._commit_seconds = commit_seconds
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._synchronous = db.execute("PRAGMA synchronous").fetchone()[0]
        self._queue: queue.SimpleQueue[Write | _Event | _Grouped | None] = queue.SimpleQueue()  # None: close
        self._group = _Group()
        self._urgent = threading.Event()  # set with whatever must not wait for the group's time
        self._closed = False
        self._grace = 0.0
        self._waits = Waits(os.path.dirname(db.execute("PRAGMA database_list").fetchone()[2]))
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def submit(
        self,
        apply: Callable[[sqlite3.Connection], T],
        *,
        durable: bool = True,
        patience: float | None = None,
        fallback: Callable[[sqlite3.Connection], T] | None = None,
        touched: frozenset[str] = frozenset(),
    ) -> concurrent.futures.Future[T]:
        """Queue a write; ``patience`` is how long it may wait for another process's lock (None: until it
        commits); ``touched``: the jobs whose events it writes."""
        if self._closed:
            raise JournalError("journal is closed")
        deadline = math.inf if patience is None else time.monotonic() + patience
        future: concurrent.futures.Future[T] = _running()
        self._put(Write(apply, fallback, durable, deadline, future, touched))
        return future

    def append(
        self, action_id: str, event: EventName, data: bytes, *, ends_group: bool
    ) -> concurrent.futures.Future[None] | None:
        """Queue a non-terminal event for the group; ``ends_group``: the group is written at once, and the
        future returned resolves when it has committed. A group that fails is logged and lost: readers
        never saw it, and the next events take its sequences."""
        if self._closed:
            raise JournalError("journal is closed")
        ends: concurrent.futures.Future[None] | None = _running() if ends_group else None
        self._put(_Event(action_id, event, data, ends, time.monotonic()))
        return ends

    def grouped(self, apply: Callable[[sqlite3.Connection], None]) -> None:
        """Queue a write to commit with the group, as an event: no commit of its own, nobody told; before whatever
        is queued after it. A group that fails is logged and lost, this write with it."""
        if self._closed:
            raise JournalError("journal is closed")
        self._put(_Grouped(apply, time.monotonic()))

    def stop_waiting(self, grace: float) -> None:
        """Writes still waiting for another process's lock or for disk space ``grace`` seconds from now
        fail then: the supervisor is stopping, and a restart fences what they would have recorded."""
        self._waits.stop_at = time.monotonic() + grace

    def close(self, grace: float) -> None:
        """Commit what is queued, then stop; a write still waiting for the lock after ``grace`` fails."""
        if self._closed:
            return
        self._closed = True
        self._grace = grace
        self._put(None)
        self._thread.join()

    def _put(self, item: Write | _Event | _Grouped | None) -> None:
        self._queue.put(item)
        grouped = isinstance(item, _Grouped) or (isinstance(item, _Event) and item.ends is None)
        if not grouped:  # a plain event, or a grouped write, waits for its group's time
            self._urgent.set()

    # The thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        pending: list[Write] = []
        while True:
            if not pending and self._waits.closing:
                return
            self._take(pending, self._wait(pending))
            if not pending:
                continue
            try:
                pending = self._round(pending)
            except Exception as exc:  # a bug here must not leave a waiter hanging forever
                log.exception("journal writer failed")
                if self._db.in_transaction:  # or every later BEGIN would fail
                    self._db.execute("ROLLBACK")
                _fail(pending, JournalError(f"journal write failed: {exc}"))
                pending = []

    def _wait(self, pending: list[Write]) -> float | None:
        """How long to wait for the next write: until the group is due, or (with writes waiting for the
        lock or for space) not at all, or until space may have been freed; None: until one comes."""
        if pending:
            return FULL_RETRY_SECONDS if self._waits.full_since is not None else 0
        if self._group.due < math.inf:
            return max(self._group.due - time.monotonic(), 0)
        return None

    def _take(self, pending: list[Write], wait: float | None) -> None:
        """Everything queued now, after waiting up to ``wait`` seconds for the first (None: until it comes);
        the group joins ``pending`` when something ends it or it is due."""
        if wait and not pending and self._group.due < math.inf:
            # Only the group waits: until it is due or something urgent comes. Its events queue meanwhile
            # without waking this thread, which would cost a hand-off of the GIL per relayed event.
            self._urgent.wait(wait)
            self._urgent.clear()  # before taking: whatever is queued after this wakes the next wait
            wait = 0
        try:
            item = self._queue.get(wait != 0, wait)
            while True:
                if isinstance(item, _Event | _Grouped):
                    self._group.add(item)
                    if isinstance(item, _Event) and item.ends is not None:
                        self._group.write_into(pending, item.ends)
                else:
                    self._group.write_into(pending)  # whatever comes after an event commits with it or after it
                    if item is None:
                        self._waits.close_at = time.monotonic() + self._grace
                    else:
                        pending.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        if time.monotonic() >= self._group.due:
            self._group.write_into(pending)

    def _round(self, pending: list[Write]) -> list[Write]:
        """One transaction for ``pending``; returns the writes to try again (the lock was busy, or SQLite
        rolled back the transaction under them)."""
        self._set_synchronous(any(write.durable for write in pending))
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if not _busy(exc):
                _fail(pending, JournalError(f"journal write failed: {exc}"))
                return []
            return self._waits.busy(pending)
        self._waits.lock_taken()
        started = time.monotonic()
        results: list[tuple[Write, Any]] = []
        failures: list[tuple[Write, Exception]] = []
        for write in pending:
            try:
                results.append((write, _apply(self._db, write)))
            except _RolledBack:  # its fallback goes again, with the rest
                return pending
            except (sqlite3.Error, JournalError) as exc:
                if isinstance(exc, sqlite3.Error) and self._waits.out_of_disk(self._db, exc):
                    return self._disk_full(pending, failures, exc)
                failures.append((write, _journal_error(exc)))
                if not self._db.in_transaction:  # SQLite rolled back the whole round: the rest go again
                    _resolve([], failures)
                    return [other for other in pending if other is not write]
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._waits.out_of_disk(self._db, exc):
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
        self._waits.committed()
        # Followers are woken before any waiter resumes: a write awaited has had its readers told.
        if touched := frozenset().union(*(write.touched for write, _ in results)):
            self._on_commit(touched)
        _resolve(results, failures)
        return []

    def _disk_full(
        self, pending: list[Write], failures: list[tuple[Write, Exception]], exc: sqlite3.Error
    ) -> list[Write]:
        """Roll the round back; the writes that failed on their own are told, the others wait for space."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        _resolve([], failures)
        failed = {id(write) for write, _ in failures}
        return self._waits.full([write for write in pending if id(write) not in failed], exc)

    def _set_synchronous(self, durable: bool) -> None:
        """FULL when any write of the round must survive a power loss; SQLite takes it outside a transaction."""
        level = 2 if durable else 1
        if level != self._synchronous:
            self._db.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level


class _Group:
    """Events taken in by the writer thread, not yet written: one write (one statement) once something ends
    the group or it is due, committed after everything queued before its events."""

    def __init__(self) -> None:
        self._events: list[tuple[str, str, bytes]] = []
        self._writes: list[Callable[[sqlite3.Connection], None]] = []  # ``Writer.grouped``'s
        self.due = math.inf  # monotonic: when it is written, if nothing ends it before

    def add(self, item: _Event | _Grouped) -> None:
        if not self._events and not self._writes:
            self.due = item.at + GROUP_SECONDS
        if isinstance(item, _Grouped):
            self._writes.append(item.apply)
        else:
            self._events.append((item.action_id, item.event, item.data))

    def write_into(self, pending: list[Write], future: concurrent.futures.Future[None] | None = None) -> None:
        """Hand the events to the round as one write (``future``: its waiter's), and begin a new group."""
        if not self._events and not self._writes:
            return
        events, writes, self._events, self._writes, self.due = self._events, self._writes, [], [], math.inf
        future = future or _running()
        future.add_done_callback(_log_failed_group)
        touched = frozenset(action_id for action_id, _, _ in events)
        pending.append(Write(functools.partial(_write_group, events, writes), None, True, math.inf, future, touched))


class _RolledBack(Exception):
    """SQLite rolled back the whole transaction while a write failed; its fallback takes its place."""


def _apply(db: sqlite3.Connection, write: Write) -> Any:
    """One write in its own savepoint; if it fails, its fallback (once) in a fresh one."""
    while True:
        db.execute("SAVEPOINT write")
        try:
            result = write.apply(db)
        except (sqlite3.Error, JournalError):
            if db.in_transaction:
                db.execute("ROLLBACK TO write")
                db.execute("RELEASE write")
            if write.fallback is None:
                raise
            write.apply, write.fallback = write.fallback, None
            if not db.in_transaction:
                raise _RolledBack from None
            continue
        db.execute("RELEASE write")
        return result


def _running() -> concurrent.futures.Future[Any]:
    """A write's future, running from now on so that it cannot be cancelled: an awaiting task that is cancelled (a
    job's timeout while its group waits for space) must neither drop the write nor make its result fail."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    return future


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _journal_error(exc: Exception) -> JournalError:
    return exc if isinstance(exc, JournalError) else JournalError(f"journal write failed: {exc}")


def _resolve(results: list[tuple[Write, Any]], failures: list[tuple[Write, Exception]]) -> None:
    for write, result in results:
        write.future.set_result(result)
    for write, exc in failures:
        write.future.set_exception(exc)


def _fail(writes: list[Write], exc: JournalError) -> None:
    for write in writes:
        if not write.future.done():
            write.future.set_exception(exc)


def _write_group(
    group: list[tuple[str, str, bytes]], writes: list[Callable[[sqlite3.Connection], None]], db: sqlite3.Connection
) -> None:
    _insert_group(group, db)
    for write in writes:
        write(db)


def _insert_group(group: list[tuple[str, str, bytes]], db: sqlite3.Connection) -> None:
    """A group of events in one statement, one count per job, numbered from each job's count: the writer
    is the only one that writes them, so a failed group leaves no gap."""
    counts: dict[str, int] = {}
    rows = []
    for action_id, event, data in group:
        sequence = counts.get(action_id)
        if sequence is None:
            row = db.execute("SELECT event_count FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
            if row is None:
                raise JournalError(f"journal append failed: no job {action_id!r}")
            (sequence,) = row
        # Its plain text: SQLite binds an exact str directly, a StrEnum member only after looking for an adapter
        # (0.5 µs a row, on every chunk of every job).
        rows.append((action_id, sequence, str(event), data))
        counts[action_id] = sequence + 1
    db.executemany("INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", rows)
    db.executemany("UPDATE jobs SET event_count = ? WHERE action_id = ?", [(n, a) for a, n in counts.items()])


def _log_failed_group(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.error("group commit failed; its events are lost: %s", exc)
