"""Per-crew concurrency on a real supervisor with real CrewAI workers (``CREW_MAX_CONCURRENCY``): one crew bound to
one worker, another beside it. The bound crew's second job waits while the other crew's job starts and ends; a
waiting job cancelled frees nothing; the next one starts once its crew's slot frees; ``top`` says who waits on
what; a drain ends the waiting ones as before. A bound naming a crew not served stops the start in one line."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.testing import Server
from tests.conftest import ROOT, gone, start_body, start_server, wait_until

pytestmark = pytest.mark.usefixtures("launcher")

SLOW, QUICK = "demo-slow", "demo"  # the bound crew (its jobs tick for as long as asked), and one that answers at once
EXIT_SECONDS = 300  # a refused start imports CrewAI in its fork server first: minutes on a loaded machine


def admit(client: httpx.Client, action_id: str, crew: str = SLOW) -> None:
    """Start a job and return once it is admitted (hanging up a stream leaves the job as it is)."""
    body = start_body(crew, action_id, input={"topic": "turns", "seconds": 600})
    with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": action_id}) as response:
        assert response.status_code == 200, response.read()


def phase(client: httpx.Client, action_id: str) -> str | None:
    return client.get(f"/jobs/{action_id}").json()["phase"]


def started_pid(client: httpx.Client, action_id: str) -> int:
    def started() -> list[dict[str, Any]]:
        return [e for e in client.get(f"/jobs/{action_id}/events").json()["events"] if e["event"] == "started"]

    assert wait_until(lambda: bool(started()), timeout=120), f"{action_id} never started"
    return int(started()[0]["data"]["pid"])


def waiting(client: httpx.Client) -> dict[str, Any]:
    return {worker["action_id"]: worker["waiting"] for worker in client.get("/workers").json()["workers"]}


def top(server: Server) -> str:
    env = {"PYTHONPATH": str(ROOT), "AIP_CREWAI_URL": server.url, "AIP_CREWAI_BEARER_TOKEN": server.token}
    shown = subprocess.run(
        [sys.executable, "-m", "supervisor", "top", "--once"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_a_bound_crew_waits_while_another_crew_runs_and_takes_its_turn(tmp_path: Path) -> None:
    env = {"AIP_CREWAI_CREW_MAX_CONCURRENCY": f"{SLOW}=1", "AIP_CREWAI_DRAIN_SECONDS": "300"}
    server = start_server(tmp_path / "state", env=env)
    with server.client() as client:
        assert client.get("/health").json()["crew_max_concurrency"] == {SLOW: 1}
        admit(client, "slow-1")
        first = started_pid(client, "slow-1")
        admit(client, "slow-2")
        # The other crew's job starts and ends while slow-2 waits for its crew's one slot.
        quick = client.post(
            "/jobs", json=start_body(QUICK, "quick", input={"topic": "turns"}), headers={"Idempotency-Key": "q"}
        )
        assert quick.status_code == 200 and client.get("/jobs/quick").json()["status"] == "completed", quick.text
        assert phase(client, "slow-2") == "queued"
        assert waiting(client)["slow-2"] == {"on": "crew", "running": 1, "limit": 1}
        assert f'crew_supervisor_crew_jobs_queued{{crew="{SLOW}"}} 1.0' in client.get("/metrics").text

        # A waiting job cancelled frees nothing: slow-3 still waits for slow-1, which runs on.
        admit(client, "slow-3")
        cancelled = client.post("/jobs/slow-2/cancel", json={"action_id": "slow-2", "crew_id": SLOW}).json()
        assert cancelled["status"] == "cancelled" and cancelled["terminal"]["launched"] is False
        assert phase(client, "slow-3") == "queued" and phase(client, "slow-1") == "running"
        assert f"slow-3 waits for crew {SLOW} (1/1 running)" in top(server)

        # slow-1 ends: its crew's slot goes to slow-3.
        client.post("/jobs/slow-1/cancel", json={"action_id": "slow-1", "crew_id": SLOW})
        third = started_pid(client, "slow-3")
        assert gone(first) and third != first

        # A drain with a job waiting for its crew: it fails, certain, while slow-3 runs on until the second signal.
        admit(client, "slow-4")
        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: client.get("/jobs/slow-4").json()["status"] == "failed", timeout=30)
        terminal = client.get("/jobs/slow-4").json()["terminal"]
        assert terminal["error_type"] == "supervisor_stopped" and terminal["uncertain_outcome"] is False
        assert terminal["launched"] is False and phase(client, "slow-3") == "running"
    server.process.send_signal(signal.SIGTERM)  # the second: the wait ends, slow-3 is killed
    assert server.process.wait(60) == -signal.SIGTERM
    assert wait_until(lambda: gone(third), timeout=10)


def test_a_bound_for_a_crew_not_served_stops_the_start_naming_it(tmp_path: Path) -> None:
    env = {"AIP_CREWAI_CREW_MAX_CONCURRENCY": f"{SLOW}=1,demo-slwo=2"}
    server = start_server(tmp_path / "state", env=env, wait=False)
    try:
        returncode = server.process.wait(EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("a bound for a crew not served did not stop the start") from None
    assert returncode == 1
    last = server.log_tail().strip().splitlines()[-1]
    assert last.startswith(
        "crew-supervisor: AIP_CREWAI_CREW_MAX_CONCURRENCY names crews not served: demo-slwo (served:"
    )
    assert f" {SLOW}," in last and "; fix: " in last
