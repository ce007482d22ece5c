"""The emulated connector's request and classification rules against a scripted transport (no server):
what it sends, which route each operation takes, its health gate, its error classes, its retries, and
the cancel it sends when a stream breaks."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.system.compat.aip_client import (
    CANCEL_REASON,
    OPERATIONS,
    STREAMED,
    AipClient,
    AuthenticationError,
    ConfigError,
    HealthGateError,
    RejectedError,
    StreamError,
    TemporaryError,
    classify,
    new_action_id,
)

TOKEN = "secret-token"
OUTPUT = {"raw": "ok", "token_usage": {"total_tokens": 1}}
HEALTH = {
    "status": "ready",
    "crews": ["demo", "other"],
    "durable_journal": True,
    "operations": ["batch_run", "cancel", "events", "knowledge_query", "run", "status"],
    "extra": {"ignored": True},
}

Handler = Callable[[httpx.Request], httpx.Response]


def sse(*events: tuple[str, int, Any]) -> bytes:
    return b"".join(
        b"event: %s\ndata: %s\n\n"
        % (name.encode(), json.dumps({"event": name, "sequence": seq, "data": data}).encode())
        for name, seq, data in events
    )


def completed_stream() -> bytes:
    return sse(("started", 0, {"status": "running"}), ("completed", 1, OUTPUT))


class Recorder:
    """A transport answering from ``handler`` and keeping every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.handler(request)

    def client(self, operations: tuple[str, ...] = tuple(sorted(OPERATIONS))) -> AipClient:
        return AipClient(
            "http://127.0.0.1:8090",
            TOKEN,
            crews=("demo",),
            operations=operations,
            transport=httpx.MockTransport(self),
        )

    def routes(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


def default_handler(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/health":
        return httpx.Response(200, json=HEALTH)
    if path == "/jobs/stream":
        return httpx.Response(200, content=completed_stream(), headers={"Content-Type": "text/event-stream"})
    if path == "/jobs":
        return httpx.Response(200, json=OUTPUT)
    if path.endswith("/cancel"):
        return httpx.Response(200)
    return httpx.Response(200, json={"status": "completed", "output": OUTPUT})


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    yield Recorder(default_handler)


def start(client: AipClient, operation: str = "run", **kwargs: Any) -> Any:
    return client.execute("demo", operation, {"topic": "x"}, action_id=new_action_id(), idempotency_key="k", **kwargs)


# --- what it sends --------------------------------------------------------------------------------------


def test_a_start_sends_the_contract_body_and_headers(recorder: Recorder) -> None:
    action = new_action_id()
    with recorder.client() as client:
        client.execute("demo", "run", {"topic": "x"}, action_id=action, idempotency_key="key-1")
        client.execute("demo", "run", {"topic": "x"}, action_id=new_action_id(), idempotency_key="k", timeout_ms=900)
    first, second = recorder.requests
    assert json.loads(first.content) == {
        "crew_id": "demo",
        "action_id": action,
        "operation": "run",
        "input": {"topic": "x"},
    }
    assert json.loads(second.content)["timeout_ms"] == 900  # only when the action has one
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"
    assert first.headers["Idempotency-Key"] == "key-1" and first.headers["X-AIP-Action-ID"] == action


def test_status_and_events_send_no_idempotency_key_but_cancel_does(recorder: Recorder) -> None:
    action = new_action_id()
    recorder.handler = lambda r: (
        httpx.Response(
            200, json={"action_id": action, "cursor": 0, "next_cursor": 0, "status": "running", "events": []}
        )
        if r.url.path.endswith("/events")
        else default_handler(r)
    )
    with recorder.client() as client:
        client.status(action)
        client.events_json(action, 0)
        assert client.cancel(action, "demo", "stop") is None  # an empty 2xx confirms
    status, events, cancel = recorder.requests
    assert "Idempotency-Key" not in status.headers and "Idempotency-Key" not in events.headers
    assert cancel.headers["Idempotency-Key"] and cancel.headers["X-AIP-Action-ID"] == action
    assert json.loads(cancel.content) == {"crew_id": "demo", "action_id": action, "reason": "stop"}
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in recorder.requests)


@pytest.mark.parametrize(
    "action", ["act_" + "a" * 31, "act_" + "A" * 32, "act-" + "a" * 32, "a" * 36, "act_" + "g" * 32]
)
def test_action_ids_are_act_and_32_hex_digits(recorder: Recorder, action: str) -> None:
    with recorder.client() as client, pytest.raises(ConfigError, match="act_"):
        client.execute("demo", "run", {}, action_id=action, idempotency_key="k")
    assert recorder.requests == []


def test_input_and_body_bounds_are_checked_before_sending(recorder: Recorder) -> None:
    with recorder.client() as client:
        with pytest.raises(ConfigError, match="1 MiB"):
            client.execute("demo", "run", {"x": "y" * 1024 * 1024}, action_id=new_action_id(), idempotency_key="k")
        with pytest.raises(ConfigError, match="not configured"):
            client.execute("nope", "run", {}, action_id=new_action_id(), idempotency_key="k")
    assert recorder.requests == []


@pytest.mark.parametrize(
    "url", ["http://example.com", "http://127.0.0.1:1/base", "ftp://127.0.0.1", "http://u:p@[::1]:1"]
)
def test_the_base_url_is_an_origin_and_plain_http_is_loopback_only(url: str) -> None:
    with pytest.raises(ConfigError):
        AipClient(url, TOKEN, crews=("demo",))


def test_loopback_and_https_origins_are_accepted() -> None:
    for url in ("http://127.0.0.1:8090", "http://[::1]:8090/", "http://localhost:1", "https://sidecar.example"):
        AipClient(url, TOKEN, crews=("demo",)).close()


# --- routes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_route_per_operation_and_invoke_always_blocks(recorder: Recorder, operation: str) -> None:
    with recorder.client() as client:
        result = start(client, operation)
        blocking = client.invoke("demo", operation, {}, action_id=new_action_id(), idempotency_key="k")
    expected = "POST /jobs/stream" if operation in STREAMED else "POST /jobs"
    assert recorder.routes() == [expected, "POST /jobs"]
    assert result.route == expected and result.output == OUTPUT
    assert blocking.route == "POST /jobs" and blocking.output == OUTPUT  # the 2xx body is the output


def test_rereading_as_sse_asks_for_an_event_stream(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(
        200, content=sse(("completed", 4, OUTPUT)), headers={"Content-Type": "text/event-stream"}
    )
    with recorder.client() as client:
        result = client.events_stream(new_action_id(), 4)
    (request,) = recorder.requests
    assert request.headers["Accept"] == "text/event-stream" and request.url.params["cursor"] == "4"
    assert result.output == OUTPUT


def test_a_stream_answered_as_json_is_an_error(recorder: Recorder) -> None:
    recorder.handler = lambda r: (
        httpx.Response(200, json=OUTPUT) if r.url.path == "/jobs/stream" else httpx.Response(200)
    )
    with recorder.client() as client, pytest.raises(StreamError, match="not text/event-stream"):
        start(client, "run")


# --- the health gate ------------------------------------------------------------------------------------


def test_the_health_gate_passes_and_ignores_extra_keys(recorder: Recorder) -> None:
    with recorder.client(("run", "batch_run", "knowledge_query")) as client:
        assert client.check_health()["extra"] == {"ignored": True}


@pytest.mark.parametrize(
    ("change", "operations", "message"),
    [
        ({"status": "starting"}, ("run",), "not ready"),
        ({"durable_journal": "true"}, ("run",), "not durable"),
        ({"durable_journal": 1}, ("run",), "not durable"),
        ({"durable_journal": False}, ("run",), "not durable"),
        ({"crews": ["other"]}, ("run",), "crews"),
        ({"operations": ["run", "status", "cancel"]}, ("run",), "events"),
        ({}, ("run", "train"), "train"),
        ({"crews": "demo"}, ("run",), "lists"),
    ],
)
def test_the_health_gate_refuses(
    recorder: Recorder, change: dict[str, Any], operations: tuple[str, ...], message: str
) -> None:
    recorder.handler = lambda r: httpx.Response(200, json={**HEALTH, **change})
    with recorder.client(operations) as client, pytest.raises(HealthGateError, match=message):
        client.check_health()


def test_the_health_gate_wants_json_and_a_2xx(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, text="ready")
    with recorder.client(("run",)) as client, pytest.raises(HealthGateError, match="not JSON"):
        client.check_health()
    recorder.handler = lambda r: httpx.Response(401, json={"detail": "no"})
    with recorder.client(("run",)) as client, pytest.raises(AuthenticationError):
        client.check_health()


# --- error classes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_authentication_errors(status: int) -> None:
    assert isinstance(classify(status, "", "run"), AuthenticationError)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 507, 599])
def test_temporary_errors_are_retryable_only_when_read_only(status: int) -> None:
    mutation, read = classify(status, "", "run"), classify(status, "", "status")
    assert isinstance(mutation, TemporaryError) and isinstance(read, TemporaryError)
    assert mutation.uncertain and not mutation.retryable
    assert read.retryable and not read.uncertain


@pytest.mark.parametrize("status", [400, 404, 409, 413, 416, 422, 428, 301])
def test_every_other_status_is_rejected_permanent_and_certain(status: int) -> None:
    error = classify(status, "", "run")
    assert isinstance(error, RejectedError) and error.permanent and not error.retryable and not error.uncertain


def test_a_temporary_error_is_retried_for_a_read_but_not_for_a_mutation(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(503, json={"detail": "draining"})
    with recorder.client() as client:
        with pytest.raises(TemporaryError) as read:
            start(client, "knowledge_query")
        assert len(recorder.requests) == 3 and read.value.retryable
        recorder.requests.clear()
        with pytest.raises(TemporaryError) as mutation:
            start(client, "memory_reset")
        assert len(recorder.requests) == 1 and mutation.value.uncertain
        recorder.requests.clear()
        with pytest.raises(TemporaryError):
            start(client, "run")
        assert recorder.routes() == ["POST /jobs/stream"]


def test_a_retried_read_can_succeed(recorder: Recorder) -> None:
    answers = iter([httpx.Response(502), httpx.Response(429), httpx.Response(200, json={"status": "running"})])
    recorder.handler = lambda r: next(answers)
    with recorder.client() as client:
        assert client.status(new_action_id()) == {"status": "running"}
    assert len(recorder.requests) == 3


def test_a_blocking_409_or_502_is_classified_by_status(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(409, json={"detail": "run was cancelled"})
    with recorder.client() as client, pytest.raises(RejectedError):
        client.invoke("demo", "run", {}, action_id=new_action_id(), idempotency_key="k")
    recorder.handler = lambda r: httpx.Response(502, json={"detail": "run failed"})
    with recorder.client() as client, pytest.raises(TemporaryError) as failed:
        client.invoke("demo", "run", {}, action_id=new_action_id(), idempotency_key="k")
    assert failed.value.uncertain


# --- a broken stream ------------------------------------------------------------------------------------


BROKEN = {
    "gap": sse(("started", 0, {}), ("chunk", 2, {"content": "x"}), ("completed", 3, OUTPUT)),
    "no terminal": sse(("started", 0, {}), ("chunk", 1, {"content": "x"})),
}


@pytest.mark.parametrize("body", BROKEN.values(), ids=BROKEN.keys())
@pytest.mark.parametrize("operation", sorted(STREAMED))
def test_a_broken_stream_cancels_run_and_batch_run_and_gives_up(
    recorder: Recorder, body: bytes, operation: str
) -> None:
    recorder.handler = lambda r: (
        httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})
        if r.url.path == "/jobs/stream"
        else httpx.Response(200, json={"status": "cancelled"})
    )
    with recorder.client() as client, pytest.raises(StreamError):
        start(client, operation)
    if operation in ("run", "batch_run"):
        assert recorder.routes()[0] == "POST /jobs/stream" and recorder.routes()[1].endswith("/cancel")
        assert json.loads(recorder.requests[1].content)["reason"] == CANCEL_REASON
        assert len(recorder.requests) == 2  # no resume, no status fetch
    else:
        assert recorder.routes() == ["POST /jobs/stream"]
