"""A worker that answers and leaves processes running (an MCP stdio server, a code interpreter not closed): its
answer stands, each process is killed and named in the job's record (``leftovers``), or with ``STRAY_PROCESSES=fail``
the job fails with ``stray_processes`` as it always did, naming them the same way."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol import Reason
from supervisor.enums import Status
from supervisor.logs import JsonFormatter
from supervisor.processes.containment import Boundary, Left
from tests.conftest import gone
from tests.supervisor.jobs.harness import DEADLINE, Core, core, in_loop
from tests.supervisor.jobs.test_stops import alive_and_ours

# A child in the worker's group and one in a session of its own; the worker answers once a sample has seen both (the
# scripted core runs without cgroups: a process that left the group is the job's by a sample alone).
LEAVES = ["tree", "started", "await-go", "complete"]


async def leave_two(it: Core, tmp_path: Path) -> tuple[tuple[int, float], tuple[int, float]]:
    """Start ``LEAVES``; once a sample has journaled both processes it left, let it answer. Their pids, start times."""
    pids, go = tmp_path / "tree.pids", tmp_path / "go"
    await it.start(LEAVES, pids=str(pids), go=str(go))
    await it.running()
    worker = it.launcher.workers[0]
    child, escaped = (alive_and_ours(int(pid), worker.pid) for pid in pids.read_text().split())
    async with asyncio.timeout(DEADLINE):
        while escaped not in Boundary.decode(it.journal.reader.get("job").boundary).tree:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
    go.touch()
    return child, escaped


def named(it: Core, child: tuple[int, float], escaped: tuple[int, float]) -> dict[str, Any]:
    """The record's ``leftovers``, checked to name both processes (each killed, gone) and how each left."""
    job = it.journal.reader.get("job")
    assert job is not None and job.leftovers is not None
    leftovers = orjson.loads(job.leftovers)
    assert leftovers["descendants_killed"] == 2 and leftovers["stop_confirmed"] is True, leftovers
    ways = {process["pid"]: process["left"] for process in leftovers["processes"]}
    assert ways == {child[0]: Left.IN_GROUP, escaped[0]: Left.OWN_SESSION}, leftovers
    assert all("time.sleep(3600)" in process["command"] for process in leftovers["processes"]), leftovers
    assert gone(*child) and gone(*escaped)
    return dict(leftovers)


@in_loop
async def test_a_job_that_answered_and_left_processes_keeps_its_answer_and_names_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "crew_supervisor.jobs")
    async with core(tmp_path) as it:
        child, escaped = await leave_two(it, tmp_path)
        event, data = await it.settled()
        assert event == Status.COMPLETED and data == {"raw": "done", "tasks_output": [], "budget": [0, 0]}
        leftovers = named(it, child, escaped)
        async with it.http() as client:
            record = (await client.get("/jobs/job")).json()
        assert record["status"] == Status.COMPLETED and record["output"] == data and record["exit_status"] == 0
        assert record["leftovers"] == leftovers
        (said,) = [line for line in caplog.records if line.getMessage().startswith("the job's worker left processes")]
        logged = orjson.loads(JsonFormatter().format(said))
        assert logged["descendants_killed"] == 2 and logged["leftovers"] == leftovers["processes"], logged
        plain = await it.start(["started", "complete"], action_id="plain")
        assert plain is not None and (await it.settled("plain"))[0] == Status.COMPLETED
        async with it.http() as client:
            assert (await client.get("/jobs/plain")).json()["leftovers"] is None  # nothing left: nothing named


@in_loop
async def test_with_stray_processes_fail_such_a_job_fails_and_names_them(tmp_path: Path) -> None:
    async with core(tmp_path, stray_processes="fail") as it:
        child, escaped = await leave_two(it, tmp_path)
        event, data = await it.settled()
        assert event == Status.FAILED and data["reason"] == Reason.STRAY_PROCESSES, data
        assert data["descendants_killed"] == 2 and data["stop_confirmed"] is True and data["exit_status"] == 0
        named(it, child, escaped)
