"""The HTTP contract: routes, admission order, status codes and SSE framing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST

from supervisor.auth import BearerAuth
from supervisor.jobs import Supervisor
from supervisor.journal import Event, Job, JournalError
from supervisor.models import (
    CancelRequest,
    InputError,
    StartRequest,
    input_too_large,
    key_problem,
    path_id_problem,
    request_hash,
    strict_json,
    validate_input,
)
from supervisor.operator import operator_routes
from supervisor.responses import BEARER_SCHEME, errors

# The input bound is 1 MiB of compact JSON; the envelope and pretty-printing get room beside it.
MAX_BODY_BYTES = 4 * 1024 * 1024
EVENTS_PER_SLICE = 1000
SLICE_BYTES = 8 * 1024 * 1024  # a JSON slice stops here (at least one event); next_cursor says where
CONTROL_OPERATIONS = ("status", "events", "cancel")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]


STREAM_ERRORS = errors(400, 403, 404, 409, 413, 422, 428, 503, 507)
START_ERRORS = {**STREAM_ERRORS, **errors(502, 504)}  # a blocking start also reports how the job ended


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """Bodies are parsed by ``strict_json``: what orjson cannot carry is a 422 here, not a 500 later."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def create_app(sup: Supervisor) -> FastAPI:
    settings = sup.settings
    journal = sup.journal

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sup.start()
        yield
        await sup.stop()

    app = FastAPI(
        title="crew-supervisor",
        version="0.1.0",
        lifespan=lifespan,
        max_body_size=MAX_BODY_BYTES,
        responses=errors(401),  # the middleware answers it on every route, included routers too
    )
    app.router.route_class = StrictJSONRoute
    app.add_middleware(BearerAuth, token=settings.token)
    generated_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """The generated schema plus the bearer scheme the middleware enforces."""
        schema = generated_openapi()
        schema.setdefault("components", {})["securitySchemes"] = BEARER_SCHEME
        schema["security"] = [{"bearer": []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

    def find(action_id: str) -> Job:
        if problem := path_id_problem(action_id):
            raise HTTPException(422, problem)
        job = journal.get(action_id)
        if job is None:
            raise HTTPException(404, "run was not found")
        return job

    def view(job: Job) -> dict[str, Any]:
        last = journal.last_event(job.action_id) if job.status != "running" else None
        return {
            "action_id": job.action_id,
            "crew_id": job.crew_id,
            "operation": job.operation,
            "status": job.status,
            "event_count": job.event_count,
            "output": journal.output(job.action_id) if job.status == "completed" else None,
            "terminal": last.data if last is not None and last.terminal else None,
            "exit_status": job.exit_status,
        }

    def admit(body: StartRequest, key: str | None, legacy: bool) -> Job:
        """The reference's admission order; an exact repeat returns its job even if policy changed since."""
        if sup.draining:
            raise HTTPException(503, "the supervisor is shutting down", headers={"Retry-After": "5"})
        if input_too_large(body):
            raise HTTPException(413, "input exceeds 1 MiB")
        if legacy and body.operation != "run":
            raise HTTPException(400, "this route starts only the run operation")
        bad_key = key_problem(key)
        digest = request_hash(body, key) if bad_key is None and key is not None else ""
        existing = journal.get(body.action_id)
        if existing is not None and existing.request_hash == digest:
            return existing
        if body.operation not in settings.allowed_operations:
            raise HTTPException(403, f"operation {body.operation} is not allowed")
        if bad_key is not None:
            raise HTTPException(*bad_key)
        try:
            operation_input = validate_input(body)
        except InputError as exc:
            raise HTTPException(422, str(exc)) from None
        if body.crew_id not in sup.crews:
            raise HTTPException(404, "crew was not found")
        if existing is not None:
            raise HTTPException(409, "action id was already admitted with different request material")
        if journal.count() >= settings.max_retained_runs:
            raise HTTPException(507, "journal holds the maximum number of retained runs; archive some")
        if journal.size_bytes() >= settings.max_state_bytes:
            raise HTTPException(507, "journal has reached its byte limit; archive some runs")
        job = Job(body.action_id, body.crew_id, body.operation, digest, "running", 0)
        try:
            journal.admit(job)
        except JournalError as exc:
            raise HTTPException(507, f"admission could not be made durable: {exc}") from None
        sup.launch(job, operation_input, body.timeout_ms)
        return job

    def stream(action_id: str, cursor: int) -> EventStream:
        return EventStream(sse_frames(sup.follow(action_id, cursor, settings.heartbeat_seconds)), headers=SSE_HEADERS)

    async def start_blocking(body: StartRequest, key: str | None, legacy: bool) -> Response:
        loop = asyncio.get_running_loop()
        waited_from = loop.time()
        job = admit(body, key, legacy)
        finished = await sup.wait(job.action_id, body.timeout_ms / 1000 - (loop.time() - waited_from))
        job = journal.get(job.action_id) or job
        if not finished or job.status == "running":
            return JSONResponse({"detail": "timed out waiting; the job continues", **view(job)}, 504)
        if job.status == "completed":
            return JSONResponse(journal.output(job.action_id))
        detail = "run was cancelled" if job.status == "cancelled" else "run failed"
        return JSONResponse({"detail": detail, **view(job)}, 409 if job.status == "cancelled" else 502)

    async def start_streaming(body: StartRequest, key: str | None, legacy: bool, last_id: str | None) -> Response:
        job = admit(body, key, legacy)
        return stream(job.action_id, resume_cursor(last_id, 0))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The reference's keys, types and order (crews and operations sorted), then ours."""
        return {
            "status": "ready",
            "crews": sorted(sup.crews),
            "active_runs": len(sup.live),
            "retained_runs": journal.count(),
            "max_retained_runs": settings.max_retained_runs,
            "durable_journal": bool(settings.state_file),
            "stream_checkpoint_events": settings.stream_checkpoint_events,
            "operations": sorted({*settings.allowed_operations, *CONTROL_OPERATIONS}),
            "training_directory": bool(settings.training_dir),
            "launcher": sup.launcher.name,
            **sup.launcher.health(),
            **sup.limits.health(),
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(sup.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/jobs", responses=START_ERRORS)
    async def post_job(body: StartRequest, key: IdempotencyKey = None) -> Response:
        return await start_blocking(body, key, legacy=False)

    @app.post("/runs", responses=START_ERRORS)
    async def post_run(body: StartRequest, key: IdempotencyKey = None) -> Response:
        return await start_blocking(body, key, legacy=True)

    @app.post("/jobs/stream", response_class=EventStream, responses=STREAM_ERRORS)
    async def post_job_stream(body: StartRequest, key: IdempotencyKey = None, last_id: LastEventId = None) -> Response:
        return await start_streaming(body, key, False, last_id)

    @app.post("/runs/stream", response_class=EventStream, responses=STREAM_ERRORS)
    async def post_run_stream(body: StartRequest, key: IdempotencyKey = None, last_id: LastEventId = None) -> Response:
        return await start_streaming(body, key, True, last_id)

    @app.get("/jobs/{action_id}", responses=errors(404, 422))
    @app.get("/runs/{action_id}", responses=errors(404, 422))
    async def get_job(action_id: str) -> dict[str, Any]:
        return view(find(action_id))

    @app.get(
        "/jobs/{action_id}/events",
        responses={200: {"content": {"text/event-stream": {}}}, **errors(400, 404, 416, 422)},
    )
    async def get_events(
        action_id: str, request: Request, cursor: Annotated[int, Query()] = 0, last_id: LastEventId = None
    ) -> Response:
        job = find(action_id)
        cursor = resume_cursor(last_id, cursor)
        if not 0 <= cursor <= job.event_count:
            raise HTTPException(416, f"cursor must be from 0 to {job.event_count}")
        if "text/event-stream" in request.headers.get("accept", ""):
            return stream(action_id, cursor)
        events = journal.events(action_id, cursor, EVENTS_PER_SLICE)
        return JSONResponse(
            {
                "action_id": action_id,
                "cursor": cursor,
                "next_cursor": cursor + len(events),
                "status": job.status,
                "events": [event.as_dict() for event in events],
            }
        )

    @app.post("/jobs/{action_id}/cancel", responses=errors(400, 404, 422))
    @app.post("/runs/{action_id}/cancel", responses=errors(400, 404, 422))
    async def cancel(action_id: str, body: CancelRequest) -> dict[str, Any]:
        if body.action_id != action_id:
            raise HTTPException(400, "action_id in the body differs from the path")
        job = find(action_id)
        if job.crew_id != body.crew_id:
            raise HTTPException(404, "run was not found")
        await sup.cancel(action_id, body.reason)
        return view(journal.get(action_id) or job)

    @app.delete("/jobs/{action_id}", responses=errors(404, 409, 422, 428, 507))
    async def archive(
        action_id: str, confirmation: Annotated[str | None, Header(alias="X-AIP-Archive-Confirmation")] = None
    ) -> dict[str, Any]:
        if confirmation != action_id:
            raise HTTPException(428, "X-AIP-Archive-Confirmation must equal the action id")
        job = find(action_id)
        if job.status == "running":
            raise HTTPException(409, "a running job cannot be archived")
        try:
            journal.archive(action_id)
        except JournalError as exc:
            raise HTTPException(507, f"archive could not be made durable: {exc}") from None
        return {"archived": True, "action_id": action_id}

    # The operator routes answer 404 (unknown job) and 422 with a sentence (bad page cursor, path id).
    app.include_router(operator_routes(sup))
    return app


def bounded_slice(events: list[Event]) -> list[Event]:
    total = 0
    for index, event in enumerate(events):
        total += len(orjson.dumps(event.data))
        if total > SLICE_BYTES and index > 0:
            return events[:index]
    return events


def resume_cursor(last_event_id: str | None, cursor: int) -> int:
    """Last-Event-ID (an SSE reconnect) resumes after that sequence and wins over the query."""
    if last_event_id is None:
        return cursor
    # isascii: "²" is a digit to str.isdigit() but not to int()
    if not (last_event_id.strip().isascii() and last_event_id.strip().isdigit()):
        raise HTTPException(400, "Last-Event-ID must be an event sequence number")
    return int(last_event_id) + 1


async def sse_frames(batches: AsyncIterator[list[Event] | None]) -> AsyncIterator[bytes]:
    """``event:`` and ``data:`` first, as the reference writes them, then ``id:`` for resuming."""
    async for batch in batches:
        if batch is None:
            yield b": keep-alive\n\n"
        else:
            yield b"".join(_frame(event) for event in batch)


def _frame(event: Event) -> bytes:
    return b"event: %s\ndata: %s\nid: %d\n\n" % (event.event.encode(), orjson.dumps(event.as_dict()), event.sequence)
