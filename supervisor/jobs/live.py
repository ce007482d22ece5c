"""A live job: what only this process knows of a job that has no terminal event yet."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from protocol import Spent
from supervisor.jobs.phases import Phase, StopReason, check_move
from supervisor.processes.limits import Breach
from supervisor.processes.process import WorkerProcess

log = logging.getLogger("crew_supervisor.jobs")


@dataclasses.dataclass
class Spending:
    """A job's LLM usage so far, as its worker reports each call (``Spent``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    model: str | None = None  # the last call's

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, spent: Spent) -> Spent:
        """Count one call; returns it with its counts as counted (a worker cannot take back what it spent)."""
        counted = Spent(
            spent.model, max(spent.prompt_tokens, 0), max(spent.completion_tokens, 0), max(spent.requests, 0)
        )
        self.prompt_tokens += counted.prompt_tokens
        self.completion_tokens += counted.completion_tokens
        self.llm_calls += counted.requests
        self.model = counted.model
        return counted


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
    phase: Phase = Phase.QUEUED  # set through move() alone
    stop: StopReason | None = None  # set through ask_stop() alone: the first reason asked
    cancel_reason: str | None = None  # what the canceller said, when stop is CANCEL
    breach: Breach | None = None  # the limit it broke, when stop is LIMIT
    worker: WorkerProcess | None = None
    secrets: tuple[str, ...] = ()  # kept out of its worker's tails (supervisor/redaction.py)
    spent: Spending = dataclasses.field(default_factory=Spending)
    task: asyncio.Task[None] | None = None
    done: asyncio.Future[None] = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    stopped: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # set with stop

    def move(self, to: Phase) -> None:
        check_move(self.phase, to)
        log.debug("job phase", extra={"action_id": self.action_id, "phase": to})
        self.phase = to

    def ask_stop(self, reason: StopReason) -> bool:
        """Whether this reason stops the job: the first asked does, unless its outcome is already decided."""
        if self.stop is not None or self.phase in (Phase.SETTLING, Phase.SETTLED):
            return False
        self.stop = reason
        self.stopped.set()
        return True

    def wake(self) -> None:
        """Its followers look at the journal again."""
        self.changed.set()
        self.changed = asyncio.Event()
