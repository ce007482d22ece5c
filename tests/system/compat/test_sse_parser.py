"""The emulated connector's SSE reader on hand-made byte streams (no server): framing, bounds, sequences,
terminal events and chunks, exactly as the real client reads them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tests.system.compat.aip_client import (
    MAX_FRAME_BYTES,
    MAX_STREAM_BYTES,
    MAX_STREAM_EVENTS,
    Event,
    SseParser,
    StreamError,
    read_stream,
)

OUTPUT = {"raw": "case triaged", "token_usage": {"total_tokens": 5}}


def frame(event: str | None, sequence: Any, data: Any = None, *, crlf: bool = False, name: bool = True) -> bytes:
    payload: dict[str, Any] = {"sequence": sequence, "data": {} if data is None else data}
    if event is not None:
        payload["event"] = event
    lines = ([f"event: {event}"] if name and event is not None else []) + [f"data: {json.dumps(payload)}"]
    end = "\r\n" if crlf else "\n"
    return (end.join(lines) + end + end).encode()


def run_stream(sequences: int = 2, **kwargs: Any) -> list[bytes]:
    """started, ``sequences - 2`` chunks, completed."""
    frames = [frame("started", 0, {"status": "running", "operation": "run"}, **kwargs)]
    frames += [frame("chunk", i, {"content": f"w{i} ", "channel": "llm"}, **kwargs) for i in range(1, sequences - 1)]
    frames.append(frame("completed", sequences - 1, OUTPUT, **kwargs))
    return frames


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def parse_all(chunks: Iterable[bytes], cursor: int = 0) -> tuple[list[Event], SseParser]:
    parser = SseParser(cursor)
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events, parser


# --- framing --------------------------------------------------------------------------------------------


def test_lf_and_crlf_frames_read_alike() -> None:
    lf = read_stream(run_stream(4))
    crlf = read_stream(run_stream(4, crlf=True))
    assert lf.kind == crlf.kind == "completed"
    assert [e.payload for e in lf.events] == [e.payload for e in crlf.events]
    assert [e.sequence for e in crlf.events] == [0, 1, 2, 3]
    assert crlf.output == OUTPUT and crlf.text == "w1 w2 "


def test_a_bare_cr_is_not_a_frame_end() -> None:
    data = frame("started", 0).replace(b"\n\n", b"\r\r")
    events, parser = parse_all([data])
    assert events == [] and parser.buffer == data


def test_comments_and_frames_without_data_are_skipped() -> None:
    body = [
        b": keep-alive\n\n",
        frame("started", 0),
        b"event: ping\n\n",
        b"id: 7\nretry: 100\n\n",
        b": a comment\r\n: another\r\n\r\n",
        frame("completed", 1, OUTPUT),
    ]
    result = read_stream(body)
    assert [e.name for e in result.events] == ["started", "completed"]
    assert result.comments == 3 and result.output == OUTPUT


def test_event_name_is_the_field_else_the_json() -> None:
    named = frame("chunk", 0, {"content": "x"}).replace(b"event: chunk", b"event: other")
    unnamed = frame("started", 1, name=False)
    nameless = frame(None, 2)
    events, _ = parse_all([named, unnamed])
    assert [e.name for e in events] == ["other", "started"]
    with pytest.raises(StreamError, match="no name"):
        parse_all([named, unnamed, nameless])


def test_data_lines_join_and_the_optional_space() -> None:
    payload = json.dumps({"event": "started", "sequence": 0, "data": {}}, indent=1)
    multi = "".join(f"data:{line}\n" for line in payload.split("\n")) + "\n"
    events, _ = parse_all([multi.encode()])
    assert [(e.name, e.sequence) for e in events] == [("started", 0)]


def test_coalesced_and_split_bytes_give_the_same_events() -> None:
    body = b"".join(run_stream(6, crlf=True))
    whole, _ = parse_all([body])  # every frame in one read
    byte_by_byte, _ = parse_all(pieces(body, 1))  # every delimiter split too
    three, _ = parse_all(pieces(body, 3))
    assert [e.payload for e in whole] == [e.payload for e in byte_by_byte] == [e.payload for e in three]
    assert [e.sequence for e in whole] == list(range(6))


def test_a_frame_split_inside_its_crlf_delimiter() -> None:
    data = frame("started", 0, crlf=True)
    head, tail = data[:-1], data[-1:]
    parser = SseParser()
    assert parser.feed(head) == []
    assert [e.name for e in parser.feed(tail)] == ["started"]


# --- bounds ---------------------------------------------------------------------------------------------


def test_a_frame_over_one_mib_is_an_error() -> None:
    big = frame("chunk", 0, {"content": "x" * MAX_FRAME_BYTES})
    with pytest.raises(StreamError, match="buffer exceeds"):
        parse_all([big])
    with pytest.raises(StreamError, match="buffer exceeds"):  # arriving in pieces, before its end is seen
        parse_all(pieces(big, 64 * 1024))


def test_a_buffer_of_exactly_one_mib_is_accepted() -> None:
    head = frame("chunk", 0, {"content": ""})
    data = frame("chunk", 0, {"content": "x" * (MAX_FRAME_BYTES - len(head))})
    assert len(data) == MAX_FRAME_BYTES
    events, _ = parse_all([data])
    assert len(events) == 1


def test_the_buffer_is_checked_before_frames_are_extracted() -> None:
    """As the real parser: small whole frames arriving in one read of over 1 MiB are still refused."""
    comment = b": " + b"k" * 1000 + b"\n\n"
    body = comment * (MAX_FRAME_BYTES // len(comment) + 1)
    assert len(body) > MAX_FRAME_BYTES
    with pytest.raises(StreamError, match="buffer exceeds"):
        parse_all([body])
    _, parser = parse_all(pieces(body, 64 * 1024))  # the same bytes in smaller reads are fine
    assert parser.comments == MAX_FRAME_BYTES // len(comment) + 1


def test_a_body_over_64_mib_is_an_error() -> None:
    comment = b": " + b"k" * (256 * 1024 - 4) + b"\n\n"
    parser = SseParser()
    with pytest.raises(StreamError, match="body exceeds"):
        for _ in range(MAX_STREAM_BYTES // len(comment) + 1):
            parser.feed(comment)
    assert parser.total_bytes == MAX_STREAM_BYTES + len(comment)


def test_more_than_100000_events_is_an_error() -> None:
    parser = SseParser()
    batch = 1000
    with pytest.raises(StreamError, match="more than 100000 events"):
        for start in range(0, MAX_STREAM_EVENTS + batch, batch):
            parser.feed(b"".join(b'data: {"event":"chunk","sequence":%d}\n\n' % i for i in range(start, start + batch)))
    assert parser.events == MAX_STREAM_EVENTS + 1


# --- sequences ------------------------------------------------------------------------------------------


def test_a_gap_in_sequences_is_an_error() -> None:
    with pytest.raises(StreamError, match="sequence 2 where 1 was expected"):
        read_stream([frame("started", 0), frame("chunk", 2), frame("completed", 3, OUTPUT)])


@pytest.mark.parametrize("sequence", ["1", 1.0, True, None])
def test_a_sequence_must_be_an_integer(sequence: Any) -> None:
    with pytest.raises(StreamError, match="integer sequence"):
        parse_all([frame("started", 0), frame("chunk", sequence)])


def test_sequences_start_at_the_cursor() -> None:
    with pytest.raises(StreamError, match="sequence 0 where 5 was expected"):
        read_stream(run_stream(3), cursor=5)
    result = read_stream([frame("chunk", 5, {"content": "a"}), frame("completed", 6, OUTPUT)], cursor=5)
    assert [e.sequence for e in result.events] == [5, 6] and result.output == OUTPUT


def test_data_must_be_a_json_object() -> None:
    with pytest.raises(StreamError, match="not JSON"):
        parse_all([b"event: started\ndata: {nope\n\n"])
    with pytest.raises(StreamError, match="not a JSON object"):
        parse_all([b"event: started\ndata: [0]\n\n"])


# --- terminal events ------------------------------------------------------------------------------------


def test_a_stream_with_no_terminal_event_is_an_error() -> None:
    with pytest.raises(StreamError, match="without a terminal event"):
        read_stream(run_stream(4)[:-1])
    with pytest.raises(StreamError, match="without a terminal event"):
        read_stream([])
    cut = frame("completed", 1, OUTPUT)[:-1]  # the terminal frame never ended
    with pytest.raises(StreamError, match="without a terminal event"):
        read_stream([frame("started", 0), cut])


def test_completed_data_is_the_output_itself() -> None:
    result = read_stream([frame("started", 0), frame("completed", 1, OUTPUT)])
    assert result.kind == "completed" and result.output == OUTPUT
    # A wrapper is not unwrapped: it reaches the user as the output, with raw/token_usage out of place.
    wrapped = {"status": "completed", "exit_status": 0, "output": OUTPUT}
    assert read_stream([frame("completed", 0, wrapped)]).output == wrapped
    with pytest.raises(StreamError, match="no output object"):
        read_stream([frame("completed", 0, "case triaged")])


def test_cancelled_and_failed_results_carry_the_data_as_details() -> None:
    cancelled = read_stream([frame("started", 0), frame("cancelled", 1, {"status": "cancelled", "pid": 9})])
    assert cancelled.kind == "cancelled" and cancelled.details == {"status": "cancelled", "pid": 9}
    assert cancelled.output is None
    data = {"status": "failed", "error_type": "TimeoutError", "message": "m", "uncertain_outcome": True}
    failed = read_stream([frame("failed", 0, data)])
    assert failed.kind == "failed" and failed.details == data
    assert failed.error_code == "execution_failed" and failed.retryable is False


def test_the_first_terminal_event_decides() -> None:
    body = [frame("completed", 0, OUTPUT), frame("failed", 1, {"status": "failed"}), frame("chunk", 3)]
    result = read_stream(body)  # what follows the first terminal event is not read, not even a gap
    assert result.kind == "completed" and [e.name for e in result.events] == ["completed"]


def test_the_first_terminal_event_decides_within_one_read() -> None:
    body = frame("cancelled", 0, {"status": "cancelled"}) + frame("completed", 1, OUTPUT) + frame("chunk", 7)
    result = read_stream([body])
    assert result.kind == "cancelled" and [e.sequence for e in result.events] == [0]


def test_draining_past_the_terminal_event() -> None:
    closed = read_stream([frame("completed", 0, OUTPUT)], drain=lambda: True)
    assert closed.closed_after_terminal is True and closed.bytes_after_terminal == 0
    beating = read_stream(
        [frame("completed", 0, OUTPUT) + b": keep-alive\n\n", b": keep-alive\n\n"], drain=lambda: False
    )
    assert beating.closed_after_terminal is False and beating.bytes_after_terminal == 2 * len(b": keep-alive\n\n")


# --- chunks ---------------------------------------------------------------------------------------------


def test_chunk_text_and_kinds() -> None:
    chunks = [
        {"content": "llm ", "channel": "llm"},
        {"content": "tool ", "channel": "tools"},
        {"content": "msg ", "channel": "messages"},
        {"content": "other ", "channel": "custom"},
        {"content": "none "},
        {"data": {"chunk": "nested "}, "channel": "llm"},  # no content: data.data.chunk
        {"content": "wins ", "data": {"chunk": "loses"}},
        {"channel": "llm"},  # no text at all: not a chunk of text
    ]
    body = [frame("chunk", i, data) for i, data in enumerate(chunks)] + [frame("completed", len(chunks), OUTPUT)]
    result = read_stream(body)
    assert [(c.kind, c.text) for c in result.chunks] == [
        ("data", "llm "),
        ("tool", "tool "),
        ("data", "msg "),
        ("progress", "other "),
        ("progress", "none "),
        ("data", "nested "),
        ("progress", "wins "),
    ]
    assert result.text == "llm tool msg other none nested wins "


def test_a_coalesced_chunk_of_several_words() -> None:
    """One chunk event carrying what the model streamed in several pieces reads as one piece of text."""
    body = b"".join(
        [
            frame("started", 0),
            frame("chunk", 1, {"content": "case triaged", "channel": "llm"}),
            frame("completed", 2, OUTPUT),
        ]
    )
    result = read_stream([body])
    assert [(c.kind, c.text, c.sequence) for c in result.chunks] == [("data", "case triaged", 1)]
