"""A JSON page of ``GET /jobs/{id}/events`` is bounded in bytes as well as in count, tested at the bound
with real events of chosen sizes: a page that fits exactly, one byte over (split), the largest event."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from supervisor.http.contract import PAGE_DATA_BYTES
from tests.conftest import Server, sse_events, start_body, start_server, stop_server

pytestmark = pytest.mark.usefixtures("launcher")

SSE = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def big_events(tmp_path_factory: pytest.TempPathFactory, launcher: str) -> Iterator[Server]:
    """Events up to the largest MAX_EVENT_BYTES allows (4 MiB of data, the page bound itself), and more
    of them than a page holds: a job's first quarter of its events is a chunk an event (worker/chunks.py), so 1,100
    small chunks are 1,100 events."""
    env = {"AIP_CREWAI_MAX_EVENT_BYTES": "4194304", "AIP_CREWAI_MAX_EVENTS_PER_RUN": "8000"}
    running = start_server(tmp_path_factory.mktemp("pages") / "state", env=env)
    yield running
    stop_server(running)


def run_sized(client: httpx.Client, action: str, sizes: list[int]) -> list[dict[str, Any]]:
    """Run the ``sized`` crew to completion (chunks of ``sizes`` characters); all its events, read as SSE."""
    body = start_body("sized", action, input={"sizes": " ".join(map(str, sizes))})
    answer = client.post("/jobs", json=body, headers={"Idempotency-Key": action})
    assert answer.status_code == 200, answer.text
    with client.stream("GET", f"/jobs/{action}/events", headers=SSE) as response:
        return list(sse_events(response))


def data_bytes(event: dict[str, Any]) -> int:
    """What the bound counts: the event's data as stored, compact JSON (orjson gives it back byte for byte)."""
    return len(orjson.dumps(event["data"]))


def page(client: httpx.Client, action: str, cursor: int) -> dict[str, Any]:
    response = client.get(f"/jobs/{action}/events", params={"cursor": cursor})
    assert response.status_code == 200, response.text
    answer = response.json()
    # The reference's keys, in its order, with its meaning of next_cursor: the first event not returned.
    assert list(answer) == ["action_id", "cursor", "next_cursor", "status", "events"]
    assert answer["cursor"] == cursor and answer["next_cursor"] == cursor + len(answer["events"])
    assert [e["sequence"] for e in answer["events"]] == list(range(cursor, answer["next_cursor"]))
    return answer


def test_a_page_holds_what_fits_in_its_bytes_and_next_cursor_resumes(big_events: Server) -> None:
    with big_events.client() as client:
        # A chunk's data is its text plus CrewAI's fields around it, the same length in every job.
        (probe,) = [e for e in run_sized(client, "probe", [1]) if e["event"] == "chunk"]
        around = data_bytes(probe) - 1
        half = PAGE_DATA_BYTES // 2
        # Chunks 1-5 of exactly half the bound, half, half, half + 1 byte, the whole bound.
        sizes = [half, half, half, half + 1, PAGE_DATA_BYTES]
        events = run_sized(client, "sized-1", [size - around for size in sizes])
        assert [e["event"] for e in events] == ["started", *["chunk"] * 5, "completed"]
        assert [data_bytes(e) for e in events[1:6]] == sizes

        def pages_from(cursor: int) -> list[int]:
            return [e["sequence"] for e in page(client, "sized-1", cursor)["events"]]

        assert pages_from(1) == [1, 2]  # exactly the bound: both fit
        assert pages_from(3) == [3]  # one byte over: split, and the next page starts at the one left out
        assert pages_from(4) == [4]
        assert pages_from(5) == [5]  # the largest event there can be fills a page of its own
        assert pages_from(0) == [0, 1]  # `started` and one half fit, the second half would not
        assert pages_from(6) == [6] and pages_from(7) == []

        # Following next_cursor from 0 reads every event once, in order, as the stream gives them.
        read: list[dict[str, Any]] = []
        cursors = [0]
        while not read or read[-1]["event"] != "completed":
            answer = page(client, "sized-1", cursors[-1])
            assert answer["events"] and answer["status"] == "completed"
            read += answer["events"]
            cursors.append(answer["next_cursor"])
        assert read == events and cursors == [0, 2, 4, 5, 6, 7]  # chunks 2 and 3 fill a page exactly


def test_small_events_are_still_bounded_by_count(big_events: Server) -> None:
    """The count bound stays: 1,000 events to a page however small they are."""
    with big_events.client() as client:
        events = run_sized(client, "many", [1] * 1100)
        assert len(events) == 1102
        first = page(client, "many", 0)
        assert first["next_cursor"] == 1000 and first["events"] == events[:1000]
        assert page(client, "many", 1000)["events"] == events[1000:]
