"""Scoped tokens on a real server: every route the app has, asked with each role's token (a route missing from
``NEEDS`` fails here, so a new one must say who may use it), then the files rewritten while it serves: rotation
with no restart and no stream dropped, and a file made unusable, which keeps the tokens read before."""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from supervisor import config
from supervisor.enums import ROLES, Role
from supervisor.http.app import create_app
from supervisor.http.auth import BearerAuth
from supervisor.jobs.supervisor import Supervisor
from supervisor.redaction import REDACTED
from supervisor.testing import Server
from supervisor.tokens import POLL_SECONDS
from tests.conftest import sse_events, start_body, start_server, stop_server
from tests.crews.prober import digest
from tests.helpers.waiting import wait_until
from tests.system.security.conftest import REGISTRY

OBSERVER, OPERATOR, CONTRACT = Role.OBSERVER, Role.OPERATOR, Role.CONTRACT
# Each route (method, path) and the least role that may use it: the table the issue asks for, held apart from
# the code's declarations (supervisor/scopes.py).
NEEDS = {
    ("GET", "/health"): OBSERVER,
    ("GET", "/jobs"): OBSERVER,
    ("GET", "/jobs/{action_id}"): OBSERVER,
    ("GET", "/runs/{action_id}"): OBSERVER,
    ("GET", "/jobs/{action_id}/events"): OBSERVER,
    ("GET", "/jobs/{action_id}/output"): OBSERVER,
    ("GET", "/jobs/{action_id}/effects"): OBSERVER,
    ("GET", "/workers"): OBSERVER,
    ("GET", "/metrics"): OBSERVER,
    ("GET", "/console"): OBSERVER,
    ("GET", "/console/"): OBSERVER,
    ("GET", "/console/{name}"): OBSERVER,
    ("POST", "/jobs/{action_id}/cancel"): OPERATOR,
    ("POST", "/runs/{action_id}/cancel"): OPERATOR,
    ("POST", "/jobs/cancel"): OPERATOR,
    ("POST", "/jobs/archive"): OPERATOR,
    ("DELETE", "/jobs/{action_id}"): OPERATOR,
    ("GET", "/jobs/{action_id}/stack"): OPERATOR,
    ("POST", "/jobs"): CONTRACT,
    ("POST", "/runs"): CONTRACT,
    ("POST", "/jobs/stream"): CONTRACT,
    ("POST", "/runs/stream"): CONTRACT,
    ("POST", "/jobs/{action_id}/resume"): CONTRACT,
    ("GET", "/openapi.json"): CONTRACT,  # FastAPI's own: it declares nothing, so the contract's token alone
}
# Paths that reach each route and change nothing: an unknown job, an unknown console file; bodies are {} (a 422).
PARAMETERS = {"{action_id}": "no-such-job", "{name}": "no-such-file"}


def app_routes() -> set[tuple[str, str]]:
    """Every (method, path) the middleware knows, as serve makes the app with the console on (but not served)."""
    env = {
        "AIP_CREWAI_REGISTRY": "tests.crews:registry",
        "AIP_CREWAI_ALLOW_EPHEMERAL": "true",
        "AIP_CREWAI_ALLOW_UNAUTHENTICATED": "true",
        "AIP_CREWAI_CONSOLE": "true",
    }
    settings = config.load({}, env)
    app = create_app(cast(Supervisor, SimpleNamespace(settings=settings, metrics=None, credentials=None)))
    (auth,) = [middleware for middleware in app.user_middleware if middleware.cls is BearerAuth]
    routes = auth.kwargs["routes"]
    return {(method, route.path) for route in routes for method in route.methods if method != "HEAD"}


def write_tokens(path: Path, *tokens: str) -> None:
    """As an operator rotates: a new file renamed over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text("".join(f"{token}\n" for token in tokens))
    fresh.chmod(0o600)
    os.replace(fresh, path)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[Role, str]:
    return {role: secrets.token_urlsafe(16) for role in ROLES}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tokens: dict[Role, str]) -> Iterator[Server]:
    place = tmp_path_factory.mktemp("roles")
    for role, token in tokens.items():
        write_tokens(place / role, token, secrets.token_urlsafe(16))  # a second token in each file
    env = {
        "AIP_CREWAI_BEARER_TOKEN": "",
        "AIP_CREWAI_BEARER_TOKEN_FILE": str(place / CONTRACT),
        "AIP_CREWAI_OBSERVER_TOKEN_FILE": str(place / OBSERVER),
        "AIP_CREWAI_OPERATOR_TOKEN_FILE": str(place / OPERATOR),
        "AIP_CREWAI_CONSOLE": "true",
    }
    running = start_server(place / "state", env=env, token=tokens[CONTRACT])
    yield running
    stop_server(running)


def test_every_route_of_the_app_says_which_role_may_use_it(server: Server) -> None:
    assert app_routes() == set(NEEDS)
    with server.client() as client:  # and the middleware knows every route the schema shows (the console's aside)
        schema = client.get("/openapi.json").json()["paths"]
    assert {(method.upper(), path) for path, methods in schema.items() for method in methods} <= set(NEEDS)


def ask(server: Server, token: str, method: str, path: str) -> httpx.Response:
    for name, value in PARAMETERS.items():
        path = path.replace(name, value)
    with server.client(token) as client:
        return client.request(method, path, json={} if method == "POST" else None)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("method", "path"), sorted(NEEDS))
def test_each_role_on_each_route(server: Server, tokens: dict[Role, str], role: Role, method: str, path: str) -> None:
    answer = ask(server, tokens[role], method, path)
    if ROLES.index(role) >= ROLES.index(NEEDS[method, path]):
        assert answer.status_code not in (401, 403), answer.text
        return
    whom = "an operator token or the contract's token" if NEEDS[method, path] == OPERATOR else "the contract's token"
    assert answer.status_code == 403, answer.text
    assert answer.json() == {"detail": f"an {role} token may not {method} {path}: that needs {whom}"}
    assert "www-authenticate" not in answer.headers  # a known token: asking again with it will not help


# Requests no route takes, and the router's own answer to each: nothing runs, so any known token gets it.
UNROUTED = [
    ("GET", "/no-such-route", 404),
    ("PUT", "/jobs", 405),
    ("HEAD", "/jobs", 405),  # FastAPI's routes answer HEAD only where they say so (the console's files)
    ("HEAD", "/jobs/{action_id}/stack", 405),
    ("GET", "/jobs/", 307),  # to /jobs, judged again there
    ("POST", "/jobs/", 307),
]


@pytest.mark.parametrize("role", ROLES)
def test_a_request_no_route_takes_gets_the_router_s_answer_with_any_known_token(
    server: Server, tokens: dict[Role, str], role: Role
) -> None:
    for method, path, status_code in UNROUTED:
        assert ask(server, tokens[role], method, path).status_code == status_code, (method, path)
        assert ask(server, secrets.token_urlsafe(16), method, path).status_code == 401, (method, path)
    with server.client(tokens[role]) as client:  # the redirect followed: the route's own rule
        followed = client.post("/jobs/", json={}, follow_redirects=True)
    assert followed.status_code == (422 if role == CONTRACT else 403), followed.text


@pytest.mark.parametrize(("method", "path"), sorted(NEEDS))
def test_an_unknown_token_is_401_on_every_route_but_the_console_s_files(server: Server, method: str, path: str) -> None:
    answer = ask(server, secrets.token_urlsafe(16), method, path)
    public = path in ("/console", "/console/")  # the page itself holds no data (supervisor/http/webconsole.py)
    assert answer.status_code != 401 if public else answer.status_code == 401, answer.text


def test_every_token_of_a_file_is_accepted(server: Server, tokens: dict[Role, str]) -> None:
    place = Path(server.state).parent
    for role in ROLES:
        held = (place / role).read_text().split()
        assert tokens[role] in held and len(held) == 2
        assert {ask(server, token, "GET", "/jobs").status_code for token in held} == {200}


def start_streamed(server: Server, body: dict[str, Any], key: str) -> None:
    """Start a job and return once it has started (a stream hung up does not cancel it)."""
    with (
        server.client() as client,
        client.stream("POST", "/jobs/stream", json=body, headers={"Idempotency-Key": key}) as stream,
    ):
        assert next(sse_events(stream))["event"] == "started"


def test_an_observer_follows_a_job_that_an_operator_cancels(server: Server, tokens: dict[Role, str]) -> None:
    """What the roles are for: a dashboard watches, an on-call operator stops, neither can start."""
    body = start_body("demo-slow", "watched", input={"seconds": 60})
    start_streamed(server, body, "watched")
    with server.client(tokens[OBSERVER]) as watcher:
        assert watcher.post("/jobs/watched/cancel", json={**body, "reason": "x"}).status_code == 403
        assert watcher.get("/jobs/watched").json()["status"] == "running"
    with server.client(tokens[OPERATOR]) as operator:
        answer = operator.post("/jobs/watched/cancel", json={"crew_id": "demo-slow", "action_id": "watched"})
        assert answer.json()["status"] == "cancelled", answer.text
        started = operator.post("/jobs", json=start_body("demo", "by-operator"), headers={"Idempotency-Key": "o"})
        assert started.status_code == 403
        assert operator.get("/jobs/by-operator").status_code == 404  # nothing was admitted


def status(server: Server, token: str) -> int:
    return ask(server, token, "GET", "/health").status_code


def test_a_rewritten_file_rotates_its_tokens_and_a_stream_opened_before_keeps_streaming(tmp_path: Path) -> None:
    contract, old, new, newer = (secrets.token_urlsafe(16) for _ in range(4))
    write_tokens(tmp_path / "contract", contract)
    write_tokens(tmp_path / "observer", old)
    env = {"AIP_CREWAI_BEARER_TOKEN": "", "AIP_CREWAI_BEARER_TOKEN_FILE": str(tmp_path / "contract")}
    env["AIP_CREWAI_OBSERVER_TOKEN_FILE"] = str(tmp_path / "observer")
    server = start_server(tmp_path / "state", env=env, token=contract)
    body = start_body("demo-slow", "long", input={"seconds": 20})
    start_streamed(server, body, "long")
    seen: list[dict[str, Any]] = []
    rotated = threading.Event()
    after_rotation: list[dict[str, Any]] = []
    with server.client(old) as watcher:
        headers = {"Accept": "text/event-stream"}
        with watcher.stream("GET", "/jobs/long/events", headers=headers) as stream:
            for event in sse_events(stream):
                (after_rotation if rotated.is_set() else seen).append(event)
                if event["event"] == "chunk" and not rotated.is_set():
                    write_tokens(tmp_path / "observer", new)  # the old one out, the new one in
                    assert wait_until(lambda: status(server, old) == 401 and status(server, new) == 200, 5)
                    (tmp_path / "observer").write_text(f"{newer}\n")  # in place: same inode, size and mode
                    assert wait_until(lambda: status(server, new) == 401 and status(server, newer) == 200, 5)
                    rotated.set()
    assert seen[-1]["event"] == "chunk"
    assert after_rotation[-1]["event"] == "completed" and len(after_rotation) > 1  # it streamed on to the end
    assert [event["sequence"] for event in seen + after_rotation] == list(range(len(seen) + len(after_rotation)))
    log = server.log.read_text()
    assert log.count("AIP_CREWAI_OBSERVER_TOKEN_FILE read again: 1 observer token(s)") >= 2
    assert not [token for token in (contract, old, new, newer) if token in log]


def test_a_file_that_becomes_unusable_keeps_the_tokens_read_before(tmp_path: Path) -> None:
    contract, observer, operator = (secrets.token_urlsafe(16) for _ in range(3))
    for role, token in ((CONTRACT, contract), (OBSERVER, observer), (OPERATOR, operator)):
        write_tokens(tmp_path / role, token)
    env = {"AIP_CREWAI_BEARER_TOKEN": "", "AIP_CREWAI_BEARER_TOKEN_FILE": str(tmp_path / CONTRACT)}
    env["AIP_CREWAI_OBSERVER_TOKEN_FILE"] = str(tmp_path / OBSERVER)
    env["AIP_CREWAI_OPERATOR_TOKEN_FILE"] = str(tmp_path / OPERATOR)
    server = start_server(tmp_path / "state", env=env, token=contract)
    path, log = tmp_path / OBSERVER, server.log

    def complaint(text: str) -> bool:
        """Whether the log says ``text`` once a request came (the files are looked at as requests come)."""
        return status(server, observer) == 200 and text in log.read_text()

    bad: list[tuple[str, str]] = [
        ("\n \n", "holds no token; the observer tokens read before are kept"),
        (f"{operator}\n", "the same token gives two roles, operator and observer"),
    ]
    for content, said in bad:
        write_tokens(path, content)
        assert wait_until(lambda said=said: complaint(said), 5 * POLL_SECONDS)
        assert status(server, observer) == 200
        assert ask(server, operator, "POST", "/jobs/cancel").status_code == 422  # still the operator's
    path.chmod(0o644)
    assert wait_until(lambda: complaint("mode 0644 lets others read it"), 5 * POLL_SECONDS)
    assert status(server, observer) == 200
    # Said once: the same complaint again (the file empty once more) and a change beside it that proves it was read.
    write_tokens(path, "\n")
    fresh = secrets.token_urlsafe(16)
    write_tokens(tmp_path / OPERATOR, fresh)
    assert wait_until(lambda: status(server, fresh) == 200, 5 * POLL_SECONDS)
    assert log.read_text().count("holds no token") == 2  # the first time, and again after another complaint
    write_tokens(path, "\n\n")  # the same complaint as the one just made: not said again
    other = secrets.token_urlsafe(16)
    write_tokens(tmp_path / OPERATOR, other)
    assert wait_until(lambda: status(server, other) == 200, 5 * POLL_SECONDS)
    assert log.read_text().count("holds no token") == 2
    assert status(server, observer) == 200
    mended = secrets.token_urlsafe(16)
    write_tokens(path, mended)
    assert wait_until(lambda: status(server, mended) == 200 and status(server, observer) == 401, 5)
    assert not [token for token in (contract, observer, operator, fresh, other, mended) if token in log.read_text()]


def test_a_token_rotated_in_is_masked_in_what_a_job_writes_and_kept_out_of_its_environment(tmp_path: Path) -> None:
    """A token added to a file while the server runs is every token's equal at the next job's start: a job that
    writes it (``echo``) shows ``[redacted]``, and a variable of the supervisor's holding it is not in the job's
    environment (``prober``); before it was added, it was nobody's secret."""
    contract, observer, added = (secrets.token_urlsafe(16) for _ in range(3))
    write_tokens(tmp_path / CONTRACT, contract)
    write_tokens(tmp_path / OBSERVER, observer)
    env = {"AIP_CREWAI_BEARER_TOKEN": "", "AIP_CREWAI_BEARER_TOKEN_FILE": str(tmp_path / CONTRACT)}
    env |= {"AIP_CREWAI_OBSERVER_TOKEN_FILE": str(tmp_path / OBSERVER), "COPY_OF_ADDED": added}
    server = start_server(tmp_path / "state", env=env, token=contract, registry=REGISTRY)

    def run(crew_id: str, action_id: str, given: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """All the API says of a job (its answer and its events), and its output."""
        with server.client() as client:
            body = start_body(crew_id, action_id, input=given)
            answer = client.post("/jobs", json=body, headers={"Idempotency-Key": action_id})
            assert answer.status_code == 200, answer.text
            return answer.text + client.get(f"/jobs/{action_id}/events").text, answer.json()

    said, _ = run("echo", "before", {"text": f"say {added}"})
    assert added in said and REDACTED not in said
    assert json.loads(run("prober", "env-before", {"environ": True})[1]["raw"])["environ"]["COPY_OF_ADDED"] == digest(
        added
    )
    write_tokens(tmp_path / OBSERVER, observer, added)
    assert wait_until(lambda: status(server, added) == 200, 5 * POLL_SECONDS)
    said, answer = run("echo", "after", {"text": f"say {added}"})
    assert answer["raw"] == f"say {REDACTED}"
    assert added not in said
    assert "COPY_OF_ADDED" not in json.loads(run("prober", "env-after", {"environ": True})[1]["raw"])["environ"]
