"""The runner: what is asked of the live jobs as a whole. Each admitted job is launched onto the roster (a
``LiveJob``, which runs itself: wait for a slot, launch, converse, settle); a cancel, a wait, a drain's closing of the
queue and the supervisor's stop are asked of the jobs it names.

Cancel, timeout, a broken limit and the supervisor's stop kill the worker's process group and record the
evidence; a worker that dies on its own fails only its own job. A drain closes the queue first: what waits
there fails at once, certain (it did nothing), while running jobs go on until the stop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from protocol import Operation
from supervisor.enums import Phase
from supervisor.jobs.housekeeping import Housekeeping
from supervisor.jobs.live import LiveJob
from supervisor.jobs.parts import Parts
from supervisor.jobs.phases import StopReason
from supervisor.jobs.roster import Roster
from supervisor.jobs.tracing import JobTrace
from supervisor.journal.records import Job, TaskRecord
from supervisor.processes.process import CONFIRM_SECONDS

log = logging.getLogger("crew_supervisor.jobs")


class Runner:
    def __init__(self, parts: Parts, roster: Roster[LiveJob], housekeeping: Housekeeping) -> None:
        self.parts = parts
        self.roster = roster
        self.housekeeping = housekeeping

    def launch(
        self, job: Job, input: dict[str, Any], timeout_ms: int, resumed: list[TaskRecord] | None, trace: JobTrace
    ) -> None:
        """Schedule an admitted (already durable) job; ``resumed``: the tasks its earlier job completed (a resume)."""
        operation = Operation(job.operation)  # admission's: one of the enum's
        live = LiveJob(
            self.parts, self.roster, job.action_id, job.crew_id, operation, input, timeout_ms, resumed, trace
        )
        self.roster.add(live)
        if (now_in := self.parts.lifecycle()).queue_closed:  # admitted as the queue closed: it ends as the others did
            live.ask_stop(StopReason.STOP if now_in.stopping else StopReason.DRAIN)
        live.start()
        self.parts.metrics.admitted.labels(job.operation).inc()
        self.housekeeping.poke()  # a live job is sampled and its orphans reaped

    async def cancel(self, action_id: str, reason: str | None) -> None:
        """Return once the job is terminal; a job stopping for another reason, or settling, keeps its outcome."""
        job = self.roster.get(action_id)
        if job is None:
            return
        with self.parts.metrics.cancel_latency.time():
            job.ask_stop(StopReason.CANCEL, said=reason or "cancelled by request")
            await asyncio.shield(job.done)

    async def wait(self, action_id: str, timeout: float) -> bool:
        """True once the job is terminal (or was never live here), False if ``timeout`` passed first."""
        job = self.roster.get(action_id)
        if job is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(job.done), max(timeout, 0))
        except TimeoutError:
            return False
        return True

    def answer_by(self, action_id: str, until: float) -> float:
        """When a blocking wait meant to end at ``until`` (loop time) gives up. Later if the job's own timeout
        falls before then, by what its kill may take (the grace, the worker's exit, its tree gone): the answer
        is then the job's timeout, not a wait that expired as the job was being killed."""
        job = self.roster.get(action_id)
        if job is None or job.deadline > until:
            return until
        return max(until, job.deadline + self.parts.grace + 2 * CONFIRM_SECONDS)

    async def close_queue(self) -> int:
        """No queued job will start: each ends `failed`, `supervisor_stopped`, `uncertain_outcome: false`.
        Jobs already launching or running go on. Returns how many were queued. (The supervisor is draining.)"""
        queued = [job for job in self.roster if job.phase is Phase.QUEUED and job.ask_stop(StopReason.DRAIN)]
        await asyncio.gather(*(asyncio.shield(job.done) for job in queued))
        return len(queued)

    async def stop(self) -> None:
        """Every worker is killed and its job ends `failed` with `uncertain_outcome` and the kill's evidence
        (never `cancelled`: nobody asked for that); a job still queued ends `failed`, certain. (The supervisor is
        stopping.)"""
        jobs = list(self.roster)
        for job in jobs:
            if job.ask_stop(StopReason.STOP) and job.phase in (Phase.LAUNCHING, Phase.RUNNING):
                pid = job.worker.pid if job.worker is not None else None
                log.warning("killing a job at stop", extra={"action_id": job.action_id, "pid": pid})
        await asyncio.gather(*(job.task for job in jobs if job.task), return_exceptions=True)
