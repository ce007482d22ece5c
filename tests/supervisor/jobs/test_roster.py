"""The roster of live jobs through the real job core: oldest first, counted by phase as the gauges and ``/health``
read them, and each job on it from its admission until its terminal event has committed."""

from __future__ import annotations

from pathlib import Path

from supervisor.enums import Phase
from tests.supervisor.jobs.harness import core, in_loop

DONE = ["started", "complete"]


@in_loop
async def test_the_roster_holds_each_job_from_admission_to_its_committed_end(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it, it.http() as client:
        it.launcher.gate.clear()  # the first job's spawn waits: it stays launching, the others queued
        for action_id in ("first", "second", "third"):
            await it.start(DONE, action_id=action_id)
        await it.phase_reached("first", Phase.LAUNCHING)
        roster = it.sup.roster
        assert [job.action_id for job in roster] == ["first", "second", "third"]  # oldest first
        assert (roster.count(Phase.LAUNCHING, Phase.RUNNING), roster.count(Phase.QUEUED)) == (1, 2)
        assert (await client.get("/health")).json()["active_runs"] == 3
        assert roster.in_phase(Phase.QUEUED) == ["second", "third"]
        it.launcher.gate.set()
        for action_id in ("first", "second", "third"):
            assert (await it.settled(action_id))[0] == "completed"
            assert action_id not in roster and roster.get(action_id) is None  # gone once its end committed
        assert len(roster) == 0 and (await client.get("/health")).json()["active_runs"] == 0
