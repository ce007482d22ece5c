"""One worker process as the supervisor sees it: its pipes, its exit, and how to stop it for sure."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

from protocol import FrameError, Message, pack
from supervisor.enums import LauncherName
from supervisor.processes.containment import Containment
from supervisor.processes.pipes import QUEUE_HIGH, QUEUE_LOW, Frames, PipeEnds, Tail
from supervisor.processes.reaper import Reaper, signal_group

CONFIRM_SECONDS = 5.0

Answer = TypeVar("Answer", bound=Message)


@dataclasses.dataclass(frozen=True)
class StopEvidence:
    """What a stop proved: recorded in the job's terminal event."""

    stop_confirmed: bool
    pid: int
    pgid: int
    signal: str
    exit_status: int | None
    descendants_killed: int
    elapsed_ms: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class WorkerProcess:
    """A launched worker: leads its own process group. Its exit status comes from the reaper
    (``Reaper.watch``), whoever's child it is."""

    def __init__(
        self, pid: int, pipes: PipeEnds, reaper: Reaper, exited: asyncio.Future[int | None], launched_by: LauncherName
    ) -> None:
        self.pid = pid
        self.launched_by = launched_by
        self.pgid = pid  # the worker leads its own process group
        self.create_time = psutil.Process(pid).create_time()
        # The job's boundary, the one object that holds every process of it: its group, the descendants samples
        # saw, and the cgroups the limits give it (``Limits.apply``). Whoever stops the job kills through it.
        self.containment = Containment(pid, self.create_time)
        self.stdout = Tail()
        self.stderr = Tail()
        self.exited = exited
        self._reaper = reaper
        self._pipes = pipes
        self._messages: asyncio.Queue[Message | FrameError | None] = asyncio.Queue()
        self._frames = Frames(self._messages, self._answered)
        self._control: asyncio.WriteTransport | None = None
        self._asked: dict[type[Message], asyncio.Future[Any]] = {}  # by the answer awaited: questions not answered yet

    async def attach(self) -> None:
        """Start reading pipes without blocking the loop."""
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: self._frames, os.fdopen(self._pipes.events, "rb", buffering=0))
        await loop.connect_read_pipe(lambda: self.stdout, os.fdopen(self._pipes.stdout, "rb", buffering=0))
        await loop.connect_read_pipe(lambda: self.stderr, os.fdopen(self._pipes.stderr, "rb", buffering=0))
        self._control, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(self._pipes.control, "wb", buffering=0)
        )

    def send(self, message: Message) -> None:
        if self._control is not None and not self._control.is_closing():
            self._control.write(pack(message))

    async def ask(self, question: Message, answer: type[Answer], timeout: float) -> Answer | None:
        """Send ``question`` and await its ``answer``; None if it did not come within ``timeout`` (a thread holding
        the GIL, a full event pipe) or the worker exited first. Askers meanwhile share one question: a worker that does
        not answer is not sent more to pile up, and each answer is one asked for."""
        awaited = self._asked.get(answer)
        if awaited is None:
            awaited = self._asked[answer] = asyncio.get_running_loop().create_future()
            self.send(question)
        await asyncio.wait((awaited, self.exited), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return awaited.result() if awaited.done() else None

    def _answered(self, message: Message) -> bool:
        """An answer asked for goes to its askers as it arrives: not behind the frames queued before it, and never
        after the terminal frame, where the relay would take it for a fault, though its question came before (a worker's
        control thread answers while its job thread sends its result). One nobody asked for is queued: a fault."""
        awaited = self._asked.pop(type(message), None)
        if awaited is None:
            return False
        awaited.set_result(message)
        return True

    def close_control(self) -> None:
        """The worker exits when it sees EOF here."""
        if self._control is not None:
            self._control.close()

    def cap_output(self, limit: int, on_over: Callable[[int], None]) -> None:
        """Once stdout and stderr together pass ``limit`` bytes, neither is read again and ``on_over`` is told the
        total, once: checked as each read arrives, so what passes the cap is at most one read (the writers, a
        grandchild that inherited the pipes too, then block on full pipes until the kill)."""

        def check() -> None:
            total = self.stdout.total + self.stderr.total
            if total > limit:
                for tail in (self.stdout, self.stderr):
                    tail.stop_reading()
                on_over(total)

        self.stdout.on_read = self.stderr.on_read = check

    async def next_message(self) -> Message | FrameError | None:
        """The next message, a FrameError if the stream broke, or None at EOF."""
        message = await self._messages.get()
        if self._messages.qsize() <= QUEUE_LOW:
            self._frames.resume()
        return message

    async def trailing_messages(self, timeout: float) -> list[Message | FrameError]:
        """After the terminal message only EOF may come: whatever else arrives, until EOF or a quiet ``timeout``."""
        trailing: list[Message | FrameError] = []
        while len(trailing) < QUEUE_HIGH:  # enough to judge; the rest is not read
            try:
                message = await asyncio.wait_for(self.next_message(), timeout)
            except TimeoutError:
                break
            if message is None:
                break
            trailing.append(message)
        return trailing

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status; None if it is unknown or ``timeout`` passed first (see ``exited``)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout)
        except TimeoutError:
            return None

    async def kill(self, grace: float = 0.0) -> StopEvidence:
        """Stop the worker's whole group and every other process of its job (its ``containment``: its cgroups and
        the descendants samples saw), then prove they are all gone. ``descendants_killed`` counts the job's
        processes but the worker that were running when the stop began, or were found and killed during it."""
        started = time.monotonic()
        containment = self.containment
        # Before any signal: a grandchild may have left the group. Once the worker is reaped its pid may be
        # another's, so nothing is looked up by it: only what the job holds (its cgroup, group, samples).
        look = containment.leftovers if self.exited.done() else containment.descendants
        snapshot = await asyncio.to_thread(look)  # a scan of /proc and a kill's rounds: off the loop
        sent = signal.SIGKILL
        if grace > 0 and not self.exited.done():
            signal_group(self.pgid, signal.SIGTERM)
            await self.wait_exit(grace)
            if self.exited.done():
                sent = signal.SIGTERM
        if not self.exited.done():  # an unreaped leader holds its group's id: the group is still the job's
            signal_group(self.pgid, signal.SIGKILL)
        killed = await asyncio.to_thread(containment.kill, snapshot)
        stopped = {process.pid: process for process in [*snapshot, *killed]}
        status = await self.wait_exit(CONFIRM_SECONDS)
        confirmed = self.exited.done() and await self._reaper.confirm_gone(list(stopped.values()), CONFIRM_SECONDS)
        self.close_control()
        for tail in (self.stdout, self.stderr):  # one that stopped reading at the output cap sees no EOF
            if tail.stopped:
                tail.close()
        return StopEvidence(
            stop_confirmed=confirmed,
            pid=self.pid,
            pgid=self.pgid,
            signal=signal.Signals(sent).name,
            exit_status=status,
            descendants_killed=len(stopped),
            elapsed_ms=round((time.monotonic() - started) * 1000, 3),
        )
