"""A record that breaks the journal's consistency rule at open is quarantined, on real SQLite files: the journal
opens and serves the others, the record's rows are kept aside as they were, its action id stays taken, each is one
warning line, and what its job left is killed by restart fencing, at every start. A schema 5 journal gains the
quarantine, and an older supervisor refuses it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.jobs.fencing import fence_restored
from supervisor.jobs.tracing import Tracing
from supervisor.journal.errors import JournalError
from supervisor.journal.ledger import Ending, Entry
from supervisor.journal.records import Job, Streams
from supervisor.journal.schema import MIRRORED, SCHEMA_VERSION
from supervisor.journal.store import Journal
from supervisor.processes.containment import Boundary


def journal_of_two(path: Path) -> None:
    """``a`` completed with its worker's output, its ledger (a call finished, one uncertain, a task) and its trace,
    ``b`` running."""
    journal = Journal(path, checkpoint_events=1)
    journal.admit(Job("a", "demo", "run", "hash-a", "running", 0), None, None, ("ab" * 16, "cd" * 8)).wait()
    journal.append("a", "started", {})
    journal.append("a", "chunk", {})
    journal.ledger.start("a", Entry(1, "tool", "search", "d1")).wait()
    journal.ledger.end("a", Ending(1, "finished", None, None, 0, 0))  # committed with the next write
    journal.ledger.task_done("a", 0, "fingerprint", b"{}").wait()
    journal.ledger.start("a", Entry(3, "llm", "model", "d3")).wait()
    journal.finish("a", "completed", {}, streams=Streams("out", "", 3, 0)).wait()
    journal.admit(Job("b", "demo", "run", "hash-b", "running", 0)).wait()
    journal.close()


def rows(path: Path, action_id: str, prefix: str = "") -> dict[str, list[tuple[Any, ...]]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {
            table: sorted(db.execute(f"SELECT * FROM {prefix}{table} WHERE action_id = ?", (action_id,)), key=str)
            for table in MIRRORED
        }


EFFECT = "(action_id, id, kind, name, digest, status, started_at)"
GHOST_EFFECTS = "effects of an unknown job"


@pytest.mark.parametrize(
    ("edit", "found"),
    [
        ("DELETE FROM events WHERE sequence = 1", {"a": "event count differs from its events"}),
        ("UPDATE events SET sequence = 7 WHERE sequence = 2", {"a": "event sequences are not contiguous from 0"}),
        ("UPDATE events SET event = 'failed' WHERE sequence = 0", {"a": "more than one terminal event"}),
        (
            "UPDATE jobs SET status = 'running'",
            {"a": "running with a terminal event; running with its worker output recorded"},
        ),
        (
            "UPDATE jobs SET status = 'cancelled'",
            {"a": "status without its terminal event", "b": "status without its terminal event"},
        ),
        ("INSERT INTO events VALUES ('ghost', 0, 'chunk', '{}')", {"ghost": "events of an unknown job"}),
        ("INSERT INTO outputs VALUES ('ghost', '', '', 0, 0)", {"ghost": "worker output of an unknown job"}),
        ("INSERT INTO stacks VALUES ('ghost', '{}')", {"ghost": "stacks of an unknown job"}),
        ("INSERT INTO outputs VALUES ('b', '', '', 0, 0)", {"b": "running with its worker output recorded"}),
        ("UPDATE outputs SET stdout_total = 2", {"a": "worker output longer than its byte count"}),
        ("UPDATE outputs SET stderr_total = -1", {"a": "worker output longer than its byte count"}),
        (f"INSERT INTO effects {EFFECT} VALUES ('ghost', 1, 'tool', 't', '', 'finished', 0)", {"ghost": GHOST_EFFECTS}),
        ("UPDATE effects SET status = 'running' WHERE id = 3", {"a": "a running effect in an ended job"}),
        ("INSERT INTO tasks_done VALUES ('ghost', 0, '', '{}')", {"ghost": "completed tasks of an unknown job"}),
        (f"INSERT INTO effects {EFFECT} VALUES ('b', 1, 'tool', 't', '', 'running', 0)", {}),  # b runs: so may it
    ],
)
def test_an_inconsistent_record_is_quarantined_and_the_others_are_served(
    path: Path, edit: str, found: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    journal_of_two(path)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(edit)
    kept = {action_id: rows(path, action_id) for action_id in found}

    with caplog.at_level(logging.WARNING, logger="crew_supervisor.journal"):
        journal = Journal(path, checkpoint_events=1)
    try:
        assert journal.quarantined == found
        warned = [(record.action_id, record.getMessage()) for record in caplog.records]  # type: ignore[attr-defined]
        said = "quarantined a journal record: {}; its rows are kept aside and its action id stays taken"
        assert warned == [(action_id, said.format(problem)) for action_id, problem in found.items()]  # a line each
        assert not journal.reader.inconsistent()
        for action_id in ("a", "b"):  # the others served as they were
            assert (journal.reader.get(action_id) is None) == (action_id in found)
        for action_id, problem in found.items():
            assert journal.reader.quarantined(action_id) == problem
        assert journal.reader.quarantine(10) == (len(found), list(found.items()))
        journal.admit(Job("c", "demo", "run", "hash-c", "running", 0)).wait()  # and it takes new work
    finally:
        journal.close()
    for action_id, before in kept.items():  # every row kept, as it was, and none left behind
        assert rows(path, action_id, "quarantined_") == before
        assert rows(path, action_id) == {table: [] for table in MIRRORED}

    caplog.clear()
    again = Journal(path, checkpoint_events=1)  # quarantined once: the next start has nothing to do
    assert again.quarantined == {} and not caplog.records
    assert all(again.reader.quarantined(action_id) == problem for action_id, problem in found.items())
    again.close()


def test_a_file_sqlite_finds_corrupt_still_refuses_to_start(path: Path) -> None:
    """The quarantine takes in a record's disagreement, not a damaged file: an index page that lost its entries."""
    journal_of_two(path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        (page,) = db.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'jobs_by_status'").fetchone()
        (size,) = db.execute("PRAGMA page_size").fetchone()
    with open(path, "r+b") as file:
        file.seek((page - 1) * size + 3)  # a b-tree page's count of cells
        file.write(b"\x00\x00")
    with pytest.raises(JournalError, match="failed its integrity check"):
        Journal(path, checkpoint_events=1)


def test_what_a_quarantined_running_job_left_is_killed_at_every_start(path: Path) -> None:
    """Its worker (its own group) outlived a dead supervisor whose record of it then went wrong; fencing kills it
    and leaves the record as it was kept: no terminal event, no fence of its action id undone."""
    journal = Journal(path, checkpoint_events=1)
    journal.admit(Job("left", "demo", "run", "hash", "running", 0)).wait()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        started = psutil.Process(worker.pid).create_time()
        journal.set_worker("left", worker.pid, started, worker.pid, Boundary().encode()).wait()
        journal.close()
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("INSERT INTO outputs VALUES ('left', '', '', 0, 0)")  # running with its output recorded

        for _ in range(2):  # at every start: the second finds nothing left to kill
            journal = Journal(path, checkpoint_events=1)
            try:
                assert asyncio.run(fence_restored(journal, {}, Tracing())) == []  # no terminal event: not served
                assert worker.wait(timeout=10) == -9
                assert journal.reader.get("left") is None
                assert journal.reader.quarantined("left") == "running with its worker output recorded"
                [kept] = journal.reader.quarantined_workers()
                assert (kept.status, kept.worker_pid, kept.worker_start_time) == ("running", worker.pid, started)
            finally:
                journal.close()
    finally:
        worker.kill()
        worker.wait()


def test_a_quarantined_record_with_a_malformed_worker_is_said_and_the_start_goes_on(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = Journal(path, checkpoint_events=1)
    journal.admit(Job("odd", "demo", "run", "hash", "running", 0)).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # a hand's edit: text where a pid goes
        db.execute("UPDATE jobs SET worker_pid = 'x', worker_start_time = 1.0, event_count = 3")
    journal = Journal(path, checkpoint_events=1)
    try:
        with caplog.at_level(logging.WARNING, logger="crew_supervisor.jobs"):
            assert asyncio.run(fence_restored(journal, {}, Tracing())) == []
    finally:
        journal.close()
    fencing = [record.getMessage() for record in caplog.records if record.name == "crew_supervisor.jobs"]
    assert fencing == ["cannot fence a quarantined record: its worker is malformed (TypeError)"]


def test_a_schema_5_journal_gains_the_quarantine_and_an_older_supervisor_refuses_it(path: Path) -> None:
    journal_of_two(path)
    with contextlib.closing(sqlite3.connect(path)) as db:  # as schema 5 wrote it
        tables = ["quarantine", *(f"quarantined_{table}" for table in MIRRORED)]
        dropped = "".join(f"DROP TABLE {table};" for table in tables) + "ALTER TABLE jobs DROP COLUMN leftovers;"
        db.executescript(dropped + "PRAGMA user_version = 5;")
        db.execute("UPDATE outputs SET stdout_total = 2")  # what a redacted tail could store before
        db.commit()
    journal = Journal(path, checkpoint_events=1)
    assert journal.upgraded_from == path.with_name("journal.db.v5.backup")
    assert journal.quarantined == {"a": "worker output longer than its byte count"}
    assert journal.reader.get("b") is not None
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (6,)
