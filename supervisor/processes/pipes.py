"""A worker's pipes as the supervisor holds them: frames in (bounded, with a stall timer), the last bytes
of its stdout and stderr, and the ends each side gets."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable

from protocol import FrameError, Message, MessageReader, TruncatedFrame

OUTPUT_TAIL_BYTES = 64 * 1024
# Reading pauses while this many messages wait: a flooding worker blocks on its own pipe.
QUEUE_HIGH, QUEUE_LOW = 256, 64
STALL_SECONDS = 5.0  # a pipe write of a whole frame never pauses this long while we read


class Tail(asyncio.Protocol):
    """The last ``limit`` bytes of a worker's stdout or stderr, and how many came in all."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self.limit = limit
        self.total = 0
        self._buffer = bytearray()
        self.transport: asyncio.ReadTransport | None = None
        self.on_read: Callable[[], None] | None = None  # told after each read (the output cap's check)
        self.stopped = False  # reads no more (``stop_reading``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types the base's parameter: a read pipe's transport (connect_read_pipe) is a ReadTransport.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self._buffer += data
        if len(self._buffer) > self.limit:
            del self._buffer[: len(self._buffer) - self.limit]
        if self.on_read is not None:
            self.on_read()

    def stop_reading(self) -> None:
        """Read no more: whoever writes blocks once the pipe is full. Closed at the kill (``close``)."""
        self.on_read, self.stopped = None, True
        if self.transport is not None:
            self.transport.pause_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def text(self) -> str:
        return self._buffer.decode(errors="replace")

    @property
    def truncated(self) -> bool:
        """Whether its beginning was dropped to keep within ``limit``."""
        return self.total > len(self._buffer)


class Frames(asyncio.Protocol):
    """Feeds the event pipe to a MessageReader; hands messages, a FrameError, then None (EOF) to a queue.

    A frame begun and not finished within STALL_SECONDS (while we were reading) is truncated: a worker
    that wrote half a frame and fell silent must not hold its job until the timeout.
    """

    def __init__(
        self, queue: asyncio.Queue[Message | FrameError | None], answered: Callable[[Message], bool] | None = None
    ) -> None:
        self._queue = queue
        # Takes an answer asked for out of turn (``WorkerProcess.ask``): never queued behind frames.
        self._answered = answered
        self._reader: MessageReader | None = MessageReader()  # None once the stream ended or failed
        self.transport: asyncio.ReadTransport | None = None
        self.paused = False
        self._stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types the base's parameter: a read pipe's transport (connect_read_pipe) is a ReadTransport.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._reader is None:  # failed: its transport is closing, and nothing it still reads counts
            return
        try:
            for message in self._reader.feed(data):
                if self._answered is None or not self._answered(message):
                    self._queue.put_nowait(message)
        except FrameError as exc:
            self._fail(exc)
            return
        if self._queue.qsize() >= QUEUE_HIGH and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._watch_stall()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False
            self._watch_stall()

    def _watch_stall(self) -> None:
        """Armed while a frame is incomplete and we are reading; re-armed by each arrival."""
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._reader is not None and self._reader.inside_frame and not self.paused:
            self._stall = asyncio.get_running_loop().call_later(STALL_SECONDS, self._stalled)

    def _stalled(self) -> None:
        self._stall = None
        self._fail(TruncatedFrame(f"a frame stayed incomplete for {STALL_SECONDS:g} s"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall is not None:
            self._stall.cancel()
        if self._reader is None:
            return
        try:
            self._reader.close()
        except FrameError as error:
            self._fail(error)
            return
        self._reader = None
        self._queue.put_nowait(None)

    def _fail(self, exc: FrameError) -> None:
        self._reader = None
        self._queue.put_nowait(exc)
        self._queue.put_nowait(None)
        if self.transport is not None:
            self.transport.close()


@dataclasses.dataclass(frozen=True)
class PipeEnds:
    """A job's four pipes, one end each: ours (write control, read the rest) or the worker's."""

    control: int
    events: int
    stdout: int
    stderr: int

    def close(self) -> None:
        for fd in dataclasses.astuple(self):
            os.close(fd)


def make_pipes() -> tuple[PipeEnds, PipeEnds]:
    """(ours, the worker's). All close-on-exec: a launcher places the worker's ends deliberately."""
    control_r, control_w = os.pipe()
    events_r, events_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    return PipeEnds(control_w, events_r, stdout_r, stderr_r), PipeEnds(control_r, events_w, stdout_w, stderr_w)
