"""What a job that did not finish leaves behind: a killed ``train``'s hidden ``.partial`` file is removed
once the kill is confirmed, and any left by an earlier supervisor at start-up; a journal whose worker
output table contradicts its jobs refuses to start, naming the job."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from protocol import partial_name
from supervisor.journal.records import Job
from supervisor.journal.statefiles import prepare_directory
from supervisor.journal.store import Journal
from tests.conftest import gone, start_body, start_server, wait_until
from tests.crews.base import EVIDENCE_DIR, HEARTBEAT

pytestmark = pytest.mark.usefixtures("launcher")

EXIT_SECONDS = 60.0


@pytest.mark.both_launchers
def test_partials_go_at_start_and_when_a_killed_train_is_confirmed_gone(tmp_path: Path) -> None:
    training = tmp_path / "training"
    training.mkdir(mode=0o700)
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    stale = training / partial_name("agent.pkl", "a-job-of-a-dead-supervisor")
    stale.write_bytes(b"half an artifact")
    older = training / ".agent.pkl.k3j9x_2q.partial"  # what an earlier version named it (mkstemp)
    older.write_bytes(b"half")
    kept = [training / "agent.pkl", training / ".notes"]  # a published artifact; a hidden file of another kind
    for path in kept:
        path.write_bytes(b"keep")
    env = {
        "AIP_CREWAI_ALLOWED_OPERATIONS": "run,train",
        "AIP_CREWAI_TRAINING_DIR": str(training),
        EVIDENCE_DIR: str(evidence),
    }
    server = start_server(tmp_path / "state", env=env)
    assert not stale.exists() and not older.exists() and all(path.exists() for path in kept)

    with server.client() as client:
        train = {"n_iterations": 1, "artifact_name": "never.pkl", "feedback": "x", "inputs": {"mode": "block"}}
        body = start_body("recorder", "train-kill", operation="train", input=train)
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "k"}):
            partial = training / partial_name("never.pkl", "train-kill")
            # The worker opened its partial before training and is now inside the blocked model call.
            assert wait_until(lambda: (evidence / HEARTBEAT).exists(), timeout=60), server.log_tail()
            assert partial.exists()
            record = client.post("/jobs/train-kill/cancel", json={"crew_id": "recorder", "action_id": "train-kill"})
        proof = record.json()["terminal"]
        assert record.json()["status"] == "cancelled" and proof["stop_confirmed"] is True and gone(proof["pid"])
        # The cancel answers once the job is terminal, and the file went before its terminal event.
        assert not partial.exists() and not (training / "never.pkl").exists()
        assert sorted(training.iterdir()) == sorted(kept)
    server.stop()


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
