"""Each crew's places on disk (its HOME and CrewAI storage, shared by all its jobs) as last measured, against
``CREW_MAX_DISK_MB``: what admission asks before it lets a start of a crew in.

Only a crew's own jobs write there (their sandbox lets them), and each job's start and end measure them (the
runner notes it here), so admission walks a crew's places only when it knows nothing of them yet (the first
start since the supervisor started), or when they were over the cap and ``RECHECK_SECONDS`` have passed: an
operator may have freed them since. A start is never held up by a walk otherwise.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from supervisor.layout import crew_places
from supervisor.processes.limits import Limits
from supervisor.processes.places import disk_use

RECHECK_SECONDS = 5.0


class CrewDisk:
    def __init__(self, limits: Limits, state: Path) -> None:
        self.limits = limits  # whose ``crew_over`` is the cap's one rule
        self.state = state
        self._used: dict[str, tuple[int, float]] = {}  # by crew id (the registry's: bounded): bytes, when (loop)

    def note(self, crew_id: str, used: int) -> None:
        """A job of the crew measured its places: ``used`` bytes, whole."""
        self._used[crew_id] = (used, asyncio.get_running_loop().time())

    async def refresh(self, crew_id: str) -> None:
        """Measure the crew's places off the loop if it is due: unknown, or over the cap long enough ago."""
        if not self.limits.crew_disk_bytes:
            return
        known = self._used.get(crew_id)
        now = asyncio.get_running_loop().time()
        if known is None or (self.limits.crew_over(known[0]) and now - known[1] >= RECHECK_SECONDS):
            used, _ = await asyncio.to_thread(disk_use, crew_places(self.state, crew_id))
            self.note(crew_id, used)

    def over(self, crew_id: str) -> int | None:
        """The bytes the crew's places held when last measured, if over the cap; else None (or no cap)."""
        known = self._used.get(crew_id)
        return known[0] if known is not None and self.limits.crew_over(known[0]) else None
