"""An admission's write (``Journal.admit``): the job's record, a ``run``'s input (what a resume runs with again), a
traced job's trace ids and, for a resume, its link to the job it continues with that job's completed tasks, all in one
commit; what only a resume reads goes once a run completed (``completed``)."""

from __future__ import annotations

import sqlite3
import time

import orjson

from supervisor.enums import Status
from supervisor.journal.records import Job, Resumed, TaskRecord, TraceIds


def insert(
    job: Job, input: bytes | None, resumed: Resumed | None, trace: TraceIds | None, db: sqlite3.Connection
) -> list[TaskRecord] | None:
    """``input``: the run's input as compact JSON (None: not a run). ``resumed``: the job this one continues and how
    many of its tasks it completed (contiguous from 0): they become this job's first ones (``tasks_done``), so that
    this job's record holds every task its output will, and a resume of this job in turn continues from all of them,
    even once that job is archived. ``trace``: a traced job's trace and root span ids (None: not traced). Returns the
    tasks copied (None: no resume): what its worker is given, so that its record and its ``Start`` agree even if the
    job it continues was archived meanwhile."""
    db.execute(
        "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, admitted_at)"
        " VALUES (?, ?, ?, ?, ?, 0, ?)",
        (job.action_id, job.crew_id, job.operation, job.request_hash, Status.RUNNING, time.time()),
    )
    if input is not None:
        db.execute("INSERT INTO inputs (action_id, input) VALUES (?, ?)", (job.action_id, input))
    if trace is not None:
        db.execute("INSERT INTO traces (action_id, trace_id, span_id) VALUES (?, ?, ?)", (job.action_id, *trace))
    if resumed is None:
        return None
    resumed_from, tasks = resumed
    db.execute("INSERT INTO resumes (action_id, resumed_from) VALUES (?, ?)", (job.action_id, resumed_from))
    db.execute("INSERT INTO resumed SELECT action_id FROM jobs WHERE action_id = ?", (resumed_from,))
    copied = db.execute(
        "INSERT INTO tasks_done (action_id, task_index, fingerprint, output)"
        " SELECT ?, task_index, fingerprint, output FROM tasks_done WHERE action_id = ? AND task_index < ?"
        " RETURNING task_index, fingerprint, output",
        (job.action_id, resumed_from, tasks),
    ).fetchall()
    return [TaskRecord(index, fingerprint, orjson.loads(output)) for index, fingerprint, output in sorted(copied)]


def completed(action_id: str, db: sqlite3.Connection) -> None:
    """In the commit that completes a run: what only a resume reads goes, since a completed job is never resumed: its
    input, and its completed tasks' outputs (its own output holds them). Their rows stay, each task's index and
    fingerprint: the ledger's reads count them (``tasks_completed``)."""
    db.execute("DELETE FROM inputs WHERE action_id = ?", (action_id,))
    db.execute("UPDATE tasks_done SET output = X'' WHERE action_id = ?", (action_id,))


def archive(removed: str, db: sqlite3.Connection) -> None:
    """Archive's part (``removed``: the action ids archived, a JSON list): their inputs, every resume link that names
    one of them either way (the id may be admitted, and resumed, again), and their own marks of having been resumed
    (a resume's archive leaves the mark of the job it continued: that job stays resumed)."""
    db.execute("DELETE FROM inputs WHERE action_id IN (SELECT value FROM json_each(?))", (removed,))
    db.execute(
        "DELETE FROM resumes WHERE action_id IN (SELECT value FROM json_each(?1))"
        " OR resumed_from IN (SELECT value FROM json_each(?1))",
        (removed,),
    )
    db.execute("DELETE FROM resumed WHERE action_id IN (SELECT value FROM json_each(?))", (removed,))
