"""Bulk cancel (``POST /jobs/cancel``) in every phase a live job can be in, its filters and its bound, on the job
core with scripted workers: a queued job ends without a worker, a running one is killed with the single cancel's
proof, and what does not match goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from supervisor.jobs import supervisor
from tests.conftest import gone
from tests.supervisor.jobs.harness import CANCEL_DEADLINE, DEADLINE, core, in_loop

HANG = ["started", "hang"]


async def bulk_cancel(client: Any, **body: Any) -> dict[str, Any]:
    async with asyncio.timeout(CANCEL_DEADLINE):
        response = await client.post("/jobs/cancel", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


@in_loop
async def test_each_phase_is_chosen_apart_and_a_running_job_is_killed_with_proof(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it, it.http() as client:
        await it.start(HANG, action_id="busy")
        await it.running("busy")
        for name in ("wait-1", "wait-2"):
            await it.start(HANG, action_id=name)
        await it.phase_reached("wait-2", "queued")

        answer = await bulk_cancel(client, phase="queued", reason="not now")
        assert (answer["more"], answer["dry_run"]) == (0, False)
        assert [job["action_id"] for job in answer["jobs"]] == ["wait-1", "wait-2"]  # oldest first
        for job in answer["jobs"]:
            assert (job["phase_before"], job["status"], job["terminal"]["reason"]) == ("queued", "cancelled", "not now")
            assert job["terminal"]["stop_confirmed"] is True and job["terminal"]["launched"] is False
        assert it.sup.roster.get("busy").phase == "running"  # another phase: untouched

        listed = await bulk_cancel(client, phase="running", dry_run=True)
        assert [(job["action_id"], job["status"], job["terminal"]) for job in listed["jobs"]] == [
            ("busy", "running", None)
        ]
        assert it.sup.roster.get("busy").stop is None  # a dry run asks nothing
        worker = it.launcher.workers[0]
        (killed,) = (await bulk_cancel(client, phase="running"))["jobs"]
        assert (killed["status"], killed["terminal"]["reason"]) == ("cancelled", "cancelled by request")
        assert killed["terminal"]["pid"] == worker.pid and killed["terminal"]["signal"] == "SIGKILL"
        assert killed["terminal"]["stop_confirmed"] is True and killed["exit_status"] == -9
        assert gone(worker.pid, worker.create_time)
        assert (await bulk_cancel(client, all=True))["jobs"] == []  # nothing live is left


@in_loop
async def test_a_launching_job_is_cancelled_before_its_worker_gets_its_job(tmp_path: Path) -> None:
    async with core(tmp_path) as it, it.http() as client:
        it.launcher.gate.clear()
        await it.start(HANG, action_id="spawning")
        await it.phase_reached("spawning", "launching")
        cancelling = asyncio.ensure_future(bulk_cancel(client, phase="launching"))
        # The cancel is asked while its spawn still waits.
        await asyncio.wait_for(it.sup.roster.get("spawning").stopped.wait(), DEADLINE)
        it.launcher.gate.set()
        (job,) = (await cancelling)["jobs"]
        assert (job["phase_before"], job["status"]) == ("launching", "cancelled")
        assert job["terminal"]["stop_confirmed"] is True


@in_loop
async def test_one_request_cancels_at_most_the_bound_and_says_how_many_are_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor, "MAX_BULK_CANCEL", 2)
    async with core(tmp_path, max_concurrency="1") as it, it.http() as client:
        for n in range(3):
            await it.start(HANG, action_id=f"job-{n}")
        await it.running("job-0")
        first = await bulk_cancel(client, crew_id="scripted")
        assert first["more"] == 1
        assert [job["action_id"] for job in first["jobs"]] == ["job-0", "job-1"]
        second = await bulk_cancel(client, crew_id="scripted")
        assert (second["more"], [job["action_id"] for job in second["jobs"]]) == (0, ["job-2"])


@in_loop
async def test_filters_that_match_nothing_touch_nothing(tmp_path: Path) -> None:
    async with core(tmp_path) as it, it.http() as client:
        await it.start(HANG, action_id="stays")
        await it.running("stays")
        for body in ({"crew_id": "another"}, {"operation": "train"}, {"crew_id": "scripted", "phase": "queued"}):
            assert (await bulk_cancel(client, **body))["jobs"] == [], body
        assert it.sup.roster.get("stays").stop is None
        await it.cancel("stays")


@in_loop
async def test_a_job_that_completed_as_the_cancel_came_is_named_without_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job named while running can complete before its cancel takes hold: its row in the answer keeps its status
    and drops its output, which its terminal repeats, so 1,000 rows stay bounded. The race is forced: the cancel
    of "done" is held until that job has completed."""
    async with core(tmp_path) as it, it.http() as client:
        go = tmp_path / "go"
        await it.start(["started", "await-go", "complete"], action_id="done", go=str(go))
        await it.start(HANG, action_id="hung")
        for name in ("done", "hung"):
            await it.running(name)
        cancel = it.sup.runner.cancel

        async def late_for_done(action_id: str, reason: str | None) -> None:
            if action_id == "done":
                go.touch()
                assert (await it.settled("done"))[0] == "completed"
            await cancel(action_id, reason)

        monkeypatch.setattr(it.sup.runner, "cancel", late_for_done)
        rows = {row["action_id"]: row for row in (await bulk_cancel(client, all=True))["jobs"]}
        assert (rows["done"]["status"], rows["done"]["output"], rows["done"]["terminal"]) == ("completed", None, None)
        assert rows["done"]["phase_before"] == "running"
        assert rows["hung"]["status"] == "cancelled" and rows["hung"]["terminal"]["stop_confirmed"] is True
        whole = await client.get("/jobs/done")
        assert whole.json()["output"]["raw"] == "done"  # the record itself keeps it
