"""A job's stream chunks into events: plain text chunks coalesce once the job has spent a quarter of its events, and
no secret of the job is ever cut between two of them.

Every chunk costs the job one of its ``MAX_EVENTS_PER_RUN`` events, and a real model streams a token a chunk: a
long answer is thousands. So past a quarter of the budget, consecutive text chunks of the same agent and task
are sent as one chunk event (the reference's shape, their texts joined in order) at most once a window, and
the window doubles at each further eighth of the budget: a long stream slows its events down instead of
failing. Short streams are sent a chunk an event, as the reference sends them. A tool call's chunk, or any
chunk other than plain text, is sent at once, after the text before it.

The supervisor masks each secret of a job (``Start.secret_names``) where an event holds it whole; a model streams a
key it repeats a few characters a chunk. So text that ends with a possible beginning of a secret (a proper prefix
of one: fewer characters than the secret) is sent without it, and that beginning waits for the text after it,
joined into the same event: the secret, if it is one, goes out whole. It waits for the next chunk however long the
model takes (a window's timer sends the text before it, never it; it is shorter than the secret), or until the stream
ends, or a chunk of another agent, task or kind comes: then it is sent as it is, since nothing can complete it.
With no secrets, a chunk costs what it did; with any, about a microsecond more (docs/security.md).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import re
import time
from collections.abc import Callable, Iterable

import orjson

from protocol import Chunk, WorkerSettings

FIRST_WINDOW = 0.05  # seconds between a job's text events once it has spent a quarter of its events
# Joined text stops growing here, whatever MAX_EVENT_BYTES allows: the AIP client refuses an SSE frame over 1 MiB,
# and a follower waits for a whole event before it sees any of its text.
MAX_JOINED_BYTES = 64 * 1024


class Coalescer:
    """Chunks in, chunk events out to ``send``; ``flush`` sends what it holds (at the stream's end). ``secrets``: the
    values no event may hold only a part of."""

    def __init__(
        self,
        send: Callable[[Chunk], None],
        settings: WorkerSettings,
        clock: Callable[[], float] = time.monotonic,
        secrets: Iterable[str] = (),
    ) -> None:
        self._send = send
        self._clock = clock
        self._budget = settings.max_events
        self._max_bytes = min(settings.max_event_bytes, MAX_JOINED_BYTES)
        self._beginnings = Beginnings(secrets)
        self._sent = 0
        self._last = -math.inf  # when the last event was sent (monotonic)
        self._held: Chunk | None = None  # the first of the text chunks held, whose fields the event keeps
        self._texts: list[str] = []
        self._bytes = 0  # of the event the held chunks make, as the supervisor measures it
        self._timer: asyncio.TimerHandle | None = None  # none while only a possible secret's beginning is held

    def add(self, chunk: Chunk) -> None:
        if not _plain_text(chunk):
            self.flush()
            self._emit(chunk)
            return
        if self._held is not None and not self._join(chunk):
            if self._beginnings and self._continues(chunk):  # too large to join: the text held goes, but for the end
                self._release()  # that may begin a secret, which this chunk may go on with
            if self._held is not None and not self._join(chunk):
                self.flush()
        if self._held is None:
            wait = self._last + self._window() - self._clock()
            # Nothing to wait for, and no possible beginning of a secret at its end: sent as it came, as the reference
            # sends it.
            if wait <= 0 and (
                not self._beginnings or self._beginnings.start(chunk.data["content"]) == len(chunk.data["content"])
            ):
                self._emit(chunk)
                return
            self._held, self._texts, self._bytes = chunk, [chunk.data["content"]], len(orjson.dumps(chunk.data))
        if self._clock() >= self._last + self._window():  # its window has passed (a flood never lets the timer run)
            self._release()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self._last + self._window() - self._clock(), self._release
            )

    def flush(self) -> None:
        """Send all the text held, a possible secret's beginning included: what comes next cannot continue it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held is None:
            return
        held, texts = self._held, self._texts
        self._held, self._texts = None, []
        self._emit(held if len(texts) == 1 else _with(held, "".join(texts)))

    def _release(self) -> None:
        """Send the text held, but for its end when that may begin a secret: kept held, with no timer, until the
        next chunk continues it or ``flush``."""
        if not self._beginnings:
            self.flush()
            return
        held = self._held
        assert held is not None
        text = self._texts[0] if len(self._texts) == 1 else "".join(self._texts)
        cut = self._beginnings.outside(text, self._beginnings.start(text))
        if cut == len(text):
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if cut:
            self._emit(_with(held, text[:cut]))
        rest = _with(held, text[cut:])
        self._held, self._texts, self._bytes = rest, [text[cut:]], len(orjson.dumps(rest.data))

    def _join(self, chunk: Chunk) -> bool:
        """Add ``chunk`` to the held text if it continues it (same agent, task, channel) and the event stays in its
        bound (and ``MAX_JOINED_BYTES``): the escaped text of a join is the join of the escaped texts, so each
        piece's size adds up exactly."""
        if not self._continues(chunk):
            return False
        grown = self._bytes + len(orjson.dumps(chunk.data["content"])) - 2  # its quotes are the held text's
        if grown > self._max_bytes:
            return False
        self._texts.append(chunk.data["content"])
        self._bytes = grown
        return True

    def _continues(self, chunk: Chunk) -> bool:
        held = self._held
        assert held is not None
        return held.data.keys() == chunk.data.keys() and all(
            value == held.data[name] for name, value in chunk.data.items() if name != "content"
        )

    def _window(self) -> float:
        """No wait for the first quarter of the budget; then FIRST_WINDOW, doubled at each eighth after."""
        stage = 8 * self._sent // self._budget
        return 0.0 if stage < 2 else FIRST_WINDOW * 2 ** (stage - 2)

    def _emit(self, chunk: Chunk) -> None:
        self._send(chunk)
        self._sent += 1
        self._last = self._clock()


class Beginnings:
    """Where a text ends with a possible beginning of one of a job's secrets (``start``). A chunk's check is a few
    calls into C whatever the number of secrets: one search for the places, in the last characters (the longest
    secret's length less one), where a secret's first character is, and at each, from the first, one bisection of
    the secrets sorted and one comparison."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._sorted = sorted({secret for secret in secrets if secret})
        self._reach = max(map(len, self._sorted), default=1) - 1
        firsts = "".join(re.escape(first) for first in {secret[0] for secret in self._sorted})
        self._firsts = re.compile(f"[{firsts}]" if firsts else "(?!)")  # none: never found

    def __bool__(self) -> bool:
        return bool(self._sorted)

    def start(self, text: str) -> int:
        """Where the longest end of ``text`` that is a proper beginning of a secret (shorter than it) starts;
        ``len(text)`` if none."""
        end = len(text)
        found = self._firsts.search(text, max(end - self._reach, 0))
        while found is not None:
            at = found.start()
            tail = text[at:]
            # The secrets that begin with ``tail`` are together in sorted order, from ``tail`` itself if it is one.
            index = bisect.bisect_left(self._sorted, tail)
            if index < len(self._sorted) and self._sorted[index] == tail:
                index += 1
            if index < len(self._sorted) and self._sorted[index].startswith(tail):
                return at
            found = self._firsts.search(text, at + 1)
        return end

    def outside(self, text: str, cut: int) -> int:
        """``cut``, or earlier: never inside a whole secret of ``text`` (a secret's own end may begin another one, or
        itself: cut there, its whole would be in no event)."""
        moved = True
        while moved:
            moved = False
            for secret in self._sorted:
                at = text.find(secret, max(cut - len(secret) + 1, 0))
                if at != -1 and at < cut:
                    cut, moved = at, True
        return cut


def _with(chunk: Chunk, content: str) -> Chunk:
    return Chunk(chunk.channel, {**chunk.data, "content": content})


def _plain_text(chunk: Chunk) -> bool:
    data = chunk.data
    return data.get("chunk_type") == "text" and data.get("tool_call") is None and isinstance(data.get("content"), str)
