"""Housekeeping: one tick that commits pending chunks, samples every worker against its limits and reaps
adopted orphans, each at its own period. How late a tick fires is the event loop's lag.

It ticks only while there is something to do: a job is live (its worker is sampled, its orphans reaped),
chunks wait to commit, or an adopted orphan is still ours. Otherwise it sleeps until ``poke``-d (a job
is launched, a first chunk waits), so an idle supervisor wakes for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from supervisor.journal.store import Journal
from supervisor.metrics import Metrics
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper

log = logging.getLogger("crew_supervisor.jobs")
FLUSH_SECONDS = 0.05  # how long a chunk may wait before readers can see it
REAP_SECONDS = 1.0  # how long an adopted orphan may stay a zombie


class Housekeeping:
    def __init__(
        self, journal: Journal, limits: Limits, reaper: Reaper, metrics: Metrics, live: Callable[[], bool]
    ) -> None:
        self.journal = journal
        self.limits = limits
        self.reaper = reaper
        self.metrics = metrics
        self.live = live  # whether any job is live
        self.tick = min(FLUSH_SECONDS, limits.period)
        self._task: asyncio.Task[None] | None = None
        self._work = asyncio.Event()  # set by ``poke``: there may be something to do

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="housekeeping")

    def poke(self) -> None:
        """Something may need housekeeping now (a job was launched, a chunk waits to commit)."""
        self._work.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.journal.flush()  # not awaited: closing the journal commits it

    def _idle(self) -> bool:
        return not (self.live() or self.journal.pending or self.limits.watching or self.reaper.adopted)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._idle():
                self._work.clear()
                await self._work.wait()
            await self._busy(loop)

    async def _busy(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick until there is nothing left to do; the last round reaps, so no orphan is left behind."""
        due = {"flush": 0.0, "sample": 0.0, "reap": loop.time() + REAP_SECONDS}
        while True:
            planned = loop.time() + self.tick
            await asyncio.sleep(self.tick)
            now = loop.time()
            self.metrics.loop_lag.observe(max(now - planned, 0.0))
            if now >= due["flush"]:
                due["flush"] = now + FLUSH_SECONDS
                self.journal.flush()  # not awaited: the writer commits it, and logs a group it could not
            if now >= due["sample"]:
                due["sample"] = now + self.limits.period
                self.limits.sample()
            idle = self._idle()
            if now >= due["reap"] or idle:
                due["reap"] = now + REAP_SECONDS
                if reaped := self.reaper.reap():
                    log.info("reaped %d exited orphan(s) of jobs", reaped)
                if self._idle():
                    return
