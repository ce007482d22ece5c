"""Housekeeping: one tick that commits pending chunks, samples every worker against its limits and reaps
adopted orphans, each at its own period. How late a tick fires is the event loop's lag."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from supervisor.journal.store import Journal
from supervisor.metrics import Metrics
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper

log = logging.getLogger("crew_supervisor.jobs")
FLUSH_SECONDS = 0.05  # how long a chunk may wait before readers can see it
REAP_SECONDS = 1.0  # how long an adopted orphan may stay a zombie


class Housekeeping:
    def __init__(self, journal: Journal, limits: Limits, reaper: Reaper, metrics: Metrics) -> None:
        self.journal = journal
        self.limits = limits
        self.reaper = reaper
        self.metrics = metrics
        self.tick = min(FLUSH_SECONDS, limits.period)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="housekeeping")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.journal.flush()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = {"flush": 0.0, "sample": 0.0, "reap": loop.time() + REAP_SECONDS}
        while True:
            planned = loop.time() + self.tick
            await asyncio.sleep(self.tick)
            now = loop.time()
            self.metrics.loop_lag.observe(max(now - planned, 0.0))
            if now >= due["flush"]:
                due["flush"] = now + FLUSH_SECONDS
                self.journal.flush()
            if now >= due["sample"]:
                due["sample"] = now + self.limits.period
                self.limits.sample()
            if now >= due["reap"]:
                due["reap"] = now + REAP_SECONDS
                if reaped := self.reaper.reap():
                    log.info("reaped %d exited orphan(s) of jobs", reaped)
