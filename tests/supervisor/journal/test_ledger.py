"""The effect ledger in the journal (``supervisor/journal/ledger.py``), on real SQLite files: a job's calls still
``running`` become ``uncertain`` in the very commit that ends the job, and in restart fencing's after a crash; a call
that ended stays as it ended; an archived record takes its ledger, completed tasks and resume row with it."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

from supervisor.jobs.fencing import fence_restored
from supervisor.jobs.tracing import Tracing
from supervisor.journal.ledger import Ending, Entry
from supervisor.journal.records import Job, TaskRecord
from supervisor.journal.store import Journal
from supervisor.journal.writer import GROUP_SECONDS


def statuses(journal: Journal, action_id: str) -> list[tuple[int, str, bool]]:
    """Each entry as (id, status, whether it has an end time)."""
    return [(entry.id, entry.status, entry.ended_at is not None) for entry in journal.reader.effects(action_id)]


def begun(journal: Journal, action_id: str) -> None:
    """A job with a call that failed, one that finished and one still running."""
    journal.admit(Job(action_id, "demo", "run", "hash", "running", 0)).wait()
    for entry in (1, 2, 3):
        journal.ledger.start(action_id, Entry(entry, "tool", f"tool-{entry}", "digest")).wait()
    journal.ledger.end(action_id, Ending(1, "failed", "ValueError", "no", 0, 0))
    journal.ledger.end(action_id, Ending(2, "finished", None, None, 7, 3))
    flushed(journal)


def flushed(journal: Journal) -> None:
    """Until what is queued has committed: an archive of nothing, a write that commits after it."""
    assert journal.archive().wait() == []


def test_the_commit_that_ends_a_job_makes_its_running_calls_uncertain(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        begun(journal, "a")
        assert statuses(journal, "a") == [(1, "failed", True), (2, "finished", True), (3, "running", False)]
        journal.finish("a", "cancelled", {}).wait()
        assert statuses(journal, "a") == [(1, "failed", True), (2, "finished", True), (3, "uncertain", False)]
        journal.ledger.end("a", Ending(3, "finished", None, None, 0, 0))  # too late: it stays uncertain
        flushed(journal)
        assert statuses(journal, "a")[2] == (3, "uncertain", False)
        assert journal.reader.inconsistent() == []
    finally:
        journal.close()


def test_restart_fencing_makes_a_crashed_supervisors_running_calls_uncertain(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    begun(journal, "a")
    journal.close()  # as a crash leaves it: the job running, its call running
    journal = Journal(path, checkpoint_events=1)
    try:
        assert asyncio.run(fence_restored(journal, {}, Tracing())) == ["a"]
        assert statuses(journal, "a") == [(1, "failed", True), (2, "finished", True), (3, "uncertain", False)]
        job = journal.reader.get("a")
        assert job is not None and job.status == "failed"
    finally:
        journal.close()


def test_an_archived_record_takes_its_ledger_its_tasks_and_its_resume_with_it(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        for action_id in ("a", "b"):
            begun(journal, action_id)
            journal.ledger.task_done(action_id, 0, "fingerprint", b"{}").wait()
            journal.finish(action_id, "failed", {}).wait()
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("INSERT INTO resumes VALUES ('b', 'a')")  # as a resume writes it: b continues a
        assert journal.archive("b").wait() == ["b"]
        with contextlib.closing(sqlite3.connect(path)) as db:
            left = {
                table: db.execute(f"SELECT DISTINCT action_id FROM {table}").fetchall()
                for table in ("effects", "tasks_done", "resumes")
            }
        assert left == {"effects": [("a",)], "tasks_done": [("a",)], "resumes": []}
        assert journal.reader.tasks_completed("a") == 1 and journal.reader.tasks_completed("b") == 0
    finally:
        journal.close()


def test_an_end_waits_for_the_events_group_and_lands_before_its_jobs_end(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1000)
    try:
        journal.admit(Job("a", "demo", "run", "hash", "running", 0)).wait()
        for entry in (1, 2):
            journal.ledger.start("a", Entry(entry, "tool", f"tool-{entry}", "digest")).wait()
        queued = time.monotonic()
        journal.append("a", "chunk", {"n": 1})
        journal.ledger.end("a", Ending(1, "finished", None, None, 0, 0))
        deadline = queued + 30
        while not journal.reader.stored_events("a", 0, 10, 1 << 20) and time.monotonic() < deadline:
            time.sleep(0.001)
        # The end did not write the group early: it committed with it, once the group was due.
        assert time.monotonic() - queued >= GROUP_SECONDS
        assert statuses(journal, "a")[0] == (1, "finished", True)
        # An end queued just before its job's end lands first; one queued after it changes nothing.
        journal.ledger.end("a", Ending(2, "failed", "E", "m", 0, 0))
        journal.finish("a", "failed", {}).wait()
        journal.ledger.end("a", Ending(2, "finished", None, None, 0, 0))
        flushed(journal)
        assert statuses(journal, "a") == [(1, "finished", True), (2, "failed", True)]
        assert journal.reader.inconsistent() == []
    finally:
        journal.close()


def test_a_resume_copies_the_tasks_it_is_given_and_none_of_a_job_archived_meanwhile(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        for old in ("a", "b"):
            journal.admit(Job(old, "demo", "run", "hash", "running", 0), b"{}").wait()
            for index in (0, 1):
                journal.ledger.task_done(old, index, "fingerprint", b'{"raw": "done"}').wait()
            journal.finish(old, "failed", {}).wait()
        copied = journal.admit(Job("a-r1", "demo", "run", "hash", "running", 0), b"{}", ("a", 2)).wait()
        assert copied == [TaskRecord(0, "fingerprint", {"raw": "done"}), TaskRecord(1, "fingerprint", {"raw": "done"})]
        assert journal.reader.was_resumed("a") and journal.reader.resumed_by("a") == "a-r1"
        # Admission read b's two tasks; a retention archived b before the write: its worker is given none, as its
        # record holds none, and no mark is left of a job no longer there.
        assert journal.archive("b").wait() == ["b"]
        assert journal.admit(Job("b-r1", "demo", "run", "hash", "running", 0), b"{}", ("b", 2)).wait() == []
        assert journal.reader.tasks_completed("b-r1") == 0 and not journal.reader.was_resumed("b")
    finally:
        journal.close()
