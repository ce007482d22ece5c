"""Restart fencing: before serving, and before listening, every job a dead supervisor left running fails,
uncertain, and everything of it still alive is killed first. First what the dead supervisor's job cgroups hold
(found through the lock file's record, ``claim.py``: even when the journal then cannot be opened), then, with the
journal open, each job's worker (same pid and start time), every member of its cgroups and group, every
descendant a sample saw (``containment.kill_remains``), even long after the worker itself died. What the job of a
quarantined record left (``supervisor/journal/quarantine.py``) is killed too, and its record left as it was kept. A
fenced job that was traced gets a ``fenced`` span in its trace, whose root died with the supervisor."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

from protocol import Reason
from supervisor.jobs.claim import Holder
from supervisor.jobs.outcomes import failure
from supervisor.jobs.tracing import Tracing
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from supervisor.processes.containment import Boundary, kill_remains, running
from supervisor.processes.process import CONFIRM_SECONDS

log = logging.getLogger("crew_supervisor.jobs")
RESTART_MESSAGE = "sidecar restarted before CrewAI produced a terminal result"  # the reference's words
MAX_PIDS_RECORDED = 100  # of the processes a fence killed, named in its evidence (all are counted)

Killed = Mapping[str, list[psutil.Process]]  # by job cgroup: what the kill of the dead supervisors' cgroups took


def kill_left_in_cgroups(holders: Iterable[Holder]) -> Killed:
    """Every process in the job cgroups of the supervisors that held the state and are gone, killed (and each
    cgroup removed once empty); returns once none of them runs. Of a holder whose pid another process took since,
    only what started before that process (``kill_remains``'s ``before``)."""
    killed: dict[str, list[psutil.Process]] = {}
    for holder in holders:
        if (now := holder.pid_started()) == holder.started:
            continue  # it runs (this very process, reopening the state): nothing of it is left
        for job in holder.jobs():
            killed[str(job)] = _confirmed(kill_remains(None, None, None, Boundary((str(job),)), before=now))
    if pids := sorted({process.pid for processes in killed.values() for process in processes}):
        extra = {"orphans_killed": len(pids), "orphan_pids": pids[:MAX_PIDS_RECORDED]}
        log.warning("killed what a dead supervisor's jobs left in their cgroups", extra=extra)
    return killed


async def fence_restored(journal: Journal, killed_before: Killed, tracing: Tracing) -> list[str]:
    """The action ids fenced (a quarantined record's is not: it gets no terminal event). What
    ``kill_left_in_cgroups`` took from a job's cgroups counts as its own. Each traced one's outcome goes to its
    trace through ``tracing`` (``Tracing.fenced``)."""
    await _fence_quarantined(journal)
    fenced = []
    for job in journal.reader.running():
        began_ns = time.time_ns()
        cgroups = Boundary.decode(job.boundary).cgroups
        earlier = [process for path in cgroups for process in killed_before.get(path, ())]
        killed = {process.pid: process for process in [*earlier, *await asyncio.to_thread(_kill_remains, job)]}
        evidence: dict[str, Any] = {
            "orphan_killed": bool(killed),
            "orphans_killed": len(killed),
            "orphan_pids": sorted(killed)[:MAX_PIDS_RECORDED],
        }
        if killed:
            log.warning("killed what a dead supervisor's job left", extra={"action_id": job.action_id, **evidence})
        outcome = failure(Reason.SUPERVISOR_RESTARTED, RESTART_MESSAGE, True, **evidence)
        await journal.finish(job.action_id, outcome.event, outcome.data)
        if (ids := journal.reader.trace(job.action_id)) is not None:
            tracing.fenced(job, ids, Reason.SUPERVISOR_RESTARTED, began_ns)
        fenced.append(job.action_id)
    if fenced:
        log.warning("fenced %d job(s) left running by a previous supervisor", len(fenced))
    return fenced


async def _fence_quarantined(journal: Journal) -> None:
    """At every start, whatever a quarantined record's status says (it may be what was wrong): its worker and
    descendants are matched by pid and start time, its cgroups are its own, so once all is dead nothing matches."""
    for job in journal.reader.quarantined_workers():
        try:
            killed = await asyncio.to_thread(_kill_remains, job)
        except (TypeError, ValueError, OverflowError) as exc:  # its worker's fields may be part of what was wrong
            log.warning(
                "cannot fence a quarantined record: its worker is malformed (%s)",
                type(exc).__name__,
                extra={"action_id": job.action_id},
            )
            continue
        if killed:
            pids = sorted(process.pid for process in killed)[:MAX_PIDS_RECORDED]
            log.warning(
                "killed what a quarantined record's job left: pids %s", pids, extra={"action_id": job.action_id}
            )


def _kill_remains(job: Job) -> list[psutil.Process]:
    return _confirmed(
        kill_remains(job.worker_pid, job.worker_start_time, job.worker_pgid, Boundary.decode(job.boundary))
    )


def _confirmed(killed: list[psutil.Process]) -> list[psutil.Process]:
    """``killed``, once none of them runs (``CONFIRM_SECONDS`` at most): a process that has exited holds no port.
    A zombie is dead already: only its new parent can reap it, and one that never does would make the wait last
    until the deadline."""
    deadline = time.monotonic() + CONFIRM_SECONDS
    while any(running(process) for process in killed) and time.monotonic() < deadline:
        time.sleep(0.005)
    return killed
