"""Writes waiting for a lock or for disk space (``supervisor.journal.waits``): who gives up when, what is logged,
and when a full journal counts as a full disk. In process, on real SQLite; the waits over real processes and a
real full disk are tests/supervisor/journal/test_journal.py's and tests/supervisor/journal/test_full_disk.py's."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import sqlite3
import time
from pathlib import Path

import pytest

from supervisor.journal import waits
from supervisor.journal.errors import JournalBusy, JournalError
from supervisor.journal.waits import Waits, Write

MORE_THAN_ANY_DISK = 4_294_967_294  # SQLite's largest max_page_count: some 17 TB of 4 KiB pages


def write(deadline: float = math.inf, fallback: bool = False) -> Write:
    return Write(
        apply=lambda db: "whole",
        fallback=(lambda db: "smaller") if fallback else None,
        durable=True,
        deadline=deadline,
        future=concurrent.futures.Future(),
    )


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "crew_supervisor.journal"]


def test_a_held_lock_fails_the_impatient_writes_keeps_the_others_and_logs_the_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "LOG_EVERY_SECONDS", 0.0)  # every later look at the lock is logged
    caplog.set_level(logging.WARNING, "crew_supervisor.journal")
    held = Waits(str(tmp_path))
    impatient, patient = write(deadline=time.monotonic() - 1), write()
    assert held.busy([impatient, patient]) == [patient]
    assert isinstance(impatient.future.exception(), JournalBusy) and not patient.future.done()
    assert held.busy_since is not None and messages(caplog) == []  # the first look starts the wait
    assert held.busy([patient]) == [patient]
    assert messages(caplog)[-1].startswith("journal write lock held by another process for ")
    assert messages(caplog)[-1].endswith("; 1 write(s) waiting")
    held.lock_taken()
    assert held.busy_since is None and messages(caplog)[-1].startswith("journal write lock free again after ")
    held.lock_taken()  # no wait to end: nothing more is said
    assert len(messages(caplog)) == 2


def test_a_lock_wait_ends_when_no_write_is_left_and_every_write_fails_once_closing(tmp_path: Path) -> None:
    held = Waits(str(tmp_path))
    assert held.busy([write()]) != [] and held.busy_since is not None
    assert held.busy([]) == [] and held.busy_since is None
    held.close_at = time.monotonic()  # the close's grace is over
    assert held.closing
    patient = write()
    assert held.busy([patient]) == [] and isinstance(patient.future.exception(), JournalBusy)


def test_a_full_disk_fails_writes_with_a_deadline_shrinks_the_rest_and_logs_until_writable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "LOG_EVERY_SECONDS", 0.0)
    caplog.set_level(logging.WARNING, "crew_supervisor.journal")
    full = Waits(str(tmp_path))
    error = sqlite3.OperationalError("database or disk is full")
    timed, whole, shrinkable = write(deadline=time.monotonic() + 60), write(), write(fallback=True)
    assert full.full([timed, whole, shrinkable], error) == [whole, shrinkable]
    failed = timed.future.exception()
    assert isinstance(failed, JournalError) and str(failed) == "journal write failed: database or disk is full"
    assert shrinkable.apply(None) == "smaller" and shrinkable.fallback is None  # retried in its smaller form
    assert whole.apply(None) == "whole"
    assert messages(caplog) == ["journal disk full (database or disk is full); 2 write(s) wait for space"]
    assert full.full([whole, shrinkable], error) == [whole, shrinkable]
    assert messages(caplog)[-1].startswith("journal disk full for ")
    full.stop_at = time.monotonic()  # asked to stop waiting: the rest fail too
    assert full.full([whole], error) == [] and isinstance(whole.future.exception(), JournalError)
    full.committed()
    assert full.full_since is None and messages(caplog)[-1].startswith("journal disk writable again after ")
    full.committed()
    assert len(messages(caplog)) == 4


def filled(path: Path) -> tuple[sqlite3.Connection, sqlite3.Error]:
    """A database at its own ceiling of pages, and the SQLITE_FULL its next insert raised."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x BLOB)")
    db.execute("PRAGMA max_page_count = 8")
    try:
        for _ in range(100):
            db.execute("INSERT INTO t VALUES (zeroblob(4096))")
    except sqlite3.Error as exc:
        assert exc.sqlite_errorcode == sqlite3.SQLITE_FULL
        return db, exc
    raise AssertionError("the database never filled")


def test_a_full_journal_is_a_full_disk_only_when_the_disk_has_less_room_than_sqlite_would_allow(
    tmp_path: Path,
) -> None:
    db, exc = filled(tmp_path / "journal.db")
    try:
        # Its own ceiling, the disk with room: not a disk wait, the write fails as any other error would.
        assert not Waits(str(tmp_path)).out_of_disk(db, exc)
        # The same error, with more pages allowed than the disk holds: the disk is what lacks room.
        db.execute(f"PRAGMA max_page_count = {MORE_THAN_ANY_DISK}")
        assert Waits(str(tmp_path)).out_of_disk(db, exc)
        # Where the disk cannot be asked, or the error is another, it cannot tell: no wait.
        assert not Waits(str(tmp_path / "gone")).out_of_disk(db, exc)
        assert not Waits(str(tmp_path)).out_of_disk(db, sqlite3.OperationalError("no such table: t"))
    finally:
        db.close()


def test_nothing_is_logged_while_the_next_look_comes_before_the_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "LOG_EVERY_SECONDS", math.inf)  # so no stall of a loaded machine reaches it
    caplog.set_level(logging.WARNING, "crew_supervisor.journal")
    waiting = Waits(str(tmp_path))
    patient = write()
    for _ in range(3):
        waiting.busy([patient])
    error = sqlite3.OperationalError("database or disk is full")
    for _ in range(2):
        waiting.full([patient], error)
    assert messages(caplog) == ["journal disk full (database or disk is full); 1 write(s) wait for space"]
