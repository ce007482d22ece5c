"""The effect ledger end to end: a real supervisor, real workers running the ``effects`` crew (``tests/crews/
effects.py``: four steps, each a tool call whose effect is a line in effects.log). Each tool call is in the ledger;
one that raised is ``failed`` though the run completes; and one under way when its job is cancelled, timed out, or
killed (its worker from outside, or the supervisor itself, then restarted) is ``uncertain``, the calls before it
``finished``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, gone, start_body, start_hostile_server, stop_server, wait_until
from tests.crews.effects import EFFECTS_LOG

KEY = {"Idempotency-Key": "key"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, evidence: Path) -> Iterator[Server]:
    running = start_hostile_server(tmp_path_factory.mktemp("state") / "s", evidence, STOP_GRACE_MS="200")
    yield running
    stop_server(running)


def begin(client: httpx.Client, action_id: str, **inputs: Any) -> int:
    """Start an ``effects`` job without waiting for it; its worker's pid, once it has started."""
    body = start_body("effects", action_id, input={"marker": action_id, **inputs}, timeout_ms=120_000)
    with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: started"):
                break
    events = client.get(f"/jobs/{action_id}/events").json()["events"]
    return int(next(event["data"]["pid"] for event in events if event["event"] == "started"))


def hung_in(evidence: Path, action_id: str, step: int) -> None:
    """Until the job's tool of ``step`` has begun, and hangs."""
    log = evidence / EFFECTS_LOG
    line = f"{action_id} step {step} begun\n"
    assert wait_until(lambda: log.exists() and line in log.read_text(), timeout=120), f"{action_id} never hung"


def tools(client: httpx.Client, action_id: str) -> list[tuple[str, str]]:
    """The job's tool calls in its ledger, as (name, status); every entry checked for its shape on the way."""
    answer = client.get(f"/jobs/{action_id}/effects")
    assert answer.status_code == 200, answer.text
    entries = answer.json()["effects"]
    for entry in entries:
        assert entry["kind"] in ("tool", "llm") and entry["started_at"] > 0 and len(entry["args_digest"]) >= 64
        assert (entry["ended_at"] is None) == (entry["status"] in ("running", "uncertain")), entry
    return [(entry["name"], entry["status"]) for entry in entries if entry["kind"] == "tool"]


CUT_OFF = [("record_effect", "finished"), ("record_effect", "uncertain")]  # hung in step 2


def test_a_run_records_every_call_a_failed_tool_as_failed_and_its_tasks(server: Server, evidence: Path) -> None:
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("effects", "whole", input={"fail_in_step": 3}), headers=KEY)
        assert answer.status_code == 200, answer.text
        ledger = client.get("/jobs/whole/effects").json()
        called = [status for _, status in tools(client, "whole")]
    # CrewAI tries a tool that raised again, a few times, before the model goes on: each try is a call of its own.
    assert called[:2] == ["finished", "finished"] and called[-1] == "finished"
    assert len(called) > 3 and set(called[2:-1]) == {"failed"}, called
    failed = [entry for entry in ledger["effects"] if entry["status"] == "failed"]
    assert all(entry["error_type"] == "RuntimeError" for entry in failed)
    assert all(entry["error_message"] == "tool failed at step 3" for entry in failed)
    assert ledger["tasks_completed"] == 4
    assert [entry["id"] for entry in ledger["effects"]] == sorted(entry["id"] for entry in ledger["effects"])
    llm = [entry for entry in ledger["effects"] if entry["kind"] == "llm"]
    assert llm and all(entry["status"] == "finished" and entry["name"] == "offline-effects" for entry in llm)


def test_a_tool_call_cut_off_by_a_cancel_is_uncertain(server: Server, evidence: Path) -> None:
    with server.client() as client:
        begin(client, "cancelled", hang_in_step=2)
        hung_in(evidence, "cancelled", 2)
        assert tools(client, "cancelled") == [("record_effect", "finished"), ("record_effect", "running")]
        answer = client.post("/jobs/cancelled/cancel", json={"crew_id": "effects", "action_id": "cancelled"})
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.text
        assert tools(client, "cancelled") == CUT_OFF
        assert client.get("/jobs/cancelled/effects").json()["tasks_completed"] == 1


def test_a_tool_call_cut_off_by_a_kill_from_outside_is_uncertain(server: Server, evidence: Path) -> None:
    with server.client() as client:
        pid = begin(client, "killed", hang_in_step=2)
        hung_in(evidence, "killed", 2)
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: client.get("/jobs/killed").json()["status"] == "failed", timeout=60)
        assert client.get("/jobs/killed").json()["terminal"]["error_type"] == "worker_killed"
        assert tools(client, "killed") == CUT_OFF


def test_a_tool_call_cut_off_by_the_jobs_timeout_is_uncertain(server: Server, evidence: Path) -> None:
    with server.client() as client:
        body = start_body("effects", "late", input={"marker": "late", "hang_in_step": 1}, timeout_ms=20_000)
        assert client.post("/jobs", json=body, headers=KEY).status_code == 502
        assert client.get("/jobs/late").json()["terminal"]["reason"] == "timeout"
        assert (evidence / EFFECTS_LOG).read_text().count("late step 1 begun") == 1
        assert tools(client, "late") == [("record_effect", "uncertain")]


def test_the_ledger_of_an_unknown_job_is_404(server: Server) -> None:
    with server.client() as client:
        assert client.get("/jobs/nobody/effects").status_code == 404


def test_a_supervisor_killed_mid_call_leaves_the_call_uncertain_after_its_restart(
    tmp_path: Path, evidence: Path
) -> None:
    state = tmp_path / "state"
    first = start_hostile_server(state, evidence)
    with first.client() as client:
        pid = begin(client, "crashed", hang_in_step=2)
        hung_in(evidence, "crashed", 2)
    first.kill()
    assert wait_until(lambda: gone(pid), timeout=30), "the worker outlived its supervisor"
    second = start_hostile_server(state, evidence)
    try:
        with second.client() as client:
            terminal = client.get("/jobs/crashed").json()["terminal"]
            assert terminal["error_type"] == "supervisor_restarted" and terminal["uncertain_outcome"] is True
            assert tools(client, "crashed") == CUT_OFF
            assert client.get("/jobs/crashed/effects").json()["tasks_completed"] == 1
    finally:
        stop_server(second)
