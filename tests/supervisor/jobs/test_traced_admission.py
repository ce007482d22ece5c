"""Admission's side of a job's trace, in the core with a tracer built by hand (``Kept``: each job's ``JobTrace`` with
ids of its own, every ``begin`` kept): the caller's trace context comes from a start's and a resume's headers as they
came, never refused; a traced job's ids commit with it and its view gives them (and its page in the trace UI); a
resume's trace is begun linked to its old job's; ``/health`` names the exporter. The real tracer's spans:
tests/supervisor/jobs/test_tracing.py and tests/system/tracing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from supervisor.jobs.tracing import NO_TRACE, JobTrace, Tracing
from supervisor.models import ResumeRequest
from tests.supervisor.jobs.harness import CREW, Core, core, in_loop

KEY = {"Idempotency-Key": "key"}
TRACE_UI = "http://localhost:16686/trace/{trace_id}"


@dataclasses.dataclass
class Begun:
    action_id: str
    traceparent: str | None
    tracestate: str | None
    link: tuple[str, str] | None


class Kept(Tracing):
    """Each job traced with ids of its own (its action id's index, as hex digits), but ``untraced`` ones; what
    every ``begin`` was given, kept."""

    exporter = "otlp/http"

    def __init__(self, untraced: tuple[str, ...] = ()) -> None:
        self.begun: list[Begun] = []
        self.untraced = untraced

    def begin(
        self,
        action_id: str,
        crew_id: str,
        operation: str,
        traceparent: str | None,
        began_ns: int,
        *,
        tracestate: str | None = None,
        link: tuple[str, str] | None = None,
    ) -> JobTrace:
        self.begun.append(Begun(action_id, traceparent, tracestate, link))
        if action_id in self.untraced:
            return NO_TRACE
        trace = JobTrace()
        trace.trace_id, trace.span_id = ids(len(self.begun))
        return trace


def ids(n: int) -> tuple[str, str]:
    return f"{n:032x}", f"{n:016x}"


def traced(it: Core, untraced: tuple[str, ...] = ()) -> Kept:
    kept = Kept(untraced)
    it.sup.reads.tracing = it.sup.admission.tracing = kept
    return kept


def start(action_id: str, script: list[str]) -> dict[str, Any]:
    return {"crew_id": CREW, "action_id": action_id, "input": {"script": script}}


PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# Each start's route and headers beside its key, and the traceparent and tracestate its trace was begun with.
STARTS: dict[str, tuple[str, list[tuple[str, bytes]], str | None, str | None]] = {
    "plain": ("/jobs", [], None, None),
    "w3c": ("/jobs", [("traceparent", PARENT.encode()), ("tracestate", b"a=1")], PARENT, "a=1"),
    "malformed": ("/jobs/stream", [("traceparent", b"not a trace"), ("tracestate", b"=")], "not a trace", "="),
    "state-alone": ("/runs/stream", [("tracestate", b"congo=t61rcWkgMzE")], None, "congo=t61rcWkgMzE"),
    # Two lines of a header, joined as HTTP joins them: two parents make one malformed value, which names none.
    "two-lines": (
        "/runs",
        [("traceparent", b"00-a-b-01"), ("traceparent", b"00-c-d-01"), ("tracestate", b"a=1"), ("tracestate", b"b=2")],
        "00-a-b-01,00-c-d-01",
        "a=1,b=2",
    ),
    "latin-1": ("/jobs", [("traceparent", "00-\xe9-01".encode("latin-1"))], "00-\xe9-01", None),
}


@in_loop
async def test_the_callers_trace_context_reaches_the_tracer_as_it_came_and_is_never_refused(tmp_path: Path) -> None:
    async with core(tmp_path) as it, it.http() as client:
        kept = traced(it)
        for action_id, (route, headers, _, _) in STARTS.items():
            body = start(action_id, ["started", "complete"])
            answer = await client.post(route, json=body, headers=[("Idempotency-Key", b"key"), *headers])
            assert answer.status_code == 200, (action_id, answer.text)
            await it.settled(action_id)
    begun = [(b.action_id, b.traceparent, b.tracestate, b.link) for b in kept.begun]
    assert begun == [(action_id, parent, state, None) for action_id, (_, _, parent, state) in STARTS.items()]


@in_loop
async def test_a_traced_jobs_ids_commit_with_it_and_its_view_gives_them_and_its_page(tmp_path: Path) -> None:
    async with core(tmp_path, trace_ui_url=TRACE_UI) as it, it.http() as client:
        traced(it, untraced=("untraced",))
        for action_id in ("traced", "untraced"):
            answer = await client.post("/jobs", json=start(action_id, ["started", "complete"]), headers=KEY)
            assert answer.status_code == 200, answer.text
        assert it.journal.reader.trace("traced") == ids(1) and it.journal.reader.trace("untraced") is None
        view = (await client.get("/jobs/traced")).json()
        assert (view["trace_id"], view["trace_url"]) == (ids(1)[0], f"http://localhost:16686/trace/{ids(1)[0]}")
        untraced = (await client.get("/runs/untraced")).json()
        assert (untraced["trace_id"], untraced["trace_url"]) == (None, None)
        health = (await client.get("/health")).json()
        assert health["tracing"] == {"exporter": "otlp/http", "trace_ui_url": TRACE_UI}


@in_loop
async def test_without_a_trace_ui_a_traced_jobs_view_gives_its_id_alone(tmp_path: Path) -> None:
    async with core(tmp_path) as it, it.http() as client:
        traced(it)
        await client.post("/jobs", json=start("traced", ["started", "complete"]), headers=KEY)
        view = (await client.get("/jobs/traced")).json()
        assert (view["trace_id"], view["trace_url"]) == (ids(1)[0], None)
        assert (await client.get("/health")).json()["tracing"] == {"exporter": "otlp/http", "trace_ui_url": None}


@pytest.mark.parametrize("old_traced", [True, False])
@in_loop
async def test_a_resumes_trace_is_linked_to_its_old_jobs_and_takes_its_own_callers_context(
    tmp_path: Path, old_traced: bool
) -> None:
    async with core(tmp_path) as it, it.http() as client:
        kept = traced(it, untraced=() if old_traced else ("old",))
        answer = await client.post("/jobs", json=start("old", ["started", "fail"]), headers=KEY)
        assert answer.status_code == 502, answer.text
        headers = {**KEY, "traceparent": PARENT, "tracestate": "a=1"}
        resumed = await client.post("/jobs/old/resume", json={"action_id": "old-r1"}, headers=headers)
        assert resumed.status_code == 502, resumed.text  # its script fails again
        again = await it.sup.resume("old", ResumeRequest(action_id="old-r1"), "key")  # a repeat begins nothing
        assert again.action_id == "old-r1"
    link = ids(1) if old_traced else None
    assert [(b.action_id, b.traceparent, b.tracestate, b.link) for b in kept.begun] == [
        ("old", None, None, None),
        ("old-r1", PARENT, "a=1", link),
    ]
