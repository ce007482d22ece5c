"""The journal's reads: a connection of their own, opened read-only, which sees only what has committed, so a
client never reads an event that a crash could take back (and whose sequence a restart would reuse). In WAL
mode a reader never waits for the writer's lock, so reads run on the caller's thread."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Collection
from pathlib import Path
from typing import Any

import orjson

from protocol import Operation
from supervisor.enums import Status
from supervisor.journal.ledger import LedgerReads
from supervisor.journal.records import Event, Job, StoredEvent, Streams, TaskRecord, TraceIds
from supervisor.journal.schema import INCONSISTENT, RUNNING

_JOB_COLUMNS = (
    "action_id, crew_id, operation, request_hash, status, event_count, worker_pid, worker_start_time, worker_pgid,"
    " exit_status, admitted_at, ended_at, boundary, leftovers"
)


def _said(key: str, *statuses: Status) -> str:
    """``key`` of a job's terminal event ``e`` (the last: one key lookup a row) where its status is one of
    ``statuses``, else NULL."""
    names = ", ".join(f"'{status}'" for status in statuses)
    return f"CASE WHEN j.status IN ({names}) THEN json_extract(CAST(e.data AS TEXT), '$.{key}') END"


# A failed or cancelled job's reason, and a failed one's error type and message, as ``list_jobs`` selects them.
_WHY = ", ".join(
    (
        _said("reason", Status.FAILED, Status.CANCELLED),
        _said("error_type", Status.FAILED),
        _said("message", Status.FAILED),
    )
)
# A row of ``list_jobs``: the record's columns, then its terminal event's reason, error type and message.
_LISTED = (
    *("action_id", "crew_id", "operation", "status", "event_count", "admitted_at", "ended_at"),
    *("reason", "error_type", "message"),
)


class ResumeReads:
    """What a resume reads of a job (``POST /jobs/{id}/resume``): its input, its completed tasks, its links."""

    _db: sqlite3.Connection

    def input(self, action_id: str) -> dict[str, Any] | None:
        """A ``run``'s input as its client sent it; None for another operation's job."""
        row = self._db.execute("SELECT input FROM inputs WHERE action_id = ?", (action_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    def tasks_done(self, action_id: str) -> list[TaskRecord]:
        """The tasks a ``run`` completed, in order, contiguous from the first: none past a gap."""
        rows = self._db.execute(
            "SELECT task_index, fingerprint, output FROM tasks_done WHERE action_id = ? ORDER BY task_index",
            (action_id,),
        )
        done: list[TaskRecord] = []
        for index, fingerprint, output in rows:
            if index != len(done):
                break
            done.append(TaskRecord(index, fingerprint, orjson.loads(output)))
        return done

    def resumed_from(self, action_id: str) -> str | None:
        """The job this one continues, if it is a resume."""
        row = self._db.execute("SELECT resumed_from FROM resumes WHERE action_id = ?", (action_id,)).fetchone()
        return row[0] if row else None

    def resumed_by(self, action_id: str) -> str | None:
        """The job that continues this one, if it was resumed."""
        row = self._db.execute("SELECT action_id FROM resumes WHERE resumed_from = ?", (action_id,)).fetchone()
        return row[0] if row else None

    def was_resumed(self, action_id: str) -> bool:
        """Whether a resume of this job was admitted, its record archived since or not."""
        return self._db.execute("SELECT 1 FROM resumed WHERE action_id = ?", (action_id,)).fetchone() is not None


class TraceReads:
    """A traced job's trace, as its admission wrote it: what its view links to, and a resume's trace links to."""

    _db: sqlite3.Connection

    def trace(self, action_id: str) -> TraceIds | None:
        """The job's trace id and its root span's id; None for a job not traced (or admitted before traces)."""
        row = self._db.execute("SELECT trace_id, span_id FROM traces WHERE action_id = ?", (action_id,)).fetchone()
        return (row[0], row[1]) if row else None


class Reader(ResumeReads, LedgerReads, TraceReads):
    def __init__(self, path: Path, *, immutable: bool = False) -> None:
        """``immutable``: for a file nothing writes (the doctor's look at a journal no supervisor has open, which
        a read-only connection in WAL mode would leave ``-wal`` and ``-shm`` files beside)."""
        self.path = path
        self._db = sqlite3.connect(
            f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro{'&immutable=1' if immutable else ''}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )

    def close(self) -> None:
        self._db.close()

    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def damage(self) -> str | None:
        """SQLite's quick check of the file: its first finding, or None where it finds the file sound."""
        found = str(self._db.execute("PRAGMA quick_check").fetchone()[0])
        return None if found == "ok" else found

    def inconsistent(self) -> list[tuple[str, str]]:
        """Each record whose rows disagree, and how (``schema.INCONSISTENT``): an action id once per problem."""
        return [(row[0], row[1]) for row in self._db.execute(INCONSISTENT)]

    def quarantined(self, action_id: str) -> str | None:
        """What was wrong with a record quarantined at an open (``quarantine.py``); None if it is not."""
        row = self._db.execute("SELECT problem FROM quarantine WHERE action_id = ?", (action_id,)).fetchone()
        return row[0] if row else None

    def quarantine(self, limit: int) -> tuple[int, list[tuple[str, str]]]:
        """How many records are quarantined, and the first ``limit`` of them (action id, problem), oldest first."""
        (count,) = self._db.execute("SELECT count(*) FROM quarantine").fetchone()
        rows = self._db.execute(
            "SELECT action_id, problem FROM quarantine ORDER BY quarantined_at, action_id LIMIT ?", (limit,)
        )
        return int(count), [(row[0], row[1]) for row in rows]

    def quarantined_workers(self) -> list[Job]:
        """The quarantined records that name a worker or its boundary, as they were kept: for restart fencing,
        whatever their status says (it may be what was wrong)."""
        rows = self._db.execute(
            f"SELECT {_JOB_COLUMNS} FROM quarantined_jobs WHERE worker_pid IS NOT NULL OR boundary IS NOT NULL"
        )
        return [Job(*row) for row in rows]

    def get(self, action_id: str) -> Job | None:
        row = self._db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
        return Job(*row) if row else None

    def output(self, action_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT output FROM jobs WHERE action_id = ?", (action_id,)).fetchone()
        return orjson.loads(row[0]) if row and row[0] is not None else None

    def stored_events(
        self, action_id: str, cursor: int, limit: int = 1000, max_bytes: int | None = None
    ) -> list[StoredEvent]:
        """A job's events from ``cursor``, each one's data as stored (compact JSON). With ``max_bytes``, only as many
        as fit in that many bytes of data, but never none: an event larger than the bound comes alone, so
        a reader paging on from the next one never sticks."""
        if max_bytes is not None:
            limit = self._fitting(action_id, cursor, limit, max_bytes)
        rows = self._db.execute(
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
            self._db.execute(
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
        row = self._db.execute(
            "SELECT event, sequence, data FROM events WHERE action_id = ? ORDER BY sequence DESC LIMIT 1", (action_id,)
        ).fetchone()
        return Event(row[0], row[1], orjson.loads(row[2])) if row else None

    def list_jobs(
        self,
        status: Status | None = None,
        crew_id: str | None = None,
        operation: Operation | None = None,
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
        rows = self._db.execute(
            f"SELECT j.action_id, j.crew_id, j.operation, j.status, j.event_count, j.admitted_at, j.ended_at, {_WHY}"
            " FROM jobs AS j LEFT JOIN events AS e ON e.action_id = j.action_id AND e.sequence = j.event_count - 1"
            f" {'WHERE ' + ' AND '.join(clauses) if clauses else ''}"
            " ORDER BY j.admitted_at DESC, j.action_id DESC LIMIT ?",
            (*params, limit),
        )
        return [dict(zip(_LISTED, row, strict=True)) for row in rows]

    def streams(self, action_id: str) -> Streams | None:
        row = self._db.execute(
            "SELECT stdout, stderr, stdout_total, stderr_total FROM outputs WHERE action_id = ?", (action_id,)
        ).fetchone()
        return Streams(*row) if row else None

    def stack(self, action_id: str) -> dict[str, Any] | None:
        """Where the job was just before the kill of its timeout, cancel or broken limit, if it was taken."""
        row = self._db.execute("SELECT stack FROM stacks WHERE action_id = ?", (action_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    def running(self) -> list[Job]:
        rows = self._db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE status = {RUNNING} ORDER BY admitted_at")
        return [Job(*row) for row in rows]

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    def copy_into(self, target: sqlite3.Connection, pages: int) -> None:
        """The journal as one read transaction sees it, held from first step to last, copied into ``target`` ``pages`` a
        step by SQLite's backup: without it each write restarts the copy (for ever, under a streaming job)."""
        self._db.execute("BEGIN")
        try:
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot is taken here
            self._db.backup(target, pages=pages)
        finally:
            self._db.execute("ROLLBACK")

    def ended_before(
        self, end: float, limit: int, statuses: Collection[Status] | None = None, crew_id: str | None = None
    ) -> tuple[list[str], int]:
        """The first ``limit`` ended records (of ``statuses``, of ``crew_id``) that ended before ``end`` (Unix
        seconds; a record whose end is unknown counts from its admission), oldest end first, and how many there are
        in all. One range of ``jobs_by_end`` each."""
        where = f"status != {RUNNING} AND coalesce(ended_at, admitted_at) < ?"  # the partial index jobs_by_end's
        params: list[Any] = [end]
        if statuses is not None:
            where += " AND status IN (SELECT value FROM json_each(?))"
            params.append(orjson.dumps(list(statuses)).decode())
        if crew_id is not None:
            where += " AND crew_id = ?"
            params.append(crew_id)
        rows = self._db.execute(
            f"SELECT action_id FROM jobs WHERE {where} ORDER BY coalesce(ended_at, admitted_at), action_id LIMIT ?",
            (*params, limit),
        )
        ids = [row[0] for row in rows]
        (count,) = self._db.execute(f"SELECT count(*) FROM jobs WHERE {where}", params).fetchone()
        return ids, int(count)

    def oldest_admitted(self) -> float | None:
        """When the oldest record the journal holds was admitted (Unix seconds); None if it holds none."""
        oldest: float | None = self._db.execute("SELECT min(admitted_at) FROM jobs").fetchone()[0]
        return oldest

    def used_bytes(self) -> int:
        """The bytes the journal's records take, as admission holds them against MAX_STATE_BYTES: its pages less
        those archiving freed (SQLite reuses them before the file grows; the file never shrinks), and its WAL."""
        (page_size,) = self._db.execute("PRAGMA page_size").fetchone()
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
        wal = self.path.with_name(self.path.name + "-wal")
        return int(page_size * (pages - free)) + (os.stat(wal).st_size if os.path.exists(wal) else 0)

    def size_bytes(self) -> int:
        return size_bytes(self.path)

    def free_bytes(self) -> int:
        return free_bytes(self.path.parent)


def size_bytes(journal: Path) -> int:
    """The journal's size as admission counts it against MAX_STATE_BYTES: the file and its WAL."""
    return sum(
        os.stat(p).st_size if os.path.exists(p) else 0 for p in (journal, journal.with_name(journal.name + "-wal"))
    )


def free_bytes(directory: Path) -> int:
    """Space left on ``directory``'s filesystem for an unprivileged writer."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize
