"""Reading this server's event streams: the one SSE parser of the CLI, the tests, the bench and the tour.

The server writes each event as ``event: <name>``, ``data: <the event as JSON>``, ``id: <sequence>`` and a
blank line, and a ``: keep-alive`` comment while a stream is idle (``api.sse_frames``). Lines are read as
the SSE standard says, so a reader does not depend on our exact spacing: a field's value loses one leading
space, ``data`` lines join with newlines, comments and unknown fields are skipped, and a frame without
``data`` is dispatched as nothing. A partial frame at the end of a dropped stream is discarded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

import orjson


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    event: str  # "message" when the frame names none, as in the standard
    data: str  # undecoded: a reader that only counts events need not parse them
    id: str | None

    def json(self) -> dict[str, Any]:
        """The event as the journal holds it: ``event``, ``sequence``, ``data`` and the rest."""
        return dict(orjson.loads(self.data))


class Parser:
    """Lines in (without their line ends, as httpx's ``iter_lines`` gives them), whole frames out."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> Frame | None:
        """The frame a blank line completes; None for every other line."""
        if not line:
            frame = Frame(self._event or "message", "\n".join(self._data), self._id) if self._data else None
            self._event, self._data, self._id = "", [], None
            return frame
        if not line.startswith(":"):  # a comment: the heartbeat
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                self._id = value
        return None


def frames(lines: Iterable[str]) -> Iterator[Frame]:
    parser = Parser()
    for line in lines:
        if (frame := parser.feed(line)) is not None:
            yield frame


async def aframes(lines: AsyncIterable[str]) -> AsyncIterator[Frame]:
    parser = Parser()
    async for line in lines:
        if (frame := parser.feed(line)) is not None:
            yield frame


def events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Each event decoded, as ``GET /jobs/{id}/events`` lists them."""
    return (frame.json() for frame in frames(lines))
