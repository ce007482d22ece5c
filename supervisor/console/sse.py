"""Reading this server's event streams: the one SSE parser of the CLI, the tests, the bench and the tour.

The server writes each event as ``event: <name>``, ``data: <the event as JSON>``, ``id: <sequence>`` and a
blank line, and a ``: keep-alive`` comment while a stream is idle (``api.sse_frames``). Lines are read as
the SSE standard says, so a reader does not depend on our exact spacing: a field's value loses one leading
space, ``data`` lines join with newlines, comments and unknown fields are skipped, and a frame without
``data`` is dispatched as nothing. A partial frame at the end of a dropped stream is discarded.

Feed it ``lines(response.iter_bytes())``, never httpx's ``iter_lines``: that splits with ``str.splitlines``,
which also ends a line at U+2028, U+2029, NEL and other characters that a crew's text may hold, so a
stream could forge fields. Whatever arrives that is not UTF-8, or not an event, raises ``StreamError``
with one line saying so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

import orjson

_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamError(ValueError):
    """The stream holds something that is not UTF-8 or not one of this server's events."""


class LineSplitter:
    """Bytes in, lines out, ended only by CR, LF or CRLF (the standard's line ends), each decoded as UTF-8.

    Splitting the bytes before decoding is safe: in UTF-8, bytes below 0x80 never occur inside a character.
    """

    def __init__(self) -> None:
        self._partial = b""
        self._after_cr = False  # a CR ended the last chunk: an LF starting the next one belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:  # says nothing, and must not forget a CR that ended the last chunk
            return []
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        *complete, self._partial = _LINE_END.split(self._partial + chunk)
        return [_decode(line) for line in complete]


def _decode(line: bytes) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError as exc:
        raise StreamError(f"the event stream is not UTF-8 ({exc.reason} at byte {exc.start} of a line)") from None


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a body read as bytes (``response.iter_bytes()``); an unfinished last line is dropped."""
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)


async def alines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    splitter = LineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    event: str  # "message" when the frame names none, as in the standard
    data: str  # undecoded: a reader that only counts events need not parse them
    id: str | None

    def json(self) -> dict[str, Any]:
        """The event as the journal holds it: ``event``, ``sequence``, ``data`` (an object) and the rest."""
        try:
            event = orjson.loads(self.data)
        except orjson.JSONDecodeError as exc:
            raise StreamError(f"an event's data is not JSON: {exc}") from None
        if not (
            isinstance(event, dict)
            and isinstance(event.get("event"), str)
            and type(event.get("sequence")) is int
            and isinstance(event.get("data"), dict)
        ):
            raise StreamError(f"an event's data is not an event: {self.data[:100]!r}")
        return event


class Parser:
    """Lines in (without their line ends, as ``lines`` gives them), whole frames out."""

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
