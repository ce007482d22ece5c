"""What the served OpenAPI schema declares beside each route's 200, so that it tells the truth about every
answer (schemathesis checks it). Shared by the contract routes and the operator routes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Problem(BaseModel):
    """Every error body: ``detail`` says what is wrong (a blocking start's 409, 502 and 504 add the job's view)."""

    detail: str


class ValidationProblem(BaseModel):
    """FastAPI's list of field errors for the envelope; one sentence for operation input and path ids."""

    detail: str | list[dict[str, Any]]


def _error(
    description: str, model: type[BaseModel] = Problem, more_content: dict[str, Any] | None = None
) -> dict[str, Any]:
    # Content spelled out rather than ``model=``: FastAPI would file errors under the route's own media type
    # (text/event-stream, text/plain), and they are always JSON.
    content = {"application/json": {"schema": model.model_json_schema()}, **(more_content or {})}
    return {"description": description, "content": content}


_PLAIN = {"text/plain": {"schema": {"type": "string"}}}
# What the served schema declares beside each route's 200, so that it tells the truth about every answer.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error(
        "Non-run start on a legacy route, bad Idempotency-Key or Last-Event-ID, cancel ids differ, or a header or"
        " query parameter that decides something given twice (any route)"
    ),
    401: _error("Missing or invalid bearer token (every route)"),
    403: _error("Operation disabled by policy, or the token's role does not allow this route"),
    404: _error("Crew or job not found"),
    409: _error("Action id admitted with other material, job cancelled, job running, or a job that cannot resume"),
    # Starlette's body limit answers in plain text when the declared Content-Length is already too big.
    413: _error("Body over 4 MiB, or a start's input over 1 MiB", more_content=_PLAIN),
    416: _error("Cursor outside 0..event_count"),
    422: _error("Request, path id or operation input invalid", ValidationProblem),
    428: _error("Idempotency-Key or archive confirmation missing"),
    502: _error("The job failed"),
    503: _error("Not now, Retry-After says when: draining (starts), the journal's lock held, or no connection free"),
    504: _error("Wait expired; the job continues"),
    507: _error("Journal full, the write could not be made durable, or the crew's places over CREW_MAX_DISK_MB"),
}
# Answered by the connection's bounds (``http/connections.py``) before any route or the token is seen, in plain text.
ERRORS[408] = {"description": "The request's body did not arrive within BODY_TIMEOUT_SECONDS", "content": _PLAIN}
ERRORS[431] = {"description": "Request headers over MAX_HEADER_BYTES, 8 KiB a line or 100 of them", "content": _PLAIN}
BEARER_SCHEME = {"bearer": {"type": "http", "scheme": "bearer"}}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: ERRORS[code] for code in codes}
