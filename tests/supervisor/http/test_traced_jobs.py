"""Jobs a real supervisor traces (``OTEL_EXPORTER_OTLP_ENDPOINT`` at a real OTLP/HTTP receiver, real workers): a
caller's ``traceparent`` makes the job's trace part of its own; a malformed trace context, on every start route, is
ignored and never refused; a resume's root links to its old job's; the job's record, ``show``, ``/health`` and
``doctor --url`` name the trace and its page in the trace UI (``TRACE_UI_URL``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from supervisor.testing import Server
from tests.conftest import ROOT, start_body, start_server, stop_server
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan

TRACE_UI = "http://localhost:16686/trace/{trace_id}"
PARENT_TRACE, PARENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
KEY = {"Idempotency-Key": "key"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as received:
        yield received


@pytest.fixture(scope="module")
def traced(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: a job's spans exported soon after it ends
        "AIP_CREWAI_TRACE_UI_URL": TRACE_UI,
    }
    server = start_server(tmp_path_factory.mktemp("traced") / "state", env=env)
    yield server
    stop_server(server)


def root_of(receiver: OtlpReceiver, action_id: str) -> ReceivedSpan:
    """The job's root span, once exported (with the job's end): the parent of its ``admission`` span."""

    def admission(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (s for s in spans if s.name == "admission" and s.attributes.get("crew_supervisor.action_id") == action_id),
            None,
        )

    def found(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        child = admission(spans)
        return next((s for s in spans if child is not None and s.span_id == child.parent_id), None)

    spans = receiver.wait_for(lambda spans: found(spans) is not None, timeout=60)
    root = found(spans)
    assert root is not None
    return root


def started(client: httpx.Client, route: str, action_id: str, headers: list[tuple[str, str]], status: int = 200) -> Any:
    body = start_body("boom" if status == 502 else "demo", action_id)
    answer = client.post(route, json=body, headers=[*KEY.items(), *headers])
    assert answer.status_code == status, answer.text
    return client.get(f"/jobs/{action_id}").json()


def test_a_callers_traceparent_makes_the_jobs_trace_part_of_its_own(traced: Server, receiver: OtlpReceiver) -> None:
    with traced.client() as client:
        view = started(client, "/jobs", "child", [("traceparent", TRACEPARENT), ("tracestate", "vendor=abc")])
        health = client.get("/health").json()
    assert view["trace_id"] == PARENT_TRACE
    assert view["trace_url"] == f"http://localhost:16686/trace/{PARENT_TRACE}"
    root = root_of(receiver, "child")
    assert (root.trace_id, root.parent_id) == (PARENT_TRACE, PARENT_SPAN)
    assert health["tracing"] == {"exporter": "otlp/http", "trace_ui_url": TRACE_UI}


MALFORMED = [
    ("/jobs", [("traceparent", "not a trace context"), ("tracestate", "=")]),
    ("/jobs/stream", [("traceparent", f"00-{'0' * 32}-{PARENT_SPAN}-01")]),  # an all-zero trace id: invalid
    ("/runs", [("traceparent", f"zz-{PARENT_TRACE}-{PARENT_SPAN}-01")]),
    ("/runs/stream", [("tracestate", "vendor=abc")]),  # a tracestate without its traceparent
    # Two valid lines: joined, as HTTP joins them, they are one malformed value (which parent would count?).
    ("/jobs", [("traceparent", TRACEPARENT), ("traceparent", f"00-{'1' * 32}-{'2' * 16}-01")]),
]


@pytest.mark.parametrize(("route", "headers"), MALFORMED)
def test_a_malformed_trace_context_is_ignored_and_never_refused(
    traced: Server, receiver: OtlpReceiver, route: str, headers: list[tuple[str, str]]
) -> None:
    action_id = f"malformed-{MALFORMED.index((route, headers))}"
    with traced.client() as client:
        view = started(client, route, action_id, headers)
    assert view["trace_id"] not in (None, PARENT_TRACE, "1" * 32)  # a trace of its own
    root = root_of(receiver, action_id)
    assert (root.trace_id, root.parent_id) == (view["trace_id"], "")


def test_a_resumes_trace_links_to_its_old_jobs(traced: Server, receiver: OtlpReceiver) -> None:
    """The resume's root is its caller's child, and links to the root of the job it continues."""
    with traced.client() as client:
        old = started(client, "/jobs", "to-resume", [], status=502)
        parent = f"00-{'a' * 32}-{'b' * 16}-01"
        answer = client.post(
            "/jobs/to-resume/resume", json={"action_id": "to-resume-r1"}, headers={**KEY, "traceparent": parent}
        )
        assert answer.status_code == 502, answer.text  # it fails again
        new = client.get("/jobs/to-resume-r1").json()
    old_root, new_root = root_of(receiver, "to-resume"), root_of(receiver, "to-resume-r1")
    assert old_root.trace_id == old["trace_id"] and (new["trace_id"], new_root.parent_id) == ("a" * 32, "b" * 16)
    assert (old_root.trace_id, old_root.span_id) in new_root.links


def test_show_and_doctor_url_name_the_trace(traced: Server, receiver: OtlpReceiver) -> None:
    with traced.client() as client:
        view = started(client, "/jobs", "shown", [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_CREWAI_")}
    env |= {"PYTHONPATH": str(ROOT), "AIP_CREWAI_URL": traced.url, "AIP_CREWAI_BEARER_TOKEN": traced.token}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", *args], env=env, capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    lines = [line.split() for line in cli("show", "shown").splitlines()]
    url = f"http://localhost:16686/trace/{view['trace_id']}"
    assert ["trace", view["trace_id"]] in lines and ["trace", "url", url] in lines
    found = {f["check"]: f for f in orjson.loads(cli("doctor", "--url", traced.url, "--json"))}
    assert found["tracing"]["detail"] == f"each job traced, sent over otlp/http; a job's record links to {TRACE_UI}"
