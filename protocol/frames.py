"""Frames: a 4-byte big-endian length, then exactly that many bytes of one orjson document."""

from __future__ import annotations

import struct
from typing import Any

import orjson

HEADER = struct.Struct(">I")
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
# The largest message is a `completed` carrying a 4 MiB output; the rest is envelope.
MAX_FRAME_BYTES = MAX_OUTPUT_BYTES + 64 * 1024


class FrameError(Exception):
    """The byte stream cannot be read as frames; the peer is broken or hostile."""


class FrameTooLarge(FrameError):
    pass


class TruncatedFrame(FrameError):
    pass


class InvalidDocument(FrameError):
    pass


def encode(document: dict[str, Any], max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One frame for ``document``; raises FrameTooLarge rather than send what no reader accepts."""
    body = orjson.dumps(document)
    if len(body) > max_bytes:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds {max_bytes}")
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Incremental reader: feed it any split of the stream, get whole documents back."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_bytes
        self._buffer = bytearray()
        self._need: int | None = None  # body length of the frame in progress

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Consume ``data``; return the documents it completes, in order."""
        buffer = self._buffer
        buffer += data
        documents: list[dict[str, Any]] = []
        offset = 0  # what is consumed is cut from the buffer once, at the end: not a move per frame
        try:
            while True:
                if self._need is None:
                    if len(buffer) - offset < HEADER.size:
                        return documents
                    (length,) = HEADER.unpack_from(buffer, offset)
                    if length > self._max:
                        raise FrameTooLarge(f"frame length {length} exceeds {self._max}")
                    offset += HEADER.size
                    self._need = length
                if len(buffer) - offset < self._need:
                    return documents
                end = offset + self._need
                self._need = None
                documents.append(_parse(buffer[offset:end]))
                offset = end
        finally:
            del buffer[:offset]

    @property
    def inside_frame(self) -> bool:
        """Part of a frame has arrived and the rest has not."""
        return bool(self._buffer) or self._need is not None

    def close(self) -> None:
        """Declare EOF: anything buffered is a frame cut short."""
        if self.inside_frame:
            raise TruncatedFrame(f"stream ended inside a frame ({len(self._buffer)} bytes buffered)")


def _parse(body: bytes | bytearray) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidDocument(f"frame is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidDocument(f"frame holds a JSON {type(document).__name__}, not an object")
    return document
