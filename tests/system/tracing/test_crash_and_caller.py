"""Traces where a job's end is not its own, and a caller's headers are hostile, with a real supervisor exporting to a
real receiver: a supervisor killed mid-job (kill -9) leaves its job's root unexported, and the supervisor restarted
on the same state says the job's outcome in its trace (a ``fenced`` span beneath the root the journal names); a
``tracestate`` W3C would discard is dropped before the SDK would log it, so it forges no field in the text log."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import gone, start_body, start_server, wait_until
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.system.tracing.test_traces import KEY, begin, job_trace


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def tracing_to(receiver: OtlpReceiver, **settings: str) -> dict[str, str]:
    """A supervisor's environment: traced to ``receiver``, its batches sent every 50 ms."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **settings}


def span_of(receiver: OtlpReceiver, name: str, action_id: str) -> ReceivedSpan:
    """The job's span ``name``, once it has arrived."""

    def matches(span: ReceivedSpan) -> bool:
        return span.name == name and span.attributes.get("crew_supervisor.action_id") == action_id

    spans = receiver.wait_for(lambda spans: any(matches(span) for span in spans), timeout=60)
    (span,) = [span for span in spans if matches(span)]
    return span


def test_a_job_its_supervisor_died_under_says_its_outcome_in_its_trace(tmp_path: Path, receiver: OtlpReceiver) -> None:
    state, env = tmp_path / "state", tracing_to(receiver)
    first = start_server(state, env=env)
    with first.client() as client:
        pid = begin(client, start_body("demo-slow", "crashed", input={"seconds": 120}))
        trace_id = client.get("/jobs/crashed").json()["trace_id"]
    admission = span_of(receiver, "admission", "crashed")  # exported while the job ran: its root never is
    first.kill()
    assert wait_until(lambda: gone(pid), timeout=10), "worker outlived the killed supervisor"
    with contextlib.closing(sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True)) as db:
        journaled = db.execute("SELECT trace_id, span_id FROM traces WHERE action_id = 'crashed'").fetchone()
    assert journaled == (trace_id, admission.parent_id)

    second = start_server(state, env=env)  # fences the job before it serves
    fenced = span_of(receiver, "fenced", "crashed")
    assert (fenced.trace_id, fenced.parent_id) == journaled
    assert fenced.status == "ERROR" and fenced.resource["process.pid"] == second.pid
    attributes = {"crew_supervisor.crew_id": "demo-slow", "crew_supervisor.operation": "run"}
    attributes |= {"crew_supervisor.outcome": "failed", "crew_supervisor.reason": "supervisor_restarted"}
    assert fenced.attributes.items() >= {**attributes, "crew_supervisor.uncertain_outcome": True}.items()
    with second.client() as client:
        view = client.get("/jobs/crashed").json()
    assert (view["status"], view["terminal"]["error_type"], view["trace_id"]) == (
        "failed",
        "supervisor_restarted",
        trace_id,
    )
    assert not [span for span in receiver.trace(trace_id) if span.span_id == journaled[1]]  # died with the first


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
