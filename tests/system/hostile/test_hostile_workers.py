"""Workers that break on purpose: each job fails with its own error type, no process of it remains,
and a normal job running beside it completes. Crews: ``tests/crews/hostile.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.processes.pipes import STALL_SECONDS
from tests.conftest import (
    ROOT,
    Server,
    gone,
    release_once_sampled,
    run_with_neighbour,
    sse_events,
    start_body,
    start_hostile_server,
    start_server,
    stop_server,
    wait_until,
)
from tests.crews.hostile import DAEMON_SEEN


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, evidence: Path) -> Iterator[Server]:
    running = start_hostile_server(
        tmp_path_factory.mktemp("state") / "s",
        evidence,
        STOP_GRACE_MS="200",
        MAX_EVENTS_PER_RUN="50",
        STRAY_PROCESSES="fail",  # runaway-daemon fails as it did before its answer was kept
        WORKER_MAX_MEMORY_MB="400",
        WORKER_MAX_OUTPUT_BYTES=str(8 * 1024 * 1024),
    )
    yield running
    stop_server(running)


def worker_pid(server: Server, action_id: str) -> int | None:
    with server.client() as client:
        events = client.get(f"/jobs/{action_id}/events").json()["events"]
    return next((e["data"]["pid"] for e in events if e["event"] == "started"), None)


CASES = [
    ("broken-segfault", "worker_crashed"),
    ("broken-exit3", "worker_exited"),
    ("broken-garbage", "frame_invalid"),
    ("broken-oversized", "frame_too_large"),
    ("broken-truncated", "frame_truncated"),
    ("broken-unknown-message", "protocol_unknown_message"),
    ("broken-old-version", "protocol_version_mismatch"),
    ("broken-second-terminal", "protocol_duplicate_terminal"),
    ("broken-forged-reason", "protocol_error"),  # it claimed memory_limit_exceeded: never taken from a worker
    ("broken-close-pipe", "frame_pipe_closed"),
    ("runaway-memory", "memory_limit_exceeded"),
    ("runaway-events", "event_limit_exceeded"),
    ("runaway-stdout-endless", "output_limit_exceeded"),
    ("runaway-daemon", "stray_processes"),
    ("broken-factory", "crew_factory_failed"),
]


def test_reasons_are_distinct() -> None:
    assert len({error for _, error in CASES}) == len(CASES)


@pytest.mark.parametrize(("crew", "reason"), CASES)
def test_a_broken_worker_fails_only_its_own_job(server: Server, evidence: Path, crew: str, reason: str) -> None:
    # The daemon's worker waits until a sample has counted its daemon (crews/hostile.py: _daemon_seen_by_a_sample).
    seen = release_once_sampled(server, crew, 2, evidence / DAEMON_SEEN) if crew == "runaway-daemon" else None
    terminal = run_with_neighbour(server, start_body(crew, crew))
    if seen is not None:
        seen.result()  # the crew went on because a sample had counted its daemon
    assert terminal["reason"] == reason, terminal
    pid = worker_pid(server, crew)
    assert pid is not None or crew == "broken-factory"  # a factory fails before `started`
    if pid is not None:
        assert wait_until(lambda: gone(pid), timeout=5)
    if reason == "worker_crashed":
        assert terminal["exit_signal"] == "SIGSEGV"
    if reason == "worker_exited":
        assert terminal["exit_status"] == 3
    if crew == "runaway-daemon":  # named in the record as when its answer is kept (tests/system/runaway)
        with server.client() as client:
            (named,) = client.get(f"/jobs/{crew}").json()["leftovers"]["processes"]
        assert named["left"] == "own_session" and named["pid"] == int((evidence / "daemon.pids").read_text()), named
    if crew == "broken-forged-reason":
        assert terminal["worker_reason"] == "memory_limit_exceeded", terminal
    if reason == "frame_truncated":
        assert f"{STALL_SECONDS:g} s" in terminal["message"]


def test_a_crew_that_blames_its_sandbox_is_not_believed(server: Server) -> None:
    """Only a worker that has not yet run the crew's code can find its sandbox refused: said later, it is the crew's."""
    terminal = run_with_neighbour(server, start_body("broken-forged-sandbox", "forged-sandbox"))
    assert terminal["reason"] == "protocol_error" and terminal["worker_reason"] == "sandbox_failed", terminal


def test_a_worker_killed_from_outside_is_reported_as_killed(server: Server) -> None:
    with (
        server.client() as client,
        client.stream(
            "POST", "/jobs/stream", json=start_body("stubborn", "outside-kill"), headers={"Idempotency-Key": "k"}
        ) as stream,
    ):
        for event in sse_events(stream):
            if event["event"] == "started":
                os.kill(event["data"]["pid"], signal.SIGKILL)
            if event["event"] == "failed":
                assert event["data"]["error_type"] == "worker_killed"
                assert event["data"]["exit_signal"] == "SIGKILL"
                assert gone(event["data"]["pid"])
                return
    pytest.fail("the stream ended without a terminal event")


def test_a_worker_ignoring_sigterm_is_killed_at_its_timeout(server: Server) -> None:
    # Its factory ignores SIGTERM; the timeout must come after it ran (a loaded machine's fork and build: seconds).
    run_with_neighbour(server, start_body("stubborn", "deaf", timeout_ms=4000), status=502)
    with server.client() as client:  # the blocking wait ends once the timeout's kill is confirmed
        terminal = client.get("/jobs/deaf").json()["terminal"]
    assert terminal["reason"] == "timeout" and terminal["signal"] == "SIGKILL"  # the grace did not help
    assert terminal["stop_confirmed"] is True and gone(terminal["pid"])


def test_a_registry_that_stops_importing_fails_jobs_with_registry_error(tmp_path: Path) -> None:
    """Cold-spawned workers import the registry per job: one that broke since startup fails only that job."""
    evidence = tmp_path / "evidence"  # apart from the state directory, which no worker may read
    evidence.mkdir()
    env = {
        "AIP_CREWAI_REGISTRY": "tests.crews.flaky:registry",
        "AIP_CREWAI_LAUNCHER": "spawn",
        "CREW_TEST_EVIDENCE_DIR": str(evidence),
    }
    server = start_server(tmp_path / "state", env=env)
    (evidence / "break-registry").touch()
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("demo", "no-registry"), headers={"Idempotency-Key": "k"})
        assert answer.status_code == 502
        terminal: dict[str, Any] = answer.json()["terminal"]
        assert terminal["error_type"] == "registry_error" and "ImportError" in terminal["message"]
        assert client.get("/health").status_code == 200
    server.stop()


def test_a_registry_that_cannot_import_stops_startup_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "break-registry").touch()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AIP_CREWAI_REGISTRY": "tests.crews.flaky:registry",
        "AIP_CREWAI_ALLOW_EPHEMERAL": "true",
        "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true",
        "CREW_TEST_EVIDENCE_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "serve"], env=env, cwd=ROOT, capture_output=True, timeout=120
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr.decode() and "Traceback" not in result.stderr.decode()
