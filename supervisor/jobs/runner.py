"""The runner: each admitted job queues for a slot, gets a worker spawned for it, has its frames relayed
to the recorder, and is settled exactly once.

Cancel, timeout, a broken limit and the supervisor's stop kill the worker's process group and record the
evidence; a worker that dies on its own fails only its own job. A drain closes the queue first: what waits
there fails at once, certain (it did nothing), while running jobs go on until the stop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from protocol import (
    READ_ONLY_OPERATIONS,
    WORKER_IDS,
    Chunk,
    Completed,
    Failed,
    Hello,
    OverBudget,
    Spent,
    Start,
    Started,
)
from supervisor.config import PREFIX, Settings
from supervisor.jobs.leftovers import remove_partial
from supervisor.jobs.live import Budget, LiveJob
from supervisor.jobs.outcomes import Outcome, after_terminal, exit_failure, failure, protocol_fault
from supervisor.jobs.phases import Phase, StopReason
from supervisor.jobs.recorder import Recorder
from supervisor.journal.records import Job
from supervisor.metrics import Metrics
from supervisor.processes.launcher import Launcher, LaunchError
from supervisor.processes.limits import Breach, Limits
from supervisor.processes.process import CONFIRM_SECONDS, StopEvidence, WorkerProcess
from supervisor.redaction import redact, secrets_in

log = logging.getLogger("crew_supervisor.jobs")
EXIT_WAIT_SECONDS = 2.0  # after its terminal frame a worker leaves at once; past this it is killed
TRAILING_SECONDS = 0.5  # after a worker's exit its event pipe reaches EOF at once; a descendant may hold it
T = TypeVar("T")


class Runner:
    def __init__(
        self,
        settings: Settings,
        launcher: Launcher,
        limits: Limits,
        recorder: Recorder,
        metrics: Metrics,
        state: Path,
        live: dict[str, LiveJob],
        budgets: Mapping[str, Budget],
    ) -> None:
        self.settings = settings
        self.budget = Budget(settings.worker_max_tokens, settings.worker_max_llm_calls)
        self.budgets = budgets  # each crew's own LLM budget, as its registry entry asks (Registry.budgets)
        self.launcher = launcher
        self.limits = limits
        self.recorder = recorder
        self.metrics = metrics
        self.state = state
        self.live = live
        self.queue_closed = False  # draining: no queued job starts
        self.stopping = False  # stopping: every job ends now
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._grace = settings.stop_grace_ms / 1000

    def launch(self, job: Job, input: dict[str, Any], timeout_ms: int) -> None:
        """Schedule an admitted (already durable) job."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        live = LiveJob(job.action_id, job.crew_id, job.operation, input, timeout_ms, now, now + timeout_ms / 1000)
        live.budget = self.budget.within(self.budgets.get(job.crew_id, Budget()))
        self.live[job.action_id] = live
        if self.stopping or self.queue_closed:  # admitted as the queue closed: it ends as the others did
            live.ask_stop(StopReason.STOP if self.stopping else StopReason.DRAIN)
        live.task = loop.create_task(self._run(live), name=f"job:{job.action_id}")
        self.metrics.admitted.labels(job.operation).inc()

    async def cancel(self, action_id: str, reason: str | None) -> None:
        """Return once the job is terminal; a job stopping for another reason, or settling, keeps its outcome."""
        job = self.live.get(action_id)
        if job is None:
            return
        with self.metrics.cancel_latency.time():
            if job.ask_stop(StopReason.CANCEL):
                job.cancel_reason = reason or "cancelled by request"
            await asyncio.shield(job.done)

    async def wait(self, action_id: str, timeout: float) -> bool:
        """True once the job is terminal (or was never live here), False if ``timeout`` passed first."""
        job = self.live.get(action_id)
        if job is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(job.done), max(timeout, 0))
        except TimeoutError:
            return False
        return True

    def answer_by(self, action_id: str, until: float) -> float:
        """When a blocking wait meant to end at ``until`` (loop time) gives up. Later if the job's own timeout
        falls before then, by what its kill may take (the grace, the worker's exit, its tree gone): the answer
        is then the job's timeout, not a wait that expired as the job was being killed."""
        job = self.live.get(action_id)
        if job is None or job.deadline > until:
            return until
        return max(until, job.deadline + self._grace + 2 * CONFIRM_SECONDS)

    async def close_queue(self) -> int:
        """No queued job will start: each ends `failed`, `supervisor_stopped`, `uncertain_outcome: false`.
        Jobs already launching or running go on. Returns how many were queued."""
        self.queue_closed = True
        queued = [job for job in self.live.values() if job.phase is Phase.QUEUED and job.ask_stop(StopReason.DRAIN)]
        await asyncio.gather(*(asyncio.shield(job.done) for job in queued))
        return len(queued)

    async def stop(self) -> None:
        """Every worker is killed and its job ends `failed` with `uncertain_outcome` and the kill's evidence
        (never `cancelled`: nobody asked for that); a job still queued ends `failed`, certain."""
        self.stopping = True
        jobs = list(self.live.values())
        for job in jobs:
            if job.ask_stop(StopReason.STOP) and job.phase in (Phase.LAUNCHING, Phase.RUNNING):
                pid = job.worker.pid if job.worker is not None else None
                log.warning("killing a job at stop", extra={"action_id": job.action_id, "pid": pid})
        await asyncio.gather(*(job.task for job in jobs if job.task), return_exceptions=True)

    # One job: queue -> spawn -> relay -> settle ----------------------------------------------------

    async def _run(self, job: LiveJob) -> None:
        timer = asyncio.get_running_loop().call_at(job.deadline, job.ask_stop, StopReason.TIMEOUT)
        try:
            try:
                outcome = await self._queue(job)
            except Exception:
                log.exception("job failed inside the supervisor", extra={"action_id": job.action_id})
                failed = "the supervisor failed while running the job"
                outcome = failure("supervisor_error", failed, job.worker is not None)
            finally:
                timer.cancel()
            await self._settle(job, outcome)
        finally:
            # Live until its terminal event has committed: a follower that finds it gone reads that event. Its
            # waiters are released even if the loop closing cancelled this task: a restart fences the job then.
            self.live.pop(job.action_id, None)
            if not job.done.done():
                job.done.set_result(None)

    async def _queue(self, job: LiveJob) -> Outcome:
        acquired = await self._unless_stopped(job, self._slots.acquire)
        if acquired and job.stop is not None:  # a slot and a stop in the same instant: nothing has started yet
            self._slots.release()
        if not acquired or job.stop is not None:
            return self._interruption(job, {"stop_confirmed": True, "launched": False})
        try:
            job.move(Phase.LAUNCHING)
            return await self._spawn_and_supervise(job)
        finally:
            self._slots.release()

    async def _spawn_and_supervise(self, job: LiveJob) -> Outcome:
        scratch = Path(tempfile.mkdtemp(prefix="job-", dir=self.state / "scratch"))
        try:
            if self.settings.worker_ids is not None:  # made 0700 by us: the worker's user must own it to write
                os.chown(scratch, *self.settings.worker_ids)
            env, cwd = worker_env(self.settings, self.state, job.crew_id), str(scratch)
            job.secrets = secrets_in(env, [self.settings.token])
            try:
                # Maybe forked ahead of demand: its environment and directory then come with Start. A stop
                # asked meanwhile is seen once the worker exists, to be killed.
                worker = await self.launcher.spawn(env, cwd)
            except LaunchError as exc:
                return failure("launch_failed", str(exc), False)
            job.worker = worker
            self.metrics.worker_starts.labels(worker.launched_by).inc()
            await self.recorder.record_worker(job, worker)
            await self.limits.apply(worker)
            if job.stop is None:  # a stop asked while launching: the worker is killed before it has its job
                limits = (job.budget.max_tokens, job.budget.max_llm_calls)
                worker.send(
                    Start(job.action_id, job.crew_id, job.operation, job.input, job.timeout_ms, env, cwd, *limits)
                )
            job.move(Phase.RUNNING)
            self.limits.watch(worker, lambda breach: self._breach(job, breach))
            result = await self._unless_stopped(job, lambda: self._relay(job, worker))
            job.move(Phase.SETTLING)
            if result is None:
                # A job over a limit gets no grace: it would spend it growing.
                evidence = await self._kill(worker, 0 if job.stop is StopReason.LIMIT else self._grace)
                return self._interruption(job, evidence.as_dict())
            if isinstance(result, Outcome):
                return result
            return await self._conclude(job, worker, result)
        finally:
            if job.worker is not None:
                self.limits.unwatch(job.worker)
                if not job.worker.exited.done():
                    await self._kill(job.worker)
                self.limits.release(job.worker)
                if job.operation == "train" and job.worker.exited.done():  # gone: nothing writes the file now
                    remove_partial(self.settings.training_dir, job.input["artifact_name"], job.action_id)
            shutil.rmtree(scratch, ignore_errors=True)

    async def _unless_stopped(self, job: LiveJob, step: Callable[[], Awaitable[T]]) -> T | None:
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
                work.cancel()  # Semaphore.acquire and the relay leave nothing behind when cancelled
        await asyncio.wait((work,))
        # Done first, it stands, even with a stop asked in the same instant.
        return None if work.cancelled() else work.result()

    async def _relay(self, job: LiveJob, worker: WorkerProcess) -> Completed | Failed | Outcome:
        """Record the worker's frames until its terminal message, or fault it."""
        hello = await worker.next_message()
        if hello is None:
            return await self._ended(worker)
        if not isinstance(hello, Hello) or hello.pid != worker.pid:
            return await self._fault(worker, *protocol_fault(hello, "hello"))
        while True:
            message = await worker.next_message()
            if isinstance(message, Completed | Failed):
                return message
            if isinstance(message, Started):
                self.limits.begin(worker)
                self.metrics.start_latency.observe(asyncio.get_running_loop().time() - job.admitted)
                started = {"status": "running", "operation": job.operation, "pid": worker.pid}
                fault = await self.recorder.record(job, "started", started)
            elif isinstance(message, Chunk):
                fault = await self.recorder.record(job, "chunk", message.data)
            elif isinstance(message, Spent):
                self._spend(job, message)
                continue
            elif isinstance(message, OverBudget):  # it holds a call back, and waits: stopped as over its budget
                if (breach := job.budget.breach(job.spent, held=message.limit)) is None:
                    fault = "protocol_error", f"the worker held a call back for a limit it has not: {message.limit!r}"
                else:
                    self._breach(job, breach)
                    continue
            elif message is None:
                return await self._ended(worker)
            else:
                fault = protocol_fault(message, "a job message")
            if fault is not None:
                return await self._fault(worker, *fault)

    async def _conclude(self, job: LiveJob, worker: WorkerProcess, message: Completed | Failed) -> Outcome:
        """The worker answered; it must also leave. Its exit status joins the proof."""
        status = await worker.wait_exit(EXIT_WAIT_SECONDS)
        proof: dict[str, Any] = {"exit_status": status}
        strays = len(self.limits.tree(worker).leftovers()) if status is not None else 0
        if status is None or strays:
            proof = (await self._kill(worker)).as_dict()
        if isinstance(message, Failed):  # its message may quote a key the crew was given, as a provider's does
            text = redact(message.message, job.secrets)
            return failure(message.reason, text, message.uncertain_outcome, error_type=message.error_type, **proof)
        if strays:  # work escaped the worker: its result cannot be trusted to be all of it
            return failure("stray_processes", f"the worker left {strays} process(es) running; killed", False, **proof)
        trailing = await worker.trailing_messages(TRAILING_SECONDS)
        if trailing:
            return after_terminal(trailing)
        # The client takes the completed event's data as the output: it must carry all of it, or the job
        # fails as the reference's does. Never a completed event without its output.
        size, bound = len(orjson.dumps(message.output)), self.settings.max_event_bytes
        if size > bound:
            message_text = f"an output of {size} bytes exceeds {PREFIX}MAX_EVENT_BYTES ({bound})"
            return failure("event_too_large", message_text, True, output_bytes=size, limit_bytes=bound, **proof)
        return Outcome("completed", message.output, message.output, exit_status=proof.get("exit_status"))

    async def _settle(self, job: LiveJob, outcome: Outcome) -> None:
        if job.phase is not Phase.SETTLING:  # it never ran: queued, or its launch failed
            job.move(Phase.SETTLING)  # nothing stops it now: its terminal event waits for the journal
        if outcome.event == "failed" and job.operation in READ_ONLY_OPERATIONS:
            outcome.data["uncertain_outcome"] = False  # nothing it did can have changed the world
        await self.recorder.finish(job, outcome)
        evidence = outcome.data if outcome.event != "completed" else {}  # completed data is the output itself
        log.info(
            "job finished",
            extra={
                "action_id": job.action_id,
                "crew_id": job.crew_id,
                "operation": job.operation,
                "outcome": outcome.event,
                "error_type": evidence.get("error_type"),
                "reason": evidence.get("reason"),
                "duration_ms": round((asyncio.get_running_loop().time() - job.admitted) * 1000, 1),
                "signal": evidence.get("signal"),  # set when the supervisor killed the worker
                "tokens": job.spent.tokens,
                "llm_calls": job.spent.llm_calls,
            },
        )
        job.move(Phase.SETTLED)
        self.metrics.finished.labels(job.operation, outcome.event).inc()
        if "signal" in evidence:  # the supervisor killed the worker: say why
            self.metrics.kills.labels(evidence.get("reason") or outcome.event).inc()

    def _spend(self, job: LiveJob, spent: Spent) -> None:
        """One LLM call's usage: the job's running totals and the supervisor's counters; over its budget, the
        job is stopped as for any broken limit."""
        counted = job.spent.add(spent)
        self.metrics.llm_tokens.labels(job.crew_id, "prompt").inc(counted.prompt_tokens)
        self.metrics.llm_tokens.labels(job.crew_id, "completion").inc(counted.completion_tokens)
        self.metrics.llm_calls.labels(job.crew_id).inc(counted.requests)
        if (breach := job.budget.breach(job.spent)) is not None:
            self._breach(job, breach)

    # How a job is stopped ------------------------------------------------------------------------------

    async def _kill(self, worker: WorkerProcess, grace: float = 0.0) -> StopEvidence:
        """Kill the worker's group and the rest of its tree, as the limits know it right now."""
        return await worker.kill(grace, self.limits.tree(worker).descendants())

    async def _ended(self, worker: WorkerProcess) -> Outcome:
        """The event pipe closed before a result: the worker died, or it closed the pipe and runs on."""
        status = await worker.wait_exit(EXIT_WAIT_SECONDS)
        if worker.exited.done():
            breach = self.limits.oom_breach(worker)
            if breach is not None:  # the kernel stopped it at its memory cap: the rest of its tree goes too
                evidence = await self._kill(worker)
                return failure(breach.error_type, breach.message, True, **breach.proof, **evidence.as_dict())
            return exit_failure(status, worker.pid)
        return await self._fault(worker, "frame_pipe_closed", "the worker closed its event pipe and kept running")

    async def _fault(self, worker: WorkerProcess, reason: str, message: str) -> Outcome:
        evidence = await self._kill(worker)
        return failure(reason, message, True, **evidence.as_dict())

    def _breach(self, job: LiveJob, breach: Breach) -> None:
        """Stop a job over a limit the way a cancel does, unless it is already stopping or ending."""
        if job.phase is Phase.RUNNING and job.ask_stop(StopReason.LIMIT):
            job.breach = breach

    def _interruption(self, job: LiveJob, proof: dict[str, Any]) -> Outcome:
        """What a stop ends a job with; a supervisor stopping, or its timeout, is uncertain if the job had begun."""
        launched = proof.get("launched", True)
        if job.stop is StopReason.LIMIT and job.breach is not None:
            return failure(job.breach.error_type, job.breach.message, True, **job.breach.proof, **proof)
        if job.stop is StopReason.CANCEL:
            data = {"status": "cancelled", "reason": job.cancel_reason, **proof}
            return Outcome("cancelled", data, exit_status=proof.get("exit_status"))
        if job.stop is StopReason.TIMEOUT and launched:
            return failure("timeout", f"job exceeded timeout_ms={job.timeout_ms}", True, **proof)
        if job.stop is StopReason.TIMEOUT:
            return failure("timeout", f"no worker slot within timeout_ms={job.timeout_ms}", False)
        if launched:
            return failure("supervisor_stopped", "the supervisor stopped before the job finished", True, **proof)
        return failure("supervisor_stopped", "the supervisor stopped before the job started", False, **proof)


ALWAYS_PASSED = ("PATH", "PYTHONPATH")  # what finds the interpreter's tools and the crews' code


def worker_env(settings: Settings, state: Path, crew_id: str) -> dict[str, str]:
    """The supervisor's environment without its secrets (or only what ``WORKER_ENV`` names), plus the
    worker's own places.

    Each crew gets its own CrewAI storage, so a replay finds that crew's latest kickoff, and its own HOME, so
    crews share no file CrewAI keeps there (its ``secret.key``, caches). TMPDIR, where CrewAI keeps its lock
    files, is one for every worker (the fork server's too), so a lock holds across crews: in the private
    state directory, not under names anyone on the host can take in /tmp, and with the state, not left
    behind. The worker creates HOME and storage, 0700; we create TMPDIR (``WORKER_PLACES``).
    """
    allowed = (*settings.worker_env, *ALWAYS_PASSED) if settings.worker_env else ()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(PREFIX + "BEARER_TOKEN") and (not allowed or _named(name, allowed))
    }
    place = hashlib.sha256(crew_id.encode()).hexdigest()[:24]
    env.update(
        AIP_CREWAI_REGISTRY=settings.registry,
        HOME=str(state / "home" / place),
        CREWAI_STORAGE_DIR=str(state / "storage" / place),
        TMPDIR=str(state / "tmp"),
    )
    env[PREFIX + "WORKER_NICE"] = str(settings.worker_nice)
    # What `python -m worker` switches to first (worker/__main__.py); never taken from our own environment.
    env.pop(WORKER_IDS, None)
    if settings.worker_ids is not None:
        env[WORKER_IDS] = "{}:{}".format(*settings.worker_ids)
    if settings.training_dir:
        env[PREFIX + "TRAINING_DIR"] = str(Path(settings.training_dir).absolute())
    return env


def _named(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern for pattern in allowed)
