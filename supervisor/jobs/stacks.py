"""A job's stacks: every thread's Python stack, asked of its worker by its conversation (``DumpStacks``) while the
job goes on, for the operator; and taken just before the kill of a timeout, a cancel or a broken limit, kept with the
job's record. Here is what is asked when, and how an answer is kept: the asking is the conversation's."""

from __future__ import annotations

import time
from typing import Any

from protocol import Reason, Stacks, bounded_threads
from supervisor.enums import Phase
from supervisor.jobs.job_state import JobState
from supervisor.jobs.phases import StopReason
from supervisor.processes.process import WorkerProcess
from supervisor.redaction import redact

ASK_SECONDS = 1.0  # a worker answers in milliseconds, unless a thread holds the GIL (a C extension's loop)
BEFORE_KILL_SECONDS = 0.2  # what a stop waits for them at most: a job that cannot answer is killed without them
KEPT_FOR = (StopReason.TIMEOUT, StopReason.CANCEL, StopReason.LIMIT)  # not a supervisor's stop: it waits for none
# Of the limits, those whose job cannot grow while it answers: one over memory, processes, disk or output is killed
# at once, without its stacks (200 ms more of a fork bomb or a hog is what its limit is there to stop).
WAITED_FOR = (Reason.CPU_LIMIT_EXCEEDED, Reason.TOKEN_LIMIT_EXCEEDED, Reason.LLM_CALL_LIMIT_EXCEEDED)


class Unavailable(Exception):
    """The job has no stacks to give: not running, or ended without them."""


class Late(Exception):
    """The worker did not answer in time."""


def asked_of(job: JobState, started: bool) -> WorkerProcess:
    """The worker a live job's stacks are asked of now (``started``: its worker said so); raises Unavailable if none
    runs its crew."""
    if job.phase is not Phase.RUNNING or not started or job.worker is None:
        raise Unavailable(f"the job is {job.phase}: no worker runs its crew now")
    return job.worker


def unanswered(worker: WorkerProcess) -> Unavailable | Late:
    """Why a worker asked gave no answer."""
    if worker.exited.done():
        return Unavailable("the job is ending: its worker has exited")
    return Late(
        f"its worker did not answer within {ASK_SECONDS:g} s: a thread holds the interpreter's lock (a C"
        " extension's loop), or the worker is stopped; the job goes on"
    )


def kept_before_kill(job: JobState, started: bool) -> bool:
    """Whether a stopping job's stacks are asked for before its kill (``started``: its worker said so)."""
    growing = job.stop is StopReason.LIMIT and (job.breach is None or job.breach.error_type not in WAITED_FOR)
    return job.stop in KEPT_FOR and started and not growing


def kept(job: JobState, stacks: Stacks) -> dict[str, Any]:
    """As the operator reads them: when taken, each thread's name, id and stack, the job's secrets redacted, held to
    the bounds the worker keeps (``protocol.bounded_threads``), which crew code writing its own answer could ignore:
    what an id is not a number is null."""
    threads = bounded_threads(
        ((str(thread.get("name")), _ident(thread.get("ident")), str(thread.get("stack"))) for thread in stacks.threads),
        lambda text: redact(text, job.secrets),
    )
    return {"taken_at": time.time(), "threads": threads}


def _ident(ident: Any) -> int | None:
    return ident if isinstance(ident, int) and not isinstance(ident, bool) else None
