"""test_tide_crews.py: the tides crew tested offline, its model scripted (crew_registry = tide_crews:registry)."""

import pytest
from tide_crews import tides

from supervisor.llm_script import answer, error, tool_call

FOUND = "high tide at Brest: 06:12 and 18:40"  # what tide_times returns for Brest


@pytest.fixture(scope="module")
def client(crew_supervisor_module):
    """One supervisor for the module's tests: each scripts its own replies, so they share it."""
    with crew_supervisor_module.client() as client:
        yield client


def start(client, action_id):
    job = {"crew_id": "tides", "action_id": action_id, "input": {"port": "Brest"}}
    return client.post("/jobs", json=job, headers={"Idempotency-Key": action_id})  # waits for the job's end


def test_the_crew_calls_its_tool_then_answers_with_what_it_found(client, crew_provider):
    crew_provider.script(tool_call("tide_times", {"port": "Brest"}), answer("High tide at Brest: 06:12."))
    response = start(client, "tides-1")
    assert response.status_code == 200 and response.json()["raw"] == "High tide at Brest: 06:12."
    first, second = crew_provider.calls()
    assert first["tools"] == ["tide_times"] and first["stream"]  # a job's run streams its model's answers
    assert "Brest" in first["messages"][-1]["content"]  # the task, with its input
    fed_back = second["messages"][-1]  # what the crew sent after its tool ran: the tool's result
    assert fed_back["role"] == "tool" and fed_back["content"] == FOUND


def test_the_same_crew_in_process_gets_the_same_script(crew_provider):
    crew_provider.script(tool_call("tide_times", {"port": "Brest"}), answer("High tide at Brest: 06:12."))
    assert tides().kickoff(inputs={"port": "Brest"}).raw == "High tide at Brest: 06:12."
    first, second = crew_provider.calls()
    assert not first["stream"] and second["messages"][-1]["content"] == FOUND  # kickoff() does not stream


def test_a_rate_limited_call_is_retried(client, crew_provider):
    crew_provider.script(error(429), tool_call("tide_times", {"port": "Brest"}), answer("06:12."))
    assert start(client, "tides-2").json()["raw"] == "06:12."
    assert [call["status"] for call in crew_provider.calls()] == [429, 200, 200]  # the openai SDK retried


def test_a_crew_that_calls_its_model_once_more_than_scripted_fails(client, crew_provider):
    crew_provider.script(tool_call("tide_times", {"port": "Brest"}))  # and no answer after the tool's result
    response = start(client, "tides-3")
    assert response.status_code == 502 and response.json()["status"] == "failed"
    statuses = [call["status"] for call in crew_provider.calls()]
    assert statuses[0] == 200 and set(statuses[1:]) == {400}  # CrewAI retried: each call answered 400
    assert "has no reply left" in client.get("/jobs/tides-3/output").json()["stderr"]["text"]  # the job's stderr
