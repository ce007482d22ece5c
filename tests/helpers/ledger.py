"""Playing the supervisor's part of the effect ledger to a worker a test speaks to itself: each ``EffectStarted``
and ``TaskDone`` answered with ``Recorded``, as the supervisor answers once its journal holds the entry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from protocol import EffectStarted, Recorded, Start, TaskDone
from supervisor.processes.launcher import SpawnLauncher
from supervisor.processes.process import WorkerProcess
from supervisor.processes.reaper import Reaper
from tests.conftest import worker_env


async def next_answered(worker: WorkerProcess, timeout: float = 60) -> Any:
    """The worker's next message; a ledger entry is answered before it is returned."""
    message = await asyncio.wait_for(worker.next_message(), timeout)
    if isinstance(message, EffectStarted | TaskDone):
        worker.send(Recorded(message.id))
    return message


async def answered_to_the_end(worker: WorkerProcess, timeout: float = 90) -> list[Any]:
    """Every message until EOF, the ledger's answered."""
    messages = []
    while (message := await next_answered(worker, timeout)) is not None:
        messages.append(message)
    return messages


def answering(worker: WorkerProcess) -> asyncio.Task[list[Any]]:
    """From now on, in the background, every message read and the ledger's answered, until EOF: what it read."""
    task = asyncio.create_task(answered_to_the_end(worker, timeout=3600))
    _background.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_background.discard)
    return task


_background: set[asyncio.Task[list[Any]]] = set()


async def launch(
    tmp: Path, crew: str, inputs: dict[str, Any], env: dict[str, str] | None = None, **start: Any
) -> WorkerProcess:
    """A real worker spawned in ``tmp`` (its cwd: where the ``effects`` crew writes its log), given job-1 of ``crew``;
    ``start``: the rest of its ``Start`` (``operation`` defaults to run)."""
    worker = await SpawnLauncher(Reaper()).spawn({**worker_env(tmp), **(env or {})}, str(tmp))
    worker.send(Start("job-1", crew, start.pop("operation", "run"), inputs, 600_000, **start))
    return worker


def job(tmp: Path, crew: str, inputs: dict[str, Any], env: dict[str, str] | None = None, **start: Any) -> list[Any]:
    """Every message of one job in a real worker (``launch``), its ledger answered; the worker exited 0."""

    async def scenario() -> list[Any]:
        worker = await launch(tmp, crew, inputs, env, **start)
        try:
            messages = await answered_to_the_end(worker)
            assert await worker.wait_exit(10) == 0, worker.stderr.text()[-2000:]
        except BaseException:
            await worker.kill()
            raise
        return messages

    return asyncio.run(scenario())
