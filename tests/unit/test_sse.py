"""The one SSE reader (supervisor/console/sse.py) on hand-made lines: frames, comments, the standard's edges."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from supervisor.console import sse
from supervisor.console.sse import Frame

SERVER = [
    "event: started",
    'data: {"event": "started", "sequence": 0, "data": {}}',
    "id: 0",
    "",
    ": keep-alive",
    "",
    "event: completed",
    'data: {"event": "completed", "sequence": 1, "data": {"raw": "x"}}',
    "id: 1",
    "",
]


def test_the_servers_frames_and_its_heartbeat() -> None:
    frames = list(sse.frames(SERVER))
    assert [(f.event, f.id) for f in frames] == [("started", "0"), ("completed", "1")]
    assert [e["sequence"] for e in sse.events(SERVER)] == [0, 1]
    assert frames[1].json()["data"] == {"raw": "x"}


def test_the_standards_edges() -> None:
    lines = ["data:a", "data:  b", "retry: 5", "", "event:x", "", "data: {}", "id:7", "event: partial"]
    # No space after the colon; only one space removed; data lines joined; unknown fields and data-less frames
    # skipped; a frame without its blank line (a dropped stream) is discarded.
    assert list(sse.frames(lines)) == [Frame("message", "a\n b", None)]


def test_async_lines() -> None:
    async def lines() -> AsyncIterator[str]:
        for line in SERVER:
            yield line

    async def read() -> list[Frame]:
        return [frame async for frame in sse.aframes(lines())]

    assert asyncio.run(read()) == list(sse.frames(SERVER))
