"""The job lifecycle, wired: admission (validate, fence, admit) hands jobs to the runner (queue, spawn,
relay, settle), which writes through the recorder (events into the journal, followers woken); one
housekeeping tick commits, samples and reaps. ``start`` and ``stop`` bring them up and down in order;
``drain`` comes before ``stop`` on SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.config import Settings
from supervisor.jobs.admission import Admission
from supervisor.jobs.housekeeping import Housekeeping
from supervisor.jobs.live import Budget, LiveJob
from supervisor.jobs.phases import Phase
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner import Runner
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from supervisor.metrics import Metrics
from supervisor.processes.launcher import Launcher
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper

log = logging.getLogger("crew_supervisor")


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        launcher: Launcher,
        limits: Limits,
        crews: list[str],
        state: Path,
        reaper: Reaper,
        budgets: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        # Each crew's own LLM budget that holds (what its registry entry asks, read as counts), for /health.
        owns = {crew_id: Budget.own(described) for crew_id, described in (budgets or {}).items()}
        self.budgets = {crew_id: dataclasses.asdict(own) for crew_id, own in owns.items() if own != Budget()}
        self.journal = journal
        self.launcher = launcher
        self.crews = crews
        self.instance = secrets.token_hex(8)  # this life of the supervisor: a restart changes it
        self.live: dict[str, LiveJob] = {}  # jobs without a terminal event, shared by the parts below
        self.metrics = Metrics()
        self.limits = limits
        self._stopped = False
        self.recorder = Recorder(settings, journal, self.live)
        self.runner = Runner(settings, launcher, self.limits, self.recorder, self.metrics, state, self.live, owns)
        self.admission = Admission(settings, journal, crews, self._launch)
        self.housekeeping = Housekeeping(journal, self.limits, reaper, self.metrics, live=lambda: bool(self.live))
        journal.on_pending = self.housekeeping.poke
        journal.commit_seconds = self.metrics.commit_latency.observe
        self.metrics.observe_with(
            running=lambda: sum(job.phase in (Phase.LAUNCHING, Phase.RUNNING) for job in self.live.values()),
            queued=lambda: sum(job.phase is Phase.QUEUED for job in self.live.values()),
            journal_bytes=journal.size_bytes,
            restarts=lambda: getattr(launcher, "restarts", 0),
            idle_workers=lambda: getattr(launcher, "idle_workers", 0),
        )

    def _launch(self, job: Job, input: dict[str, Any], timeout_ms: int) -> None:
        self.runner.launch(job, input, timeout_ms)
        self.housekeeping.poke()  # a live job is sampled and its orphans reaped

    def start(self) -> None:
        self.launcher.start()
        self.housekeeping.start()

    def phase_of(self, action_id: str, status: str) -> Phase | None:
        """Where a job of ``status`` running (as the journal says) is: queued, launching, running or settling; None
        once it has ended (its terminal event may commit a moment before it leaves ``live``)."""
        job = self.live.get(action_id) if status == "running" else None
        return job.phase if job is not None and job.phase is not Phase.SETTLED else None

    def spent_of(self, action_id: str, status: str) -> dict[str, Any] | None:
        """A running job's LLM spend so far (tokens, calls, the last call's model); None once it has ended: its
        output's ``token_usage``, or a stop's evidence, says it then."""
        job = self.live.get(action_id) if status == "running" else None
        if job is None:
            return None
        spent = job.spent
        return {"tokens": spent.tokens, "llm_calls": spent.llm_calls, "model": spent.model}

    @property
    def draining(self) -> bool:
        """From a drain's start (or a stop's) to the end: new starts answer 503."""
        return self.admission.stopped

    async def drain(self, seconds: float, skip: asyncio.Event) -> None:
        """New starts answer 503 and queued jobs fail, certain; running jobs get up to ``seconds`` to finish,
        or until ``skip`` is set. Whatever still runs is ``stop``'s to kill. The server keeps serving
        meanwhile: streams, blocking waiters, reads and cancels of the jobs still running."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self.admission.stop()
        queued = await self.runner.close_queue()
        log.warning("drain began", extra={"seconds": seconds, "running": len(self.live), "queued": queued})
        pending = [job.done for job in self.live.values()]
        skipped = asyncio.ensure_future(skip.wait())
        deadline = began + seconds
        try:
            # asyncio.wait cancels nothing it waits on: the jobs go on whatever ends the wait.
            while pending and not skip.is_set() and (left := deadline - loop.time()) > 0:
                await asyncio.wait((*pending, skipped), timeout=left, return_when=asyncio.FIRST_COMPLETED)
                pending = [done for done in pending if not done.done()]
        finally:
            skipped.cancel()
        reason = "jobs_finished" if not pending else "skipped" if skip.is_set() else "grace_expired"
        duration_ms = round((loop.time() - began) * 1000, 1)
        log.warning("drain ended", extra={"reason": reason, "duration_ms": duration_ms, "running": len(self.live)})

    async def stop(self) -> None:
        """New starts answer 503, then every job ends (see ``Runner.stop``), then the services stop.
        Idempotent: the signal handler and the app's lifespan both call it."""
        if self._stopped:
            return
        self._stopped = True
        self.journal.stop_waiting()
        await self.admission.stop()
        await self.runner.stop()
        await self.housekeeping.stop()
        await self.launcher.stop()
        self.limits.stop()
