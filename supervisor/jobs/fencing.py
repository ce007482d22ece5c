"""Restart fencing: before serving, every job a dead supervisor left running fails, uncertain, and its
worker, if still alive with the same pid and start time, is killed with its group first."""

from __future__ import annotations

from supervisor.jobs.outcomes import failure
from supervisor.journal.store import Journal
from supervisor.processes.process import kill_orphan

RESTART_MESSAGE = "sidecar restarted before CrewAI produced a terminal result"  # the reference's words


async def fence_restored(journal: Journal) -> list[str]:
    """The action ids fenced."""
    fenced = []
    for job in journal.reader.running():
        orphan = False
        if job.worker_pid and job.worker_start_time and job.worker_pgid:
            orphan = kill_orphan(job.worker_pid, job.worker_start_time, job.worker_pgid)
        outcome = failure("supervisor_restarted", RESTART_MESSAGE, True, orphan_killed=orphan)
        await journal.finish(job.action_id, outcome.event, outcome.data)
        fenced.append(job.action_id)
    return fenced
