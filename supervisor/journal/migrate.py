"""Journals written by others become ours: a reference sidecar's (one JSON array of records), and
ours of an older schema.

Both happen once, under the journal's lock, before anything is served, and the original is kept
beside the journal, complete and synced, before anything changes: a crash mid-way leaves the old
journal in place to be migrated again.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import orjson

from supervisor.enums import EventName, Status
from supervisor.journal.errors import JournalError
from supervisor.journal.schema import SCHEMA, SCHEMA_VERSION
from supervisor.layout import reference_original, upgrade_original

EVENTS = tuple(EventName)
# Schema 1 wrapped a completed event's output: {"status", "exit_status", "output" | "output_in_record"}.
WRAPPED_COMPLETED = frozenset({"status", "exit_status", "output", "output_in_record"})


def is_reference_journal(path: Path) -> bool:
    """A sniff of the first bytes; never follows a link, never waits on a FIFO (O_NONBLOCK), reads only a
    regular file (what else is there is refused when the journal is opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, IsADirectoryError):
        return False
    except OSError as exc:
        raise JournalError(f"cannot open journal {path} without following links: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, 64)
    finally:
        os.close(fd)
    return head.lstrip()[:1] == b"["


def import_reference(path: Path, max_bytes: int) -> Path:
    """Convert ``path`` in place; returns where the original JSON is kept."""
    records = _read(path, max_bytes)
    backup = reference_original(path)
    _write_private(backup, path.read_bytes())
    temporary = path.with_name(path.name + ".importing")
    temporary.unlink(missing_ok=True)
    _write_private(temporary, b"")
    db = sqlite3.connect(temporary, isolation_level=None)
    try:
        db.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION};")
        for record in records:
            _insert(db, record)
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise JournalError(f"cannot import reference journal {path}: {exc}") from None
    finally:
        db.close()
    fsync(temporary)
    os.replace(temporary, path)
    fsync(path.parent)
    return backup


def _read(path: Path, max_bytes: int) -> list[dict[str, Any]]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise JournalError(f"reference journal {path} must be a regular file with mode 0600")
        if info.st_size > max_bytes:
            raise JournalError(f"reference journal {path} is larger than AIP_CREWAI_MAX_STATE_BYTES")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read()
    finally:
        os.close(fd)
    try:
        records = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"reference journal {path} is not valid JSON: {exc}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise JournalError(f"reference journal {path} is not an array of records")
    return records


def _insert(db: sqlite3.Connection, record: dict[str, Any]) -> None:
    try:
        action_id, crew_id, operation = record["action_id"], record["crew_id"], record["operation"]
        request_hash, status, events = record["request_hash"], record["status"], record.get("events", [])
        fields = (action_id, crew_id, operation, request_hash)
        if status not in tuple(Status) or not all(isinstance(v, str) for v in fields):  # a tuple: any JSON value
            raise ValueError("bad field")
        rows = [(action_id, int(e["sequence"]), str(e["event"]), orjson.dumps(e.get("data", {}))) for e in events]
        if any(row[2] not in EVENTS for row in rows):
            raise ValueError("unknown event")
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"reference record {record.get('action_id')!r} is malformed: {exc}") from None
    output = record.get("output")
    db.execute(
        "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, output, admitted_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            action_id,
            crew_id,
            operation,
            request_hash,
            status,
            len(rows),
            orjson.dumps(output) if output is not None else None,
            time.time(),
        ),
    )
    db.executemany("INSERT INTO events (action_id, sequence, event, data) VALUES (?, ?, ?, ?)", rows)


def upgrade(db: sqlite3.Connection, path: Path, version: int) -> Path:
    """Bring a journal of an older schema up to date in one transaction, each step it lacks in turn; returns
    where its copy is kept."""
    backup = upgrade_original(path, version)
    _write_private(backup, b"")
    copy = sqlite3.connect(backup)
    try:
        db.backup(copy)
    finally:
        copy.close()
    fsync(backup)
    fsync(path.parent)
    db.execute("BEGIN IMMEDIATE")
    try:
        if version < 2:
            _unwrap_completed(db)
        if version < 3:  # when the jobs ended before is not known: null
            db.execute("ALTER TABLE jobs ADD COLUMN ended_at REAL")
        if version < 4:  # a running job's worker is still fenced by its pid, start time and group
            db.execute("ALTER TABLE jobs ADD COLUMN boundary BLOB")
        if version < 6:  # no job of an older journal had its leftovers named: null
            db.execute("ALTER TABLE jobs ADD COLUMN leftovers BLOB")
        # Schema 5 adds the stacks table, which SCHEMA makes once this commits; the version is raised so that an
        # older supervisor, which would leave a job's stacks behind when it archives the job, refuses the journal.
        # Schema 6 adds the quarantine and its tables, made the same way: an older supervisor would admit a
        # quarantined action id as a new job.
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return backup


def _unwrap_completed(db: sqlite3.Connection) -> None:
    """Schema 1 to 2. Completed events held ``{"status", "exit_status", "output"}`` (or ``output_in_record``);
    the real client takes that data as the output, so each becomes the output itself (from the record when the
    event left it out) and the exit status moves to the record."""
    db.execute("ALTER TABLE jobs ADD COLUMN exit_status INTEGER")
    rows = db.execute(
        "SELECT e.action_id, e.sequence, e.data, j.output FROM events AS e JOIN jobs AS j USING (action_id)"
        " WHERE e.event = 'completed'"
    ).fetchall()
    for action_id, sequence, data, output in rows:
        wrapped = orjson.loads(data)
        if wrapped.get("status") != Status.COMPLETED or not wrapped.keys() <= WRAPPED_COMPLETED:
            continue  # already the output itself (a reference journal's)
        unwrapped = wrapped["output"] if "output" in wrapped else orjson.loads(output or b"null")
        if not isinstance(unwrapped, dict):
            continue
        db.execute(
            "UPDATE events SET data = ? WHERE action_id = ? AND sequence = ?",
            (orjson.dumps(unwrapped), action_id, sequence),
        )
        db.execute("UPDATE jobs SET exit_status = ? WHERE action_id = ?", (wrapped.get("exit_status"), action_id))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
