"""Playing the supervisor's part of the effect ledger to a worker a test speaks to itself: each ``EffectStarted``
and ``TaskDone`` answered with ``Recorded``, as the supervisor answers once its journal holds the entry."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol import EffectStarted, Recorded, TaskDone
from supervisor.processes.process import WorkerProcess


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
