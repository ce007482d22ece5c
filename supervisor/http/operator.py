"""Operator routes: the job list, the live worker view, a worker's captured output, a job's stacks, and the cancel of
many jobs at once.

They sit behind the same bearer middleware as the contract routes; none but the bulk cancel changes a job (asking
for its stacks does not stop it), and none logs inputs, outputs or captured streams.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
import psutil
from fastapi import APIRouter, HTTPException, Query, Request

from supervisor.http.contract import view
from supervisor.http.responses import errors
from supervisor.http.routing import StrictJSONRoute, Sup
from supervisor.jobs import stacks
from supervisor.jobs.live import LiveJob
from supervisor.jobs.outcomes import bounded
from supervisor.jobs.phases import Phase
from supervisor.journal.records import Streams, shown
from supervisor.models import BulkCancelRequest, OperationName, path_id_problem
from supervisor.processes.containment import ProcessTable
from supervisor.processes.limits import Limits
from supervisor.processes.process import WorkerProcess

DEFAULT_PAGE = 50
LAST_LINE_CHARS = 200
MAX_PAGE = 500
Status = Literal["running", "completed", "failed", "cancelled"]  # the contract's, as the journal keeps it
LivePhase = Literal["queued", "launching", "running", "settling"]  # where a job of status running is
NOTHING_CAPTURED = Streams("", "", 0, 0)
# Above the longest cursor ``encode_cursor`` can issue: base64 of [admitted_at, action_id] as JSON, where an
# id of 256 characters is at most 1,024 bytes of UTF-8 (512 of escaped quotes), under 1,420 characters in
# all. The 1,024 this replaced stuck paging at 422 after a page ending in a 256-emoji id.
MAX_CURSOR_CHARS = 2048
LIST_PARAMETERS = {"status", "phase", "crew_id", "operation", "limit", "cursor"}
# Bodies parsed strictly, as the contract's: the bulk cancel's ``{"crew_id": NaN}`` was a 500 (FastAPI's 422 could
# not be written with the NaN it quoted back), and is a 422 that says why.
router = APIRouter(route_class=StrictJSONRoute)


@router.get("/jobs", responses=errors(422))
async def list_jobs(
    sup: Sup,
    request: Request,
    status: Status | None = None,
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
    among = None if phase is None else [job.action_id for job in sup.live.values() if job.phase == phase]
    rows = sup.reader.list_jobs(status, crew_id, operation, before, limit + 1, among)
    page = [
        {**row, "message": short(row["message"]), "phase": sup.phase_of(row["action_id"], row["status"])}
        for row in rows[:limit]
    ]
    more = len(rows) > limit
    return {"jobs": page, "next_cursor": encode_cursor(page[-1]) if more else None}


@router.get("/workers")
async def workers(sup: Sup) -> dict[str, Any]:
    jobs = sorted(sup.live.values(), key=lambda job: job.admitted)
    table = ProcessTable.scan()  # one scan of the process table for every job's tree
    readings = [memory_reading(job, sup.limits, table) for job in jobs]
    # Off the loop: a PSS reading walks each process's mappings in the kernel.
    memory = await asyncio.to_thread(lambda: [read() if read is not None else (None, None) for read in readings])
    now = asyncio.get_running_loop().time()
    return {
        "workers": [
            worker_view(job, sup.limits, now, *measured)
            for job, measured in zip(jobs, memory, strict=True)
            if job.action_id in sup.live and job.phase is not Phase.SETTLED  # not ended while it was measured
        ]
    }


def memory_reading(job: LiveJob, limits: Limits, table: ProcessTable) -> Callable[[], tuple[int | None, str]] | None:
    if job.worker is None or job.worker.exited.done():
        return None
    try:
        return limits.tree(job.worker).memory_view(table)
    except psutil.NoSuchProcess:  # it has just exited
        return None


@router.get("/jobs/{action_id}/output", responses=errors(404, 422))
async def output(sup: Sup, action_id: str) -> dict[str, Any]:
    """Live from the worker's tails while it runs; from the journal once it has settled."""
    if problem := path_id_problem(action_id):
        raise HTTPException(422, problem)
    live = sup.live.get(action_id)
    if live is not None:
        worker = live.worker
        streams = Streams.of(worker.stdout, worker.stderr, live.secrets) if worker is not None else NOTHING_CAPTURED
    elif sup.reader.get(action_id) is None:
        raise HTTPException(404, "run was not found")
    else:
        # A job that never launched, or settled before this table existed, captured nothing.
        streams = sup.reader.streams(action_id) or NOTHING_CAPTURED
    return {
        "action_id": action_id,
        "live": live is not None,
        "stdout": {"text": streams.stdout, "total_bytes": streams.stdout_total},
        "stderr": {"text": streams.stderr, "total_bytes": streams.stderr_total},
    }


@router.post("/jobs/cancel", responses=errors(422))
async def cancel_many(sup: Sup, body: BulkCancelRequest) -> dict[str, Any]:
    """Cancel every live job the body names (queued, launching or running), all at once; answer once each is
    terminal, with its record and so its stop's evidence, as a single cancel answers. ``dry_run`` names them and
    stops none."""
    before = {action_id: sup.phase_of(action_id, "running") for action_id in list(sup.live)}
    taken, left = await sup.cancel_many(body)
    jobs = []
    for action_id in taken:
        job = sup.reader.get(action_id)
        if job is not None:  # archived meanwhile: nothing left to show
            jobs.append({**view(sup, job), "phase_before": before.get(action_id)})
    return {"dry_run": body.dry_run, "jobs": jobs, "more": left}


@router.get("/jobs/{action_id}/stack", responses=errors(404, 409, 422, 504))
async def stack(sup: Sup, action_id: str) -> dict[str, Any]:
    """Every thread's Python stack of a running job, asked of its worker (the job goes on); of an ended job, the
    stacks taken just before the kill of its timeout, cancel or broken limit."""
    if problem := path_id_problem(action_id):
        raise HTTPException(422, problem)
    try:
        return await sup.stacks_of(action_id)
    except LookupError:
        raise HTTPException(404, "run was not found") from None
    except stacks.Unavailable as exc:
        raise HTTPException(409, str(exc)) from None
    except stacks.Late as exc:
        raise HTTPException(504, str(exc)) from None


def worker_view(
    job: LiveJob, limits: Limits, now: float, memory: int | None = None, measure: str | None = None
) -> dict[str, Any]:
    """A queued job has no worker yet: its process fields are null. ``memory`` is the job's as its cap measures
    it (``measure``: ``cgroup``, the kernel's charge, or ``pss``), where RSS counts every shared page in full."""
    worker = job.worker
    tree = limits.tree(worker) if worker is not None else None
    # The sampler refreshes ``usage``; until its first pass one sample here is cheap.
    usage = (tree.usage or tree.sample()) if tree is not None else None
    return {
        "action_id": job.action_id,
        "crew_id": job.crew_id,
        "operation": job.operation,
        "phase": job.phase,
        "pid": worker.pid if worker is not None else None,
        "rss_bytes": usage.rss_bytes if usage else None,
        "cpu_percent": usage.cpu_percent if usage else None,
        "cpu_seconds": usage.cpu_seconds if usage else None,
        "processes": usage.processes if usage else None,
        "age_seconds": round(now - job.admitted, 3),
        "event_count": job.event_count,
        "last_event_at": job.last_event_at,
        "idle_seconds": None if job.last_event_at is None else round(max(time.time() - job.last_event_at, 0), 3),
        "memory_bytes": memory,
        "memory_measure": measure,
        "memory_limit_bytes": limits.memory_bytes or None,
        "seconds_left": round(job.deadline - now, 3),  # before its timeout
        # Its LLM usage so far, call by call as CrewAI counts it (its output's token_usage only once it ends).
        "tokens": job.spent.tokens,
        "prompt_tokens": job.spent.prompt_tokens,
        "completion_tokens": job.spent.completion_tokens,
        "llm_calls": job.spent.llm_calls,
        "model": job.spent.model,
        "last_output": last_line(worker, job.secrets) if worker is not None else None,
    }


def last_line(worker: WorkerProcess, secrets: tuple[str, ...]) -> str | None:
    """The last line the worker wrote to stdout (else to stderr), as its tail is shown, at most LAST_LINE_CHARS."""
    for tail in (worker.stdout, worker.stderr):
        lines = shown(tail, secrets, last=4 * LAST_LINE_CHARS).rstrip().splitlines()
        if lines:
            return lines[-1][-LAST_LINE_CHARS:]
    return None


def short(message: str | None) -> str | None:
    """A failed job's message in a list row: its first LAST_LINE_CHARS characters (its record has it whole)."""
    return None if message is None else bounded(str(message), LAST_LINE_CHARS)


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
