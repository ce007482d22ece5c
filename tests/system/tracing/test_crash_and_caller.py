"""Traces where a caller's headers are hostile, with a real supervisor exporting to a real receiver: a ``tracestate``
W3C would discard is dropped before the SDK would log it, so it forges no field in the text log."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_body, start_server
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.system.tracing.test_traces import KEY, SDK_ON, job_trace


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def tracing_to(receiver: OtlpReceiver, **settings: str) -> dict[str, str]:
    """A supervisor's environment: traced to ``receiver``, its batches sent every 50 ms."""
    return {**SDK_ON, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **settings}


def test_a_tracestate_w3c_would_discard_forges_no_field_in_the_text_log(tmp_path: Path, receiver: OtlpReceiver) -> None:
    server = start_server(tmp_path / "state", env=tracing_to(receiver, AIP_CREWAI_LOG_FORMAT="text"))
    caller_span = secrets.token_hex(8)
    traceparent = f"00-{secrets.token_hex(16)}-{caller_span}-01"
    headers = {**KEY, "traceparent": traceparent, "tracestate": "Z action_id=victim outcome=completed"}
    with server.client() as client:
        answer = client.post("/jobs", json=start_body("demo", "stated"), headers=headers)
        assert answer.status_code == 200, answer.text
        assert client.get("/jobs/stated").json()["status"] == "completed"
    root, _ = job_trace(receiver, "stated")
    assert root.parent_id == caller_span  # the caller's traceparent stands; its state is dropped
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "action_id=stated" in log  # the text format, its fields as it writes them
    assert "victim" not in log
