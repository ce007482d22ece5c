"""A job's whole life in the core, for every path of the state machine: each move of ``MOVES`` taken, each way a
worker ends its job (answering, failing, dying, breaking the protocol) recorded as the reference would."""

from __future__ import annotations

from pathlib import Path

from protocol import BEFORE_CREW_REASONS, WORKER_REASONS, Reason
from supervisor.jobs.reads import follow
from tests.conftest import gone
from tests.supervisor.jobs.harness import DEADLINE, core, identity, in_loop


@in_loop
async def test_a_completed_job_moves_through_every_phase(tmp_path: Path, phases: dict[str, list[str]]) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "chunk", "chunk", "complete"])
        event, data = await it.settled()
        worker = it.launcher.workers[0]
        assert event == "completed" and data == {"raw": "done", "tasks_output": [], "budget": [0, 0]}
        assert [name for name, _ in it.events()] == ["started", "chunk", "chunk", "completed"]
        assert it.events()[0][1] == {"status": "running", "operation": "run", "pid": worker.pid}
        assert phases["job"] == ["launching", "running", "settling", "settled"]
        job = it.journal.reader.get("job")
        assert job is not None and job.status == "completed" and job.exit_status == 0
        assert (job.worker_pid, job.worker_start_time) == (worker.pid, worker.create_time)
        assert gone(worker.pid, worker.create_time)


@in_loop
async def test_a_failed_crew_fails_its_job_with_the_workers_words(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "fail"])
        event, data = await it.settled()
        assert event == "failed"
        assert data["error_type"] == "ValueError" and data["reason"] == Reason.OPERATION_FAILED
        assert data["uncertain_outcome"] is False and data["exit_status"] == 0


@in_loop
async def test_a_reason_only_the_supervisor_gives_is_never_taken_from_a_worker(tmp_path: Path) -> None:
    """Crew code can write any frame: a ``Failed`` claiming a limit, a stray, a stop or a restart fails its job as a
    protocol error, the claim named apart, never as the supervisor's own finding."""
    forged = [*sorted(set(Reason) - WORKER_REASONS), "no such reason"]
    async with core(tmp_path) as it:
        for index, reason in enumerate(forged):
            await it.start(["started", f"forge:{reason}"], action_id=f"forged-{index}")
        for index, reason in enumerate(forged):
            event, data = await it.settled(f"forged-{index}")
            assert event == "failed" and data["reason"] == Reason.PROTOCOL_ERROR, data
            assert data["worker_reason"] == reason and data["error_type"] == Reason.PROTOCOL_ERROR
            assert data["uncertain_outcome"] is True and reason in data["message"]


@in_loop
async def test_a_reason_found_before_the_crew_runs_is_not_taken_once_it_has(tmp_path: Path) -> None:
    """A worker says ``Building`` before it calls the crew's factory: a registry, crew or sandbox failure it gives
    before that is its own finding; after it, crew code blaming them."""
    reasons = sorted(BEFORE_CREW_REASONS)
    async with core(tmp_path) as it:
        for index, reason in enumerate(reasons):
            await it.start([f"forge:{reason}"], action_id=f"before-{index}")
            await it.start(["building", f"forge:{reason}"], action_id=f"after-{index}")
        for index, reason in enumerate(reasons):
            event, data = await it.settled(f"before-{index}")
            assert event == "failed" and data["reason"] == reason, data
            event, data = await it.settled(f"after-{index}")
            assert event == "failed" and data["reason"] == Reason.PROTOCOL_ERROR, data
            assert data["worker_reason"] == reason


@in_loop
async def test_a_launch_that_fails_goes_from_launching_to_settling(
    tmp_path: Path, phases: dict[str, list[str]]
) -> None:
    async with core(tmp_path) as it:
        it.launcher.refusal = "no more processes"
        await it.start(["started", "complete"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "launch_failed" and data["message"] == "no more processes"
        assert data["uncertain_outcome"] is False  # no worker ever ran it
        assert phases["job"] == ["launching", "settling", "settled"]


@in_loop
async def test_a_worker_that_dies_fails_only_its_own_job(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "exit:3"], action_id="dies")
        await it.start(["started", "complete"], action_id="lives")
        died, data = await it.settled("dies")
        assert died == "failed" and data["exit_status"] == 3 and data["uncertain_outcome"] is True
        assert (await it.settled("lives"))[0] == "completed"


@in_loop
async def test_a_worker_that_closes_its_event_pipe_and_runs_on_is_killed(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "close-events", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "frame_pipe_closed"
        assert data["stop_confirmed"] is True and data["signal"] == "SIGKILL"
        assert gone(*identity(it))


@in_loop
async def test_a_frame_after_the_terminal_one_fails_the_job(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "complete", "late-chunk"])
        event, data = await it.settled()
        assert event == "failed" and data["uncertain_outcome"] is True, data


@in_loop
async def test_a_worker_that_answers_but_stays_is_killed_and_its_answer_kept(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "complete", "linger"])
        event, data = await it.settled()
        assert event == "completed" and data["raw"] == "done"
        job = it.journal.reader.get("job")
        assert job is not None and job.exit_status == -9  # killed after EXIT_WAIT_SECONDS
        assert gone(*identity(it))


@in_loop
async def test_too_many_events_fail_the_job_and_keep_the_last_slot_for_its_terminal(tmp_path: Path) -> None:
    async with core(tmp_path, max_events_per_run="4") as it:
        await it.start(["started", *["chunk"] * 10, "complete"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "event_limit_exceeded"
        assert len(it.events()) == 4  # started, two chunks, the terminal


@in_loop
async def test_a_follower_is_woken_by_each_commit_not_by_its_heartbeat(tmp_path: Path) -> None:
    """The journal's writer thread tells the loop which jobs have new events; a follower waiting on a job that
    gets one reads it then. Without that wake-up it would wait for its heartbeat, which here is the test's
    whole deadline."""
    go = tmp_path / "go"
    async with core(tmp_path) as it:
        await it.start(["started", "await-go", "chunk", "hang"], go=str(go), timeout_ms=int(2 * DEADLINE * 1000))
        await it.running()
        names: list[str] = []
        async for batch in follow(it.journal.reader, it.sup.roster, "job", 0, heartbeat=DEADLINE):
            assert batch is not None, "the follower waited for its heartbeat: no commit woke it"
            names += [event.event for event in batch]
            if names == ["started"]:
                go.touch()  # the chunk comes once the follower has read `started` and waits, then nothing more
            elif names == ["started", "chunk"]:
                await it.cancel()
        assert names == ["started", "chunk", "cancelled"]
