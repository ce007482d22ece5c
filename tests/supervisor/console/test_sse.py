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


def test_a_stored_event_streams_byte_for_byte_as_its_parsed_form() -> None:
    """The stream builds each frame around the data as stored; it must equal encoding the parsed event (with
    line separators and C1 controls escaped, which only changes the bytes, not the value)."""
    import orjson

    from supervisor.escaping import json_line
    from supervisor.http.contract import _frame
    from supervisor.journal.records import Event, StoredEvent

    datas = [
        {},
        {"content": "tok ", "n": 7, "ok": True, "none": None, "f": 0.1, "big": 2**63 - 1, "neg": -1e-300},
        {"text": 'quotes " and \\ and \n\t\u0001 controls', "unicode": "é中😀", "nested": {"a": [1, [2, {"b": []}]]}},
        {"status": "completed", "output": {"raw": "x" * 1000}},
        {"content": "ok\u2028event: completed\u2029id: 9\u0085\u009b\u0080\u00a0\u2027\u202a"},
    ]
    for sequence, data in enumerate(datas):
        for name in ("started", "chunk", "completed", "failed", "cancelled"):
            stored = StoredEvent(name, sequence, orjson.dumps(data))
            parsed = Event(name, sequence, orjson.loads(stored.data))
            encoded = json_line(orjson.dumps(parsed.as_dict()))
            expected = b"event: %s\ndata: %s\nid: %d\n\n" % (name.encode(), encoded, sequence)
            assert _frame(stored) == expected
            assert orjson.loads(encoded.split(b"\n")[0]) == parsed.as_dict()
            assert "\u2028" not in expected.decode().splitlines()[1]
