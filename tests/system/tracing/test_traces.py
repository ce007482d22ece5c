"""One trace per job, end to end: a real supervisor (its fork server, real workers, real CrewAI) exporting over
OTLP/HTTP to a real receiver (tests/helpers/otlp_receiver.py), as ``OTEL_EXPORTER_OTLP_ENDPOINT`` asks. A job's
spans make one tree beneath its root, its worker's (its start, its kickoff, each task, LLM call and tool call) beneath
its ``worker`` span; a caller's ``traceparent`` makes the root its child; a cancel inside a hanging LLM call exports
its stop, its kill and the call it cut off; a worker killed from outside ends its trace too; the job's log lines carry
its trace's id; an endpoint alone turns it on, while every worker (forked or spawned) runs CrewAI with the
OpenTelemetry SDK off and none of the supervisor's ``OTEL_*`` variables; and with no endpoint nothing leaves."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import QUIET_CREWAI
from supervisor.testing import Server
from tests.conftest import start_body, start_server, stop_server, wait_until
from tests.crews.effects import TOOL
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedSpan
from worker.provider import URL_ENV, Provider

KEY = {"Idempotency-Key": "key"}
VENDOR_KEY = "vendor-" + secrets.token_hex(16)  # what an exporter's headers may hold: never a job's
STEPS = ("admission", "queue", "launch", "worker_start", "job", "exit", "cleanup", "journal", "worker")
SDK_DEFAULT_PORT = 4318  # where the SDK would send with no endpoint named: a leak would land here


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(
    receiver: OtlpReceiver, provider: Provider, evidence: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A supervisor tracing to ``receiver``, its batches sent every 50 ms, its crews' provider the module's."""
    env = {
        "CREW_TEST_EVIDENCE_DIR": str(evidence),  # where the ``effects`` crew's tool writes
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {VENDOR_KEY}",
        URL_ENV: provider.url,
    }
    server = start_server(tmp_path_factory.mktemp("traced") / "state", env=env)
    yield server
    stop_server(server)


def job_trace(receiver: OtlpReceiver, action_id: str) -> tuple[ReceivedSpan, dict[str, list[ReceivedSpan]]]:
    """The job's root, once exported (its spans all ended before it), and every other span of its trace by name."""

    def root_came(spans: list[ReceivedSpan]) -> bool:
        return any(_is_root(span, action_id) for span in spans)

    spans = receiver.wait_for(root_came, timeout=60)
    (root,) = [span for span in spans if _is_root(span, action_id)]
    named: dict[str, list[ReceivedSpan]] = {}
    for span in receiver.trace(root.trace_id):
        if span is not root:
            named.setdefault(span.name, []).append(span)
    return root, named


def _is_root(span: ReceivedSpan, action_id: str) -> bool:
    attributes = span.attributes
    return attributes.get("crew_supervisor.action_id") == action_id and "crew_supervisor.outcome" in attributes


def begin(client: httpx.Client, body: dict[str, Any], until: str = "started") -> int:
    """Start a job without waiting for its end; its worker's pid once the job's stream has said ``until``."""
    with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as stream:
        for line in stream.iter_lines():
            if line == f"event: {until}":
                break
    events = client.get(f"/jobs/{body['action_id']}/events").json()["events"]
    return int(next(event["data"]["pid"] for event in events if event["event"] == "started"))


def test_a_job_is_one_trace_beneath_its_root(traced: Server, receiver: OtlpReceiver) -> None:
    with traced.client() as client:
        answer = client.post("/jobs", json=start_body("demo", "tree"), headers=KEY)
        assert answer.status_code == 200, answer.text
    root, spans = job_trace(receiver, "tree")
    assert root.parent_id == "" and root.status == "UNSET"
    assert root.attributes["crew_supervisor.outcome"] == "completed"
    assert root.resource["service.name"] == "crew-supervisor" and root.resource["process.pid"] == traced.pid
    assert all(len(spans[step]) == 1 and spans[step][0].parent_id == root.span_id for step in STEPS), spans.keys()
    job = {"crew_supervisor.action_id": "tree", "crew_supervisor.crew_id": "demo", "crew_supervisor.operation": "run"}
    assert all(job.items() <= span.attributes.items() for named in spans.values() for span in named)
    (worker,) = spans["worker"]
    assert worker.attributes["process.exit.code"] == 0 and [name for name, _ in worker.events] == ["exit"]
    assert not {"stop", "kill"} & spans.keys()
    assert any(VENDOR_KEY in value for request in receiver.requests for value in request.values())  # its headers
    # The worker's: its start and its kickoff beneath its span, the crew's two tasks beneath the kickoff, in order,
    # and each task's LLM calls beneath it, with what they booked, which the root adds up.
    (start,), (kickoff,) = spans["worker.start"], spans["kickoff"]
    assert start.parent_id == kickoff.parent_id == worker.span_id
    tasks = sorted(spans["task"], key=lambda span: span.attributes["crew_supervisor.task.index"])
    assert [task.attributes["crew_supervisor.agent.role"] for task in tasks] == ["Researcher", "Writer"]
    assert all(task.parent_id == kickoff.span_id and task.status == "UNSET" for task in tasks)
    calls = spans["llm.call"]
    assert {call.parent_id for call in calls} == {task.span_id for task in tasks}
    chat = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "offline-demo"}
    chat |= {"crew_supervisor.effect.status": "finished"}
    assert all(call.attributes.items() >= chat.items() for call in calls)
    for kind in ("input", "output"):
        tokens = f"gen_ai.usage.{kind}_tokens"
        assert root.attributes[tokens] == sum(call.attributes[tokens] for call in calls) > 0
    assert all(worker.start_ns <= span.start_ns <= span.end_ns <= worker.end_ns for span in [start, kickoff, *tasks])


def test_a_tool_call_is_a_span_one_that_raised_an_error(traced: Server, receiver: OtlpReceiver) -> None:
    body = start_body("effects", "tools", input={"marker": "tools", "fail_in_step": 2})
    with traced.client() as client:
        answer = client.post("/jobs", json=body, headers=KEY)
        assert answer.status_code == 200, answer.text
    _, spans = job_trace(receiver, "tools")
    tasks = {task.span_id: task.attributes["crew_supervisor.task.index"] for task in spans["task"]}
    tools = spans["tool.call"]
    assert all(tool.parent_id in tasks for tool in tools)
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": TOOL}
    assert all(span.attributes.items() >= tool.items() for span in tools)
    failed = [span for span in tools if span.status == "ERROR"]
    assert failed and all(tasks[span.parent_id] == 1 for span in failed)  # step 2's tool raised (CrewAI retried it)
    assert all(span.attributes["error.type"] == "RuntimeError" for span in failed)
    assert all(span.attributes["crew_supervisor.effect.status"] == "failed" for span in failed)
    assert {tasks[span.parent_id] for span in tools if span.status == "UNSET"} == {0, 2, 3}  # step 2's never did


def test_a_caller_s_traceparent_makes_the_job_its_child(traced: Server, receiver: OtlpReceiver) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    headers = {**KEY, "traceparent": f"00-{caller_trace}-{caller_span}-01", "tracestate": "vendor=opaque"}
    with traced.client() as client:
        answer = client.post("/jobs", json=start_body("demo", "child"), headers=headers)
        assert answer.status_code == 200, answer.text
    root, _ = job_trace(receiver, "child")
    assert (root.trace_id, root.parent_id) == (caller_trace, caller_span)


def test_a_cancel_inside_a_hanging_llm_call_exports_its_stop_its_kill_and_what_it_cut_off(
    traced: Server, receiver: OtlpReceiver, provider: Provider
) -> None:
    before = len(provider.calls)
    with traced.client() as client:
        begin(client, start_body("llm-hang", "hung"))
        provider.wait(lambda calls: len(calls) > before, 60)  # the provider holds the call: it never answers
        said = f"runaway call; my key is {VENDOR_KEY}"
        answer = client.post("/jobs/hung/cancel", json={"crew_id": "llm-hang", "action_id": "hung", "reason": said})
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.text
    root, spans = job_trace(receiver, "hung")
    assert root.attributes["crew_supervisor.outcome"] == "cancelled" and root.status == "UNSET"
    (stop,), (kill,), (worker,) = spans["stop"], spans["kill"], spans["worker"]
    assert stop.parent_id == root.span_id and stop.attributes["crew_supervisor.stop_reason"] == "cancel"
    assert kill.parent_id == stop.span_id and kill.attributes["crew_supervisor.stop_confirmed"] is True
    assert kill.attributes["crew_supervisor.signal"] == "SIGKILL"
    assert worker.attributes["crew_supervisor.exit_signal"] == "SIGKILL"
    assert all(VENDOR_KEY not in repr(span) and "runaway" not in repr(span) for span in receiver.trace(root.trace_id))
    # What the kill interrupted: the call the provider held, its task and the kickoff, ended as cut off at the exit.
    (call,), (task,), (kickoff,) = spans["llm.call"], spans["task"], spans["kickoff"]
    assert call.parent_id == task.span_id and task.parent_id == kickoff.span_id
    assert call.attributes["gen_ai.request.model"] == "hang" and "crew_supervisor.effect.status" not in call.attributes
    for cut in (call, task, kickoff):
        assert cut.status == "ERROR" and cut.attributes["error.type"] == "cut_off" and cut.end_ns == worker.end_ns


def test_a_worker_killed_from_outside_ends_its_trace(traced: Server, receiver: OtlpReceiver) -> None:
    with traced.client() as client:
        # Its first tick: it is inside its kickoff (a worker says started before its kickoff's span begins).
        pid = begin(client, start_body("demo-slow", "crashed", input={"seconds": 120}), until="chunk")
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: client.get("/jobs/crashed").json()["status"] == "failed", timeout=60)
    root, spans = job_trace(receiver, "crashed")
    assert root.status == "ERROR" and root.attributes["crew_supervisor.reason"] == "worker_killed"
    assert root.attributes["crew_supervisor.uncertain_outcome"] is True
    (worker,) = spans["worker"]
    assert worker.attributes["process.pid"] == pid and worker.attributes["crew_supervisor.exit_signal"] == "SIGKILL"
    assert "stop" not in spans  # nobody asked for it
    (kickoff,) = spans["kickoff"]  # the run it was in when it died, cut off there
    assert kickoff.status == "ERROR" and kickoff.attributes["error.type"] == "cut_off"
    assert kickoff.end_ns == worker.end_ns


def test_a_traced_job_s_log_lines_carry_its_trace_s_ids(traced: Server, receiver: OtlpReceiver) -> None:
    with traced.client() as client:
        assert client.post("/jobs", json=start_body("demo", "logged"), headers=KEY).status_code == 200
    root, _ = job_trace(receiver, "logged")
    lines = [line for line in _log(traced) if line.get("action_id") == "logged"]
    (finished,) = [line for line in lines if line["event"] == "job finished"]
    assert (finished["trace_id"], finished["span_id"]) == (root.trace_id, root.span_id)
    assert all(line["trace_id"] == root.trace_id for line in lines if "trace_id" in line)


@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_an_endpoint_alone_traces_while_every_worker_runs_with_the_sdk_off_and_no_otel_variable_of_its_own(
    launcher: str, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """The supervisor's environment holds an endpoint and no OTEL_SDK_DISABLED: it traces. CrewAI is imported (in
    the fork server, once for every worker it forks, or in a spawned worker) and a job's code runs with the SDK and
    CrewAI's switches off, and with none of the supervisor's ``OTEL_*`` variables, nor were its workers launched
    with any."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {VENDOR_KEY}",
        "OTEL_SERVICE_NAME": f"sidecar-{launcher}",
        "AIP_CREWAI_LAUNCHER": launcher,
    }
    server = start_server(tmp_path / "state", env=env)
    assert "OTEL_SDK_DISABLED" not in _launched_with(server.pid)
    action_id = f"environ-{launcher}"
    with server.client() as client:
        body = {"crew_id": "prober", "action_id": action_id, "input": {"environ": True}}
        answer = client.post("/jobs", json=body, headers=KEY)
        assert answer.status_code == 200, answer.text
    found = json.loads(answer.json()["raw"])
    quiet = {name: _digest(value) for name, value in QUIET_CREWAI.items()}
    for seen in (found["imported_in"], found["environ"]):  # CrewAI's at its import, the job's code's
        assert {name: seen.get(name) for name in quiet} == quiet
        assert {name for name in seen if name.startswith("OTEL_")} == {"OTEL_SDK_DISABLED"}
    assert not {name for name in found["initial"] if name.startswith("OTEL_")}  # launched (or forked) with none
    assert VENDOR_KEY not in answer.text
    root, _ = job_trace(receiver, action_id)
    assert root.resource["service.name"] == f"sidecar-{launcher}"


def test_without_an_endpoint_nothing_leaves(tmp_path: Path) -> None:
    """Its service named, the exporter told (OTLP, a key in its headers): still nothing is sent, not even to where
    the SDK would send by default, and no log line of a job names a trace."""
    with _listening_at_the_sdk_default() as receiver:
        env = {
            "OTEL_SERVICE_NAME": "untraced",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {VENDOR_KEY}",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        server = start_server(tmp_path / "state", env=env)
        with server.client() as client:
            assert client.post("/jobs", json=start_body("demo", "quiet"), headers=KEY).status_code == 200
        stop_server(server)  # its tracer, had it one, flushed at close
        assert receiver.spans == [] and receiver.requests == []
    lines = [line for line in _log(server) if line.get("action_id") == "quiet"]
    assert lines and not any("trace_id" in line or "span_id" in line for line in lines)


@pytest.mark.parametrize(
    ("asked", "said"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json' is not one the supervisor exports"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin: the supervisor exports over otlp alone"),
    ],
)
def test_what_it_cannot_export_with_refuses_the_start_in_one_line(
    tmp_path: Path, asked: dict[str, str], said: str
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", **asked}
    server = start_server(tmp_path / "state", env=env, wait=False)
    try:
        returncode = server.process.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("a supervisor asked for an OTLP protocol it has not did not exit") from None
    assert returncode == 1
    last = server.log_tail().strip().splitlines()[-1]
    assert last.startswith(f"crew-supervisor: {said}"), last


@contextlib.contextmanager
def _listening_at_the_sdk_default() -> Iterator[OtlpReceiver]:
    try:
        receiver = OtlpReceiver(SDK_DEFAULT_PORT)
    except OSError as exc:  # another process holds it: what would leak there is not ours to read
        pytest.skip(f"127.0.0.1:{SDK_DEFAULT_PORT} is taken ({exc.strerror})")
    with receiver:
        yield receiver


def _launched_with(pid: int) -> set[str]:
    """The names in a process's initial environment block (the suite's supervisors are its children)."""
    return {item.split(b"=", 1)[0].decode() for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if item}


def _digest(value: str) -> str:
    """As the prober crew says a value (tests/crews/prober.py)."""
    return hashlib.sha256(value.encode()).hexdigest()


def _log(server: Server) -> list[dict[str, Any]]:
    """The supervisor's JSON log lines (its log file also holds what its children wrote there)."""
    lines = []
    for line in server.log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            if isinstance(document := json.loads(line), dict) and "event" in document:
                lines.append(document)
    return lines
