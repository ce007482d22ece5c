"""Text chunks coalesce into events once a job has spent a quarter of its events, in order, within the event bound,
at most one a window; anything else is sent at once, after the text before it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
import pytest

from protocol import Chunk, WorkerSettings
from worker.chunks import FIRST_WINDOW, MAX_JOINED_BYTES, Coalescer


def text(content: str, agent: str = "Writer") -> Chunk:
    """A plain text chunk's message as the worker makes it (``worker.operations.chunk_message``)."""
    fields = {"task_index": 0, "task_name": "", "task_id": "", "agent_role": agent, "agent_id": "a1"}
    return Chunk("llm", {"content": content, "chunk_type": "text", **fields, "tool_call": None, "channel": "llm"})


def tool() -> Chunk:
    call = {"tool_id": "x", "tool_name": "search", "arguments": "{}", "index": 0}
    return Chunk("tools", {"content": "", "chunk_type": "tool_call", "tool_call": call, "channel": "tools"})


def coalescer(
    budget: int = 1000,
    max_bytes: int = 262144,
    clock: Callable[[], float] = time.monotonic,
    secrets: tuple[str, ...] = (),
) -> tuple[Coalescer, list[Chunk]]:
    sent: list[Chunk] = []
    settings = WorkerSettings(max_events=budget, max_event_bytes=max_bytes)
    return Coalescer(sent.append, settings, clock, secrets), sent


def contents(sent: list[Chunk]) -> str:
    return "".join(chunk.data["content"] for chunk in sent)


def spend(chunks: Coalescer, events: int) -> None:
    """Send ``events`` chunk events (tool calls, which never wait), so the budget is that far spent."""
    for _ in range(events):
        chunks.add(tool())


def test_a_short_stream_is_a_chunk_an_event_as_the_reference_sends_it() -> None:
    async def main() -> list[Chunk]:
        chunks, sent = coalescer()
        for i in range(249):
            chunks.add(text(f"{i} "))
        return sent

    sent = asyncio.run(main())
    assert len(sent) == 249 and [c.data["content"] for c in sent] == [f"{i} " for i in range(249)]


def test_past_a_quarter_of_the_budget_a_flood_is_one_event_per_window_with_every_text_in_order() -> None:
    async def main() -> list[Chunk]:
        chunks, sent = coalescer(clock=lambda: 0.0)  # the whole flood inside one window, however slow the machine
        spend(chunks, 250)
        for i in range(3000):
            chunks.add(text(f"{i} "))
        chunks.flush()
        return sent[250:]

    sent = asyncio.run(main())
    assert contents(sent) == "".join(f"{i} " for i in range(3000))
    assert len(sent) == 1
    assert all(list(c.data) == list(text("").data) and c.channel == "llm" for c in sent)  # the reference's shape


def test_held_text_is_sent_when_its_window_passes_with_nothing_after_it() -> None:
    async def main() -> tuple[list[Chunk], float]:
        sent: list[Chunk] = []
        arrived = asyncio.Event()
        chunks = Coalescer(lambda chunk: (sent.append(chunk), arrived.set()), WorkerSettings())
        spend(chunks, 250)
        arrived.clear()
        began = time.monotonic()
        chunks.add(text("held "))
        chunks.add(text("too"))
        await asyncio.wait_for(arrived.wait(), 5)  # its timer sends it: nothing else comes
        return sent[250:], time.monotonic() - began

    sent, waited = asyncio.run(main())
    assert [c.data["content"] for c in sent] == ["held too"]
    assert waited < FIRST_WINDOW + 1  # sent by its timer, not at the stream's end


def test_a_tool_call_or_another_agent_sends_the_held_text_first() -> None:
    async def main() -> list[Chunk]:
        chunks, sent = coalescer()
        spend(chunks, 250)
        for piece in ("a", "b"):
            chunks.add(text(piece))
        chunks.add(tool())
        chunks.add(text("c"))
        chunks.add(text("d", agent="Reviewer"))
        chunks.flush()
        return sent[250:]

    sent = asyncio.run(main())
    assert [(c.channel, c.data["content"], c.data.get("agent_role")) for c in sent] == [
        ("llm", "ab", "Writer"),  # within the window of the last event: held, and joined
        ("tools", "", None),
        ("llm", "c", "Writer"),
        ("llm", "d", "Reviewer"),
    ]


@pytest.mark.parametrize("piece", ["x", '"', "\u2028", "é\n"])
def test_a_coalesced_event_never_exceeds_the_event_bound(piece: str) -> None:
    bound = 2048

    async def main() -> list[Chunk]:
        # A clock that stands still: its window never ends on time, so only the bound ends a coalesced event
        # (on the real clock a loaded machine ended some early, and none was filled up to the bound).
        chunks, sent = coalescer(budget=8, max_bytes=bound, clock=lambda: 0.0)
        spend(chunks, 2)
        for _ in range(3000):
            chunks.add(text(piece))
        chunks.flush()
        return sent[2:]

    sent = asyncio.run(main())
    sizes = [len(orjson.dumps(c.data)) for c in sent]
    assert max(sizes) <= bound and max(sizes) > bound - 12  # filled up to the bound, never past it
    assert contents(sent) == piece * 3000


def test_joined_text_stops_at_64_kib_whatever_the_event_bound() -> None:
    async def main() -> list[Chunk]:
        chunks, sent = coalescer(max_bytes=4 * 1024 * 1024, clock=lambda: 0.0)
        spend(chunks, 250)
        for _ in range(40):
            chunks.add(text("x" * 4096))
        chunks.flush()
        return sent[250:]

    sent = asyncio.run(main())
    sizes = [len(orjson.dumps(c.data)) for c in sent]
    assert len(sent) == 3 and max(sizes) <= MAX_JOINED_BYTES < sum(sizes)
    assert contents(sent) == "x" * 4096 * 40


def test_the_window_doubles_at_each_eighth_of_the_budget() -> None:
    windows: list[float] = []
    chunks, _ = coalescer(budget=80)
    for _ in range(80):
        windows.append(chunks._window())
        chunks.add(tool())
    assert windows[:20] == [0.0] * 20
    assert windows[20::10] == [FIRST_WINDOW * 2**stage for stage in range(6)]
