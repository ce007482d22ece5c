"""A traced job's trace ids in the journal, on real SQLite files: written with its admission, in its commit, only
when it is traced; gone with its record's archive; carried by a backup; and the table made at every open, without a
schema change, so that a journal an earlier version wrote gains it. Its quarantine: test_quarantine.py (every
mirrored table)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from supervisor.journal.backup import backup
from supervisor.journal.errors import JournalError
from supervisor.journal.reader import Reader
from supervisor.journal.records import Job
from supervisor.journal.schema import SCHEMA_VERSION
from supervisor.journal.store import Journal

TRACE = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def job(action_id: str) -> Job:
    return Job(action_id, "demo", "run", "hash-" + action_id, "running", 0)


def test_a_traced_admission_writes_its_trace_and_an_untraced_one_none(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        journal.admit(job("traced"), b"{}", None, TRACE).wait()
        journal.admit(job("plain"), b"{}").wait()
        assert journal.reader.trace("traced") == TRACE
        assert journal.reader.trace("plain") is None and journal.reader.trace("never") is None
        journal.finish("traced", "completed", {"raw": "done"}).wait()  # a run's end drops its input, not its trace
        assert journal.reader.trace("traced") == TRACE
    finally:
        journal.close()


def test_the_trace_commits_with_the_admission_or_not_at_all(path: Path) -> None:
    """An admission whose trace cannot be written (its row there already: a journal changed by hand) leaves no
    record either: one commit."""
    journal = Journal(path, checkpoint_events=1)
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT INTO traces VALUES ('clash', ?, ?)", TRACE)
    journal = Journal(path, checkpoint_events=1)
    try:
        with pytest.raises(JournalError):
            journal.admit(job("clash"), None, None, TRACE).wait()
        assert journal.reader.get("clash") is None
    finally:
        journal.close()


def test_an_archive_takes_the_trace_with_its_record_and_the_id_admitted_again_starts_untraced(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        journal.admit(job("gone"), None, None, TRACE).wait()
        journal.finish("gone", "failed", {"reason": "x"}).wait()
        assert journal.archive("gone").wait() == ["gone"]
        assert journal.reader.trace("gone") is None
        journal.admit(job("gone"), None).wait()
        assert journal.reader.trace("gone") is None
    finally:
        journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (0,)


def test_a_journal_written_before_traces_gains_the_table_at_its_next_open_without_a_schema_change(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    journal.admit(job("older")).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:  # as the previous version left it: the same schema
        db.executescript("DROP TABLE traces; DROP TABLE quarantined_traces;")
    journal = Journal(path, checkpoint_events=1)
    try:
        assert journal.upgraded_from is None and journal.reader.schema_version() == SCHEMA_VERSION
        assert journal.reader.trace("older") is None and journal.reader.get("older") is not None
        journal.admit(job("newer"), None, None, TRACE).wait()
        assert journal.reader.trace("newer") == TRACE
    finally:
        journal.close()


def test_a_backup_carries_the_traces(path: Path, tmp_path: Path) -> None:
    journal = Journal(path, checkpoint_events=1)
    try:
        journal.admit(job("traced"), None, None, TRACE).wait()
        copied = backup(path, tmp_path / "copy.db")
    finally:
        journal.close()
    reader = Reader(copied.path, immutable=True)
    try:
        assert reader.trace("traced") == TRACE
    finally:
        reader.close()
