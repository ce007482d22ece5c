"""A job's conversation with its worker, the whole of it, one per job (made by the job once its worker exists):
frames out (its ``Start``, ``DumpStacks``, the kill that ends whatever it left), its frames into its job's events (and
its effect ledger: ``jobs/ledger.py``, its spans, its LLM spend against its budget) until its terminal message, and how
the worker's end is read (an answer and an exit, a death, a fault, a stop asked). What the conversation learns is its
own state (building, started, spent, the stack kept before a kill, the events recorded): the job reads it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from protocol import (
    Building,
    Chunk,
    Completed,
    DumpStacks,
    EffectEnded,
    EffectStarted,
    Failed,
    Hello,
    OverBudget,
    Reason,
    Recorded,
    SpanEnded,
    SpanStarted,
    Spent,
    Stacks,
    Start,
    Started,
    TaskDone,
)
from supervisor.config import PREFIX
from supervisor.enums import EventName, Phase, Status
from supervisor.jobs import stacks
from supervisor.jobs.budget import Spending, named_limit
from supervisor.jobs.job_state import JobState
from supervisor.jobs.ledger import Fault, Ledger
from supervisor.jobs.outcomes import (
    Outcome,
    after_terminal,
    exit_failure,
    failure,
    interrupted,
    protocol_fault,
    worker_failure,
)
from supervisor.jobs.parts import Parts
from supervisor.jobs.phases import StopReason
from supervisor.jobs.recorder import masked
from supervisor.processes.limits import Breach
from supervisor.processes.process import StopEvidence, WorkerProcess
from supervisor.redaction import holding, redact

log = logging.getLogger("crew_supervisor.jobs")
EXIT_WAIT_SECONDS = 2.0  # after its terminal frame a worker leaves at once; past this it is killed
TRAILING_SECONDS = 0.5  # after a worker's exit its event pipe reaches EOF at once; a descendant may hold it
Ending = Completed | Failed | Outcome  # how the conversation ended: the worker's answer, or an outcome read already


@dataclasses.dataclass(frozen=True)
class Leftovers:
    """What a job's worker left running when it exited: each named before the kill (``Containment.named``, its command
    redacted), and the kill's evidence."""

    evidence: StopEvidence
    processes: list[dict[str, Any]]

    @property
    def record(self) -> dict[str, Any]:
        """As the job's record keeps it (``leftovers``, beside the exit status): never in a completed event, whose
        data is the output."""
        evidence = self.evidence
        killed = {"descendants_killed": evidence.descendants_killed, "stop_confirmed": evidence.stop_confirmed}
        return {**killed, "processes": self.processes}


class Conversation:
    def __init__(self, job: JobState, worker: WorkerProcess, parts: Parts) -> None:
        self.job, self.worker, self.grace = job, worker, parts.grace
        # Held here, not read through ``parts`` at each frame: the relay loop is the hot path.
        self.settings, self.limits = parts.settings, parts.limits
        self.recorder, self.metrics = parts.recorder, parts.metrics
        # What the conversation learns: its own, the job reads it (``LiveJob.conversation``), nothing else writes it.
        self.building = False  # its worker said Building: the crew's code runs in it from then on
        self.started = False  # its worker said Started: its crew runs, and it answers DumpStacks
        self.spent = Spending()  # each Spent counted
        self.stack: dict[str, Any] | None = None  # where it was just before a stop's kill (``_stop``)
        self.events = 0  # the job's events recorded
        self.last_event_at: float | None = None  # wall clock

    def start(self, env: dict[str, str], cwd: str, writable: list[str] | None) -> None:
        """Give the worker its job: ``Start``, with its environment, place, budget, what it may write, which of its
        variables hold the secrets masked in all it writes, and for a resume the tasks done already and the crew's
        fingerprint then (none done: the resume runs from the first task, as a start would)."""
        job = self.job
        limits = (job.budget.max_tokens, job.budget.max_llm_calls)
        given = (job.action_id, job.crew_id, job.operation, job.input, job.timeout_ms, env, cwd, *limits)
        done = job.resumed or None
        resumed, fingerprint = ([task.output for task in done], done[0].fingerprint) if done else (None, "")
        trace = job.trace.worker_started(self.worker.pid, job.secrets)  # its worker's spans go beneath; "": not traced
        names = holding(env, job.secrets)
        self.worker.send(Start(*given, writable, names, resumed, fingerprint, trace))

    async def end(self, result: Ending | None) -> Outcome:
        """The job's outcome from how its conversation ended (``run``'s result): None, a stop was asked (the worker
        is killed, with its grace unless over a limit, once where it was is kept); a fault or a death already read;
        or the worker's answer, which it must follow by leaving."""
        if isinstance(result, Completed | Failed):
            return await self._conclude(result)
        if result is None:
            result = interrupted(self.job, (await self._stop()).as_dict())
        self._gone(result.data)  # killed, or read dead
        return result

    async def run(self) -> Ending:
        """Record the worker's frames until its terminal message, or fault it."""
        worker = self.worker
        hello = await worker.next_message()
        if hello is None:
            return await self._ended()
        if not isinstance(hello, Hello) or hello.pid != worker.pid:
            return await _fault(worker, *protocol_fault(hello, "hello"))

        def recorded(entry: int) -> None:
            worker.send(Recorded(entry))

        ledger = Ledger(self.job, self.settings, self.metrics, self.recorder.journal.ledger, recorded, self.breach)
        try:
            return await self._relay(ledger)
        finally:  # however it ends (a stop cancels it), no frame of this worker is taken after this
            ledger.cut_off()

    async def _relay(self, ledger: Ledger) -> Ending:
        """The worker's frames after its hello, into the job's events and its ledger."""
        job, worker, recorder = self.job, self.worker, self.recorder
        action_id, secrets = job.action_id, job.secrets  # the job's own from its launch on: read once, not per frame
        while True:
            message = await worker.next_message()
            if isinstance(message, Completed | Failed):
                return message
            if isinstance(message, Building):
                self.building = True
                continue
            fault: Fault | None
            if isinstance(message, Started):
                self.started = True
                job.lap("worker_start")
                self.limits.begin(worker)
                self.metrics.start_latency.observe(asyncio.get_running_loop().time() - job.admitted)
                started = {"status": Status.RUNNING, "operation": job.operation, "pid": worker.pid}
                fault = await recorder.record(action_id, secrets, EventName.STARTED, started, self.events)
                if fault is None:
                    self.events, self.last_event_at = self.events + 1, time.time()
            elif isinstance(message, Chunk):
                fault = await recorder.record(action_id, secrets, EventName.CHUNK, message.data, self.events)
                if fault is None:
                    self.events, self.last_event_at = self.events + 1, time.time()
            elif isinstance(message, EffectStarted | EffectEnded | TaskDone):
                fault = await ledger.take(message)
            elif isinstance(message, SpanStarted | SpanEnded):
                fault = job.trace.take(message)
            elif isinstance(message, Spent):
                self._spend(message)
                continue
            elif isinstance(message, OverBudget):  # it holds a call back, and waits: stopped as over its budget
                if (breach := job.budget.breach(self.spent, held=named_limit(message.limit))) is None:
                    text = f"the worker held a call back for a limit it has not: {message.limit!r}"
                    fault = (Reason.PROTOCOL_ERROR, text)
                else:
                    self.breach(breach)
                    continue
            elif message is None:
                return await self._ended()
            else:
                fault = protocol_fault(message, "a job message")
            if fault is not None:
                return await _fault(worker, *fault)

    async def _conclude(self, message: Completed | Failed) -> Outcome:
        """The worker answered; it must also leave. Its exit status joins the proof, and what it left running is
        killed and named in the job's record."""
        job, worker = self.job, self.worker
        status = await worker.wait_exit(EXIT_WAIT_SECONDS)
        proof: dict[str, Any] = {"exit_status": status}
        if status is None:  # slow to leave: killed, which is its exit
            proof = (await worker.kill()).as_dict()
        self._gone(proof)  # its own end: the kernel's teardown of its address space, most of it
        left = await _leftovers(job, worker) if status is not None else None
        if left is not None:
            proof = left.evidence.as_dict()
        outcome = await self._answer(message, proof, left)
        return dataclasses.replace(outcome, leftovers=left.record) if left is not None else outcome

    async def _answer(self, message: Completed | Failed, proof: dict[str, Any], left: Leftovers | None) -> Outcome:
        """The outcome the answer makes, the worker gone. A process it left (``left``: killed by now) is the crew's,
        as an MCP server or a code interpreter not closed is: its answer stands, unless ``STRAY_PROCESSES=fail``."""
        if isinstance(message, Failed):
            return worker_failure(message, self.job.secrets, crew_ran=self.building, **proof)
        if left is not None and self.settings.stray_processes == "fail":
            killed = left.evidence.descendants_killed
            text = f"the worker left {killed} process(es) running; killed, and named in the job's leftovers"
            return failure(Reason.STRAY_PROCESSES, text, False, **proof)
        trailing = await self.worker.trailing_messages(TRAILING_SECONDS)
        if trailing:
            return after_terminal(trailing)
        # The client takes the completed event's data as the output: it must carry all of it, or the job
        # fails as the reference's does. Never a completed event without its output.
        size, bound = len(masked(message.output, self.job.secrets)), self.settings.max_event_bytes  # measured as stored
        if size > bound:
            message_text = f"an output of {size} bytes exceeds {PREFIX}MAX_EVENT_BYTES ({bound})"
            return failure(Reason.EVENT_TOO_LARGE, message_text, True, output_bytes=size, limit_bytes=bound, **proof)
        return Outcome(EventName.COMPLETED, message.output, message.output, exit_status=proof.get("exit_status"))

    def _spend(self, spent: Spent) -> None:
        """One LLM call's usage: the job's running totals and the supervisor's counters; over its budget, the
        job is stopped as for any broken limit."""
        job = self.job
        # The model's name is shown while the job runs (its record's llm_spent): a crew names it, and may name it badly.
        counted = self.spent.add(dataclasses.replace(spent, model=redact(spent.model, job.secrets)))
        self.metrics.llm_tokens.labels(job.crew_id, "prompt").inc(counted.prompt_tokens)
        self.metrics.llm_tokens.labels(job.crew_id, "completion").inc(counted.completion_tokens)
        self.metrics.llm_calls.labels(job.crew_id).inc(counted.requests)
        if (breach := job.budget.breach(self.spent)) is not None:
            self.breach(breach)

    async def stacks(self) -> dict[str, Any]:
        """Where a running job is now, as its worker answers ``DumpStacks``; raises ``stacks.Unavailable`` or
        ``stacks.Late``. The job goes on."""
        worker = stacks.asked_of(self.job, self.started)
        answer = await worker.ask(DumpStacks(), Stacks, stacks.ASK_SECONDS)
        if answer is None:
            raise stacks.unanswered(worker)
        return stacks.kept(self.job, answer)

    async def _stop(self) -> StopEvidence:
        """A stopped job's kill, once where it was is kept (``stacks.kept_before_kill``). A job over a limit gets no
        grace: it would spend it growing."""
        job, worker = self.job, self.worker
        if stacks.kept_before_kill(job, self.started):
            answer = await worker.ask(DumpStacks(), Stacks, stacks.BEFORE_KILL_SECONDS)
            if answer is not None:
                self.stack = {**stacks.kept(job, answer), "before": str(job.stop)}
        with job.trace.killing() as killed:
            return killed(await worker.kill(0 if job.stop is StopReason.LIMIT else self.grace))

    async def _ended(self) -> Outcome:
        """The event pipe closed before a result: the worker died, or it closed the pipe and runs on."""
        worker = self.worker
        status = await worker.wait_exit(EXIT_WAIT_SECONDS)
        if worker.exited.done():
            breach = self.limits.oom_breach(worker)
            if breach is not None:  # the kernel stopped it at its memory cap: the rest of its tree goes too
                evidence = await worker.kill()
                return failure(breach.error_type, breach.message, True, **breach.proof, **evidence.as_dict())
            outcome = exit_failure(status, worker.pid)
            left = await _leftovers(self.job, worker)  # what it started dies with it, counted and named
            if left is None:
                return outcome
            outcome.data["descendants_killed"] = left.evidence.descendants_killed
            return dataclasses.replace(outcome, leftovers=left.record)
        return await _fault(worker, Reason.FRAME_PIPE_CLOSED, "the worker closed its event pipe and kept running")

    def _gone(self, evidence: dict[str, Any]) -> None:
        """Its worker is gone, its exit read or its kill confirmed (``evidence``: its ``exit_status``, and a kill's):
        the job's "exit" step ends, and its trace's ``worker`` span."""
        self.job.lap("exit")
        self.job.trace.exited(evidence)

    def breach(self, breach: Breach) -> None:
        """Stop the job over a limit the way a cancel does, unless it is already stopping or ending."""
        if self.job.phase is Phase.RUNNING:
            self.job.ask_stop(StopReason.LIMIT, breach=breach)


async def _leftovers(job: JobState, worker: WorkerProcess) -> Leftovers | None:
    """What the exited worker left running (its containment's ``leftovers``): named, then killed; None: nothing."""
    found = await asyncio.to_thread(worker.containment.leftovers)
    if not found:
        return None
    named = await asyncio.to_thread(worker.containment.named, found)
    evidence = await worker.kill()
    processes = [{**process, "command": redact(str(process["command"]), job.secrets)} for process in named]
    killed = {"descendants_killed": evidence.descendants_killed, "leftovers": processes}
    log.warning("the job's worker left processes running: killed", extra={"action_id": job.action_id, **killed})
    return Leftovers(evidence, processes)


async def _fault(worker: WorkerProcess, reason: Reason, message: str) -> Outcome:
    """The worker broke the protocol (or the journal failed its events): killed, the job failed as ``reason``."""
    evidence = await worker.kill()
    return failure(reason, message, True, **evidence.as_dict())
