"""Graceful drain on SIGTERM: running jobs get DRAIN_SECONDS to finish while the server still serves them,
new starts answer 503, queued jobs fail (certain), what outlasts the grace is killed with evidence, and a
second signal ends the wait. DRAIN_SECONDS=0 (today's behaviour) is test_restart's SIGTERM test."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import pytest

from supervisor.testing import Server
from tests.conftest import gone, sse_events, start_body, start_server, wait_until

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}


def drain_server(tmp_path: Any, seconds: float, **settings: str) -> Server:
    env = {"AIP_CREWAI_DRAIN_SECONDS": str(seconds), **{f"AIP_CREWAI_{k}": v for k, v in settings.items()}}
    return start_server(tmp_path / "state", env=env)


def post_blocking(server: Server, body: dict[str, Any]) -> httpx.Response:
    """A blocking start from a client of its own (its answer is the job's end)."""
    with server.client() as client:
        return client.post("/jobs", json=body, headers=KEY)


def started_pid(client: httpx.Client, action_id: str, timeout: float = 60) -> int:
    """The worker's pid once the job's `started` event is in the journal."""

    def started() -> list[dict[str, Any]]:
        response = client.get(f"/jobs/{action_id}/events")
        return [e for e in response.json().get("events", []) if e["event"] == "started"]

    assert wait_until(lambda: bool(started()), timeout=timeout), f"{action_id} never started"
    return int(started()[0]["data"]["pid"])


def log_records(server: Server) -> list[dict[str, Any]]:
    records = []
    for line in server.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def logged(server: Server, event: str) -> dict[str, Any] | None:
    """The first log record whose message starts with ``event``."""
    return next((r for r in log_records(server) if r["event"].startswith(event)), None)


def test_a_job_that_finishes_inside_the_drain_completes_while_new_starts_are_refused(tmp_path: Any) -> None:
    server = drain_server(tmp_path, 30, MAX_CONCURRENCY="1")
    with ThreadPoolExecutor(1) as pool, server.client() as client:
        body = start_body("demo-slow", "short", input={"seconds": 4})
        blocking: Future[httpx.Response] = pool.submit(post_blocking, server, body)
        pid = started_pid(client, "short")
        # Admitted behind the only slot: it waits in the queue.
        with client.stream("POST", "/jobs/stream", json=start_body("demo", "queued"), headers=KEY) as queued:
            assert queued.status_code == 200
        signalled_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

        # Still serving while the job runs: /health says draining, a new start is a 503 with Retry-After.
        assert wait_until(lambda: client.get("/health").json()["status"] == "draining", timeout=10)
        refused = client.post("/jobs", json=start_body("demo", "late"), headers=KEY)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        # The queued job never started: failed, and certain of it.
        assert wait_until(lambda: client.get("/jobs/queued").json()["status"] == "failed", timeout=10)
        waiting = client.get("/jobs/queued").json()
        assert waiting["terminal"]["error_type"] == "supervisor_stopped"
        assert waiting["terminal"]["uncertain_outcome"] is False and waiting["terminal"]["launched"] is False
        # An exact repeat of the running job observes it (idempotency) and streams to its end.
        with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as repeat:
            assert repeat.status_code == 200
            events = list(sse_events(repeat))
        assert events[0]["data"]["pid"] == pid and events[-1]["event"] == "completed"

        answer = blocking.result(timeout=30)
    assert answer.status_code == 200 and answer.json()["raw"]
    # The drain ended with its last job, well before its 30 s.
    assert server.process.wait(30) == -signal.SIGTERM
    assert time.monotonic() - signalled_at < 20
    assert wait_until(lambda: gone(pid), timeout=10)

    received = logged(server, "received SIGTERM")
    began, ended = logged(server, "drain began"), logged(server, "drain ended")
    assert received is not None and received["signal"] == "SIGTERM"
    assert began is not None and began["seconds"] == 30 and began["running"] == 1 and began["queued"] == 1
    assert ended is not None and ended["reason"] == "jobs_finished" and ended["running"] == 0
    assert logged(server, "killing a job") is None
    assert received["time"] <= began["time"] <= ended["time"]
    assert not [r for r in log_records(server) if r["level"] == "error"]


def test_a_job_that_outlasts_the_drain_is_killed_with_evidence(tmp_path: Any) -> None:
    server = drain_server(tmp_path, 2)
    with ThreadPoolExecutor(1) as pool, server.client() as client:
        blocking = pool.submit(post_blocking, server, start_body("demo-slow", "long", input={"seconds": 600}))
        pid = started_pid(client, "long")
        worker = psutil.Process(pid)
        signalled_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answer = blocking.result(timeout=30)
        killed_after = time.monotonic() - signalled_at
    # The waiting client is answered with the kill's evidence, after the grace and not long after.
    assert answer.status_code == 502
    terminal = answer.json()["terminal"]
    assert terminal["error_type"] == "supervisor_stopped" and terminal["uncertain_outcome"] is True
    assert terminal["stop_confirmed"] is True and terminal["pid"] == pid and terminal["signal"] == "SIGKILL"
    assert 2 <= killed_after < 12
    assert server.process.wait(30) == -signal.SIGTERM
    assert wait_until(lambda: gone(pid, worker.create_time()), timeout=10)

    ended = logged(server, "drain ended")
    assert ended is not None and ended["reason"] == "grace_expired" and ended["running"] == 1
    assert ended["duration_ms"] >= 2000
    killing = logged(server, "killing a job")
    assert killing is not None and killing["action_id"] == "long" and killing["pid"] == pid
    finished = next(r for r in log_records(server) if r["event"] == "job finished")
    assert finished["error_type"] == "supervisor_stopped" and finished["signal"] == "SIGKILL"
    assert not [r for r in log_records(server) if r["level"] == "error"]


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_skips_the_wait(tmp_path: Any, second: signal.Signals) -> None:
    server = drain_server(tmp_path, 300)
    with server.client() as client:
        body = start_body("demo-slow", "long", input={"seconds": 600})
        with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
            assert response.status_code == 200  # admitted; hanging up leaves the job running
        pid = started_pid(client, "long")
    signalled_at = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    # Two SIGTERMs sent at once may arrive as one: the second goes once the first was handled.
    assert wait_until(lambda: logged(server, "drain began") is not None, timeout=10)
    server.process.send_signal(second)
    # Both signals are re-raised at exit, the last first: the process ends with the second.
    assert server.process.wait(30) == -second
    assert time.monotonic() - signalled_at < 20  # nowhere near the 300 s drain
    assert wait_until(lambda: gone(pid), timeout=10)
    again, ended = logged(server, f"received {second.name} again"), logged(server, "drain ended")
    assert again is not None and ended is not None and ended["reason"] == "skipped" and ended["running"] == 1
    finished = next(r for r in log_records(server) if r["event"] == "job finished")
    assert finished["action_id"] == "long" and finished["error_type"] == "supervisor_stopped"
    assert finished["signal"] == "SIGKILL"
    assert not [r for r in log_records(server) if r["level"] == "error"]
