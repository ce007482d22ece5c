"""Resume end to end: a real supervisor, real workers running the ``effects`` crew (``tests/crews/effects.py``: four
steps, each a tool call whose effect is a line in effects.log), stopped inside step 3's tool call by a cancel, by a
kill of its worker from outside, or by a SIGKILL of the supervisor and a restart on the same state; then resumed.
The resumed job does not run steps 1 and 2 again (their lines are there once), runs step 3 again in full (the call
that was cut off, uncertain in the old job's ledger), then step 4, and answers as an uninterrupted run: four task
outputs."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from supervisor.testing import Server
from tests.conftest import gone, start_hostile_server, stop_server, wait_until
from tests.crews.effects import EFFECTS_LOG
from tests.system.ledger.test_effects import begin, hung_in, tools

RESUME_KEY = {"Idempotency-Key": "resume-key"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, evidence: Path) -> Iterator[Server]:
    running = start_hostile_server(tmp_path_factory.mktemp("state") / "s", evidence, STOP_GRACE_MS="200")
    yield running
    stop_server(running)


def lines(evidence: Path, marker: str) -> list[str]:
    return [line for line in (evidence / EFFECTS_LOG).read_text().splitlines() if line.split(" step ")[0] == marker]


def resumed(client: httpx.Client, evidence: Path, old: str) -> None:
    """Release step 3's tool (the resumed job's input still hangs there), resume ``old`` and check what ran."""
    assert tools(client, old) == [("record_effect", "finished")] * 2 + [("record_effect", "uncertain")]
    (evidence / f"{old}.release").touch()
    answer = client.post(f"/jobs/{old}/resume", json={"action_id": f"{old}-r1"}, headers=RESUME_KEY)
    assert answer.status_code == 200, answer.text
    assert [task["name"] for task in answer.json()["tasks_output"]] == [f"step {n}" for n in range(1, 5)]
    assert lines(evidence, old) == [
        *(f"{old} step 1", f"{old} step 2"),  # once each: the old job's, never run again
        *(f"{old} step 3 begun", f"{old} step 3 begun"),  # the call cut off, and the resumed job's
        *(f"{old} step 3", f"{old} step 4"),
    ]
    # The new job's own calls: step 3's and step 4's tools alone; its record holds all four completed tasks.
    assert tools(client, f"{old}-r1") == [("record_effect", "finished")] * 2
    assert client.get(f"/jobs/{old}-r1/effects").json()["tasks_completed"] == 4
    assert client.get(f"/jobs/{old}").json()["resumed_by"] == f"{old}-r1"
    assert client.get(f"/jobs/{old}-r1").json()["resumed_from"] == old


def cancel(client: httpx.Client, action_id: str, pid: int) -> None:
    answer = client.post(f"/jobs/{action_id}/cancel", json={"crew_id": "effects", "action_id": action_id})
    assert answer.json()["status"] == "cancelled", answer.text


def kill_worker(client: httpx.Client, action_id: str, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: client.get(f"/jobs/{action_id}").json()["status"] == "failed", timeout=60)


@pytest.mark.parametrize("stop", [cancel, kill_worker], ids=["cancel", "worker-sigkill"])
def test_a_run_stopped_in_a_tool_call_resumes_from_that_task(
    server: Server, evidence: Path, stop: Callable[[httpx.Client, str, int], None]
) -> None:
    old = f"resume-{stop.__name__}"
    with server.client() as client:
        pid = begin(client, old, hang_in_step=3)
        hung_in(evidence, old, 3)
        stop(client, old, pid)
        resumed(client, evidence, old)


def test_a_run_cut_off_by_a_supervisor_sigkill_resumes_after_the_restart(tmp_path: Path, evidence: Path) -> None:
    state, old = tmp_path / "state", "resume-restart"
    first = start_hostile_server(state, evidence)
    with first.client() as client:
        pid = begin(client, old, hang_in_step=3)
        hung_in(evidence, old, 3)
    first.kill()
    assert wait_until(lambda: gone(pid), timeout=30), "the worker outlived its supervisor"
    second = start_hostile_server(state, evidence)
    try:
        with second.client() as client:
            assert client.get(f"/jobs/{old}").json()["terminal"]["error_type"] == "supervisor_restarted"
            resumed(client, evidence, old)
    finally:
        stop_server(second)
