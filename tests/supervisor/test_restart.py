"""Crash and restart: kill -9 of the supervisor mid-job, restart fencing, and the journal's lock."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, gone, start_body, start_server, wait_until

pytestmark = pytest.mark.usefixtures("launcher")

KEY = {"Idempotency-Key": "key-1"}


def test_kill9_mid_job_then_restart_fences_the_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_server(state)
    with first.client() as client:
        client.post("/jobs", json=start_body("demo", "done-1"), headers=KEY)
        with client.stream("POST", "/jobs/stream", json=start_body("demo-slow", "crash-1"), headers=KEY) as response:
            for line in response.iter_lines():
                if line.startswith("event: chunk"):
                    break
        pid = client.get("/jobs/crash-1/events").json()["events"][0]["data"]["pid"]
    first.kill()
    assert wait_until(lambda: gone(pid), timeout=10), "worker outlived the killed supervisor"

    second = start_server(state)
    try:
        with second.client() as client:
            record = client.get("/jobs/crash-1").json()
            assert record["status"] == "failed"
            assert record["terminal"]["uncertain_outcome"] is True
            assert record["terminal"]["error_type"] == "supervisor_restarted"
            assert record["terminal"]["orphan_killed"] is False  # PDEATHSIG got there first
            events = client.get("/jobs/crash-1/events").json()["events"]
            assert [e["sequence"] for e in events] == list(range(len(events)))
            assert events[-1]["event"] == "failed"
            assert client.get("/jobs/done-1").json()["status"] == "completed"  # nothing acknowledged was lost

        # A second supervisor on the same state refuses to start, and says why.
        rival = subprocess.run(
            [sys.executable, "-m", "supervisor", "serve"],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "AIP_CREWAI_REGISTRY": "tests.crews:registry",
                "AIP_CREWAI_STATE_FILE": str(state / "journal.db"),
                "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true",
                "AIP_CREWAI_PORT": "0",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rival.returncode != 0 and "in use by another supervisor" in rival.stderr
    finally:
        second.stop()


def test_state_files_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_server(state)
    server.stop()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("journal.db", "journal.db.lock"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600


def test_bad_startup_fails_with_one_clear_line(tmp_path: Path) -> None:
    base = {**os.environ, "PYTHONPATH": str(ROOT), "AIP_CREWAI_STATE_FILE": str(tmp_path / "s" / "j.db")}
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir(mode=0o700)
    (corrupt / "j.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    (corrupt / "j.db").chmod(0o600)
    cases = [
        (
            {
                "AIP_CREWAI_REGISTRY": "tests.crews:registry",
                "AIP_CREWAI_BEARER_TOKEN": "t",
                "AIP_CREWAI_STATE_FILE": str(corrupt / "j.db"),
            },
            "j.db",
        ),
        ({"AIP_CREWAI_REGISTRY": "tests.crews:registry"}, "AIP_CREWAI_BEARER_TOKEN"),
        (
            {"AIP_CREWAI_REGISTRY": "tests.crews:registry", "AIP_CREWAI_BEARER_TOKEN": "t", "AIP_CREWAI_PORT": "x"},
            "AIP_CREWAI_PORT",
        ),
        ({"AIP_CREWAI_REGISTRY": "no_such_module:registry", "AIP_CREWAI_BEARER_TOKEN": "t"}, "no_such_module"),
    ]
    flagged = [({"AIP_CREWAI_REGISTRY": "tests.crews:registry"}, ["--bearer-token", "t"], "--bearer-token-file")]
    for env, flags, named in [(env, [], named) for env, named in cases] + flagged:
        result = subprocess.run(
            [sys.executable, "-m", "supervisor", "serve", *flags],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("crew-supervisor:") and named in last, result.stderr[-2000:]


# A handler the supervisor finds installed when it starts, as coverage's or a host's would be: it notes that it ran.
EMBEDDER = """
import os, pathlib, signal, sys

def _handled(sig, frame):
    (pathlib.Path(__file__).parent / "handled").write_text(str(os.getpid()))
    signal.signal(sig, found)  # coverage's, under scripts/coverage: it saves its data, then ends us
    os.kill(os.getpid(), sig)

if sys.orig_argv[1:4] == ["-m", "supervisor", "serve"]:
    found = signal.signal(signal.SIGTERM, _handled)
"""


def test_sigterm_drains_kills_with_evidence_and_restart_reports_uncertain(tmp_path: Path) -> None:
    """DRAIN_SECONDS=0: no wait for running jobs, every one is killed at once (tests/supervisor/test_drain.py
    has the drain's wait)."""
    state = tmp_path / "state"
    # The worker's grace makes the stop last long enough to see a 503: the stubborn crew ignores SIGTERM.
    env = {"AIP_CREWAI_STOP_GRACE_MS": "2000", "AIP_CREWAI_MAX_CONCURRENCY": "1", "AIP_CREWAI_DRAIN_SECONDS": "0"}
    embedder = tmp_path / "embedder"
    embedder.mkdir()
    (embedder / "sitecustomize.py").write_text(EMBEDDER)
    server = start_server(state, env=env, path=[str(embedder)])
    with (
        server.client() as client,
        client.stream("POST", "/jobs/stream", json=start_body("stubborn", "term-1"), headers=KEY) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if line == "event: started":
                break
        with client.stream("POST", "/jobs/stream", json=start_body("demo", "term-2"), headers=KEY) as queued:
            assert queued.status_code == 200  # admitted; it waits for the only slot
        tree = psutil.Process(server.process.pid).children(recursive=True)
        stopped_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: client.get("/health").json()["status"] == "draining", timeout=10)
        assert client.post("/jobs", json=start_body("demo", "term-3"), headers=KEY).status_code == 503
        rest = list(lines)
    # uvicorn ends the process with the signal it handled, after the drain and the journal's close.
    assert server.process.wait(30) == -signal.SIGTERM and time.monotonic() - stopped_at < 30
    # ...through the SIGTERM handler it found at start (as coverage's saves its data), not around it.
    assert (embedder / "handled").read_text() == str(server.process.pid)
    assert "event: failed" in rest  # the stream ended with the job, not with the connection
    assert all(gone(p.pid, p.create_time()) for p in tree), "a worker outlived the supervisor"
    records = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    (ended,) = [r for r in records if r["event"] == "drain ended"]
    # DRAIN_SECONDS=0: no wait at all (a drain that waited would wait for a job that never ends); the ceiling
    # is only a hang's, loose enough for a loaded machine.
    assert ended["reason"] == "grace_expired" and ended["duration_ms"] < 10_000 and ended["running"] == 1

    restarted = start_server(state, env=env)
    try:
        with restarted.client() as client:
            running = client.get("/jobs/term-1").json()["terminal"]
            assert running["error_type"] == "supervisor_stopped" and running["uncertain_outcome"] is True
            assert running["stop_confirmed"] is True and running["signal"] == "SIGKILL"  # SIGTERM was ignored
            waiting = client.get("/jobs/term-2").json()["terminal"]
            assert waiting["error_type"] == "supervisor_stopped" and waiting["uncertain_outcome"] is False
            assert waiting["launched"] is False
            assert client.get("/jobs/term-3").status_code == 404
    finally:
        restarted.stop()
