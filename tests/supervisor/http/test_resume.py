"""``POST /jobs/{id}/resume`` against a real supervisor: each refusal with its status and reason, an exact repeat
answering the same job, and the links both ways (``resumed_from``, ``resumed_by``). What a resume runs (the
tasks it skips) is tests/system/resume's, with a crew whose every task has an effect."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import MAX_RESUMED_BYTES
from supervisor.testing import Server
from tests.conftest import start_body, start_server, stop_server, wait_until


@pytest.fixture(scope="module")
def resumable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        tmp_path_factory.mktemp("resume") / "state", env={"AIP_CREWAI_ALLOWED_OPERATIONS": "run,memory_reset"}
    )
    yield server
    stop_server(server)


def resume(client: httpx.Client, old: str, new: str, key: str | None = "resume-key", **body: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(f"/jobs/{old}/resume", json={"action_id": new, **body}, headers=headers)


def start(client: httpx.Client, crew: str, action: str, **body: Any) -> httpx.Response:
    return client.post("/jobs", json=start_body(crew, action, **body), headers={"Idempotency-Key": "start-key"})


def test_a_failed_run_resumes_once_and_the_records_name_each_other(resumable: Server) -> None:
    with resumable.client() as client:
        assert start(client, "boom", "boom-1").status_code == 502
        again = resume(client, "boom-1", "boom-1-r1")
        # Answered as its blocking start would be: it fails again (no task had completed: it ran from the first).
        assert again.status_code == 502, again.text
        assert again.json()["action_id"] == "boom-1-r1" and again.json()["resumed_from"] == "boom-1"
        assert client.get("/jobs/boom-1").json()["resumed_by"] == "boom-1-r1"
        new = client.get("/jobs/boom-1-r1").json()
        assert (new["resumed_from"], new["resumed_by"], new["crew_id"], new["operation"]) == (
            "boom-1",
            None,
            "boom",
            "run",
        )
        repeat = resume(client, "boom-1", "boom-1-r1")  # the same request: the same job, not another
        assert repeat.status_code == 502 and repeat.json()["event_count"] == new["event_count"]
        other = resume(client, "boom-1", "boom-1-r2")
        assert other.status_code == 409 and "already resumed as job boom-1-r1" in other.json()["detail"]
        taken = resume(client, "boom-1", "boom-1-r1", key="another-key")
        assert taken.status_code == 409 and "different request material" in taken.json()["detail"]
        # The resume is a job like any other: it resumes in turn.
        assert resume(client, "boom-1-r1", "boom-1-r1-r1").status_code == 502
        assert client.get("/jobs/boom-1-r1").json()["resumed_by"] == "boom-1-r1-r1"


def test_what_cannot_resume_is_refused_with_its_reason(resumable: Server) -> None:
    with resumable.client() as client:
        assert start(client, "demo", "done-1").status_code == 200
        reset = start(client, "demo", "reset-1", operation="memory_reset", input={"command_type": "memory"})
        assert client.get("/jobs/reset-1").json()["status"] != "running", reset.text  # ended, either way
        assert start(client, "boom", "boom-2").status_code == 502

        unknown = resume(client, "no-such-job", "fresh-1")
        assert unknown.status_code == 404 and unknown.json()["detail"] == "run was not found"
        completed = resume(client, "done-1", "fresh-2")
        assert completed.status_code == 409 and "completed: nothing to resume" in completed.json()["detail"]
        other = resume(client, "reset-1", "fresh-3")
        assert other.status_code == 409 and "only a run resumes" in other.json()["detail"]
        assert resume(client, "boom-2", "fresh-4", key=None).status_code == 428
        assert resume(client, "boom-2", "fresh-5", key="k" * 1000).status_code == 400
        taken = resume(client, "boom-2", "done-1")  # the new action id is another job's
        assert taken.status_code == 409 and "different request material" in taken.json()["detail"]
        assert resume(client, "boom-2", "fresh-6", timeout_ms=0).status_code == 422
        assert resume(client, "boom-2", "fresh-7", crew_id="demo").status_code == 422  # the old job's crew only
        for refused in ("fresh-1", "fresh-2", "fresh-3", "fresh-4", "fresh-5", "fresh-6", "fresh-7"):
            assert client.get(f"/jobs/{refused}").status_code == 404  # nothing was admitted
        assert client.get("/jobs/boom-2").json()["resumed_by"] is None


def test_a_running_job_is_refused_and_once_cancelled_resumes(resumable: Server) -> None:
    with resumable.client() as client:
        body = start_body("demo-slow", "slow-1", input={"seconds": 5})
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "start-key"}) as response:
            assert response.status_code == 200
        assert wait_until(lambda: client.get("/jobs/slow-1").json()["phase"] == "running", timeout=60)
        running = resume(client, "slow-1", "slow-1-r1")
        assert running.status_code == 409 and "still running" in running.json()["detail"]
        cancel = client.post("/jobs/slow-1/cancel", json={"crew_id": "demo-slow", "action_id": "slow-1"})
        assert cancel.json()["status"] == "cancelled"
        # The old job's crew and input, run to its end: the answer is its output, as a blocking start's.
        resumed = resume(client, "slow-1", "slow-1-r1")
        assert resumed.status_code == 200, resumed.text
        assert "5 seconds" in resumed.json()["tasks_output"][0]["description"]
        assert client.get("/jobs/slow-1-r1").json()["resumed_from"] == "slow-1"


def test_after_a_restart_a_crew_no_longer_served_is_404_and_a_full_journal_507(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_server(state)
    with first.client() as client:
        assert start(client, "boom", "gone-crew").status_code == 502
        assert start(client, "boom", "kept-crew").status_code == 502
    stop_server(first)
    # The same journal, served with a registry without ``boom``; then with room for no more job.
    second = start_server(state, registry="worker.demo:registry")
    with second.client() as client:
        unserved = resume(client, "gone-crew", "gone-crew-r1")
        assert unserved.status_code == 404 and "unknown crew 'boom'" in unserved.json()["detail"]
    stop_server(second)
    third = start_server(state, env={"AIP_CREWAI_MAX_RETAINED_RUNS": "2", "AIP_CREWAI_MAX_CONCURRENCY": "1"})
    with third.client() as client:
        full = resume(client, "kept-crew", "kept-crew-r1")
        assert full.status_code == 507 and "retained runs" in full.json()["detail"], full.text
        assert client.get("/jobs/kept-crew").json()["resumed_by"] is None


def archive(client: httpx.Client, action_id: str) -> None:
    answer = client.delete(f"/jobs/{action_id}", headers={"X-AIP-Archive-Confirmation": action_id})
    assert answer.status_code == 200, answer.text


def test_a_job_stays_resumed_once_its_resume_is_archived(resumable: Server) -> None:
    with resumable.client() as client:
        assert start(client, "boom", "boom-3").status_code == 502
        assert resume(client, "boom-3", "boom-3-r1").status_code == 502
        archive(client, "boom-3-r1")
        assert client.get("/jobs/boom-3").json()["resumed_by"] is None  # the link went with the resume's record
        again = resume(client, "boom-3", "boom-3-r2")  # it would run again all the first resume completed
        assert again.status_code == 409, again.text
        assert "already resumed, by a job since archived" in again.json()["detail"]
        assert client.get("/jobs/boom-3-r2").status_code == 404


def test_a_repeated_resume_is_answered_its_job_once_the_job_it_continued_is_archived(resumable: Server) -> None:
    with resumable.client() as client:
        assert start(client, "boom", "boom-4").status_code == 502
        first = resume(client, "boom-4", "boom-4-r1")
        assert first.status_code == 502
        archive(client, "boom-4")
        repeat = resume(client, "boom-4", "boom-4-r1")
        assert repeat.status_code == 502, repeat.text
        assert repeat.json()["event_count"] == first.json()["event_count"]
        other = resume(client, "boom-4", "boom-4-r1", key="another-key")
        assert other.status_code == 409 and "different request material" in other.json()["detail"]
        assert resume(client, "boom-4", "boom-4-r2").status_code == 404  # a new resume needs the job it continues


def by_hand(state: Path, *statements: str) -> None:
    """Change a stopped supervisor's journal, as an operator's ``sqlite3`` would."""
    with contextlib.closing(sqlite3.connect(state / "journal.db")) as db, db:
        for statement in statements:
            db.execute(statement)


def test_a_run_whose_input_was_not_kept_or_whose_tasks_would_not_fit_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_server(state)
    with first.client() as client:
        for action in ("old-version", "huge-tasks"):
            assert start(client, "boom", action).status_code == 502
    stop_server(first)
    # As a supervisor before this version admitted it: no input kept. And tasks past what a Start carries.
    task = "'{\"raw\": \"' || printf('%.*c', 1000000, 'x') || '\"}'"
    by_hand(
        state,
        "DELETE FROM inputs WHERE action_id = 'old-version'",
        *(f"INSERT INTO tasks_done VALUES ('huge-tasks', {n}, 'fp', {task})" for n in range(4)),
    )
    second = start_server(state)
    try:
        with second.client() as client:
            unkept = resume(client, "old-version", "old-version-r1")
            assert unkept.status_code == 409, unkept.text
            assert "input was not kept (admitted before this version)" in unkept.json()["detail"]
            huge = resume(client, "huge-tasks", "huge-tasks-r1")
            assert huge.status_code == 409, huge.text
            assert f"more than a resume's start carries ({MAX_RESUMED_BYTES})" in huge.json()["detail"]
            assert client.get("/jobs/huge-tasks").json()["resumed_by"] is None
    finally:
        stop_server(second)
