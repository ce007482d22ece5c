"""The job lifecycle, wired: admission (validate, fence, admit) hands jobs to the runner (queue, spawn,
relay, settle), which writes through the recorder (events into the journal, followers woken); one
housekeeping tick commits, samples and reaps. ``start`` and ``stop`` bring them up and down in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config import Settings
from supervisor.jobs.admission import Admission
from supervisor.jobs.housekeeping import Housekeeping
from supervisor.jobs.live import LiveJob
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.runner import Runner
from supervisor.journal.store import Job, Journal
from supervisor.metrics import Metrics
from supervisor.processes.launcher import Launcher
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper


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
    ) -> None:
        self.settings = settings
        self.journal = journal
        self.launcher = launcher
        self.crews = crews
        self.live: dict[str, LiveJob] = {}  # jobs without a terminal event, shared by the parts below
        self.metrics = Metrics()
        self.limits = limits
        self.recorder = Recorder(settings, journal, self.live)
        self.runner = Runner(settings, launcher, self.limits, self.recorder, self.metrics, state, self.live)
        self.admission = Admission(settings, journal, crews, self._launch)
        self.housekeeping = Housekeeping(journal, self.limits, reaper, self.metrics, live=lambda: bool(self.live))
        journal.on_pending = self.housekeeping.poke
        journal.commit_seconds = self.metrics.commit_latency.observe
        self.metrics.observe_with(
            running=lambda: sum(job.phase in ("launching", "running") for job in self.live.values()),
            queued=lambda: sum(job.phase == "queued" for job in self.live.values()),
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

    async def stop(self) -> None:
        """Drain: new starts answer 503, then every job ends (see ``Runner.stop``), then the services stop.
        Idempotent: the signal handler and the app's lifespan both call it."""
        if self.admission.stopped:
            return
        await self.admission.stop()
        await self.runner.stop()
        await self.housekeeping.stop()
        await self.launcher.stop()
        self.limits.stop()
