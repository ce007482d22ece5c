"""The live worker view: each live job's worker, what its tree uses against its limits, its spend and the last
line it wrote, as the operator's ``/workers`` shows them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import psutil

from supervisor.enums import Phase
from supervisor.jobs.live import LiveJob
from supervisor.jobs.roster import Roster
from supervisor.jobs.slots import Slots
from supervisor.journal.records import shown
from supervisor.processes.containment import ProcessTable
from supervisor.processes.limits import Limits
from supervisor.processes.process import WorkerProcess

LAST_LINE_CHARS = 200


async def workers(roster: Roster[LiveJob], limits: Limits, slots: Slots) -> list[dict[str, Any]]:
    """Every live job's view, oldest first; one ended while it was measured is left out."""
    jobs = list(roster)
    table = ProcessTable.scan()  # one scan of the process table for every job's tree
    readings = [memory_reading(job, table) for job in jobs]
    # Off the loop: a PSS reading walks each process's mappings in the kernel.
    memory = await asyncio.to_thread(lambda: [read() if read is not None else (None, None) for read in readings])
    now = asyncio.get_running_loop().time()
    return [
        {**worker_view(job, limits, now, *measured), "waiting": waiting(job, slots)}
        for job, measured in zip(jobs, memory, strict=True)
        if job.action_id in roster and job.phase is not Phase.SETTLED  # not ended while it was measured
    ]


def waiting(job: LiveJob, slots: Slots) -> dict[str, Any] | None:
    """What a queued job waits for (``Slots.waiting_for``): ``on`` a slot or its crew's, with how many of those are
    held (``running``) of how many (``limit``); None for a job that no longer waits."""
    if job.phase is not Phase.QUEUED:
        return None
    return dataclasses.asdict(slots.waiting_for(job.crew_id))


def memory_reading(job: LiveJob, table: ProcessTable) -> Callable[[], tuple[int | None, str]] | None:
    if job.worker is None or job.worker.exited.done():
        return None
    try:
        return job.worker.containment.memory_view(table)
    except psutil.NoSuchProcess:  # it has just exited
        return None


def worker_view(
    job: LiveJob, limits: Limits, now: float, memory: int | None = None, measure: str | None = None
) -> dict[str, Any]:
    """A queued job has no worker yet: its process fields are null. ``memory`` is the job's as its cap measures
    it (``measure``: ``cgroup``, the kernel's charge, or ``pss``), where RSS counts every shared page in full."""
    worker, conversation, spent = job.worker, job.conversation, job.spent
    last_event_at = conversation.last_event_at if conversation is not None else None
    tree = worker.containment if worker is not None else None
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
        "event_count": conversation.events if conversation is not None else 0,
        "last_event_at": last_event_at,
        "idle_seconds": None if last_event_at is None else round(max(time.time() - last_event_at, 0), 3),
        "memory_bytes": memory,
        "memory_measure": measure,
        "memory_limit_bytes": limits.memory_bytes or None,
        "seconds_left": round(job.deadline - now, 3),  # before its timeout
        # Its LLM usage so far, call by call as CrewAI counts it (its output's token_usage only once it ends).
        "tokens": spent.tokens,
        "prompt_tokens": spent.prompt_tokens,
        "completion_tokens": spent.completion_tokens,
        "llm_calls": spent.llm_calls,
        "model": spent.model,
        "last_output": last_line(worker, job.secrets) if worker is not None else None,
    }


def last_line(worker: WorkerProcess, secrets: tuple[str, ...]) -> str | None:
    """The last line the worker wrote to stdout (else to stderr), as its tail is shown, at most LAST_LINE_CHARS."""
    for tail in (worker.stdout, worker.stderr):
        lines = shown(tail, secrets, last=4 * LAST_LINE_CHARS).rstrip().splitlines()
        if lines:
            return lines[-1][-LAST_LINE_CHARS:]
    return None
