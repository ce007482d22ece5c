"""Worker slots: ``MAX_CONCURRENCY`` in all, and each crew's own bound (``CREW_MAX_CONCURRENCY``); a job starts
once it holds one of each, and gives both back as its worker is done.

The order waiting jobs start in, fair between crews: a free slot goes, among the crews with jobs waiting that are
below their own bound, to the one whose last job started longest ago (one with no job started yet first; between
those, the one whose jobs began waiting first); within a crew, jobs start in the order they were admitted. So crews
with jobs waiting take turns, a burst of one crew's jobs never makes another crew's job wait behind them, and a crew
at its bound waits without holding up the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping

from supervisor.config import PREFIX, ConfigError
from supervisor.enums import WaitingFor

EVERY_OTHER_CREW = "*"  # CREW_MAX_CONCURRENCY's name for the crews it does not name


@dataclasses.dataclass(frozen=True)
class Waiting:
    """What a queued job waits for, and how many of those slots are held, of how many."""

    on: WaitingFor
    running: int
    limit: int


class Slots:
    def __init__(self, total: int, bounds: Iterable[tuple[str, int]] = ()) -> None:
        self.total = total
        named = dict(bounds)
        self._rest = named.pop(EVERY_OTHER_CREW, None)  # the bound of every crew not named; None: only the total
        self._named = named
        self._held: dict[str, int] = {}  # slots held, by crew (a crew holding none is not here)
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # in the order each crew's began waiting
        self._starts = 0  # slots given, ever
        self._started: dict[str, int] = {}  # when (in slots given) each crew's last job took one

    def bound(self, crew: str) -> int | None:
        """The crew's own bound; None: only the total bounds it."""
        return self._named.get(crew, self._rest)

    def bounds(self, crews: Iterable[str]) -> dict[str, int]:
        """The bound of each of ``crews`` that has one (for ``/health``)."""
        return {crew: bound for crew in crews if (bound := self.bound(crew)) is not None}

    def check(self, served: Iterable[str]) -> None:
        """Refuse bounds for crews the registry does not serve (a misspelt name would bound nothing). Raises
        ConfigError."""
        crews = sorted(served)
        unknown = sorted(set(self._named) - set(crews))
        if unknown:
            raise ConfigError(
                f"{PREFIX}CREW_MAX_CONCURRENCY names crews not served: {', '.join(unknown)}"
                f" (served: {', '.join(crews) or 'none'})",
                f"name only served crews in {PREFIX}CREW_MAX_CONCURRENCY, or {EVERY_OTHER_CREW}=n for all the others",
            )

    async def take(self, crew: str) -> bool:
        """Wait for a slot for a job of ``crew`` (True once held; ``give_back`` returns it). Cancelled while
        waiting, it holds nothing and leaves its place; cancelled as it was given one, it gives it back."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(crew, deque()).append(granted)
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give_back(crew)
            else:
                self._leave(crew, granted)
            raise
        return True

    def give_back(self, crew: str) -> None:
        self._held[crew] -= 1
        if not self._held[crew]:
            del self._held[crew]
        self._dispatch()

    def waiting_for(self, crew: str) -> Waiting:
        """What a queued job of ``crew`` waits for: its crew's slot if its crew is at its bound (a free slot of the
        total would not start it), else one of the total."""
        bound, held = self.bound(crew), self._held.get(crew, 0)
        if bound is not None and held >= bound:
            return Waiting(WaitingFor.CREW, held, bound)
        return Waiting(WaitingFor.SLOT, self.held, self.total)

    @property
    def held(self) -> int:
        return sum(self._held.values())

    def queued(self, crews: Iterable[str]) -> Mapping[str, int]:
        """How many jobs of each of ``crews`` wait (0 for none)."""
        return {crew: len(self._waiting.get(crew, ())) for crew in crews}

    def _below_bound(self, crew: str) -> bool:
        bound = self.bound(crew)
        return bound is None or self._held.get(crew, 0) < bound

    def _dispatch(self) -> None:
        """Give free slots to waiting jobs, in the module's order, until none is free or every crew waiting is at
        its bound."""
        while self.held < self.total:
            ready = [crew for crew in self._waiting if self._below_bound(crew)]
            if not ready:
                return
            crew = min(ready, key=lambda crew: self._started.get(crew, -1))  # the first of equals: waiting longest
            queue = self._waiting[crew]
            granted = queue.popleft()
            if not queue:
                del self._waiting[crew]
            if granted.done():  # cancelled, its task not yet told: it takes nothing
                continue
            self._starts += 1
            self._started[crew] = self._starts
            self._held[crew] = self._held.get(crew, 0) + 1
            granted.set_result(None)

    def _leave(self, crew: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(crew)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiting[crew]
