"""Crash and restart: kill -9 of the supervisor mid-job, restart fencing, and the journal's lock."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

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
    first.stop(signal.SIGKILL)
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
    for env, named in cases:
        result = subprocess.run(
            [sys.executable, "-m", "supervisor", "serve"],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("crew-supervisor:") and named in last, result.stderr[-2000:]
