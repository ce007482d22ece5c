"""The runner: each admitted job queues for a slot (``slots.py``: its crew's too, taken in turn between crews),
gets a worker spawned for it, has its frames relayed to the recorder, and is settled exactly once.

Cancel, timeout, a broken limit and the supervisor's stop kill the worker's process group and record the
evidence; a worker that dies on its own fails only its own job. A drain closes the queue first: what waits
there fails at once, certain (it did nothing), while running jobs go on until the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

from protocol import HOME, READ_ONLY_OPERATIONS, STORAGE_DIR, Operation, Reason
from supervisor.config import Settings
from supervisor.enums import Lifecycle, Phase, Status
from supervisor.jobs.crew_disk import CrewDisk
from supervisor.jobs.environment import CrewEnvError, job_env, read_crew_env, worker_settings
from supervisor.jobs.leftovers import remove_partial
from supervisor.jobs.live import Budget, LiveJob
from supervisor.jobs.outcomes import Outcome, failure, interrupted
from supervisor.jobs.phases import StopReason
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.relay import Relay
from supervisor.jobs.sandbox import Sandbox
from supervisor.jobs.slots import Slots
from supervisor.jobs.tracing import JobTrace
from supervisor.journal.records import Job, TaskRecord
from supervisor.layout import JOB_SCRATCH_PREFIX, SCRATCH, crew_places, job_tmp
from supervisor.metrics import Metrics
from supervisor.processes.launcher import Launcher, LaunchError
from supervisor.processes.limits import Limits
from supervisor.processes.places import Places
from supervisor.processes.process import CONFIRM_SECONDS
from supervisor.redaction import secrets_in

log = logging.getLogger("crew_supervisor.jobs")
T = TypeVar("T")


class Runner:
    def __init__(
        self,
        settings: Settings,
        launcher: Launcher,
        limits: Limits,
        sandbox: Sandbox,
        recorder: Recorder,
        metrics: Metrics,
        state: Path,
        live: dict[str, LiveJob],
        budgets: Mapping[str, Budget],
        lifecycle: Callable[[], Lifecycle],
        crew_disk: CrewDisk,
        tokens: Callable[[], Collection[str]],
    ) -> None:
        self.settings, self.tokens = settings, tokens  # and every role's bearer tokens now (supervisor/tokens.py)
        self.crew_disk = crew_disk  # each crew's places as its jobs measure them, for admission
        self.budget = Budget(settings.worker_max_tokens, settings.worker_max_llm_calls)
        self.budgets = budgets  # each crew's own LLM budget, as its registry entry asks (Registry.budgets)
        self.launcher, self.limits, self.sandbox = launcher, limits, sandbox
        self.recorder, self.metrics = recorder, metrics
        self.relay = Relay(settings, limits, recorder, metrics)
        self.state = state
        self.live = live
        self.lifecycle = lifecycle  # the supervisor's, which it alone sets
        self.slots = Slots(settings.max_concurrency, settings.crew_max_concurrency)  # taken in turn between crews
        self._grace = settings.stop_grace_ms / 1000

    def launch(
        self, job: Job, input: dict[str, Any], timeout_ms: int, resumed: list[TaskRecord] | None, trace: JobTrace
    ) -> None:
        """Schedule an admitted (already durable) job; ``resumed``: the tasks its earlier job completed (a resume)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        budget = self.budget.within(self.budgets.get(job.crew_id, Budget()))
        given = (job.action_id, job.crew_id, job.operation, input, timeout_ms, now, now + timeout_ms / 1000)
        live = LiveJob(*given, resumed=resumed, budget=budget, timed=self.metrics.job_step, trace=trace)
        self.live[job.action_id] = live
        if (now_in := self.lifecycle()).queue_closed:  # admitted as the queue closed: it ends as the others did
            live.ask_stop(StopReason.STOP if now_in.stopping else StopReason.DRAIN)
        live.task = loop.create_task(self._run(live), name=f"job:{job.action_id}")
        self.metrics.admitted.labels(job.operation).inc()

    async def cancel(self, action_id: str, reason: str | None) -> None:
        """Return once the job is terminal; a job stopping for another reason, or settling, keeps its outcome."""
        job = self.live.get(action_id)
        if job is None:
            return
        with self.metrics.cancel_latency.time():
            job.ask_stop(StopReason.CANCEL, said=reason or "cancelled by request")
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
        Jobs already launching or running go on. Returns how many were queued. (The supervisor is draining.)"""
        queued = [job for job in self.live.values() if job.phase is Phase.QUEUED and job.ask_stop(StopReason.DRAIN)]
        await asyncio.gather(*(asyncio.shield(job.done) for job in queued))
        return len(queued)

    async def stop(self) -> None:
        """Every worker is killed and its job ends `failed` with `uncertain_outcome` and the kill's evidence
        (never `cancelled`: nobody asked for that); a job still queued ends `failed`, certain. (The supervisor is
        stopping.)"""
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
            with job.trace.current():  # its log lines carry its trace's ids
                try:
                    outcome = await self._queue(job)
                except Exception:
                    log.exception("job failed inside the supervisor", extra={"action_id": job.action_id})
                    failed = "the supervisor failed while running the job"
                    outcome = failure(Reason.SUPERVISOR_ERROR, failed, job.worker is not None)
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
        acquired = await self._unless_stopped(job, lambda: self.slots.take(job.crew_id))
        if acquired and job.stop is not None:  # a slot and a stop in the same instant: nothing has started yet
            self.slots.give_back(job.crew_id)
        if not acquired or job.stop is not None:
            return interrupted(job, {"stop_confirmed": True, "launched": False})
        try:
            job.move(Phase.LAUNCHING)
            return await self._spawn_and_supervise(job)
        finally:
            self.slots.give_back(job.crew_id)

    async def _spawn_and_supervise(self, job: LiveJob) -> Outcome:
        try:  # read at each start: an operator rotates a crew's key by rewriting its file
            crew_vars = read_crew_env(self.settings.crew_env_dir, job.crew_id)
        except CrewEnvError as exc:
            return failure(Reason.CREW_ENV_INVALID, str(exc), False)
        scratch = _make_places(self.state, job.crew_id, self.settings.worker_ids)
        try:
            env, cwd = _job_env(job, self.settings, self.state, scratch, crew_vars, self.tokens()), str(scratch)
            writable = self.sandbox.policy(env, cwd, job.operation)
            places = Places(scratch, (Path(env[HOME]), Path(env[STORAGE_DIR])), held=bool(self.limits.disk_bytes))
            baseline = asyncio.ensure_future(places.begin()) if self.limits.measures_disk else None
            try:
                # Forked ahead (its places come with Start) or spawned in them; a stop meanwhile: killed once it exists.
                worker = await self.launcher.spawn({**env, **worker_settings(self.settings, self.state, writable)}, cwd)
            except LaunchError as exc:
                return failure(Reason.LAUNCH_FAILED, str(exc), False)
            job.worker = worker
            self.metrics.worker_starts.labels(worker.launched_by).inc()
            await self.limits.apply(worker)  # its cgroups first: the journal names them before its job starts
            await self.recorder.record_worker(job, worker, worker.containment.boundary())
            if baseline is not None:  # walked as the worker launched; what the places grow by from here is its job's
                self.crew_disk.note(job.crew_id, await baseline)
            if job.stop is None:  # a stop asked while launching: the worker is killed before it has its job
                self.relay.start(job, worker, env, cwd, writable)
            job.move(Phase.RUNNING)
            breached, found = lambda breach: self.relay.breach(job, breach), self.recorder.record_boundary
            self.limits.watch(worker, places, breached, lambda boundary: found(job, boundary))
            result = await self._unless_stopped(job, lambda: self.relay.run(job, worker))
            job.move(Phase.SETTLING)
            outcome = await self.relay.end(job, worker, result, self._grace)
            return await _account(self.limits, self.crew_disk, job, places, outcome)
        finally:
            if job.worker is not None:
                self.limits.unwatch(job.worker)
                if not job.worker.exited.done():
                    await job.worker.kill()
                elif left := await asyncio.to_thread(job.worker.containment.kill):  # each end kills its remains
                    log.warning("killed %d process(es) a job left", len(left), extra={"action_id": job.action_id})
                self.limits.release(job.worker)
                if job.operation == Operation.TRAIN and job.worker.exited.done():  # gone: nothing writes the file now
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
                work.cancel()  # Slots.take and the relay leave nothing behind when cancelled
        await asyncio.wait((work,))
        # Done first, it stands, even with a stop asked in the same instant.
        return None if work.cancelled() else work.result()

    async def _settle(self, job: LiveJob, outcome: Outcome) -> None:
        if job.phase is not Phase.SETTLING:  # it never ran: queued, or its launch failed
            job.move(Phase.SETTLING)  # nothing stops it now: its terminal event waits for the journal
        if outcome.event == Status.FAILED and job.operation in READ_ONLY_OPERATIONS:
            outcome.data["uncertain_outcome"] = False  # nothing it did can have changed the world
        job.lap("cleanup")  # its worker's remains checked and removed (or it never launched): the journal's now
        await self.recorder.finish(job, outcome)
        evidence = outcome.data if outcome.event != Status.COMPLETED else {}  # completed data is the output itself
        log.info("job finished", extra=_finished(job, outcome.event, evidence))
        job.move(Phase.SETTLED)
        job.trace.end(outcome.event, evidence, job.spent.prompt_tokens, job.spent.completion_tokens)
        seconds = asyncio.get_running_loop().time() - job.admitted
        self.metrics.job_finished(job.crew_id, job.operation, outcome.event, evidence, seconds)


def _job_env(
    job: LiveJob, settings: Settings, state: Path, scratch: Path, crew_vars: dict[str, str], tokens: Collection[str]
) -> dict[str, str]:
    """The job's environment, its secrets (``job.secrets``) taken from it: the bearer tokens as their files hold them
    now (one rotated in is kept out and masked too), its crew's values whatever their names."""
    env = job_env(settings, state, job.crew_id, job_tmp(scratch), crew_vars, tokens)
    job.secrets = secrets_in(env, [*tokens, *crew_vars.values()])
    return env


async def _account(limits: Limits, crew_disk: CrewDisk, job: LiveJob, places: Places, outcome: Outcome) -> Outcome:
    """The final accounting, once the worker has exited and its processes are gone (``relay.end`` waited for both):
    what the job left in its places, against the disk caps; its crew's places noted for admission. An answer over
    a cap is not kept: the limit holds, and the evidence says the job had answered. Processes of the job that hid
    their descriptors are said once: the log names them, and a failed job's evidence (``unreadable_pids``)."""
    if not limits.measures_disk:
        return outcome
    final = await asyncio.to_thread(places.measure)
    crew_disk.note(job.crew_id, final.crew)
    if final.unreadable:
        hidden = list(final.unreadable)
        log.warning(
            "the files with no name held by process(es) %s of a job could not be counted: they hid their descriptors",
            ", ".join(map(str, hidden)),
            extra={"action_id": job.action_id, "crew_id": job.crew_id},
        )
        if outcome.event != Status.COMPLETED:
            outcome.data.setdefault("unreadable_pids", hidden)
    breach = limits.disk_breach(final, after_exit=True)
    if breach is None or outcome.event != Status.COMPLETED:
        return outcome  # a job that failed or was stopped keeps its own reason
    proof = {**breach.proof, "answered": True, "exit_status": outcome.exit_status}
    return failure(breach.error_type, breach.message, True, **proof)


def _finished(job: LiveJob, event: str, evidence: dict[str, Any]) -> dict[str, Any]:
    """What the log says of a job that ended: what it was, how it ended, how long it took and what it spent."""
    return {
        "action_id": job.action_id,
        "crew_id": job.crew_id,
        "operation": job.operation,
        "outcome": event,
        "error_type": evidence.get("error_type"),
        "reason": evidence.get("reason"),
        "duration_ms": round((asyncio.get_running_loop().time() - job.admitted) * 1000, 1),
        "signal": evidence.get("signal"),  # set when the supervisor killed the worker
        "tokens": job.spent.tokens,
        "llm_calls": job.spent.llm_calls,
    }


def _make_places(state: Path, crew_id: str, worker_ids: tuple[int, int] | None) -> Path:
    """A job's scratch directory (its cwd, returned), with its TMPDIR inside: the job's own, removed when it ends;
    and its crew's HOME and CrewAI storage, kept. 0700, made by us: with WORKER_USER, the workers' user must own
    them to write. They exist before the worker starts: a sandbox grants rights only to what exists."""
    made = Path(tempfile.mkdtemp(prefix=JOB_SCRATCH_PREFIX, dir=state / SCRATCH))
    try:
        job_tmp(made).mkdir(mode=0o700)
        fresh = [made, job_tmp(made)]
        for place in crew_places(state, crew_id):
            with contextlib.suppress(FileExistsError):
                place.mkdir(mode=0o700)
                fresh.append(place)
        if worker_ids is not None:
            for place in fresh:
                os.chown(place, *worker_ids)
    except OSError:
        shutil.rmtree(made, ignore_errors=True)
        raise
    return made
