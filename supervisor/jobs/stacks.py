"""A job's stacks: every thread's Python stack, asked of its worker (``DumpStacks``) while the job goes on, for the
operator; and taken just before the kill of a timeout, a cancel or a broken limit, kept with the job's record."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from protocol import DumpStacks, FrameError, Stacks
from supervisor.jobs.live import LiveJob
from supervisor.jobs.phases import Phase, StopReason
from supervisor.processes.process import WorkerProcess
from supervisor.redaction import redact

ASK_SECONDS = 1.0  # a worker answers in milliseconds, unless a thread holds the GIL (a C extension's loop)
BEFORE_KILL_SECONDS = 0.2  # what a stop waits for them at most: a job that cannot answer is killed without them
KEPT_FOR = (StopReason.TIMEOUT, StopReason.CANCEL, StopReason.LIMIT)  # not a supervisor's stop: it waits for none


class Unavailable(Exception):
    """The job has no stacks to give: not running, or ended without them."""


class Late(Exception):
    """The worker did not answer in time."""


async def of_running(job: LiveJob) -> dict[str, Any]:
    """The stacks of a live job's worker now, read by its relay (``answered``); raises Unavailable or Late."""
    if job.phase is not Phase.RUNNING or not job.started or job.worker is None:
        raise Unavailable(f"the job is {job.phase}: no worker runs its crew now")
    if job.stacks_asked is None:  # one question at a time: every asker waits for its answer
        job.stacks_asked = asyncio.get_running_loop().create_future()
        job.worker.send(DumpStacks())
    try:
        stacks = await asyncio.wait_for(asyncio.shield(job.stacks_asked), ASK_SECONDS)
    except TimeoutError:
        raise Late(
            f"its worker did not answer within {ASK_SECONDS:g} s: a thread holds the interpreter's lock (a C"
            " extension's loop), or the worker is stopped; the job goes on"
        ) from None
    return kept(job, stacks)


def answered(job: LiveJob, stacks: Stacks) -> None:
    """The worker's answer reached the relay: whoever asked has it."""
    if job.stacks_asked is not None and not job.stacks_asked.done():
        job.stacks_asked.set_result(stacks)
    job.stacks_asked = None


async def before_kill(job: LiveJob, worker: WorkerProcess) -> None:
    """Where a job stopped by its timeout, a cancel or a limit was, into ``job.stack``. Its relay has stopped: the
    worker's frames are read here until the answer, and the rest dropped (the job is being killed)."""
    if job.stop not in KEPT_FOR or not job.started:
        return
    worker.send(DumpStacks())
    deadline = asyncio.get_running_loop().time() + BEFORE_KILL_SECONDS
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            message = await asyncio.wait_for(worker.next_message(), left)
        except TimeoutError:
            return
        if message is None or isinstance(message, FrameError):
            return
        if isinstance(message, Stacks):
            answered(job, message)
            job.stack = {**kept(job, message), "before": str(job.stop)}
            return


def kept(job: LiveJob, stacks: Stacks) -> dict[str, Any]:
    """As the operator reads them: when taken, each thread's name, id and stack, the job's secrets redacted."""
    threads = [
        {"name": str(t.get("name")), "ident": t.get("ident"), "stack": redact(str(t.get("stack")), job.secrets)}
        for t in stacks.threads
        if isinstance(t, dict)
    ]
    return {"taken_at": time.time(), "threads": threads}
