"""Restart fencing: an orphan that outlived its supervisor is killed; a reused pid never is.
Also the drop-in import of a reference journal on first start."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from supervisor.processes.containment import Boundary, kill_remains
from supervisor.processes.process import CONFIRM_SECONDS
from tests.conftest import gone, start_body, start_server, wait_until
from tests.crews.base import EVIDENCE_DIR
from tests.crews.immortal import EXIT_REFUSED

# subreaper (tests/conftest.py): orphans of a killed supervisor come to us, so gone means reaped.
pytestmark = pytest.mark.usefixtures("launcher", "subreaper")

KEY = {"Idempotency-Key": "key-1"}


@pytest.mark.both_launchers
def test_an_orphan_that_survived_a_crash_is_killed_at_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    env = {"AIP_CREWAI_REGISTRY": "tests.crews.immortal:registry", EVIDENCE_DIR: str(evidence)}
    first = start_server(state, env=env)
    with (
        first.client() as client,
        client.stream("POST", "/jobs/stream", json=start_body("immortal", "orphan-1"), headers=KEY) as response,
    ):
        for line in response.iter_lines():
            if line == "event: started":
                break
        pid = client.get("/jobs/orphan-1/events").json()["events"][0]["data"]["pid"]
        # Its blocking LLM call under way, its ledger entry recorded: from here it writes nothing that could fail on
        # the dead supervisor's pipe (SIGPIPE would end it, and no fencing would be seen).
        assert wait_until(lambda: _calls(client) == ["running"], timeout=30)
    orphan = psutil.Process(pid)
    try:
        first.kill()
        _fenced_at_restart(state, env, evidence, orphan)
    finally:
        # An immortal orphan the restart failed to kill would outlive the suite: kill it (by pid and start time).
        with contextlib.suppress(psutil.NoSuchProcess):
            if orphan.is_running():
                orphan.kill()
                wait_until(lambda: gone(orphan.pid, orphan.create_time()), timeout=10)  # reaped: it is ours


def _fenced_at_restart(state: Path, env: dict[str, str], evidence: Path, orphan: psutil.Process) -> None:
    pid = orphan.pid

    def outlived_its_supervisor() -> bool:
        # Adopted by this test (a subreaper): the supervisor has exited, so its death signal, had the orphan
        # kept it armed, was sent. Its exit refused: the control thread saw the pipe close and would have left.
        refused = evidence / EXIT_REFUSED
        adopted = psutil.Process(pid).ppid() == os.getpid()
        return adopted and refused.exists() and str(pid) in refused.read_text().split()

    assert wait_until(outlived_its_supervisor, timeout=30), "the orphan was never adopted, or never saw its pipe close"
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE, "the orphan should have survived"

    second = start_server(state, env=env)
    try:
        assert gone(pid), "restart did not kill the orphan"
        with second.client() as client:
            terminal = client.get("/jobs/orphan-1").json()["terminal"]
            calls = _calls(client)
        assert terminal["uncertain_outcome"] is True and terminal["orphan_killed"] is True
        assert calls == ["uncertain"]  # the call the fence cut off
    finally:
        second.stop()


def _calls(client: httpx.Client) -> list[str]:
    return [effect["status"] for effect in client.get("/jobs/orphan-1/effects").json()["effects"]]


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    start_server(state).stop()
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        started = psutil.Process(bystander.pid).create_time()
        with sqlite3.connect(state / "journal.db") as db:
            db.execute(
                "INSERT INTO jobs (action_id, crew_id, operation, request_hash, status, event_count, admitted_at,"
                " worker_pid, worker_start_time, worker_pgid) VALUES ('reused', 'demo', 'run', 'h', 'running', 0, 0,"
                " ?, ?, ?)",
                (bystander.pid, started - 1000, bystander.pid),
            )
        server = start_server(state)
        try:
            with server.client() as client:
                terminal = client.get("/jobs/reused").json()["terminal"]
            assert terminal["orphan_killed"] is False and terminal["uncertain_outcome"] is True
            assert bystander.poll() is None, "an unrelated process holding the pid was killed"
        finally:
            server.stop()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_reference_journal_is_imported_on_first_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    records = [
        {
            "action_id": "ref-done",
            "crew_id": "demo",
            "operation": "run",
            "request_hash": "h1",
            "status": "completed",
            "events": [{"event": "completed", "sequence": 0, "data": {"status": "completed"}}],
            "output": {"raw": "r"},
        },
        {
            "action_id": "ref-running",
            "crew_id": "demo",
            "operation": "run",
            "request_hash": "h2",
            "status": "running",
            "events": [{"event": "started", "sequence": 0, "data": {}}],
            "output": None,
        },
    ]
    journal = state / "journal.db"
    journal.write_bytes(orjson.dumps(records))
    journal.chmod(0o600)
    server = start_server(state)
    try:
        with server.client() as client:
            assert client.get("/jobs/ref-done").json()["output"] == {"raw": "r"}
            running = client.get("/jobs/ref-running").json()
            assert running["status"] == "failed" and running["terminal"]["uncertain_outcome"] is True
            assert [e["sequence"] for e in client.get("/jobs/ref-running/events").json()["events"]] == [0, 1]
    finally:
        server.stop()
    assert (state / "journal.db.reference.json").read_bytes() == orjson.dumps(records)
    assert wait_until(lambda: "imported the reference journal" in server.log.read_text())


def test_a_worker_left_as_a_zombie_is_dead_not_an_orphan_and_costs_no_wait() -> None:
    """Under a subreaper that does not reap (a test runner, a careless init), a worker the dead supervisor
    left is a zombie with its pid and start time: fencing must neither report it killed nor wait for it."""
    zombie = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        started = psutil.Process(zombie.pid).create_time()
        os.kill(zombie.pid, signal.SIGKILL)
        assert wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, timeout=10)
        began = time.monotonic()
        assert kill_remains(zombie.pid, started, zombie.pid, Boundary()) == []
        assert time.monotonic() - began < CONFIRM_SECONDS  # a wait for a reap that never comes would take all of it
    finally:
        zombie.kill()
        zombie.wait()
