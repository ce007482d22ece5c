"""Housekeeping: one tick that samples every worker against its limits and reaps adopted orphans, each at its
own period. How late a tick fires is the event loop's lag.

It ticks only while there is something to do: a job is live (its worker is sampled, its orphans reaped), or an
adopted orphan is still ours. Otherwise it sleeps until ``poke``-d (a job is launched), so an idle supervisor
wakes for nothing. (Chunks commit on their own: the journal's writer thread times their groups.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from supervisor.metrics import Metrics
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper

log = logging.getLogger("crew_supervisor.jobs")
REAP_SECONDS = 1.0  # how long an adopted orphan may stay a zombie


class Housekeeping:
    def __init__(self, limits: Limits, reaper: Reaper, metrics: Metrics, live: Callable[[], bool]) -> None:
        self.limits = limits
        self.reaper = reaper
        self.metrics = metrics
        self.live = live  # whether any job is live
        self._task: asyncio.Task[None] | None = None
        self._work = asyncio.Event()  # set by ``poke``: there may be something to do

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="housekeeping")

    def poke(self) -> None:
        """Something may need housekeeping now (a job was launched)."""
        self._work.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _idle(self) -> bool:
        return not (self.live() or self.limits.watching or self.reaper.adopted)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._idle():
                self._work.clear()
                await self._work.wait()
            await self._busy(loop)

    async def _busy(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick until there is nothing left to do; the last round reaps, so no orphan is left behind."""
        reap_due = loop.time() + REAP_SECONDS
        while True:
            planned = loop.time() + self.limits.period
            await asyncio.sleep(self.limits.period)
            now = loop.time()
            self.metrics.loop_lag.observe(max(now - planned, 0.0))
            self.limits.sample()
            idle = self._idle()
            if now >= reap_due or idle:
                reap_due = now + REAP_SECONDS
                if reaped := self.reaper.reap():
                    log.info("reaped %d exited orphan(s) of jobs", reaped)
                if self._idle():
                    return
