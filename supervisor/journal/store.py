"""The durable journal: one SQLite file in WAL mode, one writer guarded by a flock.

Admission and terminal events commit before they are acknowledged; chunk events are
group-committed, so a crash loses at most ``checkpoint_events`` of them. Until their group is handed
to the writer they wait in memory, and each group is written in one statement: a SQLite statement per
event (and a savepoint around it) was most of the supervisor's CPU per relayed event.

Every write goes through one writer thread (``supervisor.journal.writer``), so no caller waits on
SQLite, an fsync or another process's lock; reads run on the caller's thread, on a connection of
their own that sees only what has committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import orjson

from supervisor.journal import migrate
from supervisor.journal.records import Event, Job, StoredEvent, Streams
from supervisor.journal.schema import INCONSISTENT, SCHEMA, SCHEMA_VERSION, JournalError
from supervisor.journal.statefiles import lock, prepare_file, restrict
from supervisor.journal.writer import Writer, Written

log = logging.getLogger("crew_supervisor.journal")
T = TypeVar("T")
HEADROOM_BYTES = 16 * 1024 * 1024
REFUSE_AFTER_SECONDS = 1.0  # how long an admission or archive waits for another process's lock
CLOSE_GRACE_SECONDS = 5.0  # how long, at close, queued writes may still wait for it


_JOB_COLUMNS = (
    "action_id, crew_id, operation, request_hash, status, event_count, worker_pid, worker_start_time, worker_pgid,"
    " exit_status, admitted_at, ended_at"
)


class Journal:
    def __init__(self, path: Path, checkpoint_events: int, max_bytes: int = 4 << 30) -> None:
        self.path = path
        self._checkpoint = checkpoint_events
        # Events appended but not yet handed to the writer: (action_id, event, data as JSON).
        self._pending: list[tuple[str, str, bytes]] = []
        self._last_group: Written[None] = Written(_done(None))  # the group most recently handed to the writer
        self.imported_from: Path | None = None  # the backup of a reference journal imported at open
        self.upgraded_from: Path | None = None  # the backup of an older schema's journal upgraded at open
        self.on_commit: Callable[[set[str]], None] = lambda action_ids: None  # their readers may look again
        self.on_pending: Callable[[], None] = lambda: None  # a group begins: it must commit within its time
        self.commit_seconds: Callable[[float], None] = lambda seconds: None  # how long a durable commit took
        self._lock_fd = lock(path.with_name(path.name + ".lock"))
        try:
            if migrate.is_reference_journal(path):
                self.imported_from = migrate.import_reference(path, max_bytes)
            prepare_file(path)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;")
            # A hard ceiling: past it SQLite reports "disk full" and the write fails cleanly. Admission
            # stops at max_bytes already; the headroom is for the terminal events of running jobs.
            (page_size,) = self._db.execute("PRAGMA page_size").fetchone()
            self._db.execute(f"PRAGMA max_page_count = {(max_bytes + HEADROOM_BYTES) // page_size}")
            self._migrate()
            # Readers get their own connection, so they see only committed events: a client never
            # reads an event that a crash could take back (and whose sequence a restart would reuse).
            # In WAL mode a reader never waits for a writer's lock, so reads stay on the caller's thread.
            self._read = sqlite3.connect(
                f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            self._verify()
            for companion in ("-wal", "-shm"):
                restrict(path.with_name(path.name + companion))
        except sqlite3.Error as exc:
            os.close(self._lock_fd)
            raise JournalError(f"journal {path} cannot be used: {exc}") from None
        except BaseException:
            os.close(self._lock_fd)
            raise
        # From here on the write connection is the writer thread's alone.
        self._writer = Writer(self._db, lambda seconds: self.commit_seconds(seconds))

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise JournalError(f"journal schema {version} is newer than this supervisor ({SCHEMA_VERSION})")
        if 0 < version < SCHEMA_VERSION:
            self.upgraded_from = migrate.upgrade(self._db, self.path, version)
        self._db.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")

    def _verify(self) -> None:
        """Refuse to serve a corrupt journal rather than repeat or lose what it says."""
        (result,) = self._db.execute("PRAGMA quick_check").fetchone()
        if result != "ok":
            raise JournalError(f"journal {self.path} failed its integrity check: {result}")
        row = self._read.execute(INCONSISTENT).fetchone()
        if row is not None:
            raise JournalError(f"journal {self.path} is inconsistent for job {row[0]!r}: {row[1]}")

    @property
    def pending(self) -> bool:
        """Whether events wait for their group commit."""
        return bool(self._pending)

    def stop_waiting(self) -> None:
        """The supervisor is stopping: writes still waiting for another process's lock or for disk space
        get ``CLOSE_GRACE_SECONDS`` more, so that a stop ends even while the disk stays full."""
        self._writer.stop_waiting(CLOSE_GRACE_SECONDS)

    def close(self) -> None:
        """Idempotent: what is queued is committed first (``CLOSE_GRACE_SECONDS`` at most for another
        process's lock); the lock goes last, so no other supervisor opens a journal still being written."""
        if self._lock_fd < 0:
            return
        try:
            self.flush()
            self._writer.close(CLOSE_GRACE_SECONDS)
            self._read.close()
            self._db.close()
        finally:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # Reads ---------------------------------------------------------------------------------------

    def get(self, action_id: str) -> Job | None:
        row = self._read.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
        return Job(*row) if row else None

    def output(self, action_id: str) -> dict[str, Any] | None:
        row = self._read.execute("SELECT output FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
        return orjson.loads(row[0]) if row and row[0] is not None else None

    def events(self, action_id: str, cursor: int, limit: int = 1000) -> list[Event]:
        rows = self._read.execute(
            "SELECT event, sequence, data FROM events WHERE action_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?",
            (action_id, cursor, limit),
        )
        return [Event(name, sequence, orjson.loads(data)) for name, sequence, data in rows]

    def stored_events(
        self, action_id: str, cursor: int, limit: int = 1000, max_bytes: int | None = None
    ) -> list[StoredEvent]:
        """``events``, with each one's data left as stored (compact JSON). With ``max_bytes``, only as many
        as fit in that many bytes of data, but never none: an event larger than the bound comes alone, so
        a reader paging on from the next one never sticks."""
        if max_bytes is not None:
            limit = self._fitting(action_id, cursor, limit, max_bytes)
        rows = self._read.execute(
            "SELECT event, sequence, data FROM events WHERE action_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?",
            (action_id, cursor, limit),
        )
        return list(map(StoredEvent._make, rows))

    def _fitting(self, action_id: str, cursor: int, limit: int, max_bytes: int) -> int:
        """How many of the ``limit`` events from ``cursor`` fit in ``max_bytes`` of data (at least one),
        counted from their lengths alone: no event past the bound is read. Later commits only append, so
        the events counted here are the first ones a read right after finds."""
        count = total = 0
        # Closed when left early: an unfinished statement would hold its read transaction open.
        with contextlib.closing(
            self._read.execute(
                "SELECT length(data) FROM events WHERE action_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?",
                (action_id, cursor, limit),
            )
        ) as sizes:
            for (size,) in sizes:
                total += size
                if count and total > max_bytes:
                    break
                count += 1
        return count

    def last_event(self, action_id: str) -> Event | None:
        row = self._read.execute(
            "SELECT event, sequence, data FROM events WHERE action_id = ? ORDER BY sequence DESC LIMIT 1", (action_id,)
        ).fetchone()
        return Event(row[0], row[1], orjson.loads(row[2])) if row else None

    def list_jobs(
        self,
        status: str | None = None,
        crew_id: str | None = None,
        operation: str | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 50,
        among: Collection[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; ``before`` is the (admitted_at, action_id) of the previous page's last row (keyset
        paging: each page costs one index range however deep it is); ``among``: only these action ids."""
        filters = {"j.status": status, "j.crew_id": crew_id, "j.operation": operation}
        clauses = [f"{column} = ?" for column, value in filters.items() if value is not None]
        params: list[Any] = [value for value in filters.values() if value is not None]
        if among is not None:  # one parameter however many: SQLite bounds their number
            clauses.append("j.action_id IN (SELECT value FROM json_each(?))")
            params.append(orjson.dumps(list(among)).decode())
        if before is not None:
            clauses.append("(j.admitted_at, j.action_id) < (?, ?)")
            params += before
        # A failed or cancelled job's reason, from its terminal event (the last: one key lookup a row).
        rows = self._read.execute(
            "SELECT j.action_id, j.crew_id, j.operation, j.status, j.event_count, j.admitted_at, j.ended_at,"
            " CASE WHEN j.status IN ('failed', 'cancelled') THEN json_extract(CAST(e.data AS TEXT), '$.reason') END"
            " FROM jobs AS j LEFT JOIN events AS e ON e.action_id = j.action_id AND e.sequence = j.event_count - 1"
            f" {'WHERE ' + ' AND '.join(clauses) if clauses else ''}"
            " ORDER BY j.admitted_at DESC, j.action_id DESC LIMIT ?",
            (*params, limit),
        )
        names = ("action_id", "crew_id", "operation", "status", "event_count", "admitted_at", "ended_at", "reason")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def streams(self, action_id: str) -> Streams | None:
        row = self._read.execute(
            "SELECT stdout, stderr, stdout_total, stderr_total FROM outputs WHERE action_id = ?", (action_id,)
        ).fetchone()
        return Streams(*row) if row else None

    def running(self) -> list[Job]:
        rows = self._read.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE status = 'running' ORDER BY admitted_at")
        return [Job(*row) for row in rows]

    def count(self) -> int:
        return int(self._read.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def size_bytes(self) -> int:
        return size_bytes(self.path)

    def free_bytes(self) -> int:
        return free_bytes(self.path.parent)

    # Writes --------------------------------------------------------------------------------------
    #
    # Each is handed to the writer thread (``supervisor.journal.writer``) and returns at once: ``await``
    # what it returns on the event loop, ``wait()`` for it elsewhere. They commit in the order they were
    # made. Admission and archive wait ``REFUSE_AFTER_SECONDS`` for another process's lock, then fail with
    # ``JournalBusy``; every other write waits until it commits, since what it records has happened.

    def admit(self, job: Job) -> Written[None]:
        """The start fence: durable before any worker exists."""
        self.flush()  # here and in every write below: earlier events commit first, with it or before it

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, admitted_at)"
                " VALUES (?, ?, ?, ?, 'running', 0, ?)",
                (job.action_id, job.crew_id, job.operation, job.request_hash, time.time()),
            )

        return self._write(insert, patience=REFUSE_AFTER_SECONDS)

    def set_worker(self, action_id: str, pid: int, start_time: float, pgid: int) -> Written[None]:
        """Committed before the worker gets its job, so a restarted supervisor can find and fence it.

        Committed without an fsync (``synchronous=NORMAL``) unless a write that needs one shares its
        commit: what it must survive is this process crashing, never the machine, since a worker does
        not outlive the kernel it runs on. After a power loss the record has no worker, as at admission,
        and is fenced all the same. The next durable commit syncs it with everything before it."""
        self.flush()

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE jobs SET worker_pid = ?, worker_start_time = ?, worker_pgid = ? WHERE action_id = ?",
                (pid, start_time, pgid, action_id),
            )

        return self._write(update, durable=False)

    def append(
        self, action_id: str, event: str, data: dict[str, Any], encoded: bytes | None = None
    ) -> Written[None] | None:
        """A non-terminal event, group-committed: it waits in memory for its group (``flush``, or
        ``checkpoint_events`` of them) and is numbered when the group is written. ``encoded`` is
        ``data`` as compact JSON, if the caller has it already. Returns the group if this event
        completed one: whoever appended it waits for it, so that a crash loses at most the events that
        wait in memory and the groups being written."""
        if not self._pending:
            self.on_pending()
        self._pending.append((action_id, event, orjson.dumps(data) if encoded is None else encoded))
        return self.flush() if len(self._pending) >= self._checkpoint else None

    def flush(self) -> Written[None]:
        """Hand the pending events to the writer as one group. A group that fails is logged and lost:
        readers never saw it, and the next events take its sequences. (A full disk is not a failure:
        the group waits for space.)"""
        if self._pending:
            group, self._pending = self._pending, []
            touched = {action_id for action_id, _, _ in group}
            self._last_group = self._write(functools.partial(_insert_group, group), touched)
            self._last_group.future.add_done_callback(_log_failed_group)
        return self._last_group  # groups commit in order: when this one has, every earlier one has

    def finish(
        self,
        action_id: str,
        event: str,
        data: dict[str, Any],
        output: dict[str, Any] | None = None,
        streams: Streams | None = None,
        exit_status: int | None = None,
    ) -> Written[Event]:
        """The terminal event, the status it implies, the output and the worker's streams: one durable
        commit, after the job's pending events. If the streams do not fit (the journal is full) they
        are dropped, never the terminal event."""
        self.flush()
        ended = time.time()

        def terminal(streams: Streams | None, db: sqlite3.Connection) -> Event:
            appended = _insert(db, action_id, event, data)
            db.execute(
                "UPDATE jobs SET status = ?, output = ?, exit_status = ?, ended_at = ? WHERE action_id = ?",
                (event, orjson.dumps(output) if output is not None else None, exit_status, ended, action_id),
            )
            if streams is not None:
                db.execute(
                    "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?, ?)", (action_id, *dataclasses.astuple(streams))
                )
            return appended

        fallback = functools.partial(terminal, None) if streams is not None else None
        return self._write(functools.partial(terminal, streams), {action_id}, fallback=fallback)

    def archive(self, action_id: str) -> Written[None]:
        self.flush()

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM events WHERE action_id = ?", (action_id,))
            db.execute("DELETE FROM outputs WHERE action_id = ?", (action_id,))
            db.execute("DELETE FROM jobs WHERE action_id = ?", (action_id,))

        return self._write(delete, patience=REFUSE_AFTER_SECONDS)

    def _write(
        self,
        apply: Callable[[sqlite3.Connection], T],
        touched: set[str] | frozenset[str] = frozenset(),
        *,
        durable: bool = True,
        patience: float | None = None,
        fallback: Callable[[sqlite3.Connection], T] | None = None,
    ) -> Written[T]:
        """Queue ``apply``; once it commits, the readers of the ``touched`` jobs are woken on the event
        loop it was queued from (or on the writer thread, queued from none)."""
        future = self._writer.submit(apply, durable=durable, patience=patience, fallback=fallback)
        if touched:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            future.add_done_callback(functools.partial(self._committed, set(touched), loop))
        return Written(future)

    def _committed(self, touched: set[str], loop: asyncio.AbstractEventLoop | None, future: Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        if loop is None:
            self.on_commit(touched)
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to wake
                loop.call_soon_threadsafe(self.on_commit, touched)


def size_bytes(journal: Path) -> int:
    """The journal's size as admission counts it against MAX_STATE_BYTES: the file and its WAL."""
    return sum(
        os.stat(p).st_size if os.path.exists(p) else 0 for p in (journal, journal.with_name(journal.name + "-wal"))
    )


def free_bytes(directory: Path) -> int:
    """Space left on ``directory``'s filesystem for an unprivileged writer."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize


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
        rows.append((action_id, sequence, event, data))
        counts[action_id] = sequence + 1
    db.executemany("INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", rows)
    db.executemany("UPDATE jobs SET event_count = ? WHERE action_id = ?", [(n, a) for a, n in counts.items()])


def _insert(db: sqlite3.Connection, action_id: str, event: str, data: dict[str, Any]) -> Event:
    row = db.execute(
        "UPDATE jobs SET event_count = event_count + 1 WHERE action_id = ? RETURNING event_count - 1", (action_id,)
    ).fetchone()
    if row is None:
        raise JournalError(f"journal write failed: no job {action_id!r}")
    db.execute(
        "INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)",
        (action_id, row[0], event, orjson.dumps(data)),
    )
    return Event(event, row[0], data)


def _done(result: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(result)
    return future


def _log_failed_group(future: Future[None]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.error("group commit failed; its events are lost: %s", exc)
