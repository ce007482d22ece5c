"""``crew-supervisor doctor --url``: a live supervisor checked through its API, as a subprocess, against real
supervisors (ready, draining, full), a wrong token, a port nothing listens on and a server that is no supervisor."""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from supervisor.testing import free_port
from tests.conftest import start_body, start_server, wait_until
from tests.supervisor.doctor.test_doctor import Deployment, deployment_in, doctor, findings

CHECKS = ["api", "status", "journal", "crews", "sandbox", "capacity", "tracing"]


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    return deployment_in(tmp_path)


def test_a_serving_supervisor_is_ready_and_the_local_doctor_points_at_url(deployment: Deployment) -> None:
    server = start_server(deployment.state)
    url = f"http://127.0.0.1:{server.port}"
    deployment.token.write_text(server.token + "\n")

    # Beside it, the local doctor cannot take its journal or its port: it says how to check the one that serves.
    deployment.env["AIP_CREWAI_PORT"] = str(server.port)
    local = doctor(deployment, "--json")
    assert local.code == 1, local.out + local.err
    journal = next(f for f in findings(local) if f["check"] == "journal")
    assert journal["status"] == "problem" and journal["fix"].endswith(f": crew-supervisor doctor --url {url}")

    # The token as the operator commands take it: here from the file the README's shell exports.
    deployment.env["AIP_CREWAI_BEARER_TOKEN_FILE"] = str(deployment.token)
    answer = doctor(deployment, "--url", url, "--json")
    assert (answer.code, answer.err) == (0, ""), answer.out + answer.err
    found = {f["check"]: f for f in findings(answer)}
    assert list(found) == CHECKS
    assert {f["status"] for f in found.values()} <= {"ok", "warning"}
    assert found["status"]["detail"].startswith("ready: it starts jobs")
    assert found["journal"]["status"] == "ok"
    with server.client() as client:
        crews = client.get("/health").json()["crews"]
    assert found["crews"]["detail"].startswith(f"{len(crews)} served ({', '.join(crews)})")
    assert found["capacity"]["detail"].startswith("0 of ")
    assert found["tracing"]["detail"] == "off: no job is traced"  # no OTLP endpoint where it serves

    text = doctor(deployment, "--url", url)
    assert text.code == 0 and text.out.splitlines()[-1].startswith("doctor: serving"), text.out

    del deployment.env["AIP_CREWAI_BEARER_TOKEN_FILE"]
    wrong = doctor(deployment, "--url", url, "--token", "not-its-token")
    assert (wrong.code, wrong.err) == (1, ""), wrong.out + wrong.err
    [line] = wrong.lines("problem")
    assert line.startswith(f"problem  api         {url} refused the bearer token (401)")
    assert wrong.out.splitlines()[-1] == "doctor: not ready (1 problem)"


def test_a_draining_full_supervisor_is_one_line_per_problem(deployment: Deployment) -> None:
    """SIGTERM while a job runs: it drains (status ``draining``); its one record fills MAX_RETAINED_RUNS=1."""
    server = start_server(
        deployment.state,
        env={"AIP_CREWAI_DRAIN_SECONDS": "120", "AIP_CREWAI_MAX_RETAINED_RUNS": "1", "AIP_CREWAI_MAX_CONCURRENCY": "1"},
    )
    url = f"http://127.0.0.1:{server.port}"
    with server.client() as client:
        body = start_body("demo-slow", "long", input={"seconds": 120})
        with client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": "k"}) as response:
            assert response.status_code == 200
        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: client.get("/health").json()["status"] == "draining", timeout=30)
    answer = doctor(deployment, "--url", url, "--token", server.token)
    assert (answer.code, answer.err) == (1, ""), answer.out + answer.err
    problems = {line.split()[1]: line for line in answer.lines("problem")}
    assert set(problems) == {"status", "capacity"}, answer.out
    assert "draining: it starts no new job" in problems["status"]
    capacity = problems["capacity"]  # /health's retention too: the window, and the one record's admission
    assert "1 of 1 job records (AIP_CREWAI_MAX_RETAINED_RUNS); archived after 604800 s, oldest from 20" in capacity
    assert ": every start answers 507; fix: archive finished jobs (crew-supervisor archive)" in capacity
    assert answer.out.splitlines()[-1].startswith("doctor: not ready (2 problems")


def test_nothing_listening_is_one_line(deployment: Deployment) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    answer = doctor(deployment, "--url", url, "--token", "t")
    assert (answer.code, answer.err) == (1, ""), answer.out + answer.err
    [line] = answer.lines("problem")
    assert line.startswith(f"problem  api         cannot connect to {url}: ")
    assert "fix: give the URL it serves on (--url) and its token" in line


class NotASupervisor(http.server.BaseHTTPRequestHandler):
    body = b"<html><body>a login page</body></html>"  # what every GET answers
    kind = "text/html"

    def do_GET(self) -> None:
        body = self.body
        self.send_response(200)
        self.send_header("Content-Type", self.kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server() -> Iterator[str]:
    with serving(NotASupervisor) as url:
        yield url


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()
    server.server_close()


def test_an_answer_that_is_not_a_supervisors_health_is_one_line(deployment: Deployment, html_server: str) -> None:
    assert httpx.get(f"{html_server}/health").status_code == 200
    answer = doctor(deployment, "--url", html_server, "--token", "t")
    assert (answer.code, answer.err) == (1, ""), answer.out + answer.err
    [line] = answer.lines("problem")
    assert f"{html_server}/health answered, but not with a crew-supervisor's health" in line


HEALTH = {"status": "ready", "crews": ["demo"], "retained_runs": 0, "max_retained_runs": 10, "sandbox": {}}


@pytest.mark.parametrize(
    ("field", "said"),
    [
        ({"retained_runs": None}, "its retained_runs is null, not a count"),
        ({"retained_runs": "many"}, 'its retained_runs is "many", not a count'),
        ({"max_retained_runs": -1}, "its max_retained_runs is -1, not a count"),
        ({"retention": {"archivable": [1]}}, "its archivable is [1], not a count"),
        ({"sandbox": ["landlock"]}, "'list' object has no attribute 'get'"),
    ],
)
def test_a_health_with_a_field_of_another_shape_is_one_line(
    deployment: Deployment, field: dict[str, object], said: str
) -> None:
    handler = type("BadHealth", (NotASupervisor,), {"body": json.dumps({**HEALTH, **field}).encode(), "kind": "json"})
    with serving(handler) as url:
        answer = doctor(deployment, "--url", url, "--token", "t")
        assert (answer.code, answer.err) == (1, ""), answer.out + answer.err
        [line] = answer.lines("problem")
        assert f"{url}/health answered, but not with a crew-supervisor's health ({said})" in line, answer.out
