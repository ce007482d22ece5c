"""The AIP connector's emulation (``aip_client``) against a real supervisor: every route it takes, every
operation it drives, exact repeats, fencing, cancel mid-stream, re-reading, and its qualification crew.

One supervisor serves the module; every test makes its own jobs under fresh action ids, so each passes
alone and in any order.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_REGISTRY, Server, start_server, stop_server
from tests.system.compat.aip_client import (
    STREAMED,
    AipClient,
    AuthenticationError,
    Event,
    HealthGateError,
    RejectedError,
    Result,
    new_action_id,
)

ALL = ("run", "batch_run", "replay", "train", "test", "knowledge_query", "memory_reset")
QUALIFICATION = "aip-qualification"
QUALIFICATION_KEY = "aip-crewai-exact-upstream-v1"
QUALIFICATION_INPUT = {"case_id": "AIP-QUALIFICATION"}
CREWS = ("demo", "demo-slow", "demo-knowledge", "stubborn")
WAIT = 60.0  # deadline for anything a job does here (they take well under a second offline)
VOLATILE = {"replay_task_ids", "execution_duration"}
WRAPPER_KEYS = {"output", "exit_status"}  # what a wrapped completed event would put where the output belongs


@dataclass
class Sidecar:
    server: Server
    registry: str
    crews: tuple[str, ...]

    def client(self, **kwargs: Any) -> AipClient:
        return AipClient(self.server.url, self.server.token, crews=self.crews, operations=ALL, **kwargs)

    def http(self) -> httpx.Client:
        return self.server.client()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("compat")
    training = root / "training"
    training.mkdir(mode=0o700)
    registry = TEST_REGISTRY
    env = {
        "AIP_CREWAI_REGISTRY": registry,
        "AIP_CREWAI_ALLOWED_OPERATIONS": ",".join(ALL),
        "AIP_CREWAI_TRAINING_DIR": str(training),
    }
    server = start_server(root / "state", env=env)
    with server.client() as http:
        offered = http.get("/health").json()["crews"]
    crews = CREWS + ((QUALIFICATION,) if QUALIFICATION in offered else ())
    yield Sidecar(server, registry, crews)
    stop_server(server)


@pytest.fixture
def aip(sidecar: Sidecar) -> Iterator[AipClient]:
    with sidecar.client() as client:
        yield client


def worker_starts(sidecar: Sidecar) -> float:
    with sidecar.http() as http:
        text = http.get("/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r"^crew_supervisor_worker_starts_total\{.*\} (\S+)$", text, re.M))


def comparable(value: Any) -> Any:
    """An output without what differs between two faithful runs: CrewAI's random task ids, timings."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def assert_is_output_object(output: Any) -> None:
    assert isinstance(output, dict)
    assert not WRAPPER_KEYS & output.keys(), f"completed data wraps the output: {sorted(output)}"


def assert_contiguous(events: list[Event], cursor: int) -> None:
    assert [e.sequence for e in events] == list(range(cursor, cursor + len(events)))


# --- the health gate ------------------------------------------------------------------------------------


def test_health_gate_passes(aip: AipClient) -> None:
    health = aip.check_health()
    assert health["status"] == "ready" and health["durable_journal"] is True
    assert set(aip.crews) <= set(health["crews"])
    assert {*ALL, "status", "events", "cancel"} <= set(health["operations"])


def test_health_gate_refuses_a_crew_the_sidecar_lacks_and_a_wrong_token(sidecar: Sidecar) -> None:
    server = sidecar.server
    lacking = AipClient(server.url, server.token, crews=("demo", "no-such-crew"))
    with lacking, pytest.raises(HealthGateError, match="no-such-crew"):
        lacking.check_health()
    wrong = AipClient(server.url, "wrong-token", crews=("demo",))
    with wrong, pytest.raises(AuthenticationError) as refused:
        wrong.check_health()
    assert refused.value.status == 401


def test_health_lists_are_sorted_as_the_reference_writes_them(aip: AipClient) -> None:
    health = aip.check_health()
    assert health["crews"] == sorted(health["crews"])
    assert health["operations"] == sorted(health["operations"])


# --- every operation, on the route the client uses ------------------------------------------------------


def _replay_input(aip: AipClient) -> dict[str, Any]:
    """A replay needs a task id of the crew's latest run: make that run here (this test's own)."""
    run = aip.invoke("demo", "run", {"topic": "replayed"}, action_id=new_action_id(), idempotency_key="compat-rp")
    assert run.output is not None
    return {"task_id": run.output["replay_task_ids"][-1]}


OPERATION_CASES: dict[str, tuple[str, dict[str, Any] | None, set[str]]] = {
    # operation: (crew, input (None: built at run time), keys the output object must hold at the top)
    "run": ("demo", {"topic": "compat"}, {"raw", "token_usage", "tasks_output"}),
    "batch_run": ("demo", {"inputs": [{"topic": "a"}, {"topic": "b"}]}, {"results", "count"}),
    "replay": ("demo", None, {"raw", "token_usage", "tasks_output"}),
    "train": ("demo", {"n_iterations": 1, "artifact_name": "compat.pkl", "feedback": "be brief"}, {"artifact_name"}),
    "test": ("demo", {"n_iterations": 1, "eval_llm": "offline-eval"}, {"n_iterations", "eval_llm"}),
    "knowledge_query": (
        "demo-knowledge",
        {"query": ["What does cancelling a job kill?"], "results_limit": 1},
        {"results"},
    ),
    "memory_reset": ("demo-knowledge", {"command_type": "kickoff_outputs"}, {"status", "command_type"}),
}


@pytest.mark.parametrize("operation", ALL)
def test_each_operation_completes_with_the_output_object(aip: AipClient, operation: str) -> None:
    crew, payload, keys = OPERATION_CASES[operation]
    payload = payload if payload is not None else _replay_input(aip)
    action = new_action_id()
    result = aip.execute(crew, operation, payload, action_id=action, idempotency_key=f"compat-{operation}")

    assert result.route == ("POST /jobs/stream" if operation in STREAMED else "POST /jobs")
    assert result.kind == "completed", result.details
    assert_is_output_object(result.output)
    assert result.output is not None and keys <= result.output.keys(), sorted(result.output)
    if operation in ("run", "replay"):
        assert isinstance(result.output["raw"], str) and result.output["raw"]
        assert result.output["token_usage"]["total_tokens"] > 0
    if operation == "batch_run":
        assert result.output["count"] == 2 and all(r["raw"] for r in result.output["results"])
    if operation in STREAMED:
        first = result.events[0]
        assert first.name == "started" and first.data["status"] == "running"
        assert first.data["operation"] == operation
        assert result.events[-1].name == "completed" and result.events[-1].data == result.output
    if operation == "run":
        assert result.chunks and {c.kind for c in result.chunks} == {"data"}  # channel llm

    # What the journal holds is what the event said.
    record = aip.status(action)
    assert record["status"] == "completed" and record["output"] == result.output

    # The blocking invoke path gives the same output for the same crew and input. (A replay makes itself
    # the crew's latest kickoff, so its twin replays the same task of a fresh, identical run.)
    if operation == "replay":
        payload = _replay_input(aip)
    blocking = aip.invoke(crew, operation, payload, action_id=new_action_id(), idempotency_key=f"compat-{operation}")
    assert blocking.route == "POST /jobs" and blocking.kind == "completed"
    assert_is_output_object(blocking.output)
    assert comparable(blocking.output) == comparable(result.output)


# --- idempotency and fencing ----------------------------------------------------------------------------


def test_exact_repeat_returns_the_same_output_and_starts_no_worker(sidecar: Sidecar, aip: AipClient) -> None:
    action, key, payload = new_action_id(), "compat-repeat", {"topic": "repeat"}
    first = aip.execute("demo", "run", payload, action_id=action, idempotency_key=key)
    assert first.kind == "completed"
    starts, count = worker_starts(sidecar), aip.status(action)["event_count"]

    again = aip.execute("demo", "run", payload, action_id=action, idempotency_key=key)
    blocking = aip.invoke("demo", "run", payload, action_id=action, idempotency_key=key)

    assert again.kind == "completed" and again.output == first.output
    assert blocking.output == first.output
    assert [e.payload for e in again.events] == [e.payload for e in first.events]  # same job, same worker pid
    assert worker_starts(sidecar) == starts
    assert aip.status(action)["event_count"] == count


def test_changed_body_under_the_same_action_id_is_rejected_permanently(aip: AipClient) -> None:
    action, key = new_action_id(), "compat-fence"
    assert aip.execute("demo", "run", {"topic": "one"}, action_id=action, idempotency_key=key).kind == "completed"
    with pytest.raises(RejectedError) as streamed:
        aip.execute("demo", "run", {"topic": "two"}, action_id=action, idempotency_key=key)
    with pytest.raises(RejectedError) as blocking:
        aip.invoke("demo", "run", {"topic": "two"}, action_id=action, idempotency_key=key)
    for error in (streamed.value, blocking.value):
        assert error.status == 409 and error.permanent and not error.retryable and not error.uncertain
    assert aip.status(action)["output"]["raw"]  # the admitted job is untouched


# --- cancel mid-stream ----------------------------------------------------------------------------------


def test_cancel_mid_stream_ends_with_cancelled_and_the_stream_closes(sidecar: Sidecar, aip: AipClient) -> None:
    action = new_action_id()
    chunk_seen = threading.Event()
    outcome: dict[str, Result | BaseException] = {}

    def on_event(event: Event) -> None:
        if event.name == "chunk":
            chunk_seen.set()

    def follow() -> None:
        try:
            outcome["result"] = aip.execute(
                "demo-slow",
                "run",
                {"seconds": 30},
                action_id=action,
                idempotency_key="compat-cancel",
                on_event=on_event,
                drain_seconds=5.0,  # ten heartbeats' time: a stream that stays open is seen
            )
        except BaseException as exc:
            outcome["result"] = exc

    with sidecar.client() as other:
        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        assert chunk_seen.wait(WAIT), "no chunk arrived on the stream"
        confirmation = other.cancel(action, "demo-slow", "compat: stop it")
        thread.join(WAIT)
    assert not thread.is_alive(), "the stream did not end after the cancel"
    result = outcome["result"]
    assert isinstance(result, Result), result

    assert confirmation is None or isinstance(confirmation, dict)  # any 2xx confirms
    assert result.kind == "cancelled" and result.events[-1].name == "cancelled"
    assert result.details is not None and result.details.get("status") == "cancelled"
    assert result.closed_after_terminal is True and result.bytes_after_terminal == 0  # no keep-alive after it
    assert aip.status(action)["status"] == "cancelled"


def test_cancel_of_a_silent_job_stops_its_keep_alives(sidecar: Sidecar, aip: AipClient) -> None:
    """A job with nothing to say (``stubborn`` blocks in its model call, ignoring SIGTERM) gets a keep-alive
    every 0.5 s; once the cancel's terminal event is sent the stream closes and they stop."""
    action = new_action_id()
    beating = threading.Event()
    outcome: dict[str, Result | BaseException] = {}

    def on_comment(count: int) -> None:
        if count >= 2:
            beating.set()

    def follow() -> None:
        try:
            outcome["result"] = aip.execute(
                "stubborn",
                "run",
                {},
                action_id=action,
                idempotency_key="compat-silent",
                on_comment=on_comment,
                drain_seconds=5.0,
            )
        except BaseException as exc:
            outcome["result"] = exc

    with sidecar.client() as other:
        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        assert beating.wait(WAIT), "no keep-alives on a silent stream"
        other.cancel(action, "stubborn", "compat: silent")
        thread.join(WAIT)
    assert not thread.is_alive(), "the stream did not end after the cancel"
    result = outcome["result"]
    assert isinstance(result, Result), result
    assert result.kind == "cancelled" and result.comments >= 2
    assert result.closed_after_terminal is True and result.bytes_after_terminal == 0


# --- re-reading -----------------------------------------------------------------------------------------


def test_reread_from_a_cursor_as_json_and_as_sse(aip: AipClient) -> None:
    action = new_action_id()
    streamed = aip.execute("demo", "run", {"topic": "reread"}, action_id=action, idempotency_key="compat-reread")
    assert streamed.kind == "completed"
    total = len(streamed.events)
    assert total >= 3

    for cursor in (0, total // 2, total - 1):
        as_json = aip.events_json(action, cursor)
        assert_contiguous(as_json, cursor)
        assert as_json[-1].name == "completed" and as_json[-1].data == streamed.output
        assert [e.payload for e in as_json] == [e.payload for e in streamed.events[cursor:]]

        as_sse = aip.events_stream(action, cursor)
        assert_contiguous(as_sse.events, cursor)
        assert [e.payload for e in as_sse.events] == [e.payload for e in streamed.events[cursor:]]
        assert as_sse.kind == "completed" and as_sse.output == streamed.output


# --- the client's own end-to-end check ------------------------------------------------------------------


def test_qualification_crew_on_the_blocking_and_the_streamed_path(sidecar: Sidecar, aip: AipClient) -> None:
    blocking = aip.invoke(
        QUALIFICATION, "run", QUALIFICATION_INPUT, action_id=new_action_id(), idempotency_key=QUALIFICATION_KEY
    )
    streamed = aip.execute(
        QUALIFICATION, "run", QUALIFICATION_INPUT, action_id=new_action_id(), idempotency_key=QUALIFICATION_KEY
    )
    for result in (blocking, streamed):
        assert result.kind == "completed"
        assert_is_output_object(result.output)
        assert result.output is not None
        assert result.output["raw"] == "case triaged"
        assert result.output["token_usage"]["total_tokens"] == 5
    assert streamed.route == "POST /jobs/stream"
    assert [(c.kind, c.text) for c in streamed.chunks] == [("data", "case "), ("data", "triaged")]
