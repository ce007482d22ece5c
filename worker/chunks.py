"""A job's stream chunks into events: plain text chunks coalesce once the job has spent a quarter of its events.

Every chunk costs the job one of its ``MAX_EVENTS_PER_RUN`` events, and a real model streams a token a chunk: a
long answer is thousands. So past a quarter of the budget, consecutive text chunks of the same agent and task
are sent as one chunk event (the reference's shape, their texts joined in order) at most once a window, and
the window doubles at each further eighth of the budget: a long stream slows its events down instead of
failing. Short streams are sent a chunk an event, as the reference sends them. A tool call's chunk, or any
chunk other than plain text, is sent at once, after the text before it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import orjson

from protocol import Chunk, WorkerSettings

FIRST_WINDOW = 0.05  # seconds between a job's text events once it has spent a quarter of its events
# Joined text stops growing here, whatever MAX_EVENT_BYTES allows: the AIP client refuses an SSE frame over 1 MiB,
# and a follower waits for a whole event before it sees any of its text.
MAX_JOINED_BYTES = 64 * 1024


class Coalescer:
    """Chunks in, chunk events out to ``send``; ``flush`` sends what it holds (at the stream's end)."""

    def __init__(
        self, send: Callable[[Chunk], None], settings: WorkerSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._send = send
        self._clock = clock
        self._budget = settings.max_events
        self._max_bytes = min(settings.max_event_bytes, MAX_JOINED_BYTES)
        self._sent = 0
        self._last = -math.inf  # when the last event was sent (monotonic)
        self._held: Chunk | None = None  # the first of the text chunks held, whose fields the event keeps
        self._texts: list[str] = []
        self._bytes = 0  # of the event the held chunks make, as the supervisor measures it
        self._timer: asyncio.TimerHandle | None = None

    def add(self, chunk: Chunk) -> None:
        if not _plain_text(chunk):
            self.flush()
            self._emit(chunk)
        elif self._held is not None and self._join(chunk):
            if self._clock() >= self._last + self._window():  # a flood that never lets the timer run
                self.flush()
        else:
            self.flush()
            wait = self._last + self._window() - self._clock()
            if wait <= 0:  # nothing to wait for: sent as it came, as the reference sends it
                self._emit(chunk)
                return
            self._held, self._texts, self._bytes = chunk, [chunk.data["content"]], len(orjson.dumps(chunk.data))
            self._timer = asyncio.get_running_loop().call_later(wait, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held is None:
            return
        held, texts = self._held, self._texts
        self._held, self._texts = None, []
        self._emit(held if len(texts) == 1 else Chunk(held.channel, {**held.data, "content": "".join(texts)}))

    def _join(self, chunk: Chunk) -> bool:
        """Add ``chunk`` to the held text if it continues it (same agent, task, channel) and the event stays in its
        bound (and ``MAX_JOINED_BYTES``): the escaped text of a join is the join of the escaped texts, so each
        piece's size adds up exactly."""
        held = self._held
        assert held is not None
        if held.data.keys() != chunk.data.keys() or any(
            value != held.data[name] for name, value in chunk.data.items() if name != "content"
        ):
            return False
        grown = self._bytes + len(orjson.dumps(chunk.data["content"])) - 2  # its quotes are the held text's
        if grown > self._max_bytes:
            return False
        self._texts.append(chunk.data["content"])
        self._bytes = grown
        return True

    def _window(self) -> float:
        """No wait for the first quarter of the budget; then FIRST_WINDOW, doubled at each eighth after."""
        stage = 8 * self._sent // self._budget
        return 0.0 if stage < 2 else FIRST_WINDOW * 2 ** (stage - 2)

    def _emit(self, chunk: Chunk) -> None:
        self._send(chunk)
        self._sent += 1
        self._last = self._clock()


def _plain_text(chunk: Chunk) -> bool:
    data = chunk.data
    return data.get("chunk_type") == "text" and data.get("tool_call") is None and isinstance(data.get("content"), str)
