"""The operator CLI as a subprocess against a real supervisor (default fork server launcher)."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from supervisor.console.durations import spoken
from supervisor.console.views import clock
from supervisor.testing import free_port
from tests.conftest import ROOT, Server, gone, sse_events, wait_until

EXIT_CANCELLED = 4


# One crew bounded by CREW_MAX_CONCURRENCY, for `crews` to show (no test here runs it).
pytestmark = pytest.mark.crew_supervisor(crew_max_concurrency="llm-loop-calls=1")


def cli_env(server: Server, url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_CREWAI_")}
    target = {"AIP_CREWAI_URL": url or server.url, "AIP_CREWAI_BEARER_TOKEN": server.token}
    return {**env, "PYTHONPATH": str(ROOT), **target}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


def cli(server: Server, *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        env=cli_env(server, url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def assert_whole(events: list[dict[str, Any]], outcome: str) -> None:
    """Every event once, in order, ending with the terminal one."""
    assert [e["sequence"] for e in events] == list(range(len(events)))
    assert events[0]["event"] == "started" and events[-1]["event"] == outcome


def test_run_then_jobs_show_and_events(server: Server, tmp_path: Path) -> None:
    (tmp_path / "input.json").write_text('{"topic": "queues"}')
    ran = cli(server, "run", "demo", "--input", str(tmp_path / "input.json"), "--action-id", "cli-run", "--json")
    assert ran.returncode == 0, ran.stderr
    events = json_lines(ran.stdout)
    assert_whole(events, "completed")
    assert "queues" in str(events[-1]["data"]["tasks_output"])

    listed = cli(server, "jobs", "--json", "--crew", "demo", "--status", "completed")
    assert listed.returncode == 0 and "cli-run" in [job["action_id"] for job in orjson.loads(listed.stdout)["jobs"]]
    # `top`'s word, asked of the API as a phase: none waits now (tests/supervisor/jobs lists a queued job this way).
    queued = cli(server, "jobs", "--json", "--crew", "demo", "--status", "queued")
    assert queued.returncode == 0 and orjson.loads(queued.stdout)["jobs"] == []
    table = cli(server, "show", "cli-run")
    assert table.returncode == 0 and "completed" in table.stdout and "Writer reports finding" in table.stdout
    replayed = cli(server, "events", "cli-run", "--json")
    assert replayed.returncode == 0 and json_lines(replayed.stdout) == events


def test_show_of_a_failed_job_ends_with_the_crews_exception(server: Server) -> None:
    """The event keeps the reference's generic words; ``show`` adds the end of the worker's stderr, where the crew's
    exception is whole, traceback and message."""
    with server.client() as client:
        client.post("/jobs", json={"crew_id": "boom", "action_id": "cli-boom"}, headers={"Idempotency-Key": "boom"})
    shown = cli(server, "show", "cli-boom")
    assert shown.returncode == 0 and "CrewAI operation failed" in shown.stdout, shown.stderr
    assert "its stderr ends with:" in shown.stdout and "Traceback (most recent call last):" in shown.stdout
    assert "RuntimeError: provider said: secret-token-123" in shown.stdout


def test_follow_top_and_cancel(server: Server, tmp_path: Path) -> None:
    (tmp_path / "slow.json").write_text('{"seconds": 60}')
    started = subprocess.Popen(
        command("run", "demo-slow", "--input", str(tmp_path / "slow.json"), "--action-id", "cli-slow", "--json"),
        env=cli_env(server),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    follower: subprocess.Popen[str] | None = None
    try:
        with server.client() as client:
            assert wait_until(lambda: client.get("/jobs/cli-slow").status_code == 200, timeout=30)
            follower = subprocess.Popen(
                command("events", "cli-slow", "--follow"),
                env=cli_env(server),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert wait_until(lambda: client.get("/jobs/cli-slow").json()["event_count"] > 2, timeout=30)
            pid = client.get("/jobs/cli-slow/events").json()["events"][0]["data"]["pid"]

        frame = cli(server, "top", "--once", "--json")
        (mine,) = [w for w in orjson.loads(frame.stdout)["workers"] if w["action_id"] == "cli-slow"]
        assert frame.returncode == 0 and mine["pid"] == pid and mine["phase"] == "running"
        table = cli(server, "top", "--once")
        assert table.returncode == 0 and "cli-slow" in table.stdout and str(pid) in table.stdout

        cancelled = cli(server, "cancel", "cli-slow", "--reason", "operator said so")
        assert cancelled.returncode == 0, cancelled.stderr
        assert "cancelled" in cancelled.stdout and "stop confirmed: True" in cancelled.stdout
        assert re.search(r", \d+ descendants? killed\)", cancelled.stdout), cancelled.stdout
        assert gone(pid)
        # Both followers end at the terminal event with the cancelled exit code.
        assert follower.wait(30) == EXIT_CANCELLED and started.wait(30) == EXIT_CANCELLED
        shown = follower.stdout.read() if follower.stdout else ""
        assert "tick 1/" in shown and "cancelled after" in shown and "operator said so" in shown
    finally:
        for process in (started, follower):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_run_detach_prints_the_id_once_admitted_and_the_job_goes_on(server: Server) -> None:
    detached = cli(server, "run", "demo-slow", "--input", '{"seconds": 60}', "--detach")
    assert detached.returncode == 0, detached.stderr
    action = detached.stdout.strip()
    assert re.fullmatch(r"cli-[0-9a-f-]{36}", action), detached.stdout  # the id alone, for $(...)
    as_json = cli(server, "run", "demo-slow", "--input", '{"seconds": 60}', "--detach", "--action-id", "j-1", "--json")
    assert as_json.returncode == 0 and orjson.loads(as_json.stdout) == {"action_id": "j-1"}, as_json.stderr
    with server.client() as client:
        for job in (action, "j-1"):
            assert wait_until(lambda job=job: client.get(f"/jobs/{job}").json()["event_count"] > 1, timeout=30)
            assert client.get(f"/jobs/{job}").json()["status"] == "running"  # it runs on, nobody following
    assert cli(server, "cancel", "--crew", "demo-slow").returncode == 0


def test_jobs_says_why_a_job_failed_and_top_never_cuts_a_crew_id(server: Server) -> None:
    failed = cli(server, "run", "boom", "--action-id", "why-in-the-list")
    assert failed.returncode == 3, failed.stderr
    listed = cli(server, "jobs", "--crew", "boom")
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("why-in-the-list ")]
    assert "failed" in row and "operation_failed" in row, listed.stdout

    # An action id shorter than its crew id and operation: the column once took the id's width, cutting the crew.
    detached = cli(server, "run", "demo-slow", "--input", '{"seconds": 60}', "--detach", "--action-id", "t1")
    assert detached.returncode == 0, detached.stderr
    try:
        with server.client() as client:
            assert wait_until(lambda: client.get("/jobs/t1").json()["event_count"] > 1, timeout=30)
        for columns in ("30", "60", "200"):  # at 30 the job column was squeezed out, ids and all
            env = {**cli_env(server), "COLUMNS": columns}
            frame = subprocess.run(command("top", "--once"), env=env, cwd=ROOT, capture_output=True, text=True)
            assert frame.returncode == 0 and "demo-slow · run" in frame.stdout, frame.stdout
            assert max(map(len, frame.stdout.splitlines())) <= int(columns)  # it fits the terminal it is given
    finally:
        cli(server, "cancel", "t1")


class DroppingProxy:
    """A flaky link: forwards to the server but cuts every connection after ``budget`` bytes of answer,
    mid-event as often as not (however fast the events come, so the test does not depend on timing)."""

    def __init__(self, upstream: str, budget: int) -> None:
        self.upstream = ("127.0.0.1", int(upstream.rsplit(":", 1)[1]))
        self.budget = budget
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._pump, args=(near,), daemon=True).start()

    def _pump(self, near: socket.socket) -> None:
        far = socket.create_connection(self.upstream)
        left = self.budget
        with selectors.DefaultSelector() as selector, near, far:
            selector.register(near, selectors.EVENT_READ, far)
            selector.register(far, selectors.EVENT_READ, near)
            while left > 0:
                for key, _ in selector.select(30):
                    try:
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    except ConnectionResetError:  # the client hung up at once: the drop it is here for
                        return
                    if not data:
                        return
                    if key.fileobj is far:
                        data, left = data[:left], left - len(data)
                    key.data.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_events_follow_resumes_after_dropped_connections(server: Server, tmp_path: Path) -> None:
    with server.client() as client:
        body = {"crew_id": "demo-slow", "action_id": "cli-flaky", "input": {"seconds": 3}}
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "k"}) as response:
            assert next(sse_events(response))["event"] == "started"  # then hang up: the job goes on
    proxy = DroppingProxy(server.url, budget=4096)
    try:
        followed = cli(server, "events", "cli-flaky", "--follow", "--json", url=proxy.url)
    finally:
        proxy.close()
    assert followed.returncode == 0, followed.stderr
    assert_whole(json_lines(followed.stdout), "completed")
    assert proxy.connections >= 3  # it really was cut, and resumed each time


def test_errors_are_one_line_and_non_zero(server: Server) -> None:
    for args, url, words in (
        (("jobs", "--token", "wrong"), None, "refused the bearer token"),
        (("show", "no-such-job"), None, "404"),
        (("top", "--once"), f"http://127.0.0.1:{free_port()}", "cannot connect"),
    ):
        result = cli(server, *args, url=url)
        assert result.returncode == 1 and result.stdout == "", args
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr


def test_ctrl_c_in_run_says_the_job_goes_on_and_how_to_cancel_it(server: Server) -> None:
    running = subprocess.Popen(
        command("run", "demo-slow", "--input", '{"seconds": 60}', "--action-id", "cli-interrupted"),
        env=cli_env(server),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with server.client() as client:
            assert wait_until(lambda: client.get("/jobs/cli-interrupted").status_code == 200, timeout=60)
            assert wait_until(lambda: client.get("/jobs/cli-interrupted").json()["event_count"] > 1, timeout=60)
            running.send_signal(signal.SIGINT)
            _, said = running.communicate(timeout=30)
            assert running.returncode == 130, said
            assert said.strip().splitlines()[-1] == (
                "crew-supervisor: stopped following; job cli-interrupted goes on "
                "(crew-supervisor cancel cli-interrupted stops it)"
            )
            assert client.get("/jobs/cli-interrupted").json()["status"] == "running"  # a hang-up cancels nothing
            cancelled = cli(server, "cancel", "cli-interrupted")
            assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stderr
    finally:
        running.kill()
        running.wait()


def test_run_prints_the_answer_or_the_end_of_a_failure_s_stderr(server: Server) -> None:
    ran = cli(server, "run", "demo", "--input", '{"topic": "cli answers"}')
    assert ran.returncode == 0, ran.stderr
    (answer,) = [line for line in ran.stdout.splitlines() if line.startswith("answer: ")]
    assert "Writer reports finding" in answer
    failed = cli(server, "run", "boom")
    assert failed.returncode == 3, failed.stderr
    assert "failed after" in failed.stdout and "RuntimeError" in failed.stdout
    # The cause is the crew's own words, in its stderr, which the terminal event does not carry.
    assert "its stderr ends with:" in failed.stdout and "provider said:" in failed.stdout


def test_output_prints_what_the_worker_wrote(server: Server) -> None:
    failed = cli(server, "run", "boom", "--action-id", "cli-output")
    assert failed.returncode == 3, failed.stderr
    shown = cli(server, "output", "cli-output")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("stdout: ") and "\nstderr: " in shown.stdout and "bytes written" in shown.stdout
    assert "provider said:" in shown.stdout.split("\nstderr: ", 1)[1]  # the crew's own words, under stderr
    only = cli(server, "output", "cli-output", "--stream", "stderr")
    assert only.stdout.startswith("stderr: ") and "stdout: " not in only.stdout
    as_json = orjson.loads(cli(server, "output", "cli-output", "--json").stdout)
    assert as_json["live"] is False and "provider said:" in as_json["stderr"]["text"]
    assert cli(server, "output", "no-such-job").returncode == 1


def test_run_says_started_only_once_the_supervisor_took_the_start(server: Server) -> None:
    """A refused start prints the status and the server's reason in one line, never "started"; so does a refused
    connection. (The 404 names the crew asked for and those served: tests/supervisor/http has its bound.)"""
    with server.client() as client:
        served = client.get("/health").json()["crews"]
    refusals = (
        (("run", "no-such-crew"), None, "404 from /jobs/stream: unknown crew 'no-such-crew'; this supervisor serves: "),
        (("run", "demo", "--action-id", "cli-once", "--input", '{"other": 1}'), None, "409 from /jobs/stream: "),
        (("run", "demo"), f"http://127.0.0.1:{free_port()}", "cannot connect to "),
    )
    first = cli(server, "run", "demo", "--action-id", "cli-once")
    assert first.returncode == 0 and first.stdout.startswith("started cli-once (demo, run)\n"), first.stdout
    for args, url, words in refusals:
        refused = cli(server, *args, url=url)
        assert refused.returncode == 1 and "started" not in refused.stdout, (args, refused.stdout)
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("crew-supervisor: " + words), line
    unknown = cli(server, "run", "no-such-crew").stderr
    assert ", ".join(sorted(served)[:20]) in unknown and f" and {len(served) - 20} more" in unknown


def test_crews_lists_what_the_supervisor_serves(server: Server) -> None:
    with server.client() as client:
        health = client.get("/health").json()
    listed = cli(server, "crews", "--json")
    assert listed.returncode == 0, listed.stderr
    assert orjson.loads(listed.stdout) == {
        **{name: health[name] for name in ("status", "crews", "operations", "llm_budget")},
        "max_concurrency": {"llm-loop-calls": 1},
    }
    table = cli(server, "crews")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"{len(health['crews'])} crew(s) served (ready)")
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
    assert set(rows) == set(health["crews"])
    (calls_only,) = [
        crew for crew, own in health["llm_budget"]["crews"].items() if own == {"max_tokens": 0, "max_llm_calls": 5}
    ]
    assert rows[calls_only] == ["-", "5", "1"] and rows["demo"] == ["-", "-", "-"]
    assert lines[-1] == "operations: " + ", ".join(health["operations"])


def test_show_and_jobs_say_when_a_job_ran_and_how_long_it_took(server: Server) -> None:
    ran = cli(server, "run", "demo", "--action-id", "cli-timed", "--json")
    assert ran.returncode == 0, ran.stderr
    with server.client() as client:
        record = client.get("/jobs/cli-timed").json()
    took = spoken(record["ended_at"] - record["admitted_at"])
    shown = [line.split() for line in cli(server, "show", "cli-timed").stdout.splitlines()]
    assert ["took", took] in shown and ["ended", *clock(record["ended_at"]).split()] in shown
    assert ["admitted", *clock(record["admitted_at"]).split()] in shown
    env = {**cli_env(server), "COLUMNS": "200"}
    listed = subprocess.run(command("jobs", "--crew", "demo"), env=env, cwd=ROOT, capture_output=True, text=True)
    (row,) = [line.split() for line in listed.stdout.splitlines() if line.startswith("cli-timed ")]
    assert row[-3:] == [clock(record["admitted_at"], short=True), clock(record["ended_at"], short=True), took], row
    as_json = orjson.loads(cli(server, "show", "cli-timed", "--json").stdout)
    assert (as_json["admitted_at"], as_json["ended_at"]) == (record["admitted_at"], record["ended_at"])  # raw
