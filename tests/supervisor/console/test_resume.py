"""``crew-supervisor resume`` as a subprocess against a real supervisor: it follows and prints the new job as ``run``
does, picks ``ID-r1`` (then ``-r2``) unless ``--as`` names it, and says a refusal's reason in one line."""

from __future__ import annotations

import orjson

from tests.conftest import Server, wait_until
from tests.supervisor.console.test_cli import assert_whole, cli, json_lines


def test_resume_follows_the_new_job_and_names_it_by_default(server: Server) -> None:
    assert cli(server, "run", "boom", "--action-id", "cli-boom").returncode == 3
    resumed = cli(server, "resume", "cli-boom", "--json")
    assert resumed.returncode == 3, resumed.stderr  # it fails again: the exit code is the new job's outcome
    assert_whole(json_lines(resumed.stdout), "failed")
    shown = orjson.loads(cli(server, "show", "cli-boom-r1", "--json").stdout)
    assert shown["resumed_from"] == "cli-boom" and shown["crew_id"] == "boom"
    table = cli(server, "show", "cli-boom")
    assert table.returncode == 0 and "resumed by" in table.stdout and "cli-boom-r1" in table.stdout
    again = cli(server, "resume", "cli-boom")  # cli-boom-r1 is taken: it asks for -r2, and is told why not
    assert again.returncode == 1 and "already resumed as job cli-boom-r1" in again.stderr, again.stderr
    assert cli(server, "show", "cli-boom-r2").returncode == 1  # nothing was admitted
    detached = cli(server, "resume", "cli-boom-r1", "--detach")
    assert detached.returncode == 0 and detached.stdout.strip() == "cli-boom-r1-r1", detached.stderr
    unknown = cli(server, "resume", "cli-no-such-job")
    assert unknown.returncode == 1 and "404" in unknown.stderr


def test_a_cancelled_run_resumed_as_named_completes_and_prints_its_answer(server: Server) -> None:
    started = cli(server, "run", "demo-slow", "--input", '{"seconds": 3}', "--action-id", "cli-slow", "--detach")
    assert started.returncode == 0, started.stderr

    # Found running and cancelled over HTTP, within its 3 s: a CLI process each would take longer at load.
    with server.client() as client:
        assert wait_until(lambda: client.get("/jobs/cli-slow").json()["phase"] == "running", timeout=60)
        cancel = {"crew_id": "demo-slow", "action_id": "cli-slow"}
        assert client.post("/jobs/cli-slow/cancel", json=cancel).json()["status"] == "cancelled"
    resumed = cli(server, "resume", "cli-slow", "--as", "cli-slow-again")
    assert resumed.returncode == 0, resumed.stderr
    assert "started cli-slow-again (demo-slow, run), resuming cli-slow" in resumed.stdout
    assert "answer:" in resumed.stdout
    completed = cli(server, "resume", "cli-slow-again")
    assert completed.returncode == 1 and "completed: nothing to resume" in completed.stderr
