"""The durable journal: one SQLite file in WAL mode, one writer guarded by a flock.

Admission and terminal events commit before they are acknowledged; chunk events are
group-committed, so a crash loses at most ``checkpoint_events`` of them. Until their group commits
they wait in memory, numbered, and are written in one statement per group: a SQLite statement per
event (and a savepoint around it) was most of the supervisor's CPU per relayed event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from supervisor.journal import migrate
from supervisor.journal.schema import INCONSISTENT, SCHEMA, SCHEMA_VERSION, TERMINAL_EVENTS, JournalError
from supervisor.journal.statefiles import lock, prepare_file, restrict

if TYPE_CHECKING:
    from supervisor.processes.pipes import Tail

HEADROOM_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Job:
    action_id: str
    crew_id: str
    operation: str
    request_hash: str
    status: str
    event_count: int
    worker_pid: int | None = None
    worker_start_time: float | None = None
    worker_pgid: int | None = None
    exit_status: int | None = None  # the worker's, once the job is terminal (negative: killed by that signal)


@dataclasses.dataclass(frozen=True)
class Event:
    event: str
    sequence: int
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS

    def as_dict(self) -> dict[str, Any]:
        return {"event": self.event, "sequence": self.sequence, "data": self.data}


class StoredEvent(NamedTuple):
    """An event as stored: its data still the compact JSON it was written as, for a reader that only
    passes it on (an SSE stream) and need not parse it and encode it again."""

    event: str
    sequence: int
    data: bytes

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS


@dataclasses.dataclass(frozen=True)
class Streams:
    """A worker's captured stdout/stderr tails and the bytes each carried in all."""

    stdout: str
    stderr: str
    stdout_total: int
    stderr_total: int

    @classmethod
    def of(cls, stdout: Tail, stderr: Tail) -> Streams:
        return cls(stdout.text(), stderr.text(), stdout.total, stderr.total)


_JOB_COLUMNS = (
    "action_id, crew_id, operation, request_hash, status, event_count, worker_pid, worker_start_time, worker_pgid,"
    " exit_status"
)


class Journal:
    def __init__(self, path: Path, checkpoint_events: int, max_bytes: int = 4 << 30) -> None:
        self.path = path
        self._checkpoint = checkpoint_events
        # Events appended but not yet committed, numbered: (action_id, sequence, event, data as JSON).
        self._pending: list[tuple[str, int, str, bytes]] = []
        self._next: dict[str, int] = {}  # the next sequence of each job that has appended since its last read
        self.imported_from: Path | None = None  # the backup of a reference journal imported at open
        self.upgraded_from: Path | None = None  # the backup of an older schema's journal upgraded at open
        self.on_commit: Callable[[set[str]], None] = lambda action_ids: None  # their readers may look again
        self.on_pending: Callable[[], None] = lambda: None  # a group begins: it must commit within its time
        self._touched: set[str] = set()  # jobs with events in the open transaction
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

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One durable commit. Pending chunks commit first, so a failure here rolls back only this."""
        self.flush()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._commit()
        except BaseException as exc:
            self._abandon()
            if isinstance(exc, sqlite3.Error):
                raise JournalError(f"journal write failed: {exc}") from exc
            raise

    def _commit(self) -> None:
        """Write the pending events (one statement for all, one count per job) and commit. On failure
        none of them is written, readers never saw them, and their sequences are free again."""
        started = time.monotonic()
        try:
            if self._pending:
                if not self._db.in_transaction:
                    self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", self._pending
                )
                counts = {action_id: sequence + 1 for action_id, sequence, _, _ in self._pending}
                self._db.executemany(
                    "UPDATE jobs SET event_count = ? WHERE action_id = ?", [(n, a) for a, n in counts.items()]
                )
            if self._db.in_transaction:
                self._db.execute("COMMIT")
                self.commit_seconds(time.monotonic() - started)
        except sqlite3.Error as exc:
            # Never acknowledge what is not durable; SQLite rolled back or the db is unusable.
            self._abandon()
            raise JournalError(f"journal commit failed: {exc}") from exc
        self._pending.clear()
        touched, self._touched = self._touched, set()
        self.on_commit(touched)

    def _abandon(self) -> None:
        """Drop what is not committed: the open transaction, the pending events and the sequences counted
        past the journal's (each job's next one is read again from the journal)."""
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
        self._pending.clear()
        self._next.clear()
        self._touched.clear()

    @property
    def pending(self) -> bool:
        """Whether events wait for their group commit."""
        return bool(self._pending)

    def flush(self) -> None:
        """Commit group-committed chunk events."""
        if self._pending or self._db.in_transaction:
            self._commit()

    def close(self) -> None:
        """Idempotent; the lock goes last, so no other supervisor opens a journal still being written."""
        if self._lock_fd < 0:
            return
        try:
            self.flush()
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

    def stored_events(self, action_id: str, cursor: int, limit: int = 1000) -> list[StoredEvent]:
        """``events``, with each one's data left as stored (compact JSON)."""
        rows = self._read.execute(
            "SELECT event, sequence, data FROM events WHERE action_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?",
            (action_id, cursor, limit),
        )
        return list(map(StoredEvent._make, rows))

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
    ) -> list[dict[str, Any]]:
        """Newest first; ``before`` is the (admitted_at, action_id) of the previous page's last row (keyset
        paging: each page costs one index range however deep it is)."""
        filters = {"status": status, "crew_id": crew_id, "operation": operation}
        clauses = [f"{column} = ?" for column, value in filters.items() if value is not None]
        params: list[Any] = [value for value in filters.values() if value is not None]
        if before is not None:
            clauses.append("(admitted_at, action_id) < (?, ?)")
            params += before
        rows = self._read.execute(
            "SELECT action_id, crew_id, operation, status, event_count, admitted_at FROM jobs"
            f" {'WHERE ' + ' AND '.join(clauses) if clauses else ''}"
            " ORDER BY admitted_at DESC, action_id DESC LIMIT ?",
            (*params, limit),
        )
        names = ("action_id", "crew_id", "operation", "status", "event_count", "admitted_at")
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
        return sum(
            os.stat(p).st_size if os.path.exists(p) else 0
            for p in (self.path, self.path.with_name(self.path.name + "-wal"))
        )

    # Writes --------------------------------------------------------------------------------------

    def admit(self, job: Job) -> None:
        """The start fence: durable before any worker exists."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, admitted_at)"
                " VALUES (?, ?, ?, ?, 'running', 0, ?)",
                (job.action_id, job.crew_id, job.operation, job.request_hash, time.time()),
            )

    def set_worker(self, action_id: str, pid: int, start_time: float, pgid: int) -> None:
        """Committed before the worker gets its job, so a restarted supervisor can find and fence it.

        Committed without an fsync (``synchronous=NORMAL``; a WAL commit is then in the file, not yet on
        the disk): what it must survive is this process crashing, never the machine, since a worker does
        not outlive the kernel it runs on. After a power loss the record has no worker, as at admission,
        and is fenced all the same. The next durable commit syncs it with everything before it."""
        self.flush()  # pending chunks keep their own durable commit
        self._db.execute("PRAGMA synchronous = NORMAL")
        try:
            with self._transaction():
                self._db.execute(
                    "UPDATE jobs SET worker_pid = ?, worker_start_time = ?, worker_pgid = ? WHERE action_id = ?",
                    (pid, start_time, pgid, action_id),
                )
        finally:
            self._db.execute("PRAGMA synchronous = FULL")

    def append(self, action_id: str, event: str, data: dict[str, Any], encoded: bytes | None = None) -> Event:
        """A non-terminal event, group-committed: numbered now, written with its group. ``encoded`` is
        ``data`` as compact JSON, if the caller has it already."""
        sequence = self._next.get(action_id)
        if sequence is None:
            try:
                row = self._db.execute("SELECT event_count FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
            except sqlite3.Error as exc:
                raise JournalError(f"journal append failed: {exc}") from exc
            if row is None:
                raise JournalError(f"journal append failed: no job {action_id!r}")
            (sequence,) = row
        if not self._pending:
            self.on_pending()
        self._pending.append((action_id, sequence, event, orjson.dumps(data) if encoded is None else encoded))
        self._next[action_id] = sequence + 1
        self._touched.add(action_id)
        if len(self._pending) >= self._checkpoint:
            self._commit()
        return Event(event, sequence, data)

    def finish(
        self,
        action_id: str,
        event: str,
        data: dict[str, Any],
        output: dict[str, Any] | None = None,
        streams: Streams | None = None,
        exit_status: int | None = None,
    ) -> Event:
        """The terminal event, the status it implies, the output and the worker's streams: one durable
        commit. If the streams do not fit (the journal is full) they are dropped, never the terminal event."""
        try:
            with self._transaction():
                appended = self._insert(action_id, event, data)
                self._db.execute(
                    "UPDATE jobs SET status = ?, output = ?, exit_status = ? WHERE action_id = ?",
                    (event, orjson.dumps(output) if output is not None else None, exit_status, action_id),
                )
                if streams is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?, ?)",
                        (action_id, *dataclasses.astuple(streams)),
                    )
        except JournalError:
            if streams is None:
                raise
            return self.finish(action_id, event, data, output, exit_status=exit_status)
        self._next.pop(action_id, None)  # no event follows a terminal one
        return appended

    def archive(self, action_id: str) -> None:
        self._next.pop(action_id, None)
        with self._transaction():
            self._db.execute("DELETE FROM events WHERE action_id = ?", (action_id,))
            self._db.execute("DELETE FROM outputs WHERE action_id = ?", (action_id,))
            self._db.execute("DELETE FROM jobs WHERE action_id = ?", (action_id,))

    def _insert(self, action_id: str, event: str, data: dict[str, Any]) -> Event:
        (sequence,) = self._db.execute(
            "UPDATE jobs SET event_count = event_count + 1 WHERE action_id = ? RETURNING event_count - 1", (action_id,)
        ).fetchone()
        self._db.execute(
            "INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)",
            (action_id, sequence, event, orjson.dumps(data)),
        )
        self._touched.add(action_id)
        return Event(event, sequence, data)
