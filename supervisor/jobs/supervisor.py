"""The job lifecycle, wired: admission (validate, fence, admit) hands jobs to the runner, which puts each on the
roster as a live job that runs itself (wait for a slot, launch, converse with its worker, settle), writing through
the recorder (events into the journal, followers woken); one housekeeping tick samples and reaps. ``open`` brings
them up on the serving loop and down again; ``stop`` (drain, then every job ended, then the services) is the one way
down, whoever asks first. The one facade HTTP talks to: its commands here, its reads in ``reads`` (``reads.py``), its
archives in ``archives`` (``retention.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from protocol import Registry
from supervisor.config import Settings
from supervisor.enums import Lifecycle, Phase
from supervisor.jobs.admission import Admission
from supervisor.jobs.budget import Budget
from supervisor.jobs.claim import Claim
from supervisor.jobs.crew_disk import CrewDisk
from supervisor.jobs.environment import worker_env
from supervisor.jobs.fencing import fence_restored, kill_left_in_cgroups
from supervisor.jobs.housekeeping import Housekeeping
from supervisor.jobs.leftovers import remove_stale_partials
from supervisor.jobs.live import LiveJob
from supervisor.jobs.parts import Parts
from supervisor.jobs.reads import Reads
from supervisor.jobs.recorder import Recorder
from supervisor.jobs.resumes import resumed_start
from supervisor.jobs.retention import Archives, Retention
from supervisor.jobs.roster import Roster
from supervisor.jobs.runner import Runner
from supervisor.jobs.sandbox import Sandbox
from supervisor.jobs.slots import Slots
from supervisor.jobs.tracing import Tracing
from supervisor.journal.records import Job
from supervisor.journal.store import Journal
from supervisor.layout import SCRATCH
from supervisor.metrics import Metrics
from supervisor.models import BulkCancelRequest, ResumeRequest, StartRequest
from supervisor.processes.launcher import Launcher
from supervisor.processes.limits import Limits
from supervisor.processes.reaper import Reaper
from supervisor.tokens import Credentials

MAX_BULK_CANCEL = 1000  # jobs one bulk cancel stops; the answer says how many more matched
log = logging.getLogger("crew_supervisor")


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        journal: Journal,
        launcher: Launcher,
        limits: Limits,
        sandbox: Sandbox,
        reaper: Reaper,
        registry: Registry,
        state: Path,
        metrics: Metrics,
        roster: Roster[LiveJob],
        tracing: Tracing,
    ) -> None:
        self.settings, self.journal, self.launcher, self.metrics = settings, journal, launcher, metrics
        self.crews = registry.crews
        limits.contained = registry.contained
        self.roster = roster  # the jobs without a terminal event
        self.lifecycle = Lifecycle.OPENING  # moved on by _become alone
        self._stopping: asyncio.Future[None] | None = None
        crew_disk = CrewDisk(limits, state)  # each crew's places as last measured: the jobs', for admission
        # The bearer tokens, read again as their files change: the HTTP middleware's, and what a job must not see.
        self.credentials = Credentials(settings.tokens, settings.token_files) if settings.tokens else None
        slots = Slots(settings.max_concurrency, settings.crew_max_concurrency)
        slots.check(self.crews)  # each crew's own bound: the crews are known here, the fork server described them
        self.parts = Parts(
            settings=settings,
            state=state,
            launcher=launcher,
            limits=limits,
            sandbox=sandbox,
            recorder=Recorder(settings, journal),
            metrics=metrics,
            slots=slots,
            crew_disk=crew_disk,
            tokens=self.credentials.every_token if self.credentials else frozenset,
            lifecycle=self._now_in,
            budget=Budget(settings.worker_max_tokens, settings.worker_max_llm_calls),
            budgets={crew_id: Budget.own(described) for crew_id, described in registry.budgets.items()},
        )
        self.housekeeping = Housekeeping(limits, reaper, metrics, live=lambda: bool(roster))
        self.runner = Runner(self.parts, roster, self.housekeeping)
        self.retention = Retention(settings, journal, roster)
        self.admission = Admission(
            settings, journal, self.crews, self.runner, self._now_in, crew_disk, self.retention, tracing
        )
        instance = secrets.token_hex(8)  # this life of the supervisor: a restart changes it
        self.reads = Reads(self.parts, roster, journal.reader, self.crews, instance, self.retention, tracing)
        self.archives = Archives(journal, self.retention)
        _observe(metrics, roster, journal, launcher, slots, self.crews)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        journal_path: Path,
        launcher_for: Callable[[Reaper, Limits], Launcher],
        fenced: Callable[[], None] = lambda: None,
    ) -> AsyncIterator[Supervisor]:
        """On the serving loop, before anything listens: take the journal's lock and kill what the dead
        supervisor's job cgroups hold, open the journal, fence what it says a dead supervisor left running, call
        ``fenced`` (nothing of the past runs now and no child of ours yet: ``serve`` binds its port there), then
        describe the crews, start the launcher and housekeeping. On the way out ``stop`` (if nobody has yet), then
        the launcher, the limits' cgroups, the journal, whose close commits what is queued, the lock, and last the
        tracer, whose spans all ended with their jobs (``TracingError`` first of all: nothing is touched)."""
        state = journal_path.parent
        roster: Roster[LiveJob] = Roster()
        metrics = Metrics()
        tracing = Tracing.from_environ(os.environ)
        async with contextlib.AsyncExitStack() as stack:  # closed in reverse: the lock, then the tracer, last
            stack.push_async_callback(asyncio.to_thread, tracing.close)  # bounded: CLOSE_SECONDS
            claim = Claim(journal_path)
            stack.callback(claim.release)
            killed = await asyncio.to_thread(kill_left_in_cgroups, claim.before)  # even if the journal cannot open
            limits = Limits(settings)
            stack.callback(limits.stop)
            claim.hold(limits.cgroup_bases())
            journal = _journal(settings, journal_path, claim, metrics, roster)
            stack.callback(journal.close)
            _said_where_the_journal_came_from(journal)
            await fence_restored(journal, killed, tracing)
            limits.remove_stale()
            remove_stale_partials(settings.training_dir)  # nothing runs yet: no such file is anyone's
            fenced()
            reaper = Reaper()
            launcher = launcher_for(reaper, limits)
            stack.push_async_callback(launcher.stop)
            registry = await launcher.describe(worker_env(settings, state, ""), str(state / SCRATCH))
            sandbox = Sandbox(settings, registry.sandbox)
            sandbox.check()
            sup = cls(settings, journal, launcher, limits, sandbox, reaper, registry, state, metrics, roster, tracing)
            stack.push_async_callback(sup.stop)
            launcher.start()
            sup.housekeeping.start()
            sup.retention.start()
            sup._become(Lifecycle.OPEN)
            yield sup

    async def admit(
        self,
        body: StartRequest,
        key: str | None,
        legacy: bool,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Job:
        """Admission's answer (``Admission.admit``): the job, durable and launched; or a ``Refused``. Each takes the
        caller's W3C trace context as its request's headers carried it (raw: a malformed one is ignored)."""
        return await self.admission.admit(body, key, legacy, traceparent=traceparent, tracestate=tracestate)

    async def resume(
        self,
        old_id: str,
        request: ResumeRequest,
        key: str | None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Job:
        """Admission's answer for a ``run`` of the job ``old_id``'s crew and input as job ``request.action_id``, its
        worker given the tasks the old job completed (``resumes.py``): the new job, durable and launched; or a
        ``Refused``."""
        body = resumed_start(self.journal.reader, old_id, request)
        traced = {"traceparent": traceparent, "tracestate": tracestate}
        return await self.admission.admit(body, key, legacy=False, resumed_from=old_id, **traced)

    async def cancel(self, action_id: str, reason: str | None) -> None:
        """Return once the job is terminal (``Runner.cancel``): a job stopping for another reason, or settling, keeps
        its outcome."""
        await self.runner.cancel(action_id, reason)

    async def wait(self, action_id: str, seconds: float) -> bool:
        """True once the job is terminal, False if ``seconds`` passed first; longer by what its kill may take if its
        own timeout falls within them (``Runner.answer_by``)."""
        loop = asyncio.get_running_loop()
        until = self.runner.answer_by(action_id, loop.time() + seconds)
        return await self.runner.wait(action_id, until - loop.time())

    async def cancel_many(self, request: BulkCancelRequest) -> tuple[dict[str, Phase], int]:
        """Cancel the live jobs ``request`` names, oldest first and at most MAX_BULK_CANCEL of them, all at once;
        return once each is terminal (or, ``dry_run``, at once, none touched). Their ids with the phase each was in,
        and how many more matched."""
        named = self.roster.stoppable(request.crew_id, request.phase, request.operation)
        taken = {job.action_id: job.phase for job in named[:MAX_BULK_CANCEL]}
        if not request.dry_run:
            await asyncio.gather(*(self.runner.cancel(action_id, request.reason) for action_id in taken))
        return taken, len(named) - len(taken)

    async def stop(self, drain_seconds: float | None = None, skip: asyncio.Event | None = None) -> None:
        """The one way down, run once whoever asks first (a signal, ``open``'s exit, a test); later callers wait for
        it. New starts answer 503; with ``drain_seconds`` (SIGTERM), queued jobs fail, certain, and running jobs get
        that long to finish (or until ``skip`` is set); then every job left ends (see ``Runner.stop``), and the
        services stop."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(drain_seconds, skip or asyncio.Event()))
        await asyncio.shield(self._stopping)

    async def _stop(self, drain_seconds: float | None, skip: asyncio.Event) -> None:
        self._become(Lifecycle.CLOSING)
        await self.admission.under_way()
        if drain_seconds is not None:
            await self._drain(drain_seconds, skip)
        self.journal.stop_waiting()
        self._become(Lifecycle.STOPPING)
        await self.runner.stop()
        await self.housekeeping.stop()
        await self.retention.stop()
        self._become(Lifecycle.STOPPED)

    def _become(self, state: Lifecycle) -> None:
        self.lifecycle = state

    def _now_in(self) -> Lifecycle:
        return self.lifecycle

    async def _drain(self, seconds: float, skip: asyncio.Event) -> None:
        """Queued jobs fail, certain; running jobs get up to ``seconds`` to finish, or until ``skip`` is set.
        The server keeps serving meanwhile: streams, blocking waiters, reads and cancels of the jobs still
        running."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._become(Lifecycle.DRAINING)
        queued = await self.runner.close_queue()
        log.warning("drain began", extra={"seconds": seconds, "running": len(self.roster), "queued": queued})
        pending = [job.done for job in self.roster]
        skipped: asyncio.Future[bool] = asyncio.ensure_future(skip.wait())
        deadline = began + seconds
        try:
            # asyncio.wait cancels nothing it waits on: the jobs go on whatever ends the wait.
            while pending and not skip.is_set() and (left := deadline - loop.time()) > 0:
                waited: list[asyncio.Future[None] | asyncio.Future[bool]] = [*pending, skipped]
                await asyncio.wait(waited, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                pending = [done for done in pending if not done.done()]
        finally:
            skipped.cancel()
        reason = "jobs_finished" if not pending else "skipped" if skip.is_set() else "grace_expired"
        duration_ms = round((loop.time() - began) * 1000, 1)
        log.warning("drain ended", extra={"reason": reason, "duration_ms": duration_ms, "running": len(self.roster)})


def _journal(settings: Settings, path: Path, claim: Claim, metrics: Metrics, roster: Roster[LiveJob]) -> Journal:
    """The journal, opened on the serving loop under the claim's lock: each commit wakes the followers of the jobs it
    holds events of."""
    loop = asyncio.get_running_loop()

    def committed(action_ids: frozenset[str]) -> None:  # on the journal's writer thread
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to wake
            loop.call_soon_threadsafe(functools.partial(roster.wake, action_ids))

    return Journal(
        path,
        settings.stream_checkpoint_events,
        settings.max_state_bytes,
        on_commit=committed,
        commit_seconds=metrics.commit_latency.observe,
        locked=claim.fd,
    )


def _said_where_the_journal_came_from(journal: Journal) -> None:
    """A reference journal imported, or an older schema upgraded, at this open: where its original is kept."""
    for what, backup in (("imported the reference", journal.imported_from), ("upgraded the", journal.upgraded_from)):
        if backup is not None:
            log.warning("%s journal at %s; the original is kept at %s", what, journal.path, backup)


def _observe(
    metrics: Metrics, roster: Roster[LiveJob], journal: Journal, launcher: Launcher, slots: Slots, crews: list[str]
) -> None:
    """The gauges, read at scrape time."""
    metrics.observe_with(
        running=lambda: roster.count(Phase.LAUNCHING, Phase.RUNNING),
        queued=lambda: roster.count(Phase.QUEUED),
        queued_by_crew=lambda: slots.queued(crews),
        journal_bytes=journal.reader.size_bytes,
        restarts=lambda: getattr(launcher, "restarts", 0),
        idle_workers=lambda: getattr(launcher, "idle_workers", 0),
    )
