"""A running job's stacks, asked of its worker while the job goes on; and those taken just before the kill of a
cancel or a timeout, kept with the job's record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.jobs.stacks import ASK_SECONDS
from tests.conftest import Server, gone, sse_events, start_body, start_server, stop_server, wait_until
from tests.crews.base import BLOCKED
from tests.supervisor.console.test_cli import cli


@pytest.fixture(scope="module")
def server(launcher: str, evidence: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The module's supervisor, its crews leaving their evidence where the tests read it."""
    running = start_server(tmp_path_factory.mktemp("stacks") / "state", env={"CREW_TEST_EVIDENCE_DIR": str(evidence)})
    yield running
    stop_server(running)


# Where a demo-slow job spends its time: ticking in the offline model's call (worker/demo.py).
TICKING = "worker/demo.py"


def ticking(answer: dict[str, Any]) -> bool:
    """Whether one of its threads is in the offline model's call, as CrewAI's thread runs it."""
    return any(TICKING in thread["stack"] and ", in call\n" in thread["stack"] for thread in answer["threads"])


def start_ticking(server: Server, action: str, **body: Any) -> int:
    """Start a demo-slow job, wait for its first tick (its crew runs), hang up (it goes on); its worker's pid."""
    with (
        server.client() as client,
        client.stream(
            "POST", "/jobs/stream", json=start_body("demo-slow", action, input={"seconds": 60}, **body),
            headers={"Idempotency-Key": action},
        ) as response,
    ):  # fmt: skip
        events = sse_events(response)
        pid = int(next(events)["data"]["pid"])
        assert next(events)["event"] == "chunk"
    return pid


@pytest.mark.both_launchers
def test_a_running_job_s_stacks_show_where_it_is_and_it_goes_on(server: Server) -> None:
    pid = start_ticking(server, "stacked")
    with server.client() as client:
        began = time.monotonic()
        answer = client.get("/jobs/stacked/stack")
        took = time.monotonic() - began
        assert answer.status_code == 200, answer.text
        stacks = answer.json()
        assert took < 1.0, took  # asked of the worker, answered by its control thread
        assert stacks["action_id"] == "stacked" and stacks["status"] == "running" and stacks["taken_at"] > 0
        assert ticking(stacks), stacks
        names = [thread["name"] for thread in stacks["threads"]]
        assert names[0] == "MainThread" and "control" not in names  # the thread that answers is left out

        # The job goes on: more ticks after, its worker the same.
        count = client.get("/jobs/stacked").json()["event_count"]
        assert wait_until(lambda: client.get("/jobs/stacked").json()["event_count"] > count + 2, timeout=30)
        assert client.get("/jobs/stacked").json()["status"] == "running"
        again = client.get("/jobs/stacked/stack").json()  # asked again: answered again
        assert ticking(again) and again["taken_at"] > stacks["taken_at"]

        cancel = {"crew_id": "demo-slow", "action_id": "stacked", "reason": "seen enough"}
        record = client.post("/jobs/stacked/cancel", json=cancel).json()
        assert record["status"] == "cancelled" and record["terminal"]["pid"] == pid and gone(pid)


@pytest.mark.parametrize(("ending", "before"), [("cancel", "cancel"), ("timeout", "timeout")])
def test_a_stopped_job_keeps_where_it_was_just_before_its_kill(server: Server, ending: str, before: str) -> None:
    action = f"kept-{ending}"
    # A timeout from admission, 6 s: its first tick must come before it, even at load.
    pid = start_ticking(server, action, **({"timeout_ms": 6000} if ending == "timeout" else {}))
    with server.client() as client:
        if ending == "cancel":
            client.post(f"/jobs/{action}/cancel", json={"crew_id": "demo-slow", "action_id": action, "reason": "x"})
        assert wait_until(lambda: client.get(f"/jobs/{action}").json()["status"] != "running", timeout=30)
        record = client.get(f"/jobs/{action}").json()
        assert record["status"] == ("cancelled" if ending == "cancel" else "failed") and gone(pid)
        kept = client.get(f"/jobs/{action}/stack")
        assert kept.status_code == 200, kept.text
        stacks = kept.json()
        assert stacks["status"] == record["status"] and stacks["before"] == before and ticking(stacks), stacks
        assert stacks["taken_at"] <= record["ended_at"]


def test_a_worker_that_cannot_answer_is_504_in_a_second_and_its_kill_is_not_held_up(
    server: Server, evidence: Path
) -> None:
    """A thread holding the interpreter's lock in C: no other thread of the worker runs, its control thread's
    neither. The route answers 504 after ASK_SECONDS, the job goes on, and a cancel kills it without its stacks."""
    body = start_body("gil-hog", "hogging")
    with server.client() as client:
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "hogging"}) as response:
            pid = int(next(sse_events(response))["data"]["pid"])
        assert wait_until(lambda: str(pid) in blocked_pids(evidence), timeout=30)  # in its call, in C now
        began = time.monotonic()
        late = client.get("/jobs/hogging/stack")
        took = time.monotonic() - began
        assert late.status_code == 504 and "did not answer within 1 s" in late.json()["detail"], late.text
        assert ASK_SECONDS <= took < ASK_SECONDS + 5, took  # its own bound, plus a loaded machine's round trip
        assert client.get("/jobs/hogging").json()["status"] == "running"
        record = client.post("/jobs/hogging/cancel", json={**body, "reason": "hog"}).json()
        assert record["status"] == "cancelled" and record["terminal"]["stop_confirmed"] and gone(pid)
        assert client.get("/jobs/hogging/stack").status_code == 409  # none was taken: it could not answer


def blocked_pids(evidence: Path) -> str:
    blocked = evidence / BLOCKED
    return blocked.read_text() if blocked.exists() else ""


def test_stacks_answer_404_409_and_422_and_never_a_500(server: Server) -> None:
    with server.client() as client:
        assert client.get("/jobs/no-such-job/stack").status_code == 404
        done = client.post("/jobs", json=start_body("demo", "quick-one"), headers={"Idempotency-Key": "quick-one"})
        assert done.status_code == 200, done.text
        refused = client.get("/jobs/quick-one/stack")
        assert refused.status_code == 409 and "completed, and no stack was taken" in refused.json()["detail"]
        assert client.get("/jobs/%2E%2E/stack").status_code in (404, 422)


def test_the_cli_prints_every_thread_s_stack(server: Server) -> None:
    start_ticking(server, "stacked-cli")
    try:
        shown = cli(server, "stack", "stacked-cli")
        assert shown.returncode == 0, shown.stderr
        assert "MainThread" in shown.stdout and TICKING in shown.stdout and ", in call" in shown.stdout
        as_json = cli(server, "stack", "stacked-cli", "--json")
        assert as_json.returncode == 0 and '"threads"' in as_json.stdout, as_json.stderr
    finally:
        with server.client() as client:
            body = {"crew_id": "demo-slow", "action_id": "stacked-cli", "reason": "done"}
            client.post("/jobs/stacked-cli/cancel", json=body)
    after = cli(server, "stack", "stacked-cli")
    assert after.returncode == 0 and "before its cancel" in after.stdout, after.stdout + after.stderr
