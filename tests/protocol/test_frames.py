"""Frames and messages: any split of the stream reads back; corrupt input always raises."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    PROTOCOL_VERSION,
    STACK_CUT,
    Building,
    Built,
    Chunk,
    Completed,
    DumpStacks,
    EffectEnded,
    EffectStarted,
    Failed,
    Fork,
    Forked,
    FrameReader,
    FrameTooLarge,
    Hello,
    InvalidDocument,
    Message,
    MessageReader,
    OverBudget,
    Recorded,
    Refused,
    Registry,
    SpanEnded,
    SpanName,
    SpanStarted,
    Spent,
    Stacks,
    Start,
    Started,
    Stop,
    TaskDone,
    TruncatedFrame,
    UnknownMessage,
    VersionMismatch,
    encode,
    innermost,
    pack,
)
from protocol.frames import FrameError
from protocol.messages import _KINDS

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
names = st.text(max_size=10)
environments = st.dictionaries(names, names, max_size=4)
pids = st.integers(1, 2**22)
# One strategy per message type: the round trips below require one for every type the protocol has.
EXAMPLES: dict[type[Message], st.SearchStrategy[Message]] = {
    Start: st.builds(
        Start,
        names,
        names,
        st.just("run"),
        objects,
        st.integers(1, 3_600_000),
        st.none() | environments,
        st.none() | names,
        st.integers(0, 10**9),
        st.integers(0, 10**6),
        st.none() | st.lists(names, max_size=3),
        st.lists(names, max_size=3),
        st.none() | st.lists(objects, max_size=3),
        names,
        names,
    ),
    Stop: st.just(Stop()),
    Recorded: st.builds(Recorded, st.integers(1, 10**6)),
    DumpStacks: st.just(DumpStacks()),
    Stacks: st.builds(Stacks, st.lists(st.fixed_dictionaries({"name": names, "ident": pids, "stack": names}))),
    Hello: st.builds(Hello, pids),
    Registry: st.builds(
        Registry, st.lists(names, max_size=4), st.lists(names, max_size=4), objects, st.dictionaries(names, objects)
    ),
    Built: st.builds(Built, names, st.text(max_size=30)),
    Fork: st.builds(Fork, environments, names),
    Forked: st.builds(Forked, st.just(0) | pids),
    Refused: st.builds(Refused, st.text(max_size=30)),
    Building: st.just(Building()),
    Started: st.just(Started()),
    Chunk: st.builds(Chunk, st.sampled_from(["llm", "tools"]), objects),
    OverBudget: st.builds(OverBudget, st.sampled_from(["max_tokens", "max_llm_calls"])),
    Spent: st.builds(Spent, names, st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 100)),
    EffectStarted: st.builds(EffectStarted, st.integers(1, 10**6), st.sampled_from(["tool", "llm"]), names, names),
    EffectEnded: st.builds(
        EffectEnded,
        st.integers(1, 10**6),
        st.sampled_from(["finished", "failed"]),
        names,
        st.text(max_size=30),
        st.integers(0, 10**9),
        st.integers(0, 10**9),
    ),
    TaskDone: st.builds(TaskDone, st.integers(1, 10**6), st.integers(0, 100), objects, names),
    SpanStarted: st.builds(SpanStarted, names, names, st.sampled_from(list(SpanName)), st.integers(0, 2**63), objects),
    SpanEnded: st.builds(SpanEnded, names, st.integers(0, 2**63), objects, names),
    Completed: st.builds(Completed, objects),
    Failed: st.builds(Failed, names, names, st.text(max_size=30), st.booleans()),
}
messages = st.one_of(*EXAMPLES.values())
# Every type the protocol reads (its registry of kinds) and every type it defines: one left out of the
# registry cannot travel, and its round trip fails.
MESSAGE_TYPES = sorted({*_KINDS.values(), *Message.__subclasses__()}, key=lambda cls: cls.__name__)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=8), st.lists(st.integers(0, 10**6), max_size=20))
def test_any_sequence_survives_any_chunking(sent: list[Message], cuts: list[int]) -> None:
    stream = b"".join(pack(m) for m in sent)
    reader = MessageReader()
    received = [m for piece in split(stream, cuts) for m in reader.feed(piece)]
    reader.close()
    assert received == sent


@pytest.mark.parametrize("message_type", MESSAGE_TYPES, ids=lambda cls: cls.__name__)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_every_message_type_round_trips(message_type: type[Message], data: st.DataObject) -> None:
    assert message_type in EXAMPLES, f"no example strategy for {message_type.__name__}: add one to EXAMPLES"
    message = data.draw(EXAMPLES[message_type])
    assert MessageReader().feed(pack(message)) == [message]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 400), max_size=10))
def test_arbitrary_bytes_parse_or_raise_never_hang(data: bytes, cuts: list[int]) -> None:
    reader = MessageReader(max_bytes=1024)
    try:
        for piece in split(data, cuts):
            reader.feed(piece)
        reader.close()
    except FrameError:
        pass  # the only acceptable failure


def test_one_byte_at_a_time_and_coalesced() -> None:
    stream = pack(Hello(pid=7)) + pack(Started()) + pack(Completed(output={"raw": "x"}))
    reader = MessageReader()
    one_by_one = [m for i in range(len(stream)) for m in reader.feed(stream[i : i + 1])]
    assert one_by_one == MessageReader().feed(stream) == [Hello(7), Started(), Completed({"raw": "x"})]


def test_oversized_length_is_rejected_before_the_body_arrives() -> None:
    reader = FrameReader(max_bytes=10)
    with pytest.raises(FrameTooLarge):
        reader.feed(struct.pack(">I", 11))  # header only: no body was needed to decide


def test_encode_refuses_what_no_reader_would_accept() -> None:
    with pytest.raises(FrameTooLarge):
        encode({"x": "y" * 100}, max_bytes=50)


def test_eof_inside_a_frame_is_truncation() -> None:
    reader = FrameReader()
    frame = encode({"a": 1})
    assert not reader.inside_frame
    reader.feed(frame[:-1])
    assert reader.inside_frame  # what the supervisor's stall timer watches
    assert reader.feed(frame[-1:]) == [{"a": 1}] and not reader.inside_frame
    reader.feed(frame[:-1])
    with pytest.raises(TruncatedFrame):
        reader.close()
    header_only = FrameReader()
    header_only.feed(b"\x00\x00")
    with pytest.raises(TruncatedFrame):
        header_only.close()


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", InvalidDocument),
        (b"[1, 2]", InvalidDocument),
        (b'{"v": %d, "type": "launch"}' % PROTOCOL_VERSION, UnknownMessage),
        (b'{"v": %d, "type": "hello"}' % PROTOCOL_VERSION, UnknownMessage),
        (b'{"v": %d, "type": "hello", "pid": true}' % PROTOCOL_VERSION, UnknownMessage),
        (b'{"v": %d, "type": "hello", "pid": 1, "extra": 2}' % PROTOCOL_VERSION, UnknownMessage),
        (b'{"v": %d, "type": "hello", "pid": 1}' % (PROTOCOL_VERSION + 1), VersionMismatch),
        (b'{"type": "hello", "pid": 1}', VersionMismatch),
    ],
)
def test_corrupt_documents_raise_precisely(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        MessageReader().feed(struct.pack(">I", len(body)) + body)


@pytest.mark.parametrize("stack", ["", "a\n", "é" * 100, "x" * 1000 + "last call\n"])
@pytest.mark.parametrize("limit", [0, 5, len(STACK_CUT) + 3, 64, 10_000])
def test_a_stack_is_cut_to_its_innermost_calls_within_its_bytes(stack: str, limit: int) -> None:
    cut = innermost(stack, limit)
    if len(stack.encode()) <= limit:
        assert cut == stack
    else:
        assert cut.startswith(STACK_CUT) and stack.endswith(cut.removeprefix(STACK_CUT))
        assert len(cut.encode()) <= max(limit, len(STACK_CUT))
