"""A registry value must be a zero-arg factory: a Crew instance fails each of its jobs, on either launcher,
with the fix in its message, while the registry's factories serve. Crews: ``tests/crews/instance.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Server, start_body, start_server, stop_server

pytestmark = pytest.mark.both_launchers
REGISTRY = "tests.crews.instance:registry"
# A blocking start on spawn waits for a fresh interpreter to import CrewAI, the openai SDK and this registry
# (~15 s of CPU): 10-20 s quiet, past a minute beside a burner and other tests (seen). A hang guard only.
ANSWER_SECONDS = 300
REFUSED = (
    "registry value 'instance' is a Crew instance, not a zero-arg factory;"
    " fix: make 'instance' a zero-arg function that returns the Crew: registry = {'instance': make_instance}"
)


@pytest.fixture(scope="module")
def instance_server(tmp_path_factory: pytest.TempPathFactory, launcher: str) -> Iterator[Server]:
    env = {"AIP_CREWAI_ALLOWED_OPERATIONS": "run,batch_run"}
    running = start_server(tmp_path_factory.mktemp("instances") / "state", env=env, registry=REGISTRY)
    if launcher == "forkserver":  # the instance, built when the fork server imported the registry, did not stop it
        with running.client() as client:
            forkserver = client.get("/health").json()["forkserver"]
        assert forkserver["alive"] and forkserver["refused"] is None, forkserver
    yield running
    stop_server(running)


@pytest.mark.parametrize(
    ("operation", "payload"), [("run", {}), ("batch_run", {"inputs": [{"topic": "a"}, {"topic": "b"}]})]
)
def test_a_crew_instance_fails_its_job_naming_the_fix(
    instance_server: Server, operation: str, payload: dict[str, Any]
) -> None:
    body = start_body("instance", f"instance-{operation}", operation=operation, input=payload)
    with instance_server.client(timeout=ANSWER_SECONDS) as client:
        answer = client.post("/jobs", json=body, headers={"Idempotency-Key": "k"})
        assert answer.status_code == 502, answer.text
        events = client.get(f"/jobs/instance-{operation}/events").json()["events"]
    terminal = answer.json()["terminal"]
    assert terminal["reason"] == "crew_factory_failed" and terminal["error_type"] == "NotAFactory"
    assert terminal["message"] == REFUSED
    assert terminal["uncertain_outcome"] is False  # refused before the crew did anything
    assert [e["event"] for e in events] == ["failed"]


def test_the_factories_beside_it_serve(instance_server: Server) -> None:
    with instance_server.client(timeout=ANSWER_SECONDS) as client:
        assert client.get("/health").json()["crews"] == ["demo", "instance"]
        answer = client.post("/jobs", json=start_body("demo", "factory-run"), headers={"Idempotency-Key": "k"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["raw"]
