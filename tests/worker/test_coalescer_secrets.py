"""No secret of a job is cut between two of its chunk events, so the supervisor, which masks a secret where an event
holds it whole, masks it however the model streamed it: the text that may begin a secret waits for what follows it,
however the stream is cut, whether the coalescer sends a chunk an event or joins them, however long the model
stalls; and it is sent as it is when the stream ends or something else comes."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator

import pytest

from protocol import Chunk
from tests.worker.test_coalescer import coalescer, contents, spend, text, tool
from worker.chunks import FIRST_WINDOW, Beginnings

KEY = "sk-4fQ9zX"  # beside one that begins as it does, one that repeats its own beginning, and one whose end begins KEY
ENDS_AS_KEY_BEGINS = "pw-9zXs"
SECRETS = (KEY, "sk-4fQ-other1", "aaXaaXaaY", ENDS_AS_KEY_BEGINS)
LEAST = 6  # the shortest part of a secret that would give it away (supervisor/redaction.py's MIN_FRAGMENT_CHARS)
PARTS = {secret[i:j] for secret in SECRETS for i in range(len(secret)) for j in range(i + LEAST, len(secret))}


def cuts(whole: str, first: int, last: int) -> Iterator[list[str]]:
    """``whole`` cut in pieces at every set of the places from ``first`` to ``last``: 2 to N pieces."""
    places = range(first, last + 1)
    for count in range(1, len(places) + 1):
        for chosen in itertools.combinations(places, count):
            bounds = (0, *chosen, len(whole))
            yield [whole[start:end] for start, end in itertools.pairwise(bounds)]


def assert_whole(sent: list[Chunk], streamed: str) -> None:
    """Every text streamed is sent, in order, and no secret in it straddles two events: with each secret masked
    (the longest first, as the supervisor masks them), no event holds a part of one of LEAST characters or more."""
    events = [chunk.data["content"] for chunk in sent]
    assert "".join(events) == streamed
    edges = set(itertools.accumulate(map(len, events)))
    for secret in SECRETS:
        at = streamed.find(secret)
        while at != -1:
            assert not [edge for edge in edges if at < edge < at + len(secret)], (secret, events)
            at = streamed.find(secret, at + 1)
    for event in events:
        for secret in sorted(SECRETS, key=len, reverse=True):
            event = event.replace(secret, "\0")
        assert not [part for part in PARTS if part in event], (event, events)


@pytest.mark.parametrize(
    "streamed, first, last",
    [
        (f"key {KEY} ok", 3, 4 + len(KEY)),  # cut anywhere from the space before it to the one after
        ("say aaXaaXaaXaaY.", 4, 16),  # it starts at its own second beginning
        (f"{KEY}{KEY}", 4, len(KEY) + 5),  # one right after the other
        (f"key {ENDS_AS_KEY_BEGINS} ok", 3, 6 + len(ENDS_AS_KEY_BEGINS)),  # whole, its last character may begin KEY
    ],
)
@pytest.mark.parametrize("joined", [False, True], ids=["a chunk an event", "coalescing"])
def test_a_secret_cut_anywhere_in_any_number_of_chunks_is_sent_whole(
    streamed: str, first: int, last: int, joined: bool
) -> None:
    """A chunk an event (the budget's first quarter), or past it with each chunk coming once its window has passed,
    so each is sent as it comes; either way the held beginning is sent only with the rest of its secret."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each chunk comes after its window: the coalescer sends what it has at once
        return now[0]

    async def main() -> None:
        for pieces in cuts(streamed, first, last):
            chunks, sent = coalescer(budget=8, clock=clock, secrets=SECRETS)
            spend(chunks, 2 if joined else 0)
            for piece in pieces:
                chunks.add(text(piece))
            chunks.flush()
            assert_whole(sent[2 if joined else 0 :], streamed)

    asyncio.run(main())


def test_streams_cut_at_random_with_windows_passing_at_random_keep_every_secret_whole() -> None:
    rng = random.Random(55)
    alphabet = "sk-4fQ9zXaY "

    async def main() -> None:
        now = [0.0]
        for _ in range(3000):
            chunks, sent = coalescer(budget=40, clock=lambda: now[0], secrets=SECRETS)
            spent = rng.choice([0, 12, 30])  # a chunk an event; joined a window; a window 16 times longer
            spend(chunks, spent)
            streamed = "".join(rng.choice([*alphabet, *SECRETS]) for _ in range(rng.randrange(1, 30)))
            at = 0
            while at < len(streamed):
                size = rng.randrange(1, 8)
                chunks.add(text(streamed[at : at + size]))
                at += size
                now[0] += rng.choice([0.0, 0.0, FIRST_WINDOW / 2, FIRST_WINDOW * 2, 10.0])
            chunks.flush()
            assert_whole(sent[spent:], streamed)

    asyncio.run(main())


def test_a_stalled_model_s_text_is_sent_on_time_but_for_what_may_begin_a_secret() -> None:
    """Past a quarter of the budget its window's timer sends the text held; the end that may begin a secret waits
    for the model's next chunk, however long that takes, and goes out joined to it (at once: its window has passed),
    whole."""

    async def main() -> tuple[list[Chunk], list[Chunk]]:
        arrived = asyncio.Event()
        chunks, sent = coalescer(secrets=SECRETS)
        spend(chunks, 250)
        chunks._send = lambda chunk: (sent.append(chunk), arrived.set())
        chunks.add(text("the key is "))
        chunks.add(text("sk-4f"))
        await asyncio.wait_for(arrived.wait(), 5)  # its window's timer: nothing else comes
        await asyncio.sleep(4 * FIRST_WINDOW)  # the model stalls: no timer sends the beginning held
        stalled = list(sent[250:])
        chunks.add(text("Q9zX, "))
        chunks.add(text("see?"))
        chunks.flush()
        return stalled, sent[250:]

    stalled, sent = asyncio.run(main())
    assert [chunk.data["content"] for chunk in stalled] == ["the key is "]
    assert [chunk.data["content"] for chunk in sent] == ["the key is ", f"{KEY}, ", "see?"]


def test_what_may_begin_a_secret_is_sent_as_it_is_when_the_stream_ends_or_something_else_comes() -> None:
    async def main() -> list[Chunk]:
        chunks, sent = coalescer(secrets=SECRETS)
        chunks.add(text("a key: sk-4f"))
        chunks.add(tool())  # a tool call: the text before it goes first
        chunks.add(text("then sk-"))
        chunks.add(text("4fQ", agent="Reviewer"))  # another agent's text does not continue it
        chunks.add(text("9zX", agent="Reviewer"))
        chunks.flush()  # the stream's end
        return sent

    sent = asyncio.run(main())
    assert [(chunk.data["content"], chunk.data.get("agent_role")) for chunk in sent] == [
        ("a key: ", "Writer"),
        ("sk-4f", "Writer"),
        ("", None),
        ("then ", "Writer"),
        ("sk-", "Writer"),
        ("4fQ", "Reviewer"),  # nothing in them may begin a secret: each sent as it comes
        ("9zX", "Reviewer"),
    ]


def test_an_event_full_to_its_bound_leaves_a_secret_s_beginning_to_the_next() -> None:
    """A flood on a clock that stands still, so only the event bound ends an event: each ends before a secret that
    would not fit, which begins the next one."""

    async def main() -> list[Chunk]:
        chunks, sent = coalescer(budget=8, max_bytes=512, clock=lambda: 0.0, secrets=SECRETS)
        spend(chunks, 2)
        for _ in range(200):
            for piece in ("lorem ", "sk", "-4fQ", "9zX ", "ipsum "):
                chunks.add(text(piece))
        chunks.flush()
        return sent[2:]

    sent = asyncio.run(main())
    assert len(sent) > 10
    assert_whole(sent, f"lorem {KEY} ipsum " * 200)
    assert contents(sent) == f"lorem {KEY} ipsum " * 200


@pytest.mark.parametrize(
    "ending, start",
    [("no secret", 9), ("ends sk", 5), ("sk-4fQ", 0), ("sk-4fQ9zX", 9), ("x aaXaaXaa", 2), ("aaXaaX", 0), ("", 0)],
)
def test_the_start_of_a_possible_secret_is_the_longest_end_that_begins_one(ending: str, start: int) -> None:
    assert Beginnings(SECRETS).start(ending) == start
