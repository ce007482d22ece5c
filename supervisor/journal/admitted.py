"""An admission's write (``Journal.admit``): the job's record, a ``run``'s input (what a resume runs with again) and,
for a resume, its link to the job it continues with that job's completed tasks, all in one commit."""

from __future__ import annotations

import sqlite3
import time

from supervisor.journal.records import Job


def insert(job: Job, input: bytes | None, resumed: tuple[str, int] | None, db: sqlite3.Connection) -> None:
    """``input``: the run's input as compact JSON (None: not a run). ``resumed``: the job this one continues and how
    many of its tasks it completed (contiguous from 0): they become this job's first ones (``tasks_done``), so that
    this job's record holds every task its output will, and a resume of this job in turn continues from all of them,
    even once that job is archived."""
    db.execute(
        "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, admitted_at)"
        " VALUES (?, ?, ?, ?, 'running', 0, ?)",
        (job.action_id, job.crew_id, job.operation, job.request_hash, time.time()),
    )
    if input is not None:
        db.execute("INSERT INTO inputs (action_id, input) VALUES (?, ?)", (job.action_id, input))
    if resumed is not None:
        resumed_from, tasks = resumed
        db.execute("INSERT INTO resumes (action_id, resumed_from) VALUES (?, ?)", (job.action_id, resumed_from))
        db.execute(
            "INSERT INTO tasks_done (action_id, task_index, fingerprint, output)"
            " SELECT ?, task_index, fingerprint, output FROM tasks_done WHERE action_id = ? AND task_index < ?",
            (job.action_id, resumed_from, tasks),
        )


def archive(removed: str, db: sqlite3.Connection) -> None:
    """Archive's part (``removed``: the action ids archived, a JSON list): their inputs, and every resume link that
    names one of them either way (the id may be admitted, and resumed, again)."""
    db.execute("DELETE FROM inputs WHERE action_id IN (SELECT value FROM json_each(?))", (removed,))
    db.execute(
        "DELETE FROM resumes WHERE action_id IN (SELECT value FROM json_each(?1))"
        " OR resumed_from IN (SELECT value FROM json_each(?1))",
        (removed,),
    )
