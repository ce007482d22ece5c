"""Every ``StopReason`` in every phase it can meet a job in, and the races between a stop and the job's own
progress: a stop during the spawn, a cancel before ``started``, a stop while the terminal event is being written."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import psutil

from tests.conftest import gone
from tests.supervisor.jobs.harness import DEADLINE, core, identity, in_loop

HANG = ["started", "hang"]


def alive_and_ours(pid: int, ancestor: int) -> tuple[int, float]:
    """Before a kill is checked: the process runs and descends from ``ancestor``; its pid and start time, for
    ``gone`` (which a pid that never was, or another's, would pass)."""
    process = psutil.Process(pid)
    assert process.status() != psutil.STATUS_ZOMBIE, f"{pid} has already exited"
    assert ancestor in {parent.pid for parent in process.parents()}, f"{pid} does not descend from {ancestor}"
    return pid, process.create_time()


@in_loop
async def test_a_cancel_kills_the_running_worker_and_proves_it(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(HANG)
        await it.running()
        worker = it.launcher.workers[0]
        alive_and_ours(worker.pid, os.getpid())
        await it.cancel("job", "enough")
        event, data = await it.settled()
        assert event == "cancelled" and data["status"] == "cancelled" and data["reason"] == "enough"
        assert data["stop_confirmed"] is True and data["pid"] == worker.pid and data["signal"] == "SIGKILL"
        assert gone(worker.pid, worker.create_time)


@in_loop
async def test_a_cancel_kills_the_workers_tree_even_what_left_its_group(tmp_path: Path) -> None:
    pids = tmp_path / "tree.pids"
    async with core(tmp_path) as it:
        await it.start(["tree", "started", "hang"], pids=str(pids))
        await it.running()
        worker = it.launcher.workers[0]
        child, escaped = (alive_and_ours(int(pid), worker.pid) for pid in pids.read_text().split())
        await it.cancel("job", None)
        event, data = await it.settled()
        assert event == "cancelled" and data["stop_confirmed"] is True and data["descendants_killed"] >= 2
        assert data["reason"] == "cancelled by request"
        assert gone(*child) and gone(*escaped) and gone(worker.pid, worker.create_time)


@in_loop
async def test_a_stop_grace_lets_a_worker_leave_on_sigterm_and_kills_one_that_ignores_it(tmp_path: Path) -> None:
    async with core(tmp_path, stop_grace_ms="2000") as it:
        await it.start(HANG, action_id="polite")
        await it.start(["ignore-term", "started", "hang"], action_id="deaf")
        await it.running("polite")
        await it.running("deaf")
        await asyncio.gather(it.cancel("polite", None), it.cancel("deaf", None))
        assert (await it.settled("polite"))[1]["signal"] == "SIGTERM"
        assert (await it.settled("deaf"))[1]["signal"] == "SIGKILL"


@in_loop
async def test_a_cancel_before_started_kills_a_worker_that_never_began(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["hang"])
        await it.phase_reached("job", "running")  # Start sent; the worker never says started
        await it.cancel("job", None)
        event, data = await it.settled()
        assert event == "cancelled" and data["stop_confirmed"] is True
        assert [name for name, _ in it.events()] == ["cancelled"]
        assert gone(*identity(it))


@in_loop
async def test_a_stop_during_the_spawn_kills_the_worker_before_it_has_its_job(
    tmp_path: Path, phases: dict[str, list[str]]
) -> None:
    async with core(tmp_path) as it:
        it.launcher.gate.clear()
        await it.start(["started", "complete"])  # would complete at once, if it were sent its Start
        async with asyncio.timeout(DEADLINE):
            await it.launcher.spawning.wait()
        cancel = asyncio.ensure_future(it.cancel("job", None))
        await asyncio.sleep(0)  # the cancel is asked while the spawn still waits
        it.launcher.gate.set()
        await cancel
        event, data = await it.settled()
        assert event == "cancelled" and data["stop_confirmed"] is True
        assert [name for name, _ in it.events()] == ["cancelled"]  # never started: it had no Start
        assert phases["job"] == ["launching", "running", "settling", "settled"]
        assert gone(*identity(it))


@in_loop
async def test_a_queued_job_cancelled_never_launches(tmp_path: Path, phases: dict[str, list[str]]) -> None:
    async with core(tmp_path, max_concurrency="1") as it:
        await it.start(HANG, action_id="first")
        await it.start(["started", "complete"], action_id="queued")
        await it.running("first")
        await it.cancel("queued", "not needed")
        event, data = await it.settled("queued")
        assert event == "cancelled" and data == {
            "status": "cancelled",
            "reason": "not needed",
            "stop_confirmed": True,
            "launched": False,
        }
        assert phases["queued"] == ["settling", "settled"] and len(it.launcher.workers) == 1


@in_loop
async def test_a_timeout_kills_a_running_job_uncertain(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(HANG, timeout_ms=300)
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "timeout" and data["error_type"] == "TimeoutError"
        assert data["uncertain_outcome"] is True and data["stop_confirmed"] is True
        assert gone(*identity(it))


@in_loop
async def test_a_timeout_in_the_queue_is_certain(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it:
        await it.start(HANG, action_id="first")
        await it.start(["started", "complete"], action_id="late", timeout_ms=200)
        event, data = await it.settled("late")
        assert event == "failed" and data["reason"] == "timeout" and data["uncertain_outcome"] is False
        assert data["message"] == "no worker slot within timeout_ms=200"


@in_loop
async def test_a_broken_limit_kills_without_grace_and_says_which(tmp_path: Path) -> None:
    async with core(tmp_path, worker_max_output_bytes="1024", stop_grace_ms="5000", limit_sample_ms="10") as it:
        await it.start(["started", "shout", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["error_type"] == "output_limit_exceeded"
        assert data["uncertain_outcome"] is True and data["signal"] == "SIGKILL"  # no grace to grow in
        assert data["output_bytes"] > 1024 and data["stop_confirmed"] is True


@in_loop
async def test_a_drain_fails_the_queued_certain_and_lets_the_running_finish(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it:
        await it.start(["started", "hang"], action_id="running")
        await it.start(["started", "complete"], action_id="queued")
        await it.running("running")
        skip = asyncio.Event()
        stopping = asyncio.ensure_future(it.sup.stop(60, skip))
        try:
            event, data = await it.settled("queued")
            assert event == "failed" and data["reason"] == "supervisor_stopped" and data["uncertain_outcome"] is False
            assert "running" in it.sup.roster and not stopping.done()  # a drain kills nothing while it waits
        finally:
            skip.set()  # a second signal: the wait ends, and what still runs is killed
        await stopping
        event, data = await it.settled("running")
        assert event == "failed" and data["reason"] == "supervisor_stopped"
        assert data["uncertain_outcome"] is True and data["stop_confirmed"] is True
        assert gone(*identity(it))


@in_loop
async def test_the_first_stop_wins(tmp_path: Path) -> None:
    async with core(tmp_path, stop_grace_ms="2000") as it:
        await it.start(["ignore-term", "started", "hang"], timeout_ms=60_000)
        await it.running()
        cancel = asyncio.ensure_future(it.cancel("job", "first"))
        await it.phase_reached("job", "settling")
        await it.sup.stop()  # while the cancel's grace runs: the job stays cancelled
        await cancel
        event, data = await it.settled()
        assert event == "cancelled" and data["reason"] == "first"


@in_loop
async def test_a_cancel_or_timeout_while_the_terminal_event_is_written_keeps_the_outcome(tmp_path: Path) -> None:
    go = tmp_path / "go"
    async with core(tmp_path) as it:
        # Its timeout is to pass while the terminal write waits; long enough that it starts first at load 10.
        await it.start(["started", "await-go", "complete"], timeout_ms=4_000, go=str(go))
        await it.running()
        # Another process's write lock holds the terminal write back: the outcome is decided, not yet durable.
        other = sqlite3.connect(it.journal.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        go.touch()
        try:
            await it.phase_reached("job", "settling")
            job = it.sup.roster.get("job")
            assert job.worker is not None
            async with asyncio.timeout(DEADLINE):
                await job.worker.exited
                while asyncio.get_running_loop().time() < job.deadline:  # its timeout passes meanwhile
                    await asyncio.sleep(0.02)
            cancel = asyncio.ensure_future(it.cancel("job", "too late"))
            await asyncio.sleep(0)  # the cancel asks, and waits for the job's end
            assert not cancel.done() and job.stop is None  # refused: the terminal event is the outcome
            assert [name for name, _ in it.events()] == ["started"]
        finally:
            other.execute("ROLLBACK")
            other.close()
        await cancel
        event, _ = await it.settled()
        assert event == "completed"
