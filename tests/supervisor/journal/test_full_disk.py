"""A journal whose disk fills: admission answers 507, a running job's events and terminal wait for space
instead of being dropped, nothing admitted is lost, and the journal stays consistent across a restart.
The disk is a small tmpfs the test mounts, so it runs as root (as CI does) and says so otherwise."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.chaos.checks import all_events
from supervisor.chaos.disk import SmallDisk
from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import Journal
from tests.conftest import ROOT, start_body, start_server, wait_until
from tests.helpers.small_disk import mounted

KEY = {"Idempotency-Key": "key-1"}
MiB = 1 << 20
RESERVE_MB = 4
CHUNKS = 30  # of 200,000 characters each: 6 MB of events, more than the disk has left when it starts


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    yield from mounted(tmp_path / "disk", 48)


def test_a_full_disk_refuses_admission_and_loses_no_admitted_job(disk: SmallDisk) -> None:
    state = disk.path / "state"
    settings = {"AIP_CREWAI_MIN_FREE_DISK_MB": str(RESERVE_MB), "AIP_CREWAI_STREAM_CHECKPOINT_EVENTS": "4"}
    server = start_server(state, env=settings)
    with server.client() as client:
        disk.fill(leave=6 * MiB)  # above the reserve: the big job is admitted, then outgrows the disk
        big = start_body("sized", "big", input={"sizes": " ".join(["200000"] * CHUNKS)})
        with client.stream("POST", "/jobs/stream", json=big, headers=KEY) as response:
            assert response.status_code == 200
        assert wait_until(lambda: "journal disk full" in server.log_tail(20000), timeout=30), server.log_tail()

        refused = client.post("/jobs", json=start_body("demo", "refused"), headers=KEY)
        assert refused.status_code == 507
        assert f"below the {RESERVE_MB} MiB kept for running jobs" in refused.json()["detail"]
        assert client.get("/jobs/refused").status_code == 404  # refused means not admitted
        assert client.get("/jobs/big").json()["status"] == "running"  # its terminal waits for space

        disk.empty()
        assert wait_until(lambda: client.get("/jobs/big").json()["status"] != "running", timeout=60)
        job = client.get("/jobs/big").json()
        events = all_events(client, "big", job["event_count"])
        names = [event["event"] for event in events]
        # CrewAI's own storage shares the disk: the crew may have failed on it, and says so. Either way the
        # outcome is the crew's, and not one event was dropped.
        assert job["status"] == "completed" or job["terminal"]["error_type"] == "DatabaseOperationError", job
        assert names == ["started", *["chunk"] * CHUNKS, job["status"]]
        assert [event["sequence"] for event in events] == list(range(len(events)))
        assert "journal disk writable again" in server.log_tail(20000)
        assert client.post("/jobs", json=start_body("demo", "after"), headers=KEY).status_code == 200
    server.stop()

    db = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()
    again = start_server(state, env=settings)  # the journal's own consistency check runs at start
    with again.client() as client:
        assert client.get("/jobs/big").json()["status"] == job["status"]
        assert client.get("/jobs/after").json()["status"] == "completed"
    again.stop()  # before the fixture unmounts the disk under it


def test_a_journal_a_killed_supervisor_left_opens_on_a_full_disk(disk: SmallDisk) -> None:
    """A restart after a SIGKILL finds the WAL it left; opening it must need no new space when nothing changed (every
    open used to set user_version again, a WAL frame: "database or disk is full" on a full disk)."""
    state = disk.path / "state"
    prepare_directory(state)
    path = state / "journal.db"
    killed = "import os, sys; from pathlib import Path; from supervisor.journal.store import Journal\n"
    killed += "Journal(Path(sys.argv[1]), 4)\nos._exit(9)"  # no close: a kill's WAL, never checkpointed
    assert subprocess.run([sys.executable, "-c", killed, str(path)], cwd=ROOT, timeout=60).returncode == 9
    assert path.with_name("journal.db-wal").exists()
    assert disk.fill()
    journal = Journal(path, 4)
    try:
        assert journal.reader.damage() is None
    finally:
        journal.close()
