"""State paths a same-uid process could plant, and the files CrewAI writes for a crew.

- A FIFO or a symlink at any path the supervisor or SQLite opens (the journal, its -wal/-shm, its lock,
  the migration backups) or at the workers' directories (home, storage, scratch) is refused at start in
  one line naming it: no hang (a FIFO made the reference-journal sniff wait forever), nothing followed.
- What a job leaves in CrewAI's storage and HOME is 0600/0700 (the workers' umask), and each crew has a
  HOME of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from supervisor.layout import WORKER_PLACES
from tests.conftest import start_server

EXIT_SECONDS = 60.0
FILES = ("journal.db", "journal.db-wal", "journal.db-shm", "journal.db.lock", "journal.db.reference.json")
FILES += ("journal.db.v1.backup",)
DIRECTORIES = WORKER_PLACES


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("name", FILES + DIRECTORIES)
def test_a_planted_fifo_or_symlink_is_refused_at_start_in_one_line(tmp_path: Path, name: str, kind: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    planted = state / name
    if kind == "fifo":
        os.mkfifo(planted, 0o600)
    else:
        target = tmp_path / "elsewhere"
        if name in DIRECTORIES:
            target.mkdir()
        else:
            target.write_bytes(b"[]")  # followed, it would even pass for a reference journal
        planted.symlink_to(target)
    server = start_server(state, wait=False)
    try:
        returncode = server.process.wait(EXIT_SECONDS)  # the exit itself, with a deadline
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError(f"start-up hung on a planted {kind} at {name}") from None
    assert returncode == 1
    lines = server.log_tail().strip().splitlines()
    assert lines[-1].startswith("crew-supervisor: ") and str(planted) in lines[-1], lines
    assert ("a FIFO" if kind == "fifo" else "a symlink") in lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert stat.S_ISFIFO(os.lstat(planted).st_mode) == (kind == "fifo")  # left as it was


def test_a_listable_state_directory_is_made_private_at_start_and_said(tmp_path: Path) -> None:
    """As the doctor warns: a volume's 0755 would let every local user list the journal and the crews' homes."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    server = start_server(state)
    try:
        assert state.stat().st_mode & 0o777 == 0o700
        said = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
        assert any(f"state directory {state} had mode 0755" in entry["event"] for entry in said), said
    finally:
        server.stop()


def test_crewai_files_are_private_and_each_crew_has_its_own_home(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state", env={"AIP_CREWAI_ALLOWED_OPERATIONS": "run,replay"})
    try:
        with server.client() as client:
            for crew in ("demo", "prober"):
                body = {"crew_id": crew, "action_id": f"{crew}-1", "input": {"topic": "umask"}}
                response = client.post("/jobs", json=body, headers={"Idempotency-Key": crew})
                assert response.status_code == 200, response.text
            found = json.loads(client.get("/jobs/prober-1").json()["output"]["raw"])
    finally:
        server.stop()
    assert found["umask"] == 0o077
    own = hashlib.sha256(b"prober").hexdigest()[:24]
    assert found["home"] == str(server.state / "home" / own)
    homes = sorted(path.name for path in (server.state / "home").iterdir())
    assert own in homes and hashlib.sha256(b"demo").hexdigest()[:24] in homes
    # A run leaves CrewAI's kickoff outputs (for replay) in the crew's storage: nothing there, nor in any
    # HOME, is open to group or others.
    written = [path for top in ("storage", "home") for path in (server.state / top).rglob("*")]
    assert any(path.is_file() for path in (server.state / "storage").rglob("*")), "CrewAI stored nothing"
    loose = {str(path): oct(path.lstat().st_mode & 0o777) for path in written if path.lstat().st_mode & 0o077}
    assert not loose
