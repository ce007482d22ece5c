"""A live job: what only this process knows of a job that has no terminal event yet."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from supervisor.processes.limits import Breach
from supervisor.processes.process import WorkerProcess


@dataclasses.dataclass(eq=False)
class LiveJob:
    action_id: str
    crew_id: str
    operation: str
    input: dict[str, Any]
    timeout_ms: int
    admitted: float  # loop time
    deadline: float  # loop time; the timeout counts from admission, queue wait included
    event_count: int = 0
    last_event_at: float | None = None  # wall clock
    phase: str = "queued"  # queued -> launching -> running -> settling
    cancel_reason: str | None = None
    breach: Breach | None = None  # a limit the job broke; it is being killed for it
    worker: WorkerProcess | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Future[None] = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def wake(self) -> None:
        """Its followers look at the journal again."""
        self.changed.set()
        self.changed = asyncio.Event()
