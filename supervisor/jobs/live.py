"""A live job: one job that has no terminal event yet, in this process, from its admission to its terminal event.
It owns its state and its conversation with its worker: ``run`` waits for a slot, launches its worker, converses
with it, and settles it, exactly once. A stop (cancel, timeout, a broken limit, a drain, the supervisor's stop) is
asked of it (``ask_stop``); nothing else writes its state, which the rest reads through its properties."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from protocol import READ_ONLY_OPERATIONS, Operation, Reason
from supervisor.enums import EventName, Phase
from supervisor.jobs.budget import Spending
from supervisor.jobs.conversation import Conversation
from supervisor.jobs.environment import CrewEnvError, read_crew_env
from supervisor.jobs.launch import Launch
from supervisor.jobs.outcomes import Outcome, failure, interrupted
from supervisor.jobs.parts import Parts
from supervisor.jobs.phases import StopReason, check_move
from supervisor.jobs.roster import Roster
from supervisor.jobs.stacks import Unavailable
from supervisor.jobs.tracing import NO_TRACE, JobTrace
from supervisor.journal.records import TaskRecord
from supervisor.processes.launcher import LaunchError
from supervisor.processes.limits import Breach
from supervisor.processes.process import WorkerProcess

log = logging.getLogger("crew_supervisor.jobs")
T = TypeVar("T")
# The step of a job's time that leaving each phase ends (``LiveJob.lap``). The conversation and the job lap the steps
# inside a phase: "worker_start" (Start sent -> Started), "exit" (terminal frame -> the worker's exit seen, or its
# kill confirmed) and "cleanup" (-> its leftovers checked and killed, what it sent after its answer and the answer's
# size checked, its cgroup and scratch removed; for a job that never launched, all of settling before the journal).
STEP_ENDED_BY_LEAVING: dict[Phase, str] = {
    Phase.QUEUED: "queue",
    Phase.LAUNCHING: "launch",
    Phase.RUNNING: "job",
    Phase.SETTLING: "journal",
}


class LiveJob:
    def __init__(
        self,
        parts: Parts,
        roster: Roster[LiveJob],
        action_id: str,
        crew_id: str,
        operation: Operation,
        input: dict[str, Any],
        timeout_ms: int,
        resumed: list[TaskRecord] | None = None,
        trace: JobTrace = NO_TRACE,
    ) -> None:
        """``resumed``: a resume's tasks its earlier job completed. Made as it is admitted: its time counts from now."""
        self.parts, self.roster = parts, roster  # the runner puts it on the roster; it leaves once settled
        self.action_id, self.crew_id, self.operation, self.input = action_id, crew_id, operation, input
        self.timeout_ms, self.resumed, self.trace = timeout_ms, resumed, trace
        self.budget = parts.budget_of(crew_id)  # what it may spend on LLM calls
        self.admitted = asyncio.get_running_loop().time()
        self.deadline = self.admitted + timeout_ms / 1000  # the timeout counts from admission, queue wait included
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # set once it has left the roster
        self.stopped = asyncio.Event()  # set with its stop
        self.changed = asyncio.Event()  # set and replaced as its events commit (``wake``): its followers look again
        # Its state: each written by its own methods alone, read through the properties below.
        self._phase = Phase.QUEUED
        self._stop: StopReason | None = None  # the first reason asked
        self._said: str | None = None  # what the canceller said, when the stop is CANCEL
        self._breach: Breach | None = None  # the limit it broke, when the stop is LIMIT
        self._worker: WorkerProcess | None = None
        self._secrets: tuple[str, ...] = ()  # kept out of all its worker wrote (supervisor/redaction.py)
        self._conversation: Conversation | None = None  # made once its worker exists
        self._task: asyncio.Task[None] | None = None
        # When the step in hand began (time.monotonic: uvloop's loop time moves in whole milliseconds, and not at all
        # within one turn of the loop, which measured a job's queue step as 0.0)
        self.lapped = time.monotonic()

    # One job: wait for a slot -> launch -> converse -> settle ------------------------------------------------

    def start(self) -> None:
        """Its one task: ``run``."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"job:{self.action_id}")

    async def run(self) -> None:
        timer = asyncio.get_running_loop().call_at(self.deadline, self.ask_stop, StopReason.TIMEOUT)
        try:
            with self.trace.current():  # its log lines carry its trace's ids
                try:
                    outcome = await self._run_in_a_slot()
                except Exception:
                    log.exception("job failed inside the supervisor", extra={"action_id": self.action_id})
                    failed = "the supervisor failed while running the job"
                    outcome = failure(Reason.SUPERVISOR_ERROR, failed, self._worker is not None)
                finally:
                    timer.cancel()
                await self._settle(outcome)
        finally:
            # Live until its terminal event has committed: a follower that finds it gone reads that event. Its
            # waiters are released even if the loop closing cancelled this task: a restart fences the job then.
            self.roster.remove(self.action_id)
            if not self.done.done():
                self.done.set_result(None)

    async def _run_in_a_slot(self) -> Outcome:
        slots = self.parts.slots
        acquired = await _unless_stopped(self, lambda: slots.take(self.crew_id))
        if acquired and self._stop is not None:  # a slot and a stop in the same instant: nothing has started yet
            slots.give_back(self.crew_id)
        if not acquired or self._stop is not None:
            return interrupted(self, {"stop_confirmed": True, "launched": False})
        try:
            self.move(Phase.LAUNCHING)
            return await self._launched()
        finally:
            slots.give_back(self.crew_id)

    async def _launched(self) -> Outcome:
        try:  # read at each start: an operator rotates a crew's key by rewriting its file
            crew_vars = read_crew_env(self.parts.settings.crew_env_dir, self.crew_id)
        except CrewEnvError as exc:
            return failure(Reason.CREW_ENV_INVALID, str(exc), False)
        launch = Launch(self, self.parts, crew_vars)
        try:
            self._secrets = launch.secrets
            try:  # a stop asked meanwhile: its worker is killed once it exists
                self._worker = worker = await launch.spawn()
            except LaunchError as exc:
                return failure(Reason.LAUNCH_FAILED, str(exc), False)
            await launch.contain(worker)
            return await self._converse(launch, worker)
        finally:
            await launch.remove()

    async def _converse(self, launch: Launch, worker: WorkerProcess) -> Outcome:
        self._conversation = conversation = Conversation(self, worker, self.parts)
        if self._stop is None:  # a stop asked while launching: the worker is killed before it has its job
            conversation.start(launch.env, launch.cwd, launch.writable)
        self.move(Phase.RUNNING)
        launch.watch(worker, conversation.breach)
        ending = await _unless_stopped(self, conversation.run)
        self.move(Phase.SETTLING)
        return await launch.account(await conversation.end(ending))

    async def _settle(self, outcome: Outcome) -> None:
        if self._phase is not Phase.SETTLING:  # it never ran: queued, or its launch failed
            self.move(Phase.SETTLING)  # nothing stops it now: its terminal event waits for the journal
        if outcome.event == EventName.FAILED and self.operation in READ_ONLY_OPERATIONS:
            outcome.data["uncertain_outcome"] = False  # nothing it did can have changed the world
        self.lap("cleanup")  # its worker's remains checked and removed (or it never launched): the journal's now
        stack = self._conversation.stack if self._conversation is not None else None  # kept before a stop's kill
        await self.parts.recorder.finish(self, outcome, stack)
        self.wake()
        evidence = outcome.data if outcome.event != EventName.COMPLETED else {}  # completed data is the output itself
        log.info("job finished", extra=_finished(self, outcome.event, evidence))
        self.move(Phase.SETTLED)
        self.trace.end(outcome.event, evidence, self.spent.prompt_tokens, self.spent.completion_tokens)
        seconds = asyncio.get_running_loop().time() - self.admitted
        self.parts.metrics.job_finished(self.crew_id, self.operation, outcome.event, evidence, seconds)

    def ask_stop(self, reason: StopReason, said: str | None = None, breach: Breach | None = None) -> bool:
        """Whether this reason stops the job: the first asked does, unless its outcome is already decided. What a
        canceller ``said`` (CANCEL) and the ``breach`` (LIMIT) are kept with the reason that won."""
        if self._stop is not None or self._phase in (Phase.SETTLING, Phase.SETTLED):
            return False
        self._stop, self._said, self._breach = reason, said, breach
        self.trace.stop_asked(reason, said)
        self.stopped.set()
        return True

    async def stacks(self) -> dict[str, Any]:
        """Where it is now, as its worker answers (``Conversation.stacks``); raises ``stacks.Unavailable`` or
        ``stacks.Late``."""
        if self._conversation is None:
            raise Unavailable(f"the job is {self._phase}: no worker runs its crew now")
        return await self._conversation.stacks()

    def wake(self) -> None:
        """Its followers look at the journal again."""
        self.changed.set()
        self.changed = asyncio.Event()

    def move(self, to: Phase) -> None:
        check_move(self._phase, to)
        log.debug("job phase", extra={"action_id": self.action_id, "phase": to})
        self.lap(STEP_ENDED_BY_LEAVING[self._phase])
        self._phase = to

    def lap(self, step: str) -> None:
        """``step`` of the job's time ends now: the metrics and its trace are told how long it took since the last."""
        now = time.monotonic()
        self.parts.metrics.job_step(step, now - self.lapped)
        self.trace.lap(step)
        self.lapped = now

    @property
    def phase(self) -> Phase:
        """Where it is: queued, launching, running, settling or settled."""
        return self._phase

    @property
    def stop(self) -> StopReason | None:
        """Why it is stopped, the first reason asked; None: it is not."""
        return self._stop

    @property
    def cancel_reason(self) -> str | None:
        """What its canceller said, when a cancel stopped it."""
        return self._said

    @property
    def breach(self) -> Breach | None:
        """The limit it broke, when one stopped it."""
        return self._breach

    @property
    def worker(self) -> WorkerProcess | None:
        """Its worker, once spawned."""
        return self._worker

    @property
    def secrets(self) -> tuple[str, ...]:
        """Its secrets, masked in all its worker wrote."""
        return self._secrets

    @property
    def task(self) -> asyncio.Task[None] | None:
        """Its one task, once started."""
        return self._task

    @property
    def conversation(self) -> Conversation | None:
        """Its conversation with its worker, once its worker exists."""
        return self._conversation

    @property
    def spent(self) -> Spending:
        """Its LLM usage so far (none before its worker talks)."""
        return self._conversation.spent if self._conversation is not None else Spending()


async def _unless_stopped(job: LiveJob, step: Callable[[], Awaitable[T]]) -> T | None:
    """``step``'s result, or None if a stop was asked first: the step is then cancelled, and awaited.
    The job's own task is never cancelled: this is its one cancel scope."""
    if job.stop is not None:
        return None
    work = asyncio.ensure_future(step())
    stop = asyncio.ensure_future(job.stopped.wait())
    try:
        await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not work.done():  # a stop asked first (or the loop closing under us)
            work.cancel()  # Slots.take and the conversation leave nothing behind when cancelled
    await asyncio.wait((work,))
    # Done first, it stands, even with a stop asked in the same instant.
    return None if work.cancelled() else work.result()


def _finished(job: LiveJob, event: EventName, evidence: dict[str, Any]) -> dict[str, Any]:
    """What the log says of a job that ended: what it was, how it ended, how long it took and what it spent."""
    spent = job.spent
    return {
        "action_id": job.action_id,
        "crew_id": job.crew_id,
        "operation": job.operation,
        "outcome": event,
        "error_type": evidence.get("error_type"),
        "reason": evidence.get("reason"),
        "duration_ms": round((asyncio.get_running_loop().time() - job.admitted) * 1000, 1),
        "signal": evidence.get("signal"),  # set when the supervisor killed the worker
        "tokens": spent.tokens,
        "llm_calls": spent.llm_calls,
    }
