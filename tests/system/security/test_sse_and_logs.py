"""Line separators in crew text: they must not forge SSE fields or log lines, and our readers split only
on CR and LF and say in one line what they cannot read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from supervisor.console import sse
from supervisor.escaping import LINE_BREAKERS
from supervisor.logs import TextFormatter
from tests.conftest import Server, start_body, wait_until

KEY = {"Idempotency-Key": "k"}
# What the issue sent: a client splitting on U+2028 (httpx's iter_lines) saw a forged ``completed`` event.
FORGERY = "ok\u2028event: completed\u2028id: 999\u2028\u2028"
SEPARATORS = ("\u2028", "\u2029", "\u0085")


def naive_events(lines: list[str]) -> list[tuple[str, Any]]:
    """(event name, parsed data) of each frame, as a client reading httpx's ``iter_lines`` sees it."""
    frames, name, data = [], None, None
    for line in lines:
        if not line:
            if data is not None:
                frames.append((name, orjson.loads(data)))
            name, data = None, None
        elif line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
    return frames


def test_crew_text_cannot_forge_an_event_for_an_iter_lines_client(server: Server) -> None:
    text = FORGERY + "".join(SEPARATORS)
    body = start_body("echo", "forge-1", input={"text": text})
    with server.client() as client:
        with client.stream("POST", "/jobs/stream", json=body, headers=KEY) as response:
            assert response.status_code == 200
            streamed = list(response.iter_lines())
        with client.stream("GET", "/jobs/forge-1/events", headers={"Accept": "text/event-stream"}) as response:
            reread = list(response.iter_lines())
    for lines in (streamed, reread):
        assert "id: 999" not in lines
        events = naive_events(lines)
        assert [name for name, _ in events] == ["started", "chunk", "completed"]
        assert events[1][1]["data"]["content"] == text  # the same text, escaped on the wire
        assert not any(separator in line for line in lines for separator in SEPARATORS)


def test_json_log_lines_escape_line_separators(server: Server) -> None:
    action = "log\u2028forged\u2029line\u0085end"
    with server.client() as client:
        assert client.post("/jobs", json=start_body("demo", action), headers=KEY).status_code == 200
    wanted = '"action_id":"log\\u2028forged\\u2029line\\u0085end"'
    assert wait_until(lambda: wanted in server.log.read_text(), timeout=10), server.log_tail()
    log = server.log.read_text()
    assert not any(separator in log for separator in SEPARATORS)
    for line in log.splitlines():  # what a naive log reader does: every line is still one whole record
        if line.startswith("{"):
            orjson.loads(line)


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"a\r\nb\rc\nd"], ["a", "b", "c"]),
        ([b"a\r", b"\nb\r", b"", b"\n"], ["a", "b"]),  # CRLF split across reads is one line end
        ([b"x\xe2\x80\xa8y\xc2\x85z\n"], ["x\u2028y\u0085z"]),  # not line ends in SSE
    ],
)
def test_lines_end_only_at_cr_and_lf(chunks: list[bytes], lines: list[str]) -> None:
    assert list(sse.lines(chunks)) == lines


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"data: \xff\n\n", "not UTF-8"),
        (b"data: {not json\n\n", "not JSON"),
        (b'data: {"event": "chunk"}\n\n', "not an event"),
    ],
)
def test_what_is_not_an_event_is_one_stream_error(body: bytes, says: str) -> None:
    with pytest.raises(sse.StreamError, match=says) as raised:
        list(sse.events(sse.lines([body])))
    assert "\n" not in str(raised.value)


def test_the_async_reader_splits_the_same() -> None:
    chunks = [b"a\r", b"\nb\xe2\x80\xa8c\r", b"\nd\n"]

    async def read() -> list[str]:
        async def arrive() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return [line async for line in sse.alines(arrive())]

    assert asyncio.run(read()) == list(sse.lines(chunks)) == ["a", "b\u2028c", "d"]


def test_text_log_lines_write_controls_and_separators_out() -> None:
    """LOG_FORMAT=text is for people at a terminal: one line per record, no escape sequence reaches them."""
    hostile = "job\u2028forged\nline\x1b]0;PWNED\x07\u0085\u009b2K"
    record = logging.LogRecord("crew_supervisor.jobs", logging.INFO, __file__, 1, "job %s finished", (hostile,), None)
    record.action_id = hostile
    line = TextFormatter().format(record)
    assert "\n" not in line and not LINE_BREAKERS.search(line)
    assert "job\\u2028forged\\x0aline\\x1b]0;PWNED\\x07\\u0085\\u009b2K finished" in line
    assert line.endswith('action_id="job\\u2028forged\\x0aline\\x1b]0;PWNED\\x07\\u0085\\u009b2K"')
