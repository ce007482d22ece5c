"""The durable journal: one SQLite file in WAL mode, one writer guarded by a flock.

Admission and terminal events commit before they are acknowledged; chunk events are
group-committed, so a crash loses at most ``checkpoint_events`` of them: the event that completes a
checkpoint is awaited by whoever appended it.

Every write goes through one writer thread (``supervisor.journal.writer``), which also forms and commits
the groups, so no caller waits on SQLite, an fsync or another process's lock, nor has to flush anything;
reads run on the caller's thread, through ``reader`` (``supervisor.journal.reader``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from supervisor.enums import EventName
from supervisor.journal import admitted, ledger, migrate
from supervisor.journal.errors import JournalError
from supervisor.journal.quarantine import quarantine
from supervisor.journal.reader import Reader
from supervisor.journal.records import Event, Job, Resumed, Streams, TaskRecord, TraceIds
from supervisor.journal.schema import RUNNING, SCHEMA, SCHEMA_VERSION
from supervisor.journal.statefiles import lock, prepare_file, restrict
from supervisor.journal.writer import Writer, Written
from supervisor.layout import lock_file

T = TypeVar("T")
HEADROOM_BYTES = 16 * 1024 * 1024
REFUSE_AFTER_SECONDS = 1.0  # how long an admission or archive waits for another process's lock
CLOSE_GRACE_SECONDS = 5.0  # how long, at close, queued writes may still wait for it


class Journal:
    def __init__(
        self,
        path: Path,
        checkpoint_events: int,
        max_bytes: int = 4 << 30,
        *,
        on_commit: Callable[[frozenset[str]], None] = lambda action_ids: None,
        commit_seconds: Callable[[float], None] = lambda seconds: None,
        locked: int | None = None,
    ) -> None:
        """``on_commit``: these jobs have newly committed events (their readers may look again);
        ``commit_seconds``: how long a commit took. Both are called on the writer thread. ``locked``: the lock's
        descriptor (``statefiles.lock``) if the caller took it already, and keeps it: closed by the caller, after
        ``close``."""
        self.path = path
        self._checkpoint = checkpoint_events
        self._uncheckpointed = 0  # events appended since the last that completed a checkpoint
        self.imported_from: Path | None = None  # the backup of a reference journal imported at open
        self.upgraded_from: Path | None = None  # the backup of an older schema's journal upgraded at open
        self.quarantined: dict[str, str] = {}  # the records quarantined at this open, and what was wrong with each
        self._own_lock = locked is None
        self._lock_fd = lock(lock_file(path)) if locked is None else locked
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
            self.upgraded_from = _migrate(self._db, path)
            self.reader = Reader(path)
            self._verify()
            for companion in ("-wal", "-shm"):
                restrict(path.with_name(path.name + companion))
        except BaseException as exc:
            self._unlock()
            if isinstance(exc, sqlite3.Error):
                raise JournalError(f"journal {path} cannot be used: {exc}") from None
            raise
        # From here on the write connection is the writer thread's alone.
        self._writer = Writer(self._db, on_commit, commit_seconds)
        self.ledger = ledger.LedgerWrites(self._writer)  # the effect ledger's writes, on the same writer

    def _verify(self) -> None:
        """Refuse to serve a corrupt file rather than repeat or lose what it says; quarantine a record that breaks the
        consistency rule: one record (a job's output, a hand's edit) never stops the others, nor any fencing."""
        if (result := self.reader.damage()) is not None:
            raise JournalError(f"journal {self.path} failed its integrity check: {result}")
        if found := self.reader.inconsistent():
            self.quarantined = quarantine(self._db, found)  # each one logged

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
            self._writer.close(CLOSE_GRACE_SECONDS)
            self.reader.close()
            self._db.close()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._own_lock:
            os.close(self._lock_fd)
        self._lock_fd = -1

    # Writes --------------------------------------------------------------------------------------
    # Each is handed to the writer thread (``supervisor.journal.writer``) and returns at once: ``await``
    # what it returns on the event loop, ``wait()`` for it elsewhere. They commit in the order they were
    # made. Admission and archive wait ``REFUSE_AFTER_SECONDS`` for another process's lock, then fail with
    # ``JournalBusy``; every other write waits until it commits, since what it records has happened.

    def admit(
        self, job: Job, input: bytes | None = None, resumed: Resumed | None = None, trace: TraceIds | None = None
    ) -> Written[list[TaskRecord] | None]:
        """The start fence: durable before any worker exists (``admitted.insert``: all an admission writes, at once)."""
        insert = functools.partial(admitted.insert, job, input, resumed, trace)
        return self._write(insert, patience=REFUSE_AFTER_SECONDS)

    def set_worker(self, action_id: str, pid: int, start_time: float, pgid: int, boundary: bytes) -> Written[None]:
        """Committed before the worker gets its job, so a restarted supervisor can find and fence it, and
        everything it starts (``boundary``: its cgroups; ``set_boundary`` adds what samples find later).

        Committed without an fsync (``synchronous=NORMAL``) unless a write that needs one shares its
        commit: what it must survive is this process crashing, never the machine, since a worker does
        not outlive the kernel it runs on. After a power loss the record has no worker, as at admission,
        and is fenced all the same. The next durable commit syncs it with everything before it."""

        def update(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE jobs SET worker_pid = ?, worker_start_time = ?, worker_pgid = ?, boundary = ?"
                " WHERE action_id = ?",
                (pid, start_time, pgid, boundary, action_id),
            )

        return self._write(update, durable=False)

    def set_boundary(self, action_id: str, boundary: bytes) -> Written[None]:
        """What identifies a running job's processes now (samples found more); committed as ``set_worker`` is."""

        def update(db: sqlite3.Connection) -> None:
            db.execute("UPDATE jobs SET boundary = ? WHERE action_id = ?", (boundary, action_id))

        return self._write(update, durable=False)

    def append(
        self,
        action_id: str,
        event: EventName,
        data: dict[str, Any],
        encoded: bytes | None = None,
        *,
        commit: bool = False,
    ) -> Written[None] | None:
        """A non-terminal event, group-committed by the writer (``supervisor.journal.writer``), numbered when
        its group is written. ``encoded`` is ``data`` as compact JSON, if the caller has it already.
        Returns its group if this event ends one (``commit``, or the ``checkpoint_events``-th since the
        last): whoever appended it waits for it, so that a crash loses at most a checkpoint's events."""
        self._uncheckpointed += 1
        ends = commit or self._uncheckpointed >= self._checkpoint
        if ends:
            self._uncheckpointed = 0
        stored = orjson.dumps(data) if encoded is None else encoded
        group = self._writer.append(action_id, event, stored, ends_group=ends)
        return Written(group) if group is not None else None

    def finish(
        self,
        action_id: str,
        event: EventName,
        data: dict[str, Any],
        output: dict[str, Any] | None = None,
        streams: Streams | None = None,
        exit_status: int | None = None,
        stack: dict[str, Any] | None = None,
        leftovers: dict[str, Any] | None = None,
    ) -> Written[Event]:
        """The terminal event, the status it implies, the output, the worker's exit status and what it left running,
        the worker's streams and the stacks taken before its kill: one durable commit, after the job's pending events.
        If the streams and stacks do not fit (the journal is full) they are dropped, never the terminal event."""
        ended = time.time()

        def terminal(streams: Streams | None, db: sqlite3.Connection) -> Event:
            appended = _insert(db, action_id, event, data)
            ledger.settle(db, action_id)  # its calls still running are uncertain from this commit on
            if event == EventName.COMPLETED:
                admitted.completed(action_id, db)
            db.execute(
                "UPDATE jobs SET status = ?, output = ?, exit_status = ?, ended_at = ?, leftovers = ?"
                " WHERE action_id = ?",
                (event, _json(output), exit_status, ended, _json(leftovers), action_id),
            )
            if streams is not None:
                db.execute(
                    "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?, ?)", (action_id, *dataclasses.astuple(streams))
                )
                if stack is not None:
                    db.execute("INSERT OR REPLACE INTO stacks VALUES (?, ?)", (action_id, orjson.dumps(stack)))
            return appended

        fallback = functools.partial(terminal, None) if streams is not None else None
        return self._write(functools.partial(terminal, streams), frozenset({action_id}), fallback=fallback)

    def archive(self, *action_ids: str) -> Written[list[str]]:
        """Remove ended jobs' records, each with its events, output, stacks, ledger, input and resume links, in one
        commit; returns the action ids removed. A record running when the write commits is left (its id, archived
        meanwhile, was admitted again)."""
        named = orjson.dumps(action_ids).decode()  # one parameter however many: SQLite bounds their number
        return self._write(functools.partial(_archive, named), patience=REFUSE_AFTER_SECONDS)

    def _write(
        self,
        apply: Callable[[sqlite3.Connection], T],
        touched: frozenset[str] = frozenset(),
        *,
        durable: bool = True,
        patience: float | None = None,
        fallback: Callable[[sqlite3.Connection], T] | None = None,
    ) -> Written[T]:
        """Queue ``apply``: it commits after everything queued before it. The ``touched`` jobs' readers are
        woken once it has (``on_commit``)."""
        return Written(
            self._writer.submit(apply, durable=durable, patience=patience, fallback=fallback, touched=touched)
        )


def _json(value: dict[str, Any] | None) -> bytes | None:
    return orjson.dumps(value) if value is not None else None


def _archive(named: str, db: sqlite3.Connection) -> list[str]:
    """``Journal.archive``'s write: the ended records of the action ids ``named`` (a JSON list), and their rows."""
    rows = db.execute(
        f"DELETE FROM jobs WHERE action_id IN (SELECT value FROM json_each(?)) AND status != {RUNNING}"
        " RETURNING action_id",
        (named,),
    ).fetchall()
    removed = [row[0] for row in rows]
    for table in ("events", "outputs", "stacks", "effects", "tasks_done", "traces"):
        db.execute(
            f"DELETE FROM {table} WHERE action_id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(removed).decode(),),
        )
    admitted.archive(orjson.dumps(removed).decode(), db)
    return removed


def _migrate(db: sqlite3.Connection, path: Path) -> Path | None:
    """The schema brought to this supervisor's; the backup of an older one's journal, if it was upgraded."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise JournalError(f"journal schema {version} is newer than this supervisor ({SCHEMA_VERSION})")
    upgraded_from = migrate.upgrade(db, path, version) if 0 < version < SCHEMA_VERSION else None
    # Every open runs this, a restart on a full disk too: CREATE ... IF NOT EXISTS of what exists writes nothing,
    # but setting user_version dirties page 1 even to the same value, and committing that needs room in the WAL.
    bump = f"PRAGMA user_version = {SCHEMA_VERSION};" if version != SCHEMA_VERSION else ""
    db.executescript(f"BEGIN; {SCHEMA} {bump} COMMIT;")
    return upgraded_from


def _insert(db: sqlite3.Connection, action_id: str, event: EventName, data: dict[str, Any]) -> Event:
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
