"""The effect ledger in the journal (``effects`` and ``tasks_done``, ``schema.py``). Its reads are the ``Reader``'s
(``LedgerReads``); its writes go through the journal's one writer: an entry's start and a completed task commit
durably before their worker is told (``Recorded``), so no call goes out that the journal does not hold; an entry's end
commits with the events' group, no commit of its own (lost to a power loss, or with a group the journal failed, the
entry reads ``uncertain``, which is the truth of it). Whatever is still ``running`` when its job ends becomes
``uncertain`` in the commit that ends it (``settle``, which ``Journal.finish`` calls, restart fencing's too)."""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
import time

from protocol import EffectStatus
from supervisor.journal.records import EffectRecord
from supervisor.journal.writer import Writer, Written

_EFFECT_COLUMNS = (
    "id, kind, name, digest, status, started_at, ended_at, error_type, error_message, prompt_tokens, completion_tokens"
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A call about to start, as the ledger keeps it: already checked and masked (``supervisor/jobs/ledger.py``)."""

    id: int
    kind: str
    name: str
    digest: str


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a call ended: ``status`` finished or failed, its error (masked) and an LLM call's tokens."""

    id: int
    status: str
    error_type: str | None
    error_message: str | None
    prompt_tokens: int
    completion_tokens: int


class LedgerWrites:
    """The ledger's writes, each queued on the journal's writer (``Journal.ledger``): ``await`` what they return."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def start(self, action_id: str, entry: Entry) -> Written[None]:
        """A call starts (``running``, at the supervisor's wall clock): durable before its worker may make it."""
        return Written(self._writer.submit(functools.partial(_start, action_id, entry, time.time())))

    def end(self, action_id: str, ending: Ending) -> None:
        """A call ended; nobody waits for it, so it waits in the writer's group with the events (a commit of its own
        would write the group early): it commits before its job's end, queued after it."""
        self._writer.grouped(functools.partial(_end, action_id, ending, time.time()))

    def task_done(self, action_id: str, index: int, fingerprint: str, output: bytes) -> Written[None]:
        """A ``run``'s task completed (``output``: the masked ``TaskDone.output`` as compact JSON): durable before
        its next task starts, so a resume never runs it again."""
        row = (action_id, index, fingerprint, output)
        return Written(self._writer.submit(functools.partial(_task_done, row)))


class LedgerReads:
    """The ledger's reads, a part of the ``Reader`` (its read-only connection: only what has committed)."""

    _db: sqlite3.Connection

    def effects(self, action_id: str) -> list[EffectRecord]:
        """A job's ledger entries (its calls, not its completed tasks), in the order its worker started them."""
        rows = self._db.execute(f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE action_id = ? ORDER BY id", (action_id,))
        return [EffectRecord(*row) for row in rows]

    def tasks_completed(self, action_id: str) -> int:
        """How many of a ``run``'s tasks completed (``tasks_done``)."""
        row = self._db.execute("SELECT count(*) FROM tasks_done WHERE action_id = ?", (action_id,)).fetchone()
        return int(row[0])


def settle(db: sqlite3.Connection, action_id: str) -> None:
    """In the commit that ends a job: each of its calls still ``running`` becomes ``uncertain`` (no end time: nobody
    saw it end)."""
    db.execute(
        "UPDATE effects SET status = ? WHERE action_id = ? AND status = ?",
        (EffectStatus.UNCERTAIN, action_id, EffectStatus.RUNNING),
    )


def _start(action_id: str, entry: Entry, at: float, db: sqlite3.Connection) -> None:
    db.execute(
        "INSERT INTO effects (action_id, id, kind, name, digest, status, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (action_id, entry.id, entry.kind, entry.name, entry.digest, EffectStatus.RUNNING, at),
    )


def _end(action_id: str, ending: Ending, at: float, db: sqlite3.Connection) -> None:
    """Only a ``running`` entry ends: one its job's end made ``uncertain`` stays so."""
    db.execute(
        "UPDATE effects SET status = ?, ended_at = ?, error_type = ?, error_message = ?, prompt_tokens = ?,"
        " completion_tokens = ? WHERE action_id = ? AND id = ? AND status = ?",
        (
            ending.status,
            at,
            ending.error_type,
            ending.error_message,
            ending.prompt_tokens,
            ending.completion_tokens,
            action_id,
            ending.id,
            EffectStatus.RUNNING,
        ),
    )


def _task_done(row: tuple[str, int, str, bytes], db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO tasks_done (action_id, task_index, fingerprint, output) VALUES (?, ?, ?, ?)", row)
