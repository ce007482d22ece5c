"""The CLI's followers wait out a supervisor's restart (kill -9, then a new one on the same journal and port): they
say once that they reconnect, resume after the last event seen, and report the job's outcome; one whose --wait is
shorter than the outage gives up in one line."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.console.reconnect import NOTICE_SECONDS
from supervisor.testing import free_port
from tests.conftest import ROOT, Server, start_server, wait_until
from tests.supervisor.console.test_cli import assert_whole, cli_env, command, json_lines

pytestmark = pytest.mark.usefixtures("launcher")

ACTION = "cli-restarted"


class Follower:
    """A CLI command in the background, its stdout and stderr in files a test reads while it runs."""

    def __init__(self, tmp_path: Path, name: str, server: Server, *args: str) -> None:
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(command(*args), env=cli_env(server), cwd=ROOT, stdout=out, stderr=err)

    def said(self) -> str:
        return self.err.read_text()

    def wrote(self) -> str:
        return self.out.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def test_followers_wait_out_a_restart_and_report_the_fenced_outcome(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_server(state, port=free_port())
    slow = '{"seconds": 600}'
    run = Follower(tmp_path, "run", first, "run", "demo-slow", "--input", slow, "--action-id", ACTION, "--wait", "5m")
    followers = [run]
    try:
        with first.client() as client:
            running = lambda: client.get(f"/jobs/{ACTION}").json().get("event_count", 0) > 2  # noqa: E731
            assert wait_until(running, timeout=120), run.said()
        events = Follower(tmp_path, "events", first, "events", ACTION, "--follow", "--json", "--wait", "5m")
        # Longer than the 8 reconnects (~21 s) the CLI once gave up after: the others outlast it.
        short = Follower(tmp_path, "short", first, "events", ACTION, "--follow", "--wait", "25s")
        followers += [events, short]
        assert wait_until(lambda: len(json_lines(events.wrote())) > 2 and "tick" in short.wrote(), timeout=60)

        first.kill()
        lost_at = time.monotonic()
        # The short bound gives up while the supervisor is down; the others go on reconnecting meanwhile.
        assert short.process.wait(90) == 1
        *notices, gave_up = short.said().strip().splitlines()
        assert "lost the link; reconnecting to " + first.url in notices[0] and len(notices) <= 3, notices
        assert re.fullmatch(
            rf"crew-supervisor: gave up reconnecting to {first.url} after [\d.]+s \(--wait 25s\): .+", gave_up
        )
        assert run.process.poll() is None and events.process.poll() is None
        assert wait_until(lambda: "reconnecting" in run.said() and "reconnecting" in events.said(), timeout=30)

        second = start_server(state, port=first.port, token=first.token)
        assert events.process.wait(120) == 3 and run.process.wait(120) == 3  # the restart fenced the job: failed
        outage = time.monotonic() - lost_at
        streamed = json_lines(events.wrote())
        assert_whole(streamed, "failed")  # every event once, in order: none lost or repeated across the outage
        assert streamed[-1]["data"]["error_type"] == "supervisor_restarted"
        with second.client() as client:
            assert client.get(f"/jobs/{ACTION}/events").json()["events"] == streamed
        said = run.wrote().splitlines()
        assert (
            said[0] == f"started {ACTION} (demo-slow, run)" and sum(line.startswith("started ") for line in said) == 1
        )
        assert "failed after" in run.wrote() and "supervisor_restarted" in run.wrote()
        for follower in (run, events):
            lines = follower.said().strip().splitlines()
            assert "lost the link; reconnecting" in lines[0] and sum("lost the link" in line for line in lines) == 1
            assert re.search(r"reconnected to \S+ after [\dhms.]+; resumed after event \d+", lines[-1]), lines
            assert len(lines) <= 2 + outage / NOTICE_SECONDS, lines  # one line each NOTICE_SECONDS, not a flood
    finally:
        for follower in followers:
            follower.stop()
