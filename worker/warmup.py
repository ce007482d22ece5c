"""Warming the fork server: run CrewAI's first-use paths once, then make it single-threaded again.

Every forked worker would otherwise repeat CrewAI's first-kickoff work (pydantic's first validations,
lazy imports, the event bus's first emit). The fork server does that work once, on a small offline
crew of our own (never a registry crew, never a network call), in a throwaway storage directory, so
no crew's replay storage is touched. Then it quiesces what the kickoff started: CrewAI's event bus
keeps a loop thread and a handler pool alive after a kickoff, and a fork with those threads alive can
hang the child. We stop them and mark the bus uninitialised, so CrewAI starts them afresh, lazily, in
each child on its first emit.

What quiescing relies on is read from crewai 1.15's ``CrewAIEventsBus`` (``events/event_bus.py``):
``flush``, ``_loop``, ``_loop_thread``, ``_sync_executor``, ``_executor_initialized``,
``_has_pending_events``. If a release changes them, or anything leaves a thread running,
``WarmupError`` says so in one line and the fork server refuses to start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from worker import operations

STORAGE_ENV = "CREWAI_STORAGE_DIR"
# The event bus's attributes quiescing needs (crewai 1.15's CrewAIEventsBus).
BUS_ATTRIBUTES = ("flush", "_loop", "_loop_thread", "_sync_executor", "_executor_initialized", "_has_pending_events")
KICKOFFS = 2  # a second kickoff still finds first-use work (measured: child CPU ~83 -> ~71 ms)
KICKOFF_SECONDS = 60.0  # a kickoff that hangs leaves its thread: the check below then refuses
JOIN_SECONDS = 5.0  # how long a CrewAI thread may take to stop once told to
SETTLE_SECONDS = 5.0  # how long threads that were asked to end (kickoff, stream) may take to be gone
FLUSH_SECONDS = 10.0


class WarmupError(Exception):
    """Warming or quiescing failed; the message is one line the supervisor logs."""


def warm() -> None:
    """Run streamed kickoffs of our own offline crew, then quiesce CrewAI; raises WarmupError."""
    native = _kernel_threads()  # what importing left (numpy's OpenBLAS pool): forks already live with it
    try:
        for _ in range(KICKOFFS):
            rehearse()
    except WarmupError:
        raise
    except Exception as exc:  # a timeout included
        raise WarmupError(f"the warm-up kickoff failed: {type(exc).__name__}: {exc}") from None
    try:
        quiesce(native)
    except WarmupError:
        raise
    except Exception as exc:  # CrewAI's internals changed shape
        raise WarmupError(f"cannot quiesce CrewAI: {type(exc).__name__}: {exc}") from None


def rehearse() -> None:
    """One kickoff of our own crew, in throwaway storage (also what the prefault probe runs)."""
    storage = tempfile.mkdtemp(prefix="crew-warmup-")
    saved = os.environ.get(STORAGE_ENV)
    os.environ[STORAGE_ENV] = storage
    try:
        _kickoff()
    finally:
        if saved is None:
            os.environ.pop(STORAGE_ENV, None)
        else:
            os.environ[STORAGE_ENV] = saved
        shutil.rmtree(storage, ignore_errors=True)


def _crew() -> Any:
    from crewai import Agent, Crew, Task

    from worker.demo import OfflineLLM

    agent = Agent(
        role="Warmer", goal="Answer", backstory="Quick.", llm=OfflineLLM(model="offline-warmup"), allow_delegation=False
    )
    task = Task(description="Answer briefly.", expected_output="One line.", agent=agent)
    return Crew(agents=[agent], tasks=[task])


def _kickoff() -> None:
    """What a `run` job does: a fresh crew, a streamed ``kickoff_async``, chunks and the output converted."""
    chunks: list[Any] = []
    loop = asyncio.new_event_loop()
    try:
        work = operations.Work(_crew(), {}, chunks.append, _crew, "warm-up")
        output = loop.run_until_complete(asyncio.wait_for(operations.run(work), KICKOFF_SECONDS))
        loop.run_until_complete(loop.shutdown_default_executor())  # the thread kickoff_async ran in
    finally:
        loop.close()
    if not chunks or not output.get("raw"):
        raise WarmupError("the warm-up kickoff streamed no chunks or gave no output")


def quiesce(native: int | None = None) -> None:
    """Stop CrewAI's event-bus threads and leave the bus to start again lazily; check that only the main
    thread is left, besides the ``native`` kernel threads that were there before the warm-up."""
    try:
        from crewai.events.event_bus import crewai_event_bus as bus
    except ImportError as exc:
        raise WarmupError(f"cannot quiesce CrewAI: no event bus to import ({exc})") from None
    missing = [name for name in BUS_ATTRIBUTES if not hasattr(bus, name)]
    if missing:
        raise WarmupError(f"cannot quiesce CrewAI: its event bus has no {', '.join(missing)}")
    if not bus.flush(timeout=FLUSH_SECONDS):
        raise WarmupError(f"cannot quiesce CrewAI: its event handlers did not finish within {FLUSH_SECONDS:.0f} s")
    if bus._executor_initialized:
        loop, thread = bus._loop, bus._loop_thread
        loop.call_soon_threadsafe(loop.stop)
        thread.join(JOIN_SECONDS)
        if thread.is_alive():
            raise WarmupError(f"cannot quiesce CrewAI: its event loop thread did not stop within {JOIN_SECONDS:.0f} s")
        loop.close()
        bus._sync_executor.shutdown(wait=True)
        bus._executor_initialized = False
        bus._has_pending_events = False
    others = _other_threads(_kernel_threads() if native is None else native)
    if others:
        raise WarmupError(f"cannot quiesce CrewAI: threads still running after warm-up: {', '.join(others)}")


def _other_threads(native: int) -> list[str]:
    """Python threads besides this one, and kernel threads beyond ``native``; waits a little for those ending."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        names = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        extra = _kernel_threads() - native
        if not names and extra <= 0:
            return []
        if time.monotonic() > deadline:
            return names or [f"{extra} thread(s) unknown to Python"]
        time.sleep(0.005)


def _kernel_threads() -> int:
    """This process's threads as the kernel counts them (Python's and native ones)."""
    return len(os.listdir("/proc/self/task"))
