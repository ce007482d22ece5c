"""``crew-supervisor backup``: a copy of the journal taken while a supervisor serves and a job streams, restored as
docs/operating.md says (stop, the copy in place 0600, start), and served again; and its refusals."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.journal.backup import backup
from supervisor.journal.errors import JournalError
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from tests.conftest import ROOT, start_body, start_server, wait_until

KEY = {"Idempotency-Key": "key-1"}


def run_backup(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIP_CREWAI_STATE_FILE": str(journal)}
    command = [sys.executable, "-m", "supervisor", "backup", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def events(client: httpx.Client, action_id: str) -> list[dict[str, Any]]:
    return list(client.get(f"/jobs/{action_id}/events").json()["events"])


def test_a_copy_taken_while_a_job_streams_restores_with_that_job_fenced(tmp_path: Path) -> None:
    state, copy = tmp_path / "state", tmp_path / "copy.db"
    first = start_server(state)
    with first.client() as client:
        assert client.post("/jobs", json=start_body("demo", "done-1"), headers=KEY).status_code == 200
        done = client.get("/jobs/done-1").json()
        done_events = events(client, "done-1")
        slow = start_body("demo-slow", "live-1", input={"seconds": 60})
        with client.stream("POST", "/jobs/stream", json=slow, headers=KEY) as response:
            assert response.status_code == 200
            assert wait_until(lambda: len(events(client, "live-1")) >= 5, timeout=120), "live-1 never streamed"
            before = len(events(client, "live-1"))
            answer = run_backup(state / "journal.db", str(copy))
            after = len(events(client, "live-1"))
            assert wait_until(lambda: len(events(client, "live-1")) > after, timeout=30), "the job stopped streaming"
        assert answer.returncode == 0, answer.stdout + answer.stderr
        assert answer.stdout.startswith(f"backed up {state / 'journal.db'} to {copy}: 2 job records, ")
        assert client.get("/jobs/live-1").json()["status"] == "running"  # the supervisor went on serving
    first.stop()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["state", "copy.db", *_logs(tmp_path)])

    # The restore, as docs/operating.md's "Backup and restore": a state directory, the copy in it as the journal.
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    shutil.copyfile(copy, restored / "journal.db")
    (restored / "journal.db").chmod(0o600)
    second = start_server(restored)
    with second.client() as client:
        assert client.get("/jobs/done-1").json() == done  # completed: its record, its output, as it was
        assert events(client, "done-1") == done_events
        live = client.get("/jobs/live-1").json()
        assert live["status"] == "failed", live
        assert live["terminal"]["error_type"] == "supervisor_restarted"
        assert live["terminal"]["uncertain_outcome"] is True
        kept = events(client, "live-1")
        # The events the copy had, whole (the copy was consistent, or the start would have quarantined the record),
        # then the fence's terminal event.
        assert [e["sequence"] for e in kept] == list(range(len(kept)))
        assert before <= len(kept) - 1 <= after and kept[-1]["event"] == "failed"
        assert client.get("/health").json()["retained_runs"] == 2
    second.stop()


def _logs(directory: Path) -> list[str]:
    return [path.name for path in directory.iterdir() if path.name.startswith("supervisor-")]


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "journal.db"
    path.parent.mkdir(mode=0o700)
    held = Journal(path, checkpoint_events=1)
    held.admit(Job("kept", "plain", "run", "hash", "running", 0)).wait()
    held.close()
    return path


def test_an_existing_file_is_replaced_only_with_force(journal: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy.db"
    target.write_text("an earlier copy\n")
    answer = run_backup(journal, str(target))
    assert (answer.returncode, answer.stdout) == (1, "")
    assert answer.stderr == f"crew-supervisor backup: {target} exists: give --force to replace it\n"
    assert target.read_text() == "an earlier copy\n"
    assert backup(journal, target, force=True).records == 1
    with contextlib.closing(sqlite3.connect(f"file:{target}?immutable=1", uri=True)) as db:
        assert db.execute("SELECT action_id FROM jobs").fetchall() == [("kept",)]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy.db", "state"]  # no partial copy left


def test_a_killed_backups_partial_copy_is_removed_by_the_next_and_a_running_ones_kept(
    journal: Path, tmp_path: Path
) -> None:
    stale, running, other = (
        tmp_path / name
        for name in (".copy.db.k1ll3d_0.partial", ".copy.db.running0.partial", ".other.db.k1ll3d_0.partial")
    )
    for path in (stale, stale.with_name(stale.name + "-journal"), running, other):
        path.write_text("a copy cut short\n")
        os.utime(path, (1, 1))  # long before this backup
    with open(running) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the backup writing it holds it
        assert backup(journal, tmp_path / "copy.db").records == 1
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == [running.name, other.name, "copy.db", "state"]  # another target's are not its own
    fresh = tmp_path / ".copy.db.0started.partial"  # a backup begun after the next one, not locking it yet
    fresh.write_text("")
    os.utime(fresh, (time.time() + 3600, time.time() + 3600))
    assert backup(journal, tmp_path / "copy.db", force=True).records == 1
    assert fresh.exists()


@pytest.mark.parametrize("name", ["journal.db", "journal.db-wal", "journal.db.lock"])
def test_the_journals_own_files_are_never_a_target(journal: Path, name: str) -> None:
    with pytest.raises(JournalError, match="is one of the journal's own files"):
        backup(journal, journal.with_name(name), force=True)
    reopened = Journal(journal, checkpoint_events=1)  # the journal, untouched
    assert reopened.reader.count() == 1
    reopened.close()


def test_without_a_journal_it_says_so(tmp_path: Path) -> None:
    answer = run_backup(tmp_path / "none.db", str(tmp_path / "copy.db"))
    assert answer.returncode == 1
    assert answer.stderr == f"crew-supervisor backup: no journal at {tmp_path / 'none.db'}: nothing to back up\n"
    assert not (tmp_path / "copy.db").exists()
