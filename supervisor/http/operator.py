"""Operator routes: the job list, the live worker view, a worker's captured output, a job's effect ledger, a job's
stacks, and the cancel and the archive of many jobs at once.

They sit behind the same bearer middleware as the contract routes; none but the bulk cancel and archive changes a job
(asking for its stacks does not stop it), and none logs inputs, outputs or captured streams.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Annotated, Any

import orjson
from fastapi import APIRouter, Header, HTTPException, Query, Request

from protocol import Operation
from supervisor.enums import LIVE_PHASES, Phase, Role, Status, literal
from supervisor.http.contract import archiving, find, view
from supervisor.http.responses import errors
from supervisor.http.routing import StrictJSONRoute, Sup
from supervisor.jobs.stacks import Late, Unavailable
from supervisor.models import BulkArchiveRequest, BulkCancelRequest, OperationName, path_id_problem
from supervisor.scopes import needs

DEFAULT_PAGE = 50
MAX_PAGE = 500
if TYPE_CHECKING:  # Literals built at run time (``literal``), of the enums' text, which ``list_jobs`` makes members
    StatusName = str
    LivePhase = str
else:
    StatusName = literal(Status)
    LivePhase = literal(LIVE_PHASES)
# Above the longest cursor ``encode_cursor`` can issue: base64 of [admitted_at, action_id] as JSON, where an
# id of 256 characters is at most 1,024 bytes of UTF-8 (512 of escaped quotes), under 1,420 characters in
# all. The 1,024 this replaced stuck paging at 422 after a page ending in a 256-emoji id.
MAX_CURSOR_CHARS = 2048
LIST_PARAMETERS = {"status", "phase", "crew_id", "operation", "limit", "cursor"}
BULK_CONFIRMATION = "bulk"  # what X-AIP-Archive-Confirmation says for the archive of many: no one id to repeat
# Bodies parsed strictly, as the contract's: the bulk cancel's ``{"crew_id": NaN}`` was a 500 (FastAPI's 422 could
# not be written with the NaN it quoted back), and is a 422 that says why.
router = APIRouter(route_class=StrictJSONRoute)


@router.get("/jobs", responses=errors(422))
@needs(Role.OBSERVER)
async def list_jobs(
    sup: Sup,
    request: Request,
    status: StatusName | None = None,
    phase: LivePhase | None = None,
    crew_id: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    operation: OperationName | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
) -> dict[str, Any]:
    """Newest first. One extra row is read to know whether another page exists. Each row has the job's
    ``phase`` beside its ``status`` (the contract's ``running`` covers all four), and ``phase`` filters on it."""
    # A misspelt filter (``?stauts=failed``) would otherwise list every job as if it had been applied.
    if unknown := set(request.query_params) - LIST_PARAMETERS:
        raise HTTPException(422, f"unknown query parameter {sorted(unknown)[0]!r}")
    before = decode_cursor(cursor) if cursor else None
    among = (Status(status) if status else None, Phase(phase) if phase else None)  # checked: the enums' text
    kind = Operation(operation) if operation else None
    rows = sup.reads.list_jobs(*among, crew_id, kind, before, limit + 1)
    page, more = rows[:limit], len(rows) > limit
    return {"jobs": page, "next_cursor": encode_cursor(page[-1]) if more else None}


@router.get("/workers")
@needs(Role.OBSERVER)
async def workers(sup: Sup) -> dict[str, Any]:
    return {"workers": await sup.reads.workers()}


@router.get("/jobs/{action_id}/output", responses=errors(404, 422))
@needs(Role.OBSERVER)
async def output(sup: Sup, action_id: str) -> dict[str, Any]:
    """Live from the worker's tails while it runs; from the journal once it has settled."""
    if problem := path_id_problem(action_id):
        raise HTTPException(422, problem)
    try:
        live, streams = sup.reads.captured(action_id)
    except LookupError:
        raise HTTPException(404, "run was not found") from None
    return {
        "action_id": action_id,
        "live": live,
        "stdout": {"text": streams.stdout, "total_bytes": streams.stdout_total},
        "stderr": {"text": streams.stderr, "total_bytes": streams.stderr_total},
    }


@router.get("/jobs/{action_id}/effects", responses=errors(404, 422))
@needs(Role.OBSERVER)
async def effects(sup: Sup, action_id: str) -> dict[str, Any]:
    """A job's effect ledger: each tool and LLM call its worker started, in order, and how it ended (``uncertain``:
    it had started when the job ended otherwise, and may or may not have had its effect); and how many of a run's
    tasks completed. Times in Unix seconds, as the job's record gives them."""
    find(sup, action_id)  # 422, or 404 (unknown, or quarantined), as the job's own route answers
    entries, tasks = sup.reads.effects(action_id)
    return {
        "action_id": action_id,
        "effects": [
            {
                "id": entry.id,
                "kind": entry.kind,
                "name": entry.name,
                "status": entry.status,
                "started_at": entry.started_at,
                "ended_at": entry.ended_at,
                "args_digest": entry.digest,
                "error_type": entry.error_type,
                "error_message": entry.error_message,
                "prompt_tokens": entry.prompt_tokens,
                "completion_tokens": entry.completion_tokens,
            }
            for entry in entries
        ],
        "tasks_completed": tasks,
    }


@router.post("/jobs/cancel", responses=errors(422))
@needs(Role.OPERATOR)
async def cancel_many(sup: Sup, body: BulkCancelRequest) -> dict[str, Any]:
    """Cancel every live job the body names (queued, launching or running), all at once; answer once each is
    terminal, with its record and so its stop's evidence, as a single cancel answers. ``dry_run`` names them and
    stops none. One that completed before its cancel took hold is named without its output: a thousand outputs of
    up to MAX_EVENT_BYTES each, twice (the terminal's data is the output), would make one answer unbounded."""
    taken, left = await sup.cancel_many(body)
    jobs = []
    for action_id, before in taken.items():
        job = sup.reads.job(action_id)
        if job is not None:  # archived meanwhile: nothing left to show
            jobs.append({**view(sup, job, with_output=False), "phase_before": before})
    return {"dry_run": body.dry_run, "jobs": jobs, "more": left}


@router.post("/jobs/archive", responses=errors(422, 428, 503, 507))
@needs(Role.OPERATOR)
async def archive_many(
    sup: Sup,
    body: BulkArchiveRequest,
    confirmation: Annotated[str | None, Header(alias="X-AIP-Archive-Confirmation")] = None,
) -> dict[str, Any]:
    """Archive the ended records the body names, as ``DELETE /jobs/{id}`` archives one: oldest end first, at most
    ``limit``; never a running one. ``dry_run`` names them and archives none. ``more``: how many more matched."""
    if confirmation != BULK_CONFIRMATION:
        raise HTTPException(428, f"X-AIP-Archive-Confirmation must be {BULK_CONFIRMATION!r} to archive many jobs")
    with archiving():
        archived, more = await sup.archives.archive_many(body)
    return {"archived": len(archived), "action_ids": archived, "dry_run": body.dry_run, "more": more}


@router.get("/jobs/{action_id}/stack", responses=errors(404, 409, 422, 504))
@needs(Role.OPERATOR)
async def stack(sup: Sup, action_id: str) -> dict[str, Any]:
    """Every thread's Python stack of a running job, asked of its worker (the job goes on); of an ended job, the
    stacks taken just before the kill of its timeout, cancel or broken limit."""
    if problem := path_id_problem(action_id):
        raise HTTPException(422, problem)
    try:
        return await sup.reads.stacks_of(action_id)
    except LookupError:
        raise HTTPException(404, "run was not found") from None
    except Unavailable as exc:
        raise HTTPException(409, str(exc)) from None
    except Late as exc:
        raise HTTPException(504, str(exc)) from None


def encode_cursor(row: dict[str, Any]) -> str:
    """Opaque to clients: the keyset (admitted_at, action_id) of a page's last row."""
    return base64.urlsafe_b64encode(orjson.dumps([row["admitted_at"], row["action_id"]])).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        admitted_at, action_id = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError):
        raise HTTPException(422, "cursor is not one this server handed out") from None
    if isinstance(admitted_at, bool) or not isinstance(admitted_at, int | float) or not isinstance(action_id, str):
        raise HTTPException(422, "cursor is not one this server handed out")
    return float(admitted_at), action_id
