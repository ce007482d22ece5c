"""Restart fencing: before serving, every job a dead supervisor left running fails, uncertain, and everything of
it still alive is killed first: its worker (same pid and start time), every member of its cgroups and group, every
descendant a sample saw (``containment.kill_remains``), even long after the worker itself died. What the job of a
quarantined record left (``supervisor/journal/quarantine.py``) is killed too, and its record left as it was kept."""

from __future__ import annotations

import asyncio
import logging
import time

import psutil

from protocol import Reason
from supervisor.jobs.outcomes import failure
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from supervisor.processes.containment import Boundary, kill_remains, running
from supervisor.processes.process import CONFIRM_SECONDS

log = logging.getLogger("crew_supervisor.jobs")
RESTART_MESSAGE = "sidecar restarted before CrewAI produced a terminal result"  # the reference's words
MAX_PIDS_RECORDED = 100  # of the processes a fence killed, named in its evidence (all are counted)


async def fence_restored(journal: Journal) -> list[str]:
    """The action ids fenced (a quarantined record's is not: it gets no terminal event)."""
    await _fence_quarantined(journal)
    fenced = []
    for job in journal.reader.running():
        killed = await asyncio.to_thread(_kill_remains, job)
        evidence = {
            "orphan_killed": bool(killed),
            "orphans_killed": len(killed),
            "orphan_pids": sorted(process.pid for process in killed)[:MAX_PIDS_RECORDED],
        }
        if killed:
            log.warning("killed what a dead supervisor's job left", extra={"action_id": job.action_id, **evidence})
        outcome = failure(Reason.SUPERVISOR_RESTARTED, RESTART_MESSAGE, True, **evidence)
        await journal.finish(job.action_id, outcome.event, outcome.data)
        fenced.append(job.action_id)
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
    """Kill, then wait (``CONFIRM_SECONDS`` at most) until none of them runs. A zombie is dead already: only its
    new parent can reap it, and one that never does would make the wait last until the deadline."""
    killed = kill_remains(job.worker_pid, job.worker_start_time, job.worker_pgid, Boundary.decode(job.boundary))
    deadline = time.monotonic() + CONFIRM_SECONDS
    while any(running(process) for process in killed) and time.monotonic() < deadline:
        time.sleep(0.005)
    return killed
