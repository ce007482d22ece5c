"""The journal on real SQLite files: the start fence, group commit, crash loss bounds, lock and modes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from supervisor.journal import store, writer
from supervisor.journal.errors import JournalBusy, JournalError, JournalLocked
from supervisor.journal.records import Event, Job
from supervisor.journal.schema import SCHEMA_VERSION
from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import REFUSE_AFTER_SECONDS, Journal
from supervisor.journal.writer import Written
from tests.conftest import ROOT, wait_until


def job(action_id: str) -> Job:
    return Job(action_id, "demo", "run", "hash-" + action_id, "running", 0)


def checkpoint(group: Written[None] | None) -> None:
    """Wait for the group an append completed (every append does, with ``checkpoint_events=1``)."""
    assert group is not None
    group.wait()


def read_events(journal: Journal, action_id: str, cursor: int, limit: int = 1000) -> list[Event]:
    """A job's committed events from ``cursor``, their data parsed."""
    stored = journal.reader.stored_events(action_id, cursor, limit)
    return [Event(event.event, event.sequence, orjson.loads(event.data)) for event in stored]


def test_readers_see_only_committed_events(path: Path) -> None:
    commits: list[tuple[frozenset[str], int]] = []
    journal = Journal(path, checkpoint_events=3, on_commit=lambda ids: commits.append((ids, threading.get_ident())))
    journal.admit(job("a")).wait()
    journal.admit(job("b")).wait()
    with held_lock(path):  # the writer has the events, and cannot commit them
        journal.append("a", "chunk", {"n": 0})
        journal.append("a", "chunk", {"n": 1})
        group = journal.append("a", "chunk", {"n": 2})  # the third makes a checkpoint
        assert group is not None and wait_until(journal._writer._queue.empty, timeout=10)
        assert read_events(journal, "a", 0) == [] and journal.reader.get("a").event_count == 0  # type: ignore[union-attr]
    group.wait()
    assert len(read_events(journal, "a", 0)) == 3
    # Admissions have no events to read; the callback runs on the writer's thread, never the caller's.
    assert commits == [({"a"}, journal._writer._thread.ident)]
    checkpoint(journal.append("b", "chunk", {"n": 3}, commit=True))
    assert len(read_events(journal, "b", 0)) == 1 and commits[-1][0] == {"b"}  # only b's followers are woken
    journal.close()


def test_events_commit_on_their_own_within_the_group_time(path: Path) -> None:
    """No caller flushes: the writer commits a group its time after its first event."""
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    appended = time.monotonic()
    assert journal.append("a", "chunk", {"n": 0}) is None  # nothing to wait for: no checkpoint
    assert wait_until(lambda: len(read_events(journal, "a", 0)) == 1, timeout=10)
    assert time.monotonic() - appended >= writer.GROUP_SECONDS  # not before: the group waited for company
    journal.close()


def test_events_are_contiguous_and_the_terminal_sets_status(path: Path) -> None:
    journal = Journal(path, checkpoint_events=3)
    journal.admit(job("a")).wait()
    journal.admit(job("b")).wait()
    for n in range(5):
        journal.append("a", "chunk", {"n": n})
        journal.append("b", "chunk", {"n": n})
    journal.finish("a", "completed", {"status": "completed"}, {"raw": "x"}).wait()
    events = read_events(journal, "a", 0)
    assert [e.sequence for e in events] == list(range(6)) and events[-1].terminal
    assert journal.reader.get("a").status == "completed" and journal.reader.get("a").event_count == 6  # type: ignore[union-attr]
    assert journal.reader.output("a") == {"raw": "x"} and journal.reader.output("b") is None
    assert [e.data["n"] for e in read_events(journal, "b", 3)] == [3, 4]
    assert [j.action_id for j in journal.reader.running()] == ["b"]
    assert journal.archive("a", "b", "ghost").wait() == ["a"]  # a running record is left, whoever names it
    assert journal.reader.get("a") is None and read_events(journal, "a", 0) == []
    assert [e.data["n"] for e in read_events(journal, "b", 0)] == list(range(5))
    journal.close()


def test_a_bounded_read_stops_at_its_bytes_and_is_never_empty(path: Path) -> None:
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    for text in ("x" * 8, "x" * 8, "x" * 40, "x"):  # data {"t":"…"} is 8 bytes more than its text
        group = journal.append("a", "chunk", {"t": text}, commit=text == "x")
    checkpoint(group)

    def read(cursor: int, max_bytes: int, limit: int = 1000) -> list[int]:
        return [event.sequence for event in journal.reader.stored_events("a", cursor, limit, max_bytes)]

    assert read(0, 32) == [0, 1]  # 16 + 16: exactly the bound
    assert read(0, 31) == [0]  # one byte short: the second waits for the next read
    assert read(2, 32) == [2]  # 48 alone is over the bound, and comes all the same
    assert read(3, 32) == [3] and read(4, 32) == []
    assert read(0, 10**6, limit=3) == [0, 1, 2]  # the count bound still holds
    assert journal.reader.stored_events("a", 0, 1000, 31) == journal.reader.stored_events(
        "a", 0, 1
    )  # the same events, whole
    journal.close()


CRASH = """
import os, sys
from pathlib import Path
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
journal = Journal(Path(sys.argv[1]), checkpoint_events=int(sys.argv[2]))
journal.admit(Job("a", "demo", "run", "h", "running", 0)).wait()
for n in range(int(sys.argv[3])):
    group = journal.append("a", "chunk", {"n": n})
    if group is not None:
        group.wait()  # as the recorder does: a checkpoint is durable before more is relayed
os._exit(0)  # a crash: no flush, no close
"""


@pytest.mark.parametrize(("every", "appended", "survive"), [(10, 9, 0), (10, 10, 10), (4, 10, 8)])
def test_a_crash_loses_at_most_the_uncommitted_chunks(path: Path, every: int, appended: int, survive: int) -> None:
    """At least every checkpoint survives; more may (a group's time may pass before the crash), never a gap."""
    subprocess.run([sys.executable, "-c", CRASH, str(path), str(every), str(appended)], cwd=ROOT, check=True)
    journal = Journal(path, checkpoint_events=every)
    assert journal.reader.get("a") is not None  # admission is durable at once
    kept = [event.data["n"] for event in read_events(journal, "a", 0)]
    assert survive <= len(kept) <= appended and kept == list(range(len(kept)))
    journal.close()


def test_a_second_writer_is_locked_out(path: Path) -> None:
    first = Journal(path, checkpoint_events=1)
    with pytest.raises(JournalLocked, match="in use"):
        Journal(path, checkpoint_events=1)
    first.close()
    Journal(path, checkpoint_events=1).close()  # released with the first


def test_files_are_private_and_links_refused(path: Path) -> None:
    Journal(path, checkpoint_events=1).close()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    path.chmod(0o644)
    with pytest.raises(JournalError, match="0600"):
        Journal(path, checkpoint_events=1)
    path.chmod(0o600)
    link = path.with_name("link.db")
    os.symlink(path, link)
    with pytest.raises(JournalError, match="cannot open"):
        Journal(link, checkpoint_events=1)


def test_a_lock_file_that_is_a_link_is_refused(path: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.lock"
    elsewhere.write_text("")
    os.symlink(elsewhere, path.with_name("journal.db.lock"))
    with pytest.raises(JournalError, match="lock file"):
        Journal(path, checkpoint_events=1)


def test_state_directory_must_be_private_and_real(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(JournalError, match="writable"):
        prepare_directory(shared)
    os.symlink(tmp_path, tmp_path / "alias")
    with pytest.raises(JournalError, match="symlink"):
        prepare_directory(tmp_path / "alias")


def test_a_listable_state_directory_of_ours_is_made_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)  # a volume's usual mode
    assert prepare_directory(state) == 0o755  # serve logs that it tightened it
    assert state.stat().st_mode & 0o777 == 0o700
    assert prepare_directory(state) is None  # nothing to do the second time
    state.chmod(0o500)
    assert prepare_directory(state) is None and state.stat().st_mode & 0o777 == 0o500  # the owner's bits stay


def test_a_listable_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: chown to another uid (CI runs as root)")
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    os.chown(state, 65534, 65534)
    with pytest.raises(JournalError, match=r"mode 0755 \(others can list it\) and is another user's: chmod 700"):
        prepare_directory(state)
    assert state.stat().st_mode & 0o777 == 0o755  # left as it was


def test_a_corrupt_file_is_refused(path: Path) -> None:
    path.write_bytes(b"this is not a database" * 100)
    path.chmod(0o600)
    with pytest.raises(JournalError, match="cannot be used"):
        Journal(path, checkpoint_events=1)


REFERENCE_RECORDS = [
    {
        "action_id": "old-done",
        "crew_id": "demo",
        "operation": "run",
        "request_hash": "h1",
        "status": "completed",
        "events": [
            {"event": "started", "sequence": 0, "data": {}},
            {"event": "chunk", "sequence": 1, "data": {"content": "hi", "channel": "llm"}},
            {"event": "completed", "sequence": 2, "data": {"status": "completed"}},
        ],
        "output": {"raw": "done"},
    },
    {
        "action_id": "old-running",
        "crew_id": "demo",
        "operation": "run",
        "request_hash": "h2",
        "status": "running",
        "events": [{"event": "started", "sequence": 0, "data": {}}],
        "output": None,
    },
]


def test_a_reference_journal_is_imported_once_and_kept(path: Path) -> None:
    original = orjson.dumps(REFERENCE_RECORDS)
    path.write_bytes(original)
    path.chmod(0o600)
    journal = Journal(path, checkpoint_events=1)
    assert journal.imported_from == path.with_name("journal.db.reference.json")
    assert journal.imported_from.read_bytes() == original
    assert oct(journal.imported_from.stat().st_mode & 0o777) == "0o600"
    assert journal.reader.output("old-done") == {"raw": "done"}
    assert [e.event for e in read_events(journal, "old-done", 0)] == ["started", "chunk", "completed"]
    assert [j.action_id for j in journal.reader.running()] == ["old-running"]  # fenced by the supervisor at start
    journal.close()
    again = Journal(path, checkpoint_events=1)
    assert again.imported_from is None and again.reader.count() == 2
    again.close()


def test_a_malformed_reference_journal_refuses_to_start(path: Path) -> None:
    path.write_bytes(orjson.dumps([{"action_id": "x"}]))
    path.chmod(0o600)
    with pytest.raises(JournalError, match="malformed"):
        Journal(path, checkpoint_events=1)
    assert path.read_bytes().startswith(b"[")  # the original is untouched


def test_a_full_journal_fails_the_write_not_the_journal(path: Path) -> None:
    journal = Journal(path, checkpoint_events=1, max_bytes=1024 * 1024)
    journal.admit(job("a")).wait()
    with pytest.raises(JournalError, match="full"):
        for n in range(1, 10_000):
            checkpoint(journal.append("a", "chunk", {"blob": "x" * 8192, "n": n}))
    written = journal.reader.get("a").event_count  # type: ignore[union-attr]
    assert written > 0
    assert [e.sequence for e in read_events(journal, "a", 0, 100_000)] == list(range(written))  # nothing half-written
    with pytest.raises(JournalError, match="full"):
        checkpoint(journal.append("a", "chunk", {"blob": "x" * 8192}))
    journal.finish("a", "failed", {"status": "failed"}).wait()  # small writes still fit: the terminal event lands
    written += 1
    journal.close()
    reopened = Journal(path, checkpoint_events=1)
    assert reopened.reader.get("a").event_count == written  # type: ignore[union-attr]
    reopened.close()


V1_JOURNAL = Path(__file__).parent / "data" / "journal-v1.db"  # written by the previous version's supervisor


def test_a_journal_of_the_previous_version_is_upgraded_once_and_kept(path: Path) -> None:
    """Schema 1 wrapped a completed event's output ({"status", "exit_status", "output" | "output_in_record"});
    the client takes that data as the output, so each becomes the output itself and the exit status moves
    to the record. A completed event that already is an output (imported from a reference) stays."""
    path.write_bytes(V1_JOURNAL.read_bytes())
    path.chmod(0o600)
    imported = {"raw": "r", "status": "completed", "token_usage": {}}
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, output, admitted_at)"
            " VALUES ('ref-done', 'demo', 'run', 'h', 'completed', 1, ?, 0)",
            (orjson.dumps(imported),),
        )
        db.execute("INSERT INTO events VALUES ('ref-done', 0, 'completed', ?)", (orjson.dumps(imported),))
    original = dump(path)

    journal = Journal(path, checkpoint_events=3)
    backup = path.with_name("journal.db.v1.backup")
    assert journal.upgraded_from == backup and dump(backup) == original and backup.stat().st_mode & 0o777 == 0o600
    for action_id in ("v1-completed", "v1-in-record"):
        completed = journal.reader.last_event(action_id)
        assert completed is not None and completed.event == "completed"
        assert completed.data == journal.reader.output(action_id) and completed.data["raw"]
        assert journal.reader.get(action_id).exit_status == 0  # type: ignore[union-attr]
    assert journal.reader.last_event("ref-done").data == imported  # type: ignore[union-attr]
    failed = journal.reader.last_event("v1-failed")
    assert failed is not None and failed.data["error_type"] == "RuntimeError"  # other events are untouched
    journal.close()

    again = Journal(path, checkpoint_events=3)  # once: a second open finds nothing to upgrade
    assert again.upgraded_from is None and again.reader.last_event("v1-completed").data["raw"]  # type: ignore[union-attr]
    again.close()


def test_a_schema_2_journal_gains_when_each_job_ends(path: Path) -> None:
    journal = Journal(path, checkpoint_events=3)
    journal.admit(job("before")).wait()
    journal.finish("before", "failed", {"status": "failed", "reason": "x"}).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:  # as schema 2 wrote it
        db.executescript(
            "DROP INDEX jobs_by_end; ALTER TABLE jobs DROP COLUMN ended_at; ALTER TABLE jobs DROP COLUMN boundary;"
            " ALTER TABLE jobs DROP COLUMN leftovers; PRAGMA user_version = 2;"
        )
    journal = Journal(path, checkpoint_events=3)
    assert journal.upgraded_from == path.with_name("journal.db.v2.backup")
    assert journal.reader.get("before").ended_at is None  # type: ignore[union-attr]  # not known: not made up
    journal.admit(job("after")).wait()
    begun = time.time()
    journal.finish("after", "cancelled", {"status": "cancelled", "reason": "enough"}).wait()
    after = journal.reader.get("after")
    assert after is not None and after.admitted_at is not None and after.ended_at is not None
    assert after.admitted_at <= begun <= after.ended_at <= time.time()
    rows = {row["action_id"]: row for row in journal.reader.list_jobs()}
    assert (rows["after"]["reason"], rows["after"]["ended_at"]) == ("enough", after.ended_at)
    assert (rows["before"]["reason"], rows["before"]["ended_at"]) == ("x", None)
    journal.close()


def test_a_schema_4_journal_gains_the_stacks_table_and_an_older_supervisor_refuses_it(path: Path) -> None:
    journal = Journal(path, checkpoint_events=3)
    journal.admit(job("before")).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:  # as schema 4 wrote it
        db.executescript("DROP TABLE stacks; ALTER TABLE jobs DROP COLUMN leftovers; PRAGMA user_version = 4;")
    journal = Journal(path, checkpoint_events=3)
    assert journal.upgraded_from == path.with_name("journal.db.v4.backup")
    assert journal.reader.get("before") is not None
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM stacks").fetchone() == (0,)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (6,)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")  # as a later supervisor would leave it
    with pytest.raises(JournalError, match=f"journal schema {SCHEMA_VERSION + 1} is newer than this supervisor"):
        Journal(path, checkpoint_events=3)


def test_a_schema_5_journal_gains_each_jobs_leftovers(path: Path) -> None:
    journal = Journal(path, checkpoint_events=3)
    journal.admit(job("before")).wait()
    journal.finish("before", "completed", {"raw": "b"}, {"raw": "b"}, exit_status=0).wait()
    journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:  # as schema 5 wrote it
        db.executescript("ALTER TABLE jobs DROP COLUMN leftovers; PRAGMA user_version = 5;")
    journal = Journal(path, checkpoint_events=3)
    assert journal.upgraded_from == path.with_name("journal.db.v5.backup")
    assert journal.reader.get("before").leftovers is None  # type: ignore[union-attr]  # not known: not made up
    journal.admit(job("after")).wait()
    left = {"descendants_killed": 1, "stop_confirmed": True, "processes": [{"pid": 7, "command": "sleep", "left": "x"}]}
    journal.finish("after", "completed", {"raw": "a"}, {"raw": "a"}, exit_status=0, leftovers=left).wait()
    assert orjson.loads(journal.reader.get("after").leftovers) == left  # type: ignore[union-attr, arg-type]
    journal.close()


def dump(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [*db.iterdump(), str(db.execute("PRAGMA user_version").fetchone())]


def test_a_group_that_fails_to_commit_frees_its_sequences(path: Path) -> None:
    """If a group fails, readers never saw its events and the next events take their sequences, so every job's
    events stay contiguous."""
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    journal.admit(job("b")).wait()
    for n in range(3):
        journal.append("a", "chunk", {"n": n})
    checkpoint(journal.append("b", "chunk", {"n": 0}, commit=True))
    journal._db.execute("PRAGMA query_only = ON")  # every write now fails, as a full or failing disk would
    journal.append("a", "chunk", {"n": 3}, encoded=b'{"n":3}')
    with pytest.raises(JournalError, match="write failed"):
        checkpoint(journal.append("b", "chunk", {"n": 1}, commit=True))
    journal._db.execute("PRAGMA query_only = OFF")
    assert journal.reader.get("a").event_count == 3 and journal.reader.get("b").event_count == 1  # type: ignore[union-attr]
    journal.append("a", "chunk", {"n": "again"})
    journal.finish("b", "completed", {"raw": "b"}, {"raw": "b"}).wait()  # after the chunk: one group, then it
    assert [(e.sequence, e.data) for e in read_events(journal, "a", 2)] == [(2, {"n": 2}), (3, {"n": "again"})]
    assert [e.sequence for e in read_events(journal, "b", 0)] == [0, 1] and journal.reader.get("b").event_count == 2  # type: ignore[union-attr]
    assert journal.reader.stored_events("a", 3) == [("chunk", 3, b'{"n":"again"}')]
    journal.close()
    reopened = Journal(path, checkpoint_events=100)  # consistent: the integrity check passes
    assert reopened.reader.get("a").event_count == 4  # type: ignore[union-attr]
    reopened.close()


WORKER_CRASH = """
import os, sys
from pathlib import Path
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
journal = Journal(Path(sys.argv[1]), checkpoint_events=100)
journal.admit(Job("a", "demo", "run", "h", "running", 0)).wait()
journal.append("a", "chunk", {"n": 0})
journal.set_worker("a", 4242, 1234.5, 4242, b"{}").wait()
os._exit(0)  # a crash right after: the worker would now get its Start
"""


def test_the_worker_record_survives_a_crash_of_the_supervisor(path: Path) -> None:
    """It is committed without an fsync (a worker does not outlive the machine), never left uncommitted."""
    subprocess.run([sys.executable, "-c", WORKER_CRASH, str(path)], cwd=ROOT, check=True)
    journal = Journal(path, checkpoint_events=1)
    restored = journal.reader.get("a")
    assert restored is not None and (restored.worker_pid, restored.worker_start_time) == (4242, 1234.5)
    assert len(read_events(journal, "a", 0)) == 1  # the pending chunk committed (durably) before it
    journal.close()


# The writer thread ---------------------------------------------------------------------------------


@contextlib.contextmanager
def held_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the journal's write lock, as a backup or an operator's sqlite3 would."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


def test_under_a_held_lock_admission_is_refused_in_time_and_the_terminal_waits(path: Path) -> None:
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    with held_lock(path):
        submitted = time.monotonic()
        admission, terminal = journal.admit(job("b")), journal.finish("a", "completed", {"raw": "a"}, {"raw": "a"})
        # Handing a write over never waits for SQLite: both are queued, neither decided yet.
        assert not admission.future.done() and not terminal.future.done()
        with pytest.raises(JournalBusy):
            admission.wait()
        # Not before its patience is spent; the ceiling is only a hang's, loose enough for a machine at load 10.
        assert REFUSE_AFTER_SECONDS <= time.monotonic() - submitted < REFUSE_AFTER_SECONDS + 10
        time.sleep(0.3)
        assert not terminal.future.done()  # what happened is never dropped for a busy journal
    assert terminal.wait().sequence == 0  # lands once the lock is free
    assert journal.reader.get("a").status == "completed" and journal.reader.get("b") is None  # type: ignore[union-attr]
    journal.close()


def test_writes_queued_together_commit_together(path: Path) -> None:
    """Group commit: what queues while the writer waits is one transaction, one fsync."""
    commits: list[float] = []
    journal = Journal(path, checkpoint_events=100, commit_seconds=commits.append)
    for name in "abc":
        journal.admit(job(name)).wait()
    del commits[:]
    with held_lock(path):
        journal.append("a", "chunk", {"n": 0})
        journal.set_worker("b", 4242, 1.0, 4242, b"{}")
        finished = [journal.finish(name, "completed", {"raw": name}) for name in "abc"]
        # Until the writer, retrying the lock, has taken in every queued write: then they share its next round.
        assert wait_until(journal._writer._queue.empty, timeout=10)
    assert [written.wait().sequence for written in finished] == [1, 0, 0]
    assert len(commits) == 1
    assert journal.reader.get("b").worker_pid == 4242 and not journal.reader.running()  # type: ignore[union-attr]
    journal.close()


def test_a_failing_write_rolls_back_only_itself(path: Path) -> None:
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    with held_lock(path):  # so that all three share one transaction
        duplicate, ghost, fine = journal.admit(job("a")), journal.finish("ghost", "failed", {}), journal.admit(job("b"))
    with pytest.raises(JournalError, match="UNIQUE"):
        duplicate.wait()
    with pytest.raises(JournalError, match="no job 'ghost'"):
        ghost.wait()
    fine.wait()
    assert [j.action_id for j in journal.reader.running()] == ["a", "b"]
    journal.close()


def test_close_commits_what_is_queued_and_gives_up_after_its_grace(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    journal.append("a", "chunk", {"n": 0})
    journal.close()  # the pending chunk is handed over and committed before the writer stops
    journal = Journal(path, checkpoint_events=100)
    assert len(read_events(journal, "a", 0)) == 1
    monkeypatch.setattr(store, "CLOSE_GRACE_SECONDS", 0.2)
    with held_lock(path):
        terminal = journal.finish("a", "completed", {})
        started = time.monotonic()
        journal.close()
        # It gave up: without its grace it would wait as long as the lock is held, for ever here. The ceiling
        # is only a hang's, loose enough for a loaded machine.
        assert time.monotonic() - started < 0.2 + 10
    with pytest.raises(JournalBusy):
        terminal.wait()  # never silently lost: its waiter is told, and a restart fences the job


def test_a_waiter_cancelled_while_its_write_waits_neither_drops_nor_fails_it(path: Path) -> None:
    """A job's timeout cancels the relay awaiting its group: the group still commits, and so does every
    write of its round (cancelling a queued future once made the round's results fail after committing)."""
    journal = Journal(path, checkpoint_events=1)
    journal.admit(job("a")).wait()

    async def cancelled_waiter() -> Written[None]:
        group = journal.append("a", "chunk", {"n": 0})
        assert group is not None
        waiter = asyncio.ensure_future(asyncio.wrap_future(group.future))
        await asyncio.sleep(0)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        return group

    with held_lock(path):
        group = asyncio.run(cancelled_waiter())
        terminal = journal.finish("a", "completed", {"raw": "a"}, {"raw": "a"})
    group.wait()  # committed once the lock was free, not cancelled
    assert terminal.wait().sequence == 1
    assert [event.event for event in read_events(journal, "a", 0)] == ["chunk", "completed"]
    journal.close()


def test_stop_waiting_ends_the_wait_of_writes_without_a_deadline(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopping supervisor must end even while the journal stays locked (or its disk full)."""
    monkeypatch.setattr(store, "CLOSE_GRACE_SECONDS", 0.2)
    journal = Journal(path, checkpoint_events=100)
    journal.admit(job("a")).wait()
    with held_lock(path):
        terminal = journal.finish("a", "completed", {})
        journal.stop_waiting()
        with pytest.raises(JournalBusy):
            terminal.wait()
    journal.close()
