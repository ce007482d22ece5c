"""A live job: what only this process knows of a job that has no terminal event yet."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from protocol import Reason, Spent
from supervisor.enums import Phase
from supervisor.jobs.phases import StopReason, check_move
from supervisor.jobs.tracing import NO_TRACE, JobTrace
from supervisor.journal.records import TaskRecord
from supervisor.processes.limits import Breach
from supervisor.processes.process import WorkerProcess

log = logging.getLogger("crew_supervisor.jobs")
MODEL_CHARS = 200  # of the model a worker names: it goes into the record and a stopped job's terminal
# The step of a job's time that leaving each phase ends (``LiveJob.lap``). The relay and the runner lap the steps
# inside a phase: "worker_start" (Start sent -> Started), "exit" (terminal frame -> the worker's exit seen, or its
# kill confirmed) and "cleanup" (-> its leftovers checked and killed, what it sent after its answer and the answer's
# size checked, its cgroup and scratch removed; for a job that never launched, all of settling before the journal).
STEP_ENDED_BY_LEAVING: dict[Phase, str] = {
    Phase.QUEUED: "queue",
    Phase.LAUNCHING: "launch",
    Phase.RUNNING: "job",
    Phase.SETTLING: "journal",
}


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

    def summary(self) -> dict[str, Any]:
        """As a job's record says it (``llm_spent``): tokens, calls and the last call's model."""
        return {"tokens": self.tokens, "llm_calls": self.llm_calls, "model": self.model}

    def add(self, spent: Spent) -> Spent:
        """Count one call; returns it with its counts as counted (a worker cannot take back what it spent)."""
        counted = Spent(
            spent.model[:MODEL_CHARS],
            max(spent.prompt_tokens, 0),
            max(spent.completion_tokens, 0),
            max(spent.requests, 0),
        )
        self.prompt_tokens += counted.prompt_tokens
        self.completion_tokens += counted.completion_tokens
        self.llm_calls += counted.requests
        self.model = counted.model
        return counted


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a job may spend on LLM calls (0: no limit): the supervisor's, or its crew's own where that is lower."""

    max_tokens: int = 0
    max_llm_calls: int = 0

    @classmethod
    def own(cls, described: Any) -> Budget:
        """A crew's own budget as its registry describes it; what is no count of tokens or calls counts as none."""
        if not isinstance(described, Mapping):
            return cls()
        return cls(*(_count(described.get(name)) for name in ("max_tokens", "max_llm_calls")))

    def within(self, other: Budget) -> Budget:
        """The lower of each limit of the two, where 0 is none."""
        return Budget(_lower(self.max_tokens, other.max_tokens), _lower(self.max_llm_calls, other.max_llm_calls))

    def breach(self, spent: Spending, held: str | None = None) -> Breach | None:
        """The limit ``spent`` is over: tokens crossed, more calls than allowed, or the worker holding a call
        back (``held``: which of the job's limits it says is spent, as ``OverBudget`` does)."""
        proof = {"tokens": spent.tokens, "llm_calls": spent.llm_calls, "model": spent.model}
        if self.max_tokens and (held == "max_tokens" or spent.tokens > self.max_tokens):
            message = f"the job spent {spent.tokens} LLM tokens, over its {self.max_tokens}"
            return Breach(Reason.TOKEN_LIMIT_EXCEEDED, message, {**proof, "limit": self.max_tokens})
        if self.max_llm_calls and (held == "max_llm_calls" or spent.llm_calls > self.max_llm_calls):
            message = (
                f"the job made its {self.max_llm_calls} LLM calls and would have made another"
                if held == "max_llm_calls"
                else f"the job made {spent.llm_calls} LLM calls, over its {self.max_llm_calls}"
            )
            return Breach(Reason.LLM_CALL_LIMIT_EXCEEDED, message, {**proof, "limit": self.max_llm_calls})
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _lower(one: int, other: int) -> int:
    return min(one, other) if one and other else one or other


@dataclasses.dataclass(eq=False)
class LiveJob:
    action_id: str
    crew_id: str
    operation: str
    input: dict[str, Any]
    timeout_ms: int
    admitted: float  # loop time
    deadline: float  # loop time; the timeout counts from admission, queue wait included
    # Each field below has one writer, named beside it; everything else only reads it.
    resumed: list[TaskRecord] | None = None  # the runner, at launch: a resume's tasks its earlier job completed
    budget: Budget = Budget()  # the runner, as it launches the job: the supervisor's, or its crew's own if lower
    timed: Callable[[str, float], None] | None = None  # the runner: told each step of its time as it ends
    trace: JobTrace = NO_TRACE  # admission, as it admits the job: its trace (supervisor/jobs/tracing.py)
    event_count: int = 0  # the recorder, as it records an event
    last_event_at: float | None = None  # the recorder; wall clock
    phase: Phase = Phase.QUEUED  # move() alone, which the runner calls
    stop: StopReason | None = None  # ask_stop() alone: the first reason asked
    cancel_reason: str | None = None  # ask_stop(): what the canceller said, when stop is CANCEL
    breach: Breach | None = None  # ask_stop(): the limit it broke, when stop is LIMIT
    worker: WorkerProcess | None = None  # the runner, once its worker is launched
    secrets: tuple[str, ...] = ()  # the runner: kept out of all its worker wrote (supervisor/redaction.py)
    building: bool = False  # the relay: its worker said Building: the crew's code runs in it from then on
    started: bool = False  # the relay: its worker said Started: its crew runs, and it answers DumpStacks
    spent: Spending = dataclasses.field(default_factory=Spending)  # the relay, counting each Spent
    stack: dict[str, Any] | None = None  # the relay (its _stop): where it was just before a stop's kill
    task: asyncio.Task[None] | None = None  # the runner: the job's one task
    done: asyncio.Future[None] = dataclasses.field(default_factory=lambda: asyncio.get_running_loop().create_future())
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # wake() alone
    stopped: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # ask_stop() alone: set with stop
    # lap() alone: when the step in hand began (time.monotonic: uvloop's loop time moves in whole milliseconds, and
    # not at all within one turn of the loop, which measured a job's queue step as 0.0)
    lapped: float = dataclasses.field(init=False, default_factory=time.monotonic)

    def move(self, to: Phase) -> None:
        check_move(self.phase, to)
        log.debug("job phase", extra={"action_id": self.action_id, "phase": to})
        self.lap(STEP_ENDED_BY_LEAVING[self.phase])
        self.phase = to

    def lap(self, step: str) -> None:
        """``step`` of the job's time ends now: ``timed`` is told how long it took since the last one ended."""
        now = time.monotonic()
        if self.timed is not None:
            self.timed(step, now - self.lapped)
        self.trace.lap(step)
        self.lapped = now

    def gone(self, evidence: Mapping[str, Any]) -> None:
        """Its worker is gone, its exit read or its kill confirmed (``evidence``: its ``exit_status``, and a kill's):
        the "exit" step ends, and its trace's ``worker`` span."""
        self.lap("exit")
        self.trace.exited(evidence)

    def ask_stop(self, reason: StopReason, said: str | None = None, breach: Breach | None = None) -> bool:
        """Whether this reason stops the job: the first asked does, unless its outcome is already decided. What a
        canceller ``said`` (CANCEL) and the ``breach`` (LIMIT) are kept with the reason that won."""
        if self.stop is not None or self.phase in (Phase.SETTLING, Phase.SETTLED):
            return False
        self.stop, self.cancel_reason, self.breach = reason, said, breach
        self.trace.stop_asked(reason, said)
        self.stopped.set()
        return True

    def wake(self) -> None:
        """Its followers look at the journal again."""
        self.changed.set()
        self.changed = asyncio.Event()
