"""The contract's routes: start (blocking or streamed), status, events, cancel, resume, archive, health.

Admission decides (``supervisor.jobs.admission``); these routes only translate HTTP to it and back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from supervisor.enums import Role, Status
from supervisor.escaping import json_line
from supervisor.http.responses import errors
from supervisor.http.routing import StrictJSONRoute, Sup
from supervisor.jobs.supervisor import Supervisor
from supervisor.journal.errors import JournalBusy, JournalError
from supervisor.journal.records import Job, StoredEvent
from supervisor.models import CancelRequest, ResumeRequest, StartRequest, path_id_problem
from supervisor.scopes import needs

# A JSON page of events: at most this many, and this many bytes of their data (each event's ``data`` as
# stored, compact JSON; the first event comes even if it alone is larger, so paging never sticks). An
# answer is then bounded by the bound plus 1,000 events' small envelopes, not 1,000 of the largest events.
EVENTS_PER_PAGE = 1000
PAGE_DATA_BYTES = 4 * 1024 * 1024
# Sequences are SQLite integers (64-bit signed): a resume cursor (Last-Event-ID + 1) must be one too.
MAX_SEQUENCE = 2**63 - 1
MAX_SEQUENCE_DIGITS = len(str(MAX_SEQUENCE))
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]
TraceParent = Annotated[str | None, Header(alias="traceparent", description="W3C: the job's trace joins the caller's")]
TraceState = Annotated[str | None, Header(alias="tracestate", description="W3C: the caller's vendors' trace state")]
TRACE_HEADERS = ("traceparent", "tracestate")  # the W3C trace context a start may carry

ADMISSION_ERRORS = errors(400, 403, 404, 409, 413, 422, 428, 503, 507)
STREAM_ERRORS = {**ADMISSION_ERRORS, **errors(416)}  # a Last-Event-ID beyond the job's events
START_ERRORS = {**ADMISSION_ERRORS, **errors(502, 504)}  # a blocking start also reports how the job ended


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


def caller_trace(
    request: Request,
    traceparent: TraceParent = None,
    tracestate: TraceState = None,
) -> tuple[str | None, str | None]:
    """The caller's W3C trace context for a new job's trace (``Tracing.begin``): never refused, a malformed one is
    ignored. The parameters put the headers in the schema; their values are read here whole, a header's lines joined
    as HTTP joins them (two ``tracestate`` lines are one list; two ``traceparent`` lines, one malformed value)."""
    parent, state = (",".join(request.headers.getlist(name)) or None for name in TRACE_HEADERS)
    return parent, state


CallerTrace = Annotated[tuple[str | None, str | None], Depends(caller_trace)]
router = APIRouter(route_class=StrictJSONRoute)


@router.get("/health")
@needs(Role.OBSERVER)
async def health(sup: Sup) -> dict[str, Any]:
    """The reference's keys, types and order (crews and operations sorted), then ours. While the supervisor
    drains, ``status`` is ``draining``: the reference's client starts work only on ``ready``, and the
    container's probe reports it unready, so an orchestrator sends nothing new meanwhile."""
    return sup.reads.health()


@router.post("/jobs", responses=START_ERRORS)
@router.post("/runs", responses=START_ERRORS)
async def post_job(
    sup: Sup, request: Request, body: StartRequest, caller: CallerTrace, key: IdempotencyKey = None
) -> Response:
    return await start_blocking(sup, body, key, request.url.path == "/runs", caller)


@router.post("/jobs/stream", response_class=EventStream, responses=STREAM_ERRORS)
@router.post("/runs/stream", response_class=EventStream, responses=STREAM_ERRORS)
async def post_job_stream(
    sup: Sup,
    request: Request,
    body: StartRequest,
    caller: CallerTrace,
    key: IdempotencyKey = None,
    last_id: LastEventId = None,
) -> Response:
    """The legacy ``/runs`` routes start only ``run``. A malformed Last-Event-ID is refused before anything
    is admitted; one beyond the job's events (416) can only be known once the job is."""
    resume_after = last_event_id(last_id)
    job = await sup.admit(body, key, request.url.path == "/runs/stream", *caller)
    cursor = 0 if resume_after is None else resume_after + 1
    check_cursor(cursor, job.event_count)
    return stream(sup, job.action_id, cursor)


@router.post(
    "/jobs/{action_id}/resume",
    responses={200: {"content": {"text/event-stream": {}}}, **START_ERRORS, **errors(416)},
)
async def resume(
    sup: Sup,
    action_id: str,
    request: Request,
    body: ResumeRequest,
    caller: CallerTrace,
    key: IdempotencyKey = None,
    last_id: LastEventId = None,
) -> Response:
    """A new job (``body.action_id``) continuing this ``run`` from its last completed task, answered as a start is:
    blocking (``start_blocking``: the client sees what an uninterrupted run answers), or streamed with ``Accept:
    text/event-stream`` (as ``POST /jobs/stream``, Last-Event-ID too). The contract's role only, as a start's: it
    runs a crew."""
    streamed = "text/event-stream" in request.headers.get("accept", "")
    resume_after = last_event_id(last_id) if streamed else None
    checked(action_id)  # whether the job is there is the facade's to say: a repeat is answered its job regardless
    job = await sup.resume(action_id, body, key, *caller)
    if not streamed:
        return await answer(sup, job, body.timeout_ms)
    cursor = 0 if resume_after is None else resume_after + 1
    check_cursor(cursor, job.event_count)
    return stream(sup, job.action_id, cursor)


@router.get("/jobs/{action_id}", responses=errors(404, 422))
@router.get("/runs/{action_id}", responses=errors(404, 422))
@needs(Role.OBSERVER)
async def get_job(sup: Sup, action_id: str) -> dict[str, Any]:
    return view(sup, find(sup, action_id))


@router.get(
    "/jobs/{action_id}/events",
    responses={200: {"content": {"text/event-stream": {}}}, **errors(400, 404, 416, 422)},
)
@needs(Role.OBSERVER)
async def get_events(
    sup: Sup, action_id: str, request: Request, cursor: Annotated[int, Query()] = 0, last_id: LastEventId = None
) -> Response:
    job = find(sup, action_id)
    resume_after = last_event_id(last_id)  # an SSE reconnect: it wins over the query
    if resume_after is not None:
        cursor = resume_after + 1
    check_cursor(cursor, job.event_count)
    if "text/event-stream" in request.headers.get("accept", ""):
        return stream(sup, action_id, cursor)
    events = sup.reads.events(action_id, cursor, EVENTS_PER_PAGE, PAGE_DATA_BYTES)
    return Response(page(job, cursor, events), media_type="application/json")


@router.post("/jobs/{action_id}/cancel", responses=errors(400, 404, 422))
@router.post("/runs/{action_id}/cancel", responses=errors(400, 404, 422))
@needs(Role.OPERATOR)
async def cancel(sup: Sup, action_id: str, body: CancelRequest) -> dict[str, Any]:
    if body.action_id != action_id:
        raise HTTPException(400, "action_id in the body differs from the path")
    job = find(sup, action_id)
    if job.crew_id != body.crew_id:
        raise HTTPException(404, "run was not found")
    await sup.cancel(action_id, body.reason)
    return view(sup, sup.reads.job(action_id) or job)


@router.delete("/jobs/{action_id}", responses=errors(404, 409, 422, 428, 503, 507))
@needs(Role.OPERATOR)
async def archive(
    sup: Sup,
    action_id: str,
    confirmation: Annotated[str | None, Header(alias="X-AIP-Archive-Confirmation")] = None,
) -> dict[str, Any]:
    if confirmation != action_id:
        raise HTTPException(428, "X-AIP-Archive-Confirmation must equal the action id")
    job = find(sup, action_id)
    if job.status == Status.RUNNING:
        raise HTTPException(409, "a running job cannot be archived")
    with archiving():
        await sup.archives.archive(action_id)
    return {"archived": True, "action_id": action_id}


@contextlib.contextmanager
def archiving() -> Iterator[None]:
    """An archive's journal errors, as HTTP: another process's lock is a 503 (try again shortly), any other a 507."""
    try:
        yield
    except JournalBusy:
        detail = "the journal is locked by another process; try again shortly"
        raise HTTPException(503, detail, headers={"Retry-After": "1"}) from None
    except JournalError as exc:
        raise HTTPException(507, f"archive could not be made durable: {exc}") from None


async def start_blocking(
    sup: Supervisor, body: StartRequest, key: str | None, legacy: bool, caller: tuple[str | None, str | None]
) -> Response:
    """Wait for the job up to its own timeout: 200 output, 409 cancelled, 502 failed (a job that reached its
    own timeout too: the wait lasts until its kill is confirmed), 504 wait expired (the job continues)."""
    return await answer(sup, await sup.admit(body, key, legacy, *caller), body.timeout_ms)


async def answer(sup: Supervisor, job: Job, timeout_ms: int) -> Response:
    """A blocking start's answer for its admitted ``job``, once it ends or its wait (``timeout_ms``) expires."""
    finished = await sup.wait(job.action_id, timeout_ms / 1000)
    job = sup.reads.job(job.action_id) or job
    if not finished or job.status == Status.RUNNING:
        return JSONResponse({"detail": "timed out waiting; the job continues", **view(sup, job)}, 504)
    if job.status == Status.COMPLETED:
        return JSONResponse(sup.reads.output(job.action_id))
    detail = "run was cancelled" if job.status == Status.CANCELLED else "run failed"
    return JSONResponse({"detail": detail, **view(sup, job)}, 409 if job.status == Status.CANCELLED else 502)


def checked(action_id: str) -> None:
    if problem := path_id_problem(action_id):
        raise HTTPException(422, problem)


def find(sup: Supervisor, action_id: str) -> Job:
    checked(action_id)
    job = sup.reads.job(action_id)
    if job is None:
        if (
            sup.reads.quarantined(action_id) is not None
        ):  # kept aside, not served: its rows disagreed (docs/operating.md)
            raise HTTPException(404, "run was quarantined at start: its journal record is inconsistent")
        raise HTTPException(404, "run was not found")
    return job


def view(sup: Supervisor, job: Job, with_output: bool = True) -> dict[str, Any]:
    """The reference's record, then ours: the terminal event's data, the worker's exit status and what it left
    running (``leftovers``, killed), where a running
    job is (``phase``: queued, launching, running or settling; null once terminal), and when it was admitted
    and ended (Unix seconds; ``ended_at`` null while it runs), and its LLM spend: so far while it runs, all of it
    once it failed or was cancelled (its terminal's evidence keeps it; a completed job's ``token_usage`` says it).
    Without ``with_output``, a completed job's output is null, and its terminal too (its data is the output)."""
    completed = job.status == Status.COMPLETED
    last = (
        sup.reads.last_event(job.action_id) if job.status != Status.RUNNING and (with_output or not completed) else None
    )
    terminal = last.data if last is not None and last.terminal else None
    kept = (
        terminal.get("llm_spent") if terminal is not None and job.status in (Status.FAILED, Status.CANCELLED) else None
    )
    return {
        "action_id": job.action_id,
        "crew_id": job.crew_id,
        "operation": job.operation,
        "status": job.status,
        "event_count": job.event_count,
        "output": sup.reads.output(job.action_id) if completed and with_output else None,
        "terminal": terminal,
        "exit_status": job.exit_status,
        "leftovers": orjson.loads(job.leftovers) if job.leftovers is not None else None,
        "phase": sup.reads.phase_of(job.action_id, job.status),
        "admitted_at": job.admitted_at,
        "ended_at": job.ended_at,
        "llm_spent": sup.reads.spent_of(job.action_id, job.status) or kept,
        **sup.reads.links(job.action_id),  # a resume's: the job it continues, and the job that continues it
        **sup.reads.trace_of(job.action_id),  # a traced job's trace id, and its page in the trace UI (TRACE_UI_URL)
    }


def page(job: Job, cursor: int, events: list[StoredEvent]) -> bytes:
    """The reference's slice: ``next_cursor`` is the first event not in it (the job's event count when
    it holds the rest). The events' data goes out as stored, never parsed and encoded again."""
    head = orjson.dumps(
        {"action_id": job.action_id, "cursor": cursor, "next_cursor": cursor + len(events), "status": job.status}
    )
    return b'%s,"events":[%s]}' % (head[:-1], b",".join(_event(event, event.data) for event in events))


def stream(sup: Supervisor, action_id: str, cursor: int) -> EventStream:
    return EventStream(sse_frames(sup.reads.follow(action_id, cursor)), headers=SSE_HEADERS)


def last_event_id(header: str | None) -> int | None:
    """The sequence a Last-Event-ID names (the stream resumes after it); 400 unless it is one.

    Bounded before ``int()``: 5,000 digits exceed Python's int conversion limit, and a value past the
    journal's 64-bit sequences overflows SQLite once the stream reads from it.
    """
    if header is None:
        return None
    digits = header.strip()
    # isascii: "²" is a digit to str.isdigit() but not to int()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_SEQUENCE_DIGITS):
        raise HTTPException(400, "Last-Event-ID must be an event sequence number")
    sequence = int(digits)
    if sequence >= MAX_SEQUENCE:
        raise HTTPException(400, "Last-Event-ID must be an event sequence number")
    return sequence


def check_cursor(cursor: int, event_count: int) -> None:
    if not 0 <= cursor <= event_count:
        raise HTTPException(416, f"cursor must be from 0 to {event_count}")


async def sse_frames(batches: AsyncIterator[list[StoredEvent] | None]) -> AsyncIterator[bytes]:
    """``event:`` and ``data:`` first, as the reference writes them, then ``id:`` for resuming.

    After each batch the loop serves the others: a write the socket takes at once never suspends the
    stream, so a follower catching up on many events would otherwise hold the loop until its socket fills."""
    async for batch in batches:
        if batch is None:
            yield b": keep-alive\n\n"
        else:
            yield b"".join(_frame(event) for event in batch)
            await asyncio.sleep(0)


def _frame(event: StoredEvent) -> bytes:
    """Byte for byte ``json_line(orjson.dumps(Event.as_dict()))``, built around the stored data: parsing it
    only to encode it again cost more than anything else per streamed event. The data is escaped here, not
    when stored, so that events a journal already holds (or a reference journal brought) are safe too."""
    return b"event: %s\ndata: %s\nid: %d\n\n" % (
        event.event.encode(),
        _event(event, json_line(event.data)),
        event.sequence,
    )


def _event(event: StoredEvent, data: bytes) -> bytes:
    """``orjson.dumps(Event.as_dict())`` with ``data`` (the event's, as stored or escaped) put in as it is."""
    return b'{"event":%s,"sequence":%d,"data":%s}' % (orjson.dumps(event.event), event.sequence, data)
