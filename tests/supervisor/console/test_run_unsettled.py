"""``crew-supervisor run`` whose start reached the server unanswered: the job may run, so the CLI never says the
start failed without the job's id and how to check it (a server that took the POST, then restarted)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading

from tests.conftest import ROOT
from tests.supervisor.console.test_cli import command


def swallow_one_request(listener: socket.socket, received: list[bytes]) -> None:
    """Read one whole request, stop listening (a refused connection from then on), and hang up unanswered."""
    connection, _ = listener.accept()
    with connection:
        connection.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            data += connection.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)
        while length and len(body) < int(length[1]):
            body += connection.recv(65536)
        received.append(head + b"\r\n\r\n" + body)
        listener.close()


def run_against_a_swallower(*args: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    """``crew-supervisor run ARGS`` against a server that takes the start's request whole and never answers it."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    received: list[bytes] = []
    thread = threading.Thread(target=swallow_one_request, args=(listener, received), daemon=True)
    thread.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_CREWAI_")}
    env |= {"PYTHONPATH": str(ROOT), "AIP_CREWAI_URL": url, "AIP_CREWAI_BEARER_TOKEN": "t"}
    answer = subprocess.run(command("run", *args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    thread.join(30)
    [request] = received
    assert request.startswith(b"POST /jobs/stream ") and b'"action_id":"cli-unsettled"' in request
    return url, answer


def test_a_start_sent_then_unanswered_is_unknown_not_failed_and_names_the_job() -> None:
    url, answer = run_against_a_swallower("demo", "--action-id", "cli-unsettled", "--wait", "2s")
    assert (answer.returncode, answer.stdout) == (1, "")
    [*_, said] = answer.stderr.splitlines()
    assert said.startswith(f"crew-supervisor: gave up reconnecting to {url} after "), answer.stderr
    assert said.endswith(
        "; job cli-unsettled may be running, its outcome unknown (crew-supervisor show cli-unsettled says)"
    ), answer.stderr
    assert "cannot connect" not in answer.stderr


def test_a_detached_start_sent_then_unanswered_names_the_job_too() -> None:
    url, answer = run_against_a_swallower("demo", "--action-id", "cli-unsettled", "--detach")
    assert (answer.returncode, answer.stdout) == (1, "")
    [said] = answer.stderr.splitlines()
    assert said.startswith(f"crew-supervisor: {url} did not answer the start: "), answer.stderr
    assert said.endswith(
        "; job cli-unsettled may be running, its outcome unknown (crew-supervisor show cli-unsettled says)"
    ), answer.stderr
