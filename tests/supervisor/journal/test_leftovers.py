"""What a job that did not finish leaves behind: a killed ``train``'s hidden ``.partial`` file is removed
once the kill is confirmed, and any left by an earlier supervisor at start-up; a journal record that
contradicts itself is quarantined at start, named in the log and by the doctor, and the others are served."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from protocol import partial_name
from tests.conftest import gone, start_body, start_server, wait_until
from tests.crews.base import EVIDENCE_DIR, HEARTBEAT
from tests.supervisor.doctor.test_doctor import deployment_in, doctor, findings

pytestmark = pytest.mark.usefixtures("launcher")


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


def test_a_record_made_inconsistent_by_hand_is_quarantined_named_and_the_others_served(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_server(state)
    with first.client() as client:
        for action_id in ("good-1", "bad-1"):
            answer = client.post("/jobs", json=start_body("demo", action_id), headers={"Idempotency-Key": action_id})
            assert answer.status_code == 200, answer.text
    first.stop()
    with contextlib.closing(sqlite3.connect(state / "journal.db")) as db, db:  # what no write of ours makes
        db.execute("UPDATE jobs SET event_count = event_count + 1 WHERE action_id = 'bad-1'")

    second = start_server(state)
    said = [line for line in second.log.read_text().splitlines() if "quarantined" in line]
    assert len(said) == 1 and "bad-1" in said[0] and "event count differs from its events" in said[0], said
    with second.client() as client:
        assert client.get("/jobs/good-1").json()["status"] == "completed"
        kept = client.get("/jobs/bad-1")
        assert kept.status_code == 404 and kept.json()["detail"].startswith("run was quarantined at start")
        reused = client.post("/jobs", json=start_body("demo", "bad-1"), headers={"Idempotency-Key": "bad-1"})
        assert reused.status_code == 409 and "quarantined" in reused.json()["detail"]  # its action id stays taken
        assert [job["action_id"] for job in client.get("/jobs").json()["jobs"]] == ["good-1"]
        fresh = client.post("/jobs", json=start_body("demo", "new-1"), headers={"Idempotency-Key": "new-1"})
        assert fresh.status_code == 200, fresh.text
    second.stop()

    found = {f["check"]: f for f in findings(doctor(deployment_in(tmp_path), "--json"))}
    assert found["records"]["status"] == "warning", found["records"]
    assert (
        "1 quarantined" in found["records"]["detail"] and "'bad-1' (event count differs" in found["records"]["detail"]
    )
