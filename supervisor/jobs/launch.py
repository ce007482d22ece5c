"""A job's launch, step by step as its job takes them (``LiveJob._launched``): its places made, its environment (its
secrets found in it), its sandbox's policy; its worker spawned in them, then contained (its cgroups) and journaled
before it has its job; watched against its limits while it runs; its places' final accounting; and, however the
job ends, its remains removed: its worker's processes killed, its cgroup released, its scratch gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from protocol import HOME, STORAGE_DIR, Operation
from supervisor.enums import EventName
from supervisor.jobs.environment import job_env, worker_settings
from supervisor.jobs.job_state import JobState
from supervisor.jobs.leftovers import remove_partial
from supervisor.jobs.outcomes import Outcome, failure
from supervisor.jobs.parts import Parts
from supervisor.layout import JOB_SCRATCH_PREFIX, SCRATCH, crew_places, job_tmp
from supervisor.processes.limits import Breach
from supervisor.processes.places import Places
from supervisor.processes.process import WorkerProcess
from supervisor.redaction import secrets_in

log = logging.getLogger("crew_supervisor.jobs")


class Launch:
    def __init__(self, job: JobState, parts: Parts, crew_vars: dict[str, str]) -> None:
        """The job's places, made (its scratch, its cwd; its crew's HOME and storage), and what its worker is given
        there: its environment, the secrets in it (the bearer tokens as their files hold them now, its crew's values
        whatever their names), and what its sandbox lets it write."""
        self.job, self.parts = job, parts
        settings = parts.settings
        self.scratch = _make_places(parts.state, job.crew_id, settings.worker_ids)
        try:
            tokens = parts.tokens()
            self.env = job_env(settings, parts.state, job.crew_id, job_tmp(self.scratch), crew_vars, tokens)
            self.secrets = secrets_in(self.env, [*tokens, *crew_vars.values()])
            self.cwd = str(self.scratch)
            self.writable = parts.sandbox.policy(self.env, self.cwd, job.operation)
            kept = (Path(self.env[HOME]), Path(self.env[STORAGE_DIR]))
            self.places = Places(self.scratch, kept, held=bool(parts.limits.disk_bytes))
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.worker: WorkerProcess | None = None
        self._baseline: asyncio.Future[int] | None = None

    async def spawn(self) -> WorkerProcess:
        """Its worker: forked ahead (its places come with Start) or spawned in them. Raises ``LaunchError``."""
        parts = self.parts
        if parts.limits.measures_disk:  # walked as the worker launches; what the places grow by from here is its job's
            self._baseline = asyncio.ensure_future(self.places.begin())
        given = worker_settings(parts.settings, parts.state, self.writable)
        self.worker = worker = await parts.launcher.spawn({**self.env, **given}, self.cwd)
        parts.metrics.worker_starts.labels(worker.launched_by).inc()
        return worker

    async def contain(self, worker: WorkerProcess) -> None:
        """Its cgroups first, then its record: the journal names them before its job starts, so that a restart can
        find and fence the worker and all it starts."""
        await self.parts.limits.apply(worker)
        await self.parts.recorder.record_worker(self.job.action_id, worker, worker.containment.boundary())
        if self._baseline is not None:
            self.parts.crew_disk.note(self.job.crew_id, await self._baseline)

    def watch(self, worker: WorkerProcess, breached: Callable[[Breach], None]) -> None:
        """Sampled against its limits until its remains are removed; the processes found are journaled."""
        action_id, found = self.job.action_id, self.parts.recorder.record_boundary
        self.parts.limits.watch(worker, self.places, breached, lambda boundary: found(action_id, boundary))

    async def account(self, outcome: Outcome) -> Outcome:
        """The final accounting, once the worker has exited and its processes are gone (its conversation's end waited
        for both): what the job left in its places, against the disk caps; its crew's places noted for admission. An
        answer over a cap is not kept: the limit holds, and the evidence says the job had answered. Processes of the
        job that hid their descriptors are said once: the log names them, and a failed job's evidence
        (``unreadable_pids``)."""
        limits, job = self.parts.limits, self.job
        if not limits.measures_disk:
            return outcome
        final = await asyncio.to_thread(self.places.measure)
        self.parts.crew_disk.note(job.crew_id, final.crew)
        if final.unreadable:
            hidden = list(final.unreadable)
            log.warning(
                "the files with no name held by process(es) %s of a job could not be counted: they hid their"
                " descriptors",
                ", ".join(map(str, hidden)),
                extra={"action_id": job.action_id, "crew_id": job.crew_id},
            )
            if outcome.event != EventName.COMPLETED:
                outcome.data.setdefault("unreadable_pids", hidden)
        breach = limits.disk_breach(final, after_exit=True)
        if breach is None or outcome.event != EventName.COMPLETED:
            return outcome  # a job that failed or was stopped keeps its own reason
        proof = {**breach.proof, "answered": True, "exit_status": outcome.exit_status}
        return failure(breach.error_type, breach.message, True, **proof)

    async def remove(self) -> None:
        """However the job ended: its worker's processes killed (each end kills its remains), its cgroup released,
        a training's partial file removed once nothing writes it, its scratch gone."""
        worker, job, limits = self.worker, self.job, self.parts.limits
        try:
            if worker is not None:
                limits.unwatch(worker)
                if not worker.exited.done():
                    await worker.kill()
                elif left := await asyncio.to_thread(worker.containment.kill):
                    log.warning("killed %d process(es) a job left", len(left), extra={"action_id": job.action_id})
                limits.release(worker)
                if job.operation == Operation.TRAIN and worker.exited.done():  # gone: nothing writes the file now
                    remove_partial(self.parts.settings.training_dir, job.input["artifact_name"], job.action_id)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)


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
