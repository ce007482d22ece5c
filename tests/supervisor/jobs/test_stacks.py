"""A job's stacks and the job's own progress: an answer that comes late (after the ask gave up, or after the job's
result) is nobody's fault, and a job asked for its stacks keeps the outcome it had without the ask."""

from __future__ import annotations

import asyncio
from pathlib import Path

from protocol import MAX_NAME_CHARS, MAX_STACK_BYTES, STACK_CUT
from tests.supervisor.jobs.harness import core, in_loop


@in_loop
async def test_an_answer_after_the_result_leaves_a_completed_job_completed(tmp_path: Path) -> None:
    """The worker's job thread sends its result while its control thread is still writing the stacks asked of it:
    the stacks come after the terminal frame, where any other message fails the job as a protocol fault."""
    async with core(tmp_path) as it:
        await it.start(["started", "await-dump", "complete", "stacks"])
        await it.running()
        asked = asyncio.ensure_future(it.sup.reads.stacks_of("job"))
        event, data = await it.settled()
        assert event == "completed", data
        await asyncio.wait((asked,))  # answered, or given up on as the job ended: never an error of the job


@in_loop
async def test_an_answer_after_the_ask_gave_up_is_not_a_fault(tmp_path: Path) -> None:
    """A worker that answers past the second the ask waits (a thread held the GIL meanwhile) goes on, and its next
    answer goes to the next ask."""
    async with core(tmp_path) as it, it.http() as client:
        go = tmp_path / "go"
        await it.start(["started", "await-dump", "await-go", "stacks", "await-dump", "stacks", "hang"], go=str(go))
        await it.running()
        late = await client.get("/jobs/job/stack")
        assert late.status_code == 504, late.text
        go.touch()
        asked = await client.get("/jobs/job/stack")
        assert asked.status_code == 200 and asked.json()["threads"][0]["name"] == "MainThread", asked.text
        assert it.sup.roster.get("job").phase == "running"
        await it.cancel("job")
        event, _ = await it.settled()
        assert event == "cancelled"


@in_loop
async def test_stacks_nobody_asked_for_are_a_message_out_of_place(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "stacks", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "protocol_error", data
        assert "got Stacks" in data["message"] and data["stop_confirmed"] is True


@in_loop
async def test_an_answer_past_the_bounds_is_held_to_them(tmp_path: Path) -> None:
    """Crew code can write its own answer: the supervisor keeps it within what a worker's would be."""
    async with core(tmp_path) as it, it.http() as client:
        await it.start(["started", "await-dump", "huge-stacks", "hang"])
        await it.running()
        answer = await client.get("/jobs/job/stack")
        assert answer.status_code == 200, answer.text
        first, *_ = threads = answer.json()["threads"]
        assert len(answer.content) < MAX_STACK_BYTES + 4096
        assert len(first["name"]) == MAX_NAME_CHARS and first["ident"] is None
        assert first["stack"].startswith(STACK_CUT) and first["stack"].endswith("innermost call\n")
        assert sum(len(thread["stack"]) for thread in threads) <= MAX_STACK_BYTES
        assert it.sup.roster.get("job").phase == "running"  # the job goes on
        await it.cancel("job")
        await it.settled()
