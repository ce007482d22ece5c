"""The supervisor's traces (supervisor/jobs/tracing.py), exported by the real SDK over OTLP/HTTP to a real receiver
(tests/helpers/otlp_receiver.py): when tracing is on and with what; one job's spans as one tree; a worker's span frames
taken as the untrusted text they are (ids, parents, names, attributes and their types, masked and cut, clamped times,
a bound); what a stop, a kill, a cut-off and a failure leave; and the same through the job core itself, its worker a
scripted one that sends span frames."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import logging
import os
import re
import socket
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import MAX_OPEN_SPANS, MAX_SPAN_VALUE_CHARS, MAX_SPANS, Reason, SpanEnded, SpanStarted
from supervisor import logs
from supervisor.jobs import worker_spans
from supervisor.jobs.admission import JournalUnavailable
from supervisor.jobs.phases import StopReason
from supervisor.jobs.tracing import CLOSE_SECONDS, NO_TRACE, Traced, Tracing, TracingError
from supervisor.journal.records import Job
from supervisor.models import ResumeRequest
from supervisor.processes.process import StopEvidence
from supervisor.redaction import redact
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.supervisor.jobs.harness import DEADLINE, Core, core, in_loop
from tests.system.security.test_journal_lock import held_lock

KICKOFF, TASK, LLM, TOOL = "a" * 16, "b" * 16, "c" * 16, "d" * 16
SECRET = "sk-very-secret-0123456789"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    """The module's: each test reads the spans of its own tracer (``mine``)."""
    with OtlpReceiver() as running:
        yield running


def mine(receiver: OtlpReceiver, action_id: str) -> list[ReceivedSpan]:
    """The spans of the job ``action_id``: every span carries its job's."""
    return [span for span in receiver.spans if span.attributes.get("crew_supervisor.action_id") == action_id]


def tracing_to(receiver: OtlpReceiver, **environ: str) -> Tracing:
    return Tracing.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **environ})


def traced(tracing: Tracing, traceparent: str | None = None, **given: Any) -> Traced:
    """A new job's trace (an action id of its own: the tests share the module's receiver)."""
    trace = tracing.begin(f"job-{uuid.uuid4().hex}", "crew", "run", traceparent, time.time_ns(), **given)
    assert isinstance(trace, Traced)
    return trace


def exported(receiver: OtlpReceiver, tracing: Tracing, trace: Traced, count: int) -> dict[str, list[ReceivedSpan]]:
    """The spans of ``trace``'s job exported once ``tracing`` is closed (``count`` of them), by name; its root as
    "root"."""
    tracing.close()
    action_id = trace.job["crew_supervisor.action_id"]
    receiver.wait_for(lambda spans: len(mine(receiver, action_id)) >= count, timeout=30)
    return by_name(mine(receiver, action_id), count)


def by_name(spans: list[ReceivedSpan], count: int) -> dict[str, list[ReceivedSpan]]:
    assert len(spans) == count, " ".join(sorted(span.name for span in spans))
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        root = span.name == "job" and span.attributes.get("crew_supervisor.outcome") is not None
        named.setdefault("root" if root else span.name, []).append(span)
    return named


def started(id: str, name: str, parent: str = "", at: int | None = None, **attributes: Any) -> SpanStarted:
    return SpanStarted(id, parent, name, time.time_ns() if at is None else at, attributes)


def ended(id: str, at: int | None = None, error: str = "", **attributes: Any) -> SpanEnded:
    return SpanEnded(id, time.time_ns() if at is None else at, attributes, error)


# When tracing is on, and with what ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_SERVICE_NAME": "named", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"},  # no endpoint: nothing leaves
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "TRUE"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": " ", "OTEL_EXPORTER_OTLP_PROTOCOL": "nonsense"},
    ],
)
def test_tracing_is_off_without_an_endpoint_or_when_turned_off(environ: dict[str, str]) -> None:
    tracing = Tracing.from_environ(environ)
    assert tracing.exporter is None
    trace = tracing.begin("job-1", "crew", "run", None, time.time_ns())
    assert trace is NO_TRACE and trace.trace_id is None
    trace.refused("journal_full")
    assert trace.worker_started(1, ()) == ""  # Start.trace empty: the worker opens no span
    assert trace.take(started(KICKOFF, "kickoff")) is None  # a span frame of a job not traced: ignored
    evidence = StopEvidence(True, 1, 1, "SIGKILL", -9, 0, 1.0)
    with trace.killing() as killed:
        assert killed(evidence) is evidence
    tracing.close()


@pytest.mark.parametrize(
    ("environ", "exporter"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "otlp/http"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, "otlp/http"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "otlp"}, "otlp/http"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "otlp/grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # the signal's own wins
            },
            "otlp/http",
        ),
    ],
)
def test_an_endpoint_turns_tracing_on_over_the_protocol_named(environ: dict[str, str], exporter: str) -> None:
    tracing = Tracing.from_environ(environ)
    try:
        assert tracing.exporter == exporter
    finally:
        tracing.close()


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json' is not one"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, "OTLP protocol 'thrift' is not one"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
    ],
)
def test_what_cannot_be_had_is_a_tracing_error_in_one_line(environ: dict[str, str], said: str) -> None:
    with pytest.raises(TracingError) as raised:
        Tracing.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", **environ})
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_grpc_without_its_exporter_installed_is_a_tracing_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)  # not importable
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(TracingError, match="opentelemetry-exporter-otlp-proto-grpc"):
        Tracing.from_environ(environ)


@pytest.mark.parametrize(
    ("environ", "service"),
    [
        ({}, "crew-supervisor"),
        ({"OTEL_SERVICE_NAME": "sidecar-7"}, "sidecar-7"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from%20attributes,deployment.environment=test"}, "from attributes"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=attributes", "OTEL_SERVICE_NAME": "name"}, "name"),
    ],
)
def test_the_resource_names_the_service_its_version_and_pid(
    receiver: OtlpReceiver, environ: dict[str, str], service: str
) -> None:
    tracing = tracing_to(receiver, **environ)
    trace = traced(tracing)
    trace.admitted()
    trace.end("completed", {})
    resource = exported(receiver, tracing, trace, 2)["root"][0].resource
    assert resource["service.name"] == service and resource["process.pid"] == os.getpid()
    assert resource["service.version"] and resource["telemetry.sdk.name"] == "opentelemetry"
    if "deployment.environment" in environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        assert resource["deployment.environment"] == "test"


def test_the_signal_s_own_endpoint_is_taken_as_it_is(receiver: OtlpReceiver) -> None:
    tracing = Tracing.from_environ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces"})
    trace = traced(tracing)
    trace.admitted()
    trace.end("completed", {})
    assert set(exported(receiver, tracing, trace, 2)) == {"root", "admission"}


# One job's spans --------------------------------------------------------------------------------------------------


def test_a_job_s_spans_make_one_tree_each_with_the_job_s_attributes(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing)
    trace.admitted()
    trace.lap("queue")
    parent = trace.worker_started(4242, ())
    trace.lap("launch")
    assert trace.take(started(KICKOFF, "kickoff")) is None
    role = {"crew_supervisor.agent.role": "Researcher", "crew_supervisor.task.name": "research"}
    assert trace.take(started(TASK, "task", KICKOFF, **{"crew_supervisor.task.index": 0}, **role)) is None
    call = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-test"}
    assert trace.take(started(LLM, "llm.call", TASK, **call)) is None
    usage = {"gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5, "crew_supervisor.effect.id": 1}
    assert trace.take(ended(LLM, **usage, **{"crew_supervisor.effect.status": "finished"})) is None
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
    assert trace.take(started(TOOL, "tool.call", TASK, **tool)) is None
    assert trace.take(ended(TOOL, error="ValueError")) is None
    for id in (TASK, KICKOFF):
        assert trace.take(ended(id)) is None
    for step in ("worker_start", "job", "exit"):
        trace.lap(step)
    trace.exited({"exit_status": 0})
    for step in ("cleanup", "journal"):
        trace.lap(step)
    trace.end("completed", {"reason": "never read for a completed job"}, 10, 5)
    spans = exported(receiver, tracing, trace, 14)
    (root,) = spans["root"]
    assert root.parent_id == "" and root.trace_id == trace.trace_id and root.span_id == trace.span_id
    assert all(span.trace_id == root.trace_id for named in spans.values() for span in named)
    assert all(trace.job.items() <= span.attributes.items() for named in spans.values() for span in named)
    steps = ["admission", "queue", "launch", "worker_start", "job", "exit", "cleanup", "journal", "worker"]
    assert all(spans[name][0].parent_id == root.span_id for name in steps)
    laps = [spans[name][0] for name in steps[:-1]]  # each from the previous one's end, in order
    assert all(one.end_ns == after.start_ns for one, after in itertools.pairwise(laps))
    assert root.start_ns == laps[0].start_ns and root.end_ns >= laps[-1].end_ns
    (worker,) = spans["worker"]
    assert parent.startswith(f"00-{root.trace_id}-{worker.span_id}-")  # Start.trace: the worker's spans go beneath
    assert int(parent[-2:], 16) & 1  # sampled (the SDK's ids also say "random", W3C's level 2 flag)
    assert worker.attributes["process.pid"] == 4242 and worker.attributes["process.exit.code"] == 0
    assert [name for name, _ in worker.events] == ["exit"]
    assert spans["kickoff"][0].parent_id == worker.span_id
    assert spans["task"][0].parent_id == spans["kickoff"][0].span_id
    assert {spans["llm.call"][0].parent_id, spans["tool.call"][0].parent_id} == {spans["task"][0].span_id}
    assert spans["task"][0].attributes.items() >= role.items()
    assert spans["llm.call"][0].attributes.items() >= {**call, **usage}.items()
    assert spans["llm.call"][0].status == "UNSET"
    failed_tool = spans["tool.call"][0]
    assert failed_tool.status == "ERROR" and failed_tool.attributes["error.type"] == "ValueError"
    assert root.attributes["crew_supervisor.outcome"] == "completed" and root.status == "UNSET"
    assert "crew_supervisor.reason" not in root.attributes
    assert root.attributes["gen_ai.usage.input_tokens"] == 10 and root.attributes["gen_ai.usage.output_tokens"] == 5
    assert not {"stop", "kill"} & spans.keys()


def test_a_caller_s_traceparent_makes_the_job_its_child(receiver: OtlpReceiver) -> None:
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    tracing = tracing_to(receiver)
    trace = traced(tracing, f"00-{caller_trace}-{caller_span}-01", tracestate="vendor=opaque")
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert (root.trace_id, root.parent_id) == (caller_trace, caller_span) and trace.trace_id == caller_trace


@pytest.mark.parametrize(
    "traceparent",
    ["", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"],
)
def test_a_malformed_traceparent_is_ignored(receiver: OtlpReceiver, traceparent: str) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing, traceparent)
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert root.parent_id == "" and re.fullmatch("[0-9a-f]{32}", root.trace_id) and root.trace_id != "0" * 32


CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{CALLER_SPAN}-01"
FORGING = "Z action_id=victim outcome=completed"  # a text log line would show it as two fields of its own


def sdk_said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the OpenTelemetry API and SDK logged: a caller's header, in a warning, would be quoted there."""
    return [record.getMessage() for record in caplog.records if record.name.startswith("opentelemetry")]


@pytest.mark.parametrize(
    ("tracestate", "kept"),
    [
        ("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", True),
        ("a=1,, b=two words\t,\tt3n@vendor=x", True),  # empty members and blanks: two header lines joined
        (FORGING, False),
        ("a=1,Z action_id=victim", False),  # one member breaks the grammar: the whole header goes
        ("a=1,b=has=equals", False),
        (",".join(f"k{n}=v" for n in range(33)), False),  # W3C's 32 members at most
        (",".join(f"k{n}={'v' * 200}" for n in range(3)), False),  # W3C's 512 characters at most
    ],
)
def test_a_tracestate_is_kept_only_within_w3c_s_grammar_and_bounds_and_never_logged(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture, tracestate: str, kept: bool
) -> None:
    caplog.set_level(logging.DEBUG, "opentelemetry")
    tracing = tracing_to(receiver)
    trace = traced(tracing, CALLER, tracestate=tracestate)
    state = trace.root.get_span_context().trace_state  # the caller's, which its child carries on
    assert state.to_header() == (",".join(part.strip(" \t") for part in tracestate.split(",") if part) if kept else "")
    assert sdk_said(caplog) == []
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert root.parent_id == CALLER_SPAN  # the traceparent stands without its state


def test_a_traceparent_too_long_to_be_one_is_ignored_unread(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "opentelemetry")
    tracing = tracing_to(receiver)
    trace = traced(tracing, f"01-{CALLER[3:]}-" + "f" * 600, tracestate="a=1")  # a later version may carry more
    assert sdk_said(caplog) == []
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert root.parent_id == ""


def test_a_caller_that_does_not_sample_its_trace_leaves_the_job_untraced(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = tracing.begin("unsampled", "crew", "run", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", 1)
    assert trace is NO_TRACE
    tracing.close()
    assert mine(receiver, "unsampled") == []


def test_a_resume_s_root_links_to_the_job_it_continues(receiver: OtlpReceiver) -> None:
    old = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    tracing = tracing_to(receiver)
    trace = traced(tracing, link=old)
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert root.links == (old,) and root.parent_id == ""


@pytest.mark.parametrize(
    "ids",
    [
        ("changed by hand", CALLER_SPAN),
        ("4bf92f3577b34da6a3ce929d0e0e4736", "0" * 16),  # W3C's invalid id
        ("4BF92F3577B34DA6A3CE929D0E0E4736", CALLER_SPAN),
        (b"4bf92f3577b34da6a3ce929d0e0e4736", CALLER_SPAN),  # SQLite keeps what it is given: a blob
        (7, 8),
    ],
)
def test_a_resume_s_root_is_not_linked_through_ids_the_journal_holds_malformed(
    receiver: OtlpReceiver, ids: tuple[Any, Any]
) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing, link=ids)
    trace.admitted()
    trace.end("completed", {})
    (root,) = exported(receiver, tracing, trace, 2)["root"]
    assert root.links == ()


def test_a_start_refused_once_its_trace_began_ends_its_root_and_admission_as_errors(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing)
    trace.refused("journal_unavailable")
    trace.refused("journal_full")  # once ended, nothing more of it
    trace.end("completed", {})
    spans = exported(receiver, tracing, trace, 2)
    (root,), (admission,) = spans["root"], spans["admission"]
    assert root.attributes["crew_supervisor.outcome"] == "refused"
    assert root.attributes["crew_supervisor.reason"] == "journal_unavailable"
    assert root.status == admission.status == "ERROR" and root.status_message == "journal_unavailable"
    assert admission.parent_id == root.span_id and "crew_supervisor.outcome" not in admission.attributes
    assert root.end_ns == admission.end_ns


def test_a_fenced_job_s_outcome_is_a_span_beneath_its_journaled_root(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    job = Job(f"job-{uuid.uuid4().hex}", "crew", "run", "", "running", 3)
    unreadable = Job(f"job-{uuid.uuid4().hex}", "crew", "run", "", "running", 3)
    root = (uuid.uuid4().hex, uuid.uuid4().hex[:16])
    began = time.time_ns()
    tracing.fenced(job, root, Reason.SUPERVISOR_RESTARTED, began)
    tracing.fenced(unreadable, ("changed by hand", root[1]), Reason.SUPERVISOR_RESTARTED, began)  # nothing
    Tracing().fenced(job, root, Reason.SUPERVISOR_RESTARTED, began)  # not tracing: nothing
    tracing.close()
    receiver.wait_for(lambda spans: mine(receiver, job.action_id) != [], timeout=30)
    (fenced,) = mine(receiver, job.action_id)
    assert (fenced.name, fenced.trace_id, fenced.parent_id) == ("fenced", *root)
    assert fenced.status == "ERROR" and fenced.status_message == "supervisor_restarted"
    assert fenced.attributes == {
        "crew_supervisor.action_id": job.action_id,
        "crew_supervisor.crew_id": "crew",
        "crew_supervisor.operation": "run",
        "crew_supervisor.outcome": "failed",
        "crew_supervisor.reason": "supervisor_restarted",
        "crew_supervisor.uncertain_outcome": True,
    }
    assert began <= fenced.start_ns <= fenced.end_ns
    assert mine(receiver, unreadable.action_id) == []


def test_a_cancel_exports_its_stop_and_kill_and_cuts_off_what_the_worker_had_open(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing)
    trace.admitted()
    trace.worker_started(4242, ())
    assert trace.take(started(KICKOFF, "kickoff")) is None
    assert trace.take(started(LLM, "llm.call", KICKOFF, **{"gen_ai.request.model": "slow"})) is None
    trace.stop_asked(StopReason.CANCEL, f"stop it, my key is {SECRET}")
    trace.stop_asked(StopReason.TIMEOUT, None)  # the first stop won: one stop span
    with trace.killing() as killed:
        killed(StopEvidence(True, 4242, 4242, "SIGKILL", -9, 2, 3.0))
    trace.exited({"exit_status": -9, "signal": "SIGKILL"})
    trace.end("cancelled", {"reason": f"stop it, my key is {SECRET}", "stop_confirmed": True})
    spans = exported(receiver, tracing, trace, 7)
    (root,), (stop,), (kill,), (worker,) = spans["root"], spans["stop"], spans["kill"], spans["worker"]
    assert stop.parent_id == root.span_id and stop.attributes["crew_supervisor.stop_reason"] == "cancel"
    assert stop.status == "UNSET" and stop.end_ns == root.end_ns  # it lasts until the job's end
    assert kill.parent_id == stop.span_id and stop.end_ns >= kill.end_ns and kill.status == "UNSET"
    expected = {"crew_supervisor.signal": "SIGKILL", "crew_supervisor.descendants_killed": 2}
    assert kill.attributes.items() >= {**expected, "crew_supervisor.stop_confirmed": True}.items()
    assert worker.attributes["crew_supervisor.exit_signal"] == "SIGKILL"
    for name in ("kickoff", "llm.call"):  # what the kill interrupted: ended as cut off, no later than the worker
        (cut,) = spans[name]
        assert cut.status == "ERROR" and cut.attributes["error.type"] == "cut_off" and cut.end_ns <= worker.end_ns
    assert root.status == "UNSET" and root.attributes["crew_supervisor.outcome"] == "cancelled"
    assert "crew_supervisor.reason" not in root.attributes  # what a canceller said is free text
    said = [repr(span) for span in mine(receiver, trace.job["crew_supervisor.action_id"])]
    assert all(SECRET not in text and "stop it" not in text for text in said)


def test_a_failed_job_s_root_is_an_error_with_its_reason(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing)
    trace.admitted()
    trace.worker_started(4242, ())
    assert trace.take(started(KICKOFF, "kickoff")) is None
    trace.end("failed", {"reason": Reason.WORKER_KILLED, "uncertain_outcome": True, "message": "free text"})
    spans = exported(receiver, tracing, trace, 4)
    (root,) = spans["root"]
    assert root.status == "ERROR" and root.status_message == "worker_killed"
    assert root.attributes["crew_supervisor.reason"] == "worker_killed"
    assert root.attributes["crew_supervisor.uncertain_outcome"] is True
    for name in ("worker", "kickoff"):  # never said gone: cut off by the job's end
        assert spans[name][0].status == "ERROR" and spans[name][0].attributes["error.type"] == "cut_off"


def test_the_root_is_current_within_the_job_and_its_log_lines_carry_its_ids(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = traced(tracing)
    said = io.StringIO()
    handler = logging.StreamHandler(said)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.TraceFields())
    logger = logging.getLogger("crew_supervisor.tests.tracing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("outside")
        with trace.current():
            logger.info("inside")
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in said.getvalue().splitlines()]
    assert [("trace_id" in line, "span_id" in line) for line in lines] == [(False, False), (True, True), (False, False)]
    assert (lines[1]["trace_id"], lines[1]["span_id"]) == (trace.trace_id, trace.span_id)
    # Left without its end (the supervisor failed settling it): the trace ends all the same, its root cut off.
    (root,) = exported(receiver, tracing, trace, 2)["job"]  # no outcome: it never had one
    assert root.status == "ERROR" and root.attributes["error.type"] == "cut_off"


def test_the_sdk_s_lines_said_within_a_job_carry_no_trace_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export queue full (two spans), its exporter retrying a refused export: the SDK says "Queue full" at the
    end of a job's span, within the job, and the line is the supervisor's, not the job's."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "2")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    tracing = Tracing.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})  # nothing listens there
    with serving_logs() as said:
        trace = traced(tracing)
        with trace.current():
            for _ in range(20):
                trace.lap("queue")  # the queue holds two, the exporter takes one and waits to retry it
            logging.getLogger("crew_supervisor.tests.tracing").warning("the job's own")
        trace.end("completed", {})
        tracing.close()
    lines = [json.loads(line) for line in said.getvalue().splitlines()]
    (own,) = [line for line in lines if line["event"] == "the job's own"]
    assert own["trace_id"] == trace.trace_id
    sdk = [line for line in lines if line["logger"].startswith("opentelemetry.")]
    assert any(line["event"].startswith("Queue full") for line in sdk), lines
    assert not any("trace_id" in line or "span_id" in line for line in sdk), sdk


def test_the_sdk_s_lines_of_one_kind_come_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the SDK says an export failure, for each batch while the collector is down: its loggers' records pass
    the supervisor's handler once a minute each kind, the next saying how many were held back."""
    exporter = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    with serving_logs() as said:
        for attempt in range(100):
            exporter.error("Failed to export %s batch code: %s, reason: %s", "spans", 503, f"attempt {attempt}")
        exporter.warning("Transient error %s encountered while exporting %s batch, retrying in %.2fs.", "x", "y", 1)
        logging.getLogger("crew_supervisor.tests.tracing").warning("ours, each time")
        logging.getLogger("crew_supervisor.tests.tracing").warning("ours, each time")
    lines = [json.loads(line) for line in said.getvalue().splitlines()]
    assert [line["event"][:24] for line in lines] == [
        "Failed to export spans b",
        "Transient error x encoun",
        "ours, each time",
        "ours, each time",
    ]
    now = [0.0]
    held = logs.SdkLines(clock=lambda: now[0])
    record = logging.LogRecord("opentelemetry.sdk._shared_internal", logging.WARNING, "", 0, "Queue full", (), None)
    assert held.filter(record) and not held.filter(record) and not held.filter(record)
    now[0] = logs.SDK_LINE_SECONDS - 0.001  # still within its minute
    assert not held.filter(record)
    now[0] = logs.SDK_LINE_SECONDS
    assert held.filter(record) and record.held_back == 3


@contextlib.contextmanager
def serving_logs() -> Iterator[io.StringIO]:
    """What the supervisor's log handler (``logs.handler``) writes, in JSON, while within."""
    said = io.StringIO()
    handler = logs.handler("json", said)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield said
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_close_gives_up_on_an_endpoint_that_never_answers_within_its_bound() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections (the backlog), answers none
        port = silent.getsockname()[1]
        tracing = Tracing.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
        trace = traced(tracing)
        trace.admitted()
        trace.end("completed", {})
        began = time.monotonic()
        tracing.close()
        assert time.monotonic() - began < CLOSE_SECONDS + 2


# A worker's span frames, untrusted ----------------------------------------------------------------------------------


def worker_trace(tracing: Tracing, secrets: tuple[str, ...] = ()) -> Traced:
    trace = traced(tracing)
    trace.admitted()
    trace.worker_started(4242, secrets)
    return trace


BAD_FRAMES: list[tuple[list[SpanStarted | SpanEnded], str]] = [
    ([started("A" * 16, "kickoff")], "is not 16 lowercase hex digits"),
    ([started("a" * 15, "kickoff")], "is not 16 lowercase hex digits"),
    ([started("a" * 16 + "\n", "kickoff")], "is not 16 lowercase hex digits"),
    ([started(KICKOFF, "kickoff"), started(KICKOFF, "task")], "was used before"),
    ([started(TASK, "task", KICKOFF)], "is no span this job started"),
    ([started(KICKOFF, "http.request")], "is none a worker opens"),
    ([started(KICKOFF, "kickoff", **{"gen_ai.prompt": "hello"})], "is none a worker's span carries"),
    ([started(KICKOFF, "kickoff", **{"crew_supervisor.action_id": "forged"})], "is none a worker's span carries"),
    ([started(KICKOFF, "task", **{"crew_supervisor.task.index": "0"})], "is not a int"),
    ([started(KICKOFF, "task", **{"crew_supervisor.task.index": True})], "is not a int"),
    ([started(KICKOFF, "task", **{"crew_supervisor.task.index": 2**63})], "out of range"),
    ([started(KICKOFF, "task", **{"crew_supervisor.task.name": 7})], "is not a str"),
    ([ended(KICKOFF)], "which is no span of this job open"),
    ([started(KICKOFF, "kickoff"), ended(KICKOFF), ended(KICKOFF)], "which is no span of this job open"),
    ([started(KICKOFF, "kickoff"), ended(KICKOFF, **{"gen_ai.usage.input_tokens": 1.5})], "is not a int"),
]


@pytest.mark.parametrize(("frames", "said"), BAD_FRAMES)
def test_a_span_frame_that_breaks_a_rule_is_a_protocol_fault(
    receiver: OtlpReceiver, frames: list[SpanStarted | SpanEnded], said: str
) -> None:
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing)
    *before, last = frames
    assert all(trace.take(frame) is None for frame in before)
    fault = trace.take(last)
    tracing.close()
    assert fault is not None and fault[0] == Reason.PROTOCOL_ERROR and said in fault[1], fault
    assert len(fault[1]) < 200


def test_a_worker_s_strings_are_masked_and_cut(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing, (SECRET,))
    model = {"gen_ai.request.model": f"model-{SECRET}", "gen_ai.tool.name": "t" * 5000}
    assert trace.take(started(TOOL, "tool.call", **model)) is None
    assert trace.take(ended(TOOL, error=f"Error{SECRET[:10]}")) is None  # a secret it cut itself, at its end
    assert trace.take(started(TASK, "task", **{"crew_supervisor.task.name": "n" * 5000 + SECRET})) is None
    trace.end("completed", {})
    spans = exported(receiver, tracing, trace, 5)
    (tool,), (task,) = spans["tool.call"], spans["task"]
    assert tool.attributes["gen_ai.request.model"] == "model-[redacted]"
    assert tool.attributes["gen_ai.tool.name"] == "t" * MAX_SPAN_VALUE_CHARS
    assert tool.attributes["error.type"] == tool.status_message == "Error[redacted]"
    assert task.attributes["crew_supervisor.task.name"] == "n" * MAX_SPAN_VALUE_CHARS
    assert all(SECRET[:10] not in repr(span) for span in mine(receiver, trace.job["crew_supervisor.action_id"]))


def test_a_worker_s_times_are_clamped_into_its_span_and_now(receiver: OtlpReceiver) -> None:
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing)
    far = time.time_ns() + 3600 * 10**9
    assert trace.take(started(KICKOFF, "kickoff", at=0)) is None  # 1970
    assert trace.take(started(TASK, "task", KICKOFF, at=far)) is None
    assert trace.take(ended(TASK, at=0)) is None  # before its own start
    assert trace.take(ended(KICKOFF, at=far)) is None
    trace.exited({"exit_status": 0})
    closed = time.time_ns()
    trace.end("completed", {})
    spans = exported(receiver, tracing, trace, 5)
    (worker,), (kickoff,), (task,) = spans["worker"], spans["kickoff"], spans["task"]
    assert kickoff.start_ns == worker.start_ns and kickoff.end_ns <= closed
    assert worker.start_ns <= task.start_ns == task.end_ns <= closed


def test_past_max_spans_spans_are_dropped_and_counted(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_spans, "MAX_SPANS", 2)
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing)
    assert trace.take(started(KICKOFF, "kickoff")) is None
    assert trace.take(started(TASK, "task", KICKOFF)) is None
    assert trace.take(started(LLM, "llm.call", TASK)) is None  # dropped
    assert trace.take(started(TOOL, "tool.call", LLM)) is None  # beneath one dropped: dropped too
    assert trace.take(ended(LLM)) is None and trace.take(ended(TOOL)) is None  # their ends: nothing to end
    assert trace.take(started("e" * 16, "bogus")) is not None  # still checked
    trace.end("completed", {})
    spans = exported(receiver, tracing, trace, 5)
    assert not {"llm.call", "tool.call"} & spans.keys()
    assert spans["root"][0].attributes["crew_supervisor.spans_dropped"] == 2


def test_past_max_open_spans_spans_are_dropped_and_counted(receiver: OtlpReceiver) -> None:
    """A worker that keeps spans open holds the supervisor's memory: past the bound, one begun is dropped, and so
    is any span beneath it, whose end is then nothing to end; one ended makes room again."""
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing)
    held = [f"{n + 1:016x}" for n in range(MAX_OPEN_SPANS + 10)]
    assert all(trace.take(started(id, "task")) is None for id in held)  # the last 10 dropped
    assert trace.take(started(LLM, "llm.call", held[-1])) is None  # beneath one dropped: dropped too, no fault
    assert trace.take(ended(LLM)) is None and trace.take(ended(held[-1])) is None
    assert trace.take(started(TOOL, "tool.call", "e" * 16)) is None  # a parent never started, once one was dropped
    assert trace.take(ended(held[0])) is None
    assert trace.take(started(KICKOFF, "kickoff")) is None  # room for one again
    trace.end("completed", {})
    spans = exported(receiver, tracing, trace, 3 + MAX_OPEN_SPANS + 1)  # root, admission, worker, and the worker's
    assert len(spans["task"]) == MAX_OPEN_SPANS and len(spans["kickoff"]) == 1
    assert not {"llm.call", "tool.call"} & spans.keys()
    assert spans["root"][0].attributes["crew_supervisor.spans_dropped"] == 10 + 2


@pytest.mark.parametrize(
    "text",
    [
        "x" * 195 + SECRET + "y" * (1 << 20),  # across the cut, in a string as long as a frame allows
        SECRET * 100,  # each marker shorter than what it masks: the cut string reaches far into the worker's
        "z" * 150 + SECRET * 30 + SECRET[:12],
    ],
)
def test_a_worker_s_string_is_masked_as_a_whole_before_it_is_cut(receiver: OtlpReceiver, text: str) -> None:
    tracing = tracing_to(receiver)
    trace = worker_trace(tracing, (SECRET, "short-secret"))
    assert trace.take(started(TASK, "task", **{"crew_supervisor.task.name": text})) is None
    trace.end("completed", {})
    (task,) = exported(receiver, tracing, trace, 4)["task"]
    name = task.attributes["crew_supervisor.task.name"]
    assert name == redact(text, (SECRET, "short-secret"), cut_end=True)[:MAX_SPAN_VALUE_CHARS]
    assert len(name) == MAX_SPAN_VALUE_CHARS and SECRET[:6] not in name


# Through the job core -----------------------------------------------------------------------------------------------


@pytest.fixture
def tracing_on(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> OtlpReceiver:
    """Supervisors opened in this test trace to ``receiver`` (``Supervisor.open`` reads the process's environment)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {SECRET}")
    return receiver


@in_loop
async def test_a_job_through_the_core_is_one_trace_its_worker_s_spans_beneath(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    given = tmp_path / "trace"
    script = ["trace", "started", f"span:{KICKOFF}::kickoff", f"span:{TASK}:{KICKOFF}:task", f"span-end:{TASK}"]
    async with core(tmp_path) as it:
        assert it.sup.reads.tracing.exporter == "otlp/http"
        await it.start([*script, f"span-end:{KICKOFF}", "complete"], "core-tree", trace=str(given))
        assert (await it.settled("core-tree"))[0] == "completed"
    spans = by_name(mine(tracing_on, "core-tree"), 12)  # exported as the supervisor closed
    steps = ["admission", "queue", "launch", "worker_start", "job", "exit", "cleanup", "journal", "worker"]
    (root,) = spans["root"]
    assert set(spans) == {"root", *steps, "kickoff", "task"}
    assert all(spans[step][0].parent_id == root.span_id for step in steps)
    (worker,), (kickoff,), (task,) = spans["worker"], spans["kickoff"], spans["task"]
    assert given.read_text().startswith(f"00-{root.trace_id}-{worker.span_id}-")
    assert kickoff.parent_id == worker.span_id and task.parent_id == kickoff.span_id
    assert any(SECRET in request.get("authorization", "") for request in tracing_on.requests)  # the SDK's own


@in_loop
async def test_a_worker_flooding_its_trace_exports_its_bound_and_its_job_completes(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    """Spans past MAX_SPANS, or with MAX_OPEN_SPANS open, are dropped and counted on the root: the shared export
    queue holds what one job may send beside other jobs' spans, which all reach the receiver."""
    async with core(tmp_path) as it:
        await it.start(["started", "complete"], "core-quiet")
        await it.start(["started", f"span-flood:{MAX_SPANS + 2000}", "complete"], "core-flood")
        await it.start(["started", f"span-hold:{MAX_OPEN_SPANS + 100}", "complete"], "core-hold")
        for action_id in ("core-quiet", "core-flood", "core-hold"):
            assert (await it.settled(action_id))[0] == "completed"
    steps = ("admission", "queue", "launch", "worker_start", "job", "exit", "cleanup", "journal", "worker")
    assert set(by_name(mine(tracing_on, "core-quiet"), 10)) == {"root", *steps}
    flood = by_name(mine(tracing_on, "core-flood"), 10 + MAX_SPANS)
    assert len(flood["task"]) == MAX_SPANS and flood["root"][0].attributes["crew_supervisor.spans_dropped"] == 2000
    hold = by_name(mine(tracing_on, "core-hold"), 10 + MAX_OPEN_SPANS)
    assert len(hold["task"]) == MAX_OPEN_SPANS and hold["root"][0].attributes["crew_supervisor.spans_dropped"] == 100
    assert all(span.attributes["error.type"] == "cut_off" for span in hold["task"])  # never ended: cut off


@in_loop
async def test_a_bad_span_frame_fails_its_job_as_a_protocol_error(tmp_path: Path, tracing_on: OtlpReceiver) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", f"span:{TASK}:{KICKOFF}:task", "hang"], "core-fault")
        event, data = await it.settled("core-fault")
    assert (event, data["error_type"]) == ("failed", "protocol_error")
    assert "is no span this job started" in data["message"]
    (root,) = by_name(mine(tracing_on, "core-fault"), len(mine(tracing_on, "core-fault")))["root"]
    assert root.status == "ERROR" and root.attributes["crew_supervisor.reason"] == "protocol_error"


@in_loop
async def test_a_cancelled_job_s_trace_has_its_stop_its_kill_and_the_span_it_cut_off(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", f"span:{KICKOFF}::kickoff", "hang"], "core-cancel")
        await it.running("core-cancel")
        await it.cancel("core-cancel", reason=f"my key is {SECRET}")
        assert (await it.settled("core-cancel"))[0] == "cancelled"
    spans = by_name(mine(tracing_on, "core-cancel"), len(mine(tracing_on, "core-cancel")))
    (root,), (stop,), (kill,), (kickoff,) = spans["root"], spans["stop"], spans["kill"], spans["kickoff"]
    assert stop.parent_id == root.span_id and kill.parent_id == stop.span_id
    assert kill.attributes["crew_supervisor.stop_confirmed"] is True
    assert kickoff.status == "ERROR" and kickoff.attributes["error.type"] == "cut_off"
    assert all(SECRET not in repr(span) for span in mine(tracing_on, "core-cancel"))


@in_loop
async def test_a_start_the_locked_journal_refuses_ends_its_trace_as_refused(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    async with core(tmp_path) as it:
        with held_lock(it.journal.reader.path), pytest.raises(JournalUnavailable):  # a 503, its trace begun
            await it.start(["started", "complete"], "core-refused")
        assert it.journal.reader.get("core-refused") is None
    spans = by_name(mine(tracing_on, "core-refused"), 2)  # exported as the supervisor closed
    (root,), (admission,) = spans["root"], spans["admission"]
    assert root.attributes["crew_supervisor.outcome"] == "refused" and root.status == "ERROR"
    assert root.attributes["crew_supervisor.reason"] == "journal_unavailable"
    assert admission.status == "ERROR" and admission.parent_id == root.span_id


def changed_by_hand(it: Core, statement: str) -> None:
    """The supervisor's journal changed behind its back, as an operator's ``sqlite3`` could."""
    with contextlib.closing(sqlite3.connect(it.journal.reader.path)) as db, db:
        db.execute(statement)


@in_loop
async def test_a_resume_whose_old_trace_ids_are_malformed_runs_unlinked(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "fail"], "core-malformed")
        assert (await it.settled("core-malformed"))[0] == "failed"
        changed_by_hand(it, "UPDATE traces SET trace_id = 'changed by hand' WHERE action_id = 'core-malformed'")
        resumed = await it.sup.resume("core-malformed", ResumeRequest(action_id="core-malformed-r1"), "key")
        assert (await it.settled("core-malformed-r1"))[0] == "failed"  # its script fails again
        again = await it.sup.resume("core-malformed", ResumeRequest(action_id="core-malformed-r1"), "key")  # a repeat
        assert again.action_id == resumed.action_id == "core-malformed-r1"
    (root,) = by_name(mine(tracing_on, "core-malformed-r1"), len(mine(tracing_on, "core-malformed-r1")))["root"]
    assert root.links == ()


@in_loop
async def test_a_resume_whose_old_trace_cannot_be_read_leaves_nothing_waiting_on_it(
    tmp_path: Path, tracing_on: OtlpReceiver
) -> None:
    """Its trace cannot begin (its link is read from the journal): refused, and neither a retry nor the drain
    waits for an admission that never was."""
    async with core(tmp_path) as it:
        await it.start(["started", "fail"], "core-unread")
        assert (await it.settled("core-unread"))[0] == "failed"
        changed_by_hand(it, "ALTER TABLE traces RENAME TO traces_aside")
        for _ in range(2):
            async with asyncio.timeout(DEADLINE):
                with pytest.raises(sqlite3.OperationalError, match="no such table: traces"):
                    await it.sup.resume("core-unread", ResumeRequest(action_id="core-unread-r1"), "key")
        async with asyncio.timeout(DEADLINE):
            await it.sup.admission.under_way()  # what a drain waits for first
        changed_by_hand(it, "ALTER TABLE traces_aside RENAME TO traces")
    assert mine(tracing_on, "core-unread-r1") == []


@in_loop
async def test_a_supervisor_not_tracing_gives_its_workers_an_empty_trace(tmp_path: Path) -> None:
    given = tmp_path / "trace"
    given.write_text("untouched")
    async with core(tmp_path) as it:
        assert it.sup.reads.tracing.exporter is None
        await it.start(["trace", f"span:{TASK}:{KICKOFF}:task", "complete"], trace=str(given))  # ignored, not a fault
        assert (await it.settled())[0] == "completed"
    assert given.read_text() == ""
