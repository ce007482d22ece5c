"""Leftovers: a journal whose worker output table contradicts its jobs refuses to start, naming the job."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import Job, Journal
from tests.conftest import start_server, wait_until

pytestmark = pytest.mark.usefixtures("launcher")

EXIT_SECONDS = 60.0


def test_worker_output_of_an_unknown_job_refuses_start_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    prepare_directory(state)
    journal = Journal(state / "journal.db", checkpoint_events=1)
    journal.admit(Job("real", "demo", "run", "hash", "running", 0)).wait()
    journal.close()
    with sqlite3.connect(state / "journal.db") as db:  # what no write of ours makes: an archive that left it
        db.execute("INSERT INTO outputs VALUES ('ghost', 'out', '', 3, 0)")
    server = start_server(state, wait=False)
    exited = wait_until(lambda: server.process.poll() is not None, timeout=EXIT_SECONDS)
    assert exited, "start-up went on with an inconsistent journal"
    assert server.process.returncode == 1
    lines = server.log_tail().strip().splitlines()
    assert lines[-1].startswith("crew-supervisor: ") and "'ghost': worker output of an unknown job" in lines[-1]
    assert not any("Traceback" in line for line in lines)
