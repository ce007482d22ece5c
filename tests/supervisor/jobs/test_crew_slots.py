"""Per-crew concurrency through the real job core (``CREW_MAX_CONCURRENCY``): a crew's jobs over its bound wait
while other crews' jobs start, a cancel or a timeout of a waiting job frees nothing, a drain ends them as before;
``/workers``, ``/health`` and ``/metrics`` say who waits on what. ``test_slots.py`` holds the order itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from supervisor.config import ConfigError
from tests.supervisor.jobs.harness import Core, core, in_loop

HANG = ["started", "hang"]
DONE = ["started", "complete"]
BOUND_A = {"crews": ("a", "b"), "max_concurrency": "2", "crew_max_concurrency": "a=1"}


async def waiting(client: httpx.AsyncClient) -> dict[str, object]:
    """Each live job's ``waiting``, by action id."""
    return {worker["action_id"]: worker["waiting"] for worker in (await client.get("/workers")).json()["workers"]}


def phase(it: Core, action_id: str) -> str:
    return it.sup.roster.get(action_id).phase


@in_loop
async def test_bounds_naming_a_crew_not_served_refuse_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        async with core(tmp_path, crews=("a", "b"), crew_max_concurrency="a=1,c=1,*=1"):
            pass
    assert str(refused.value) == "AIP_CREWAI_CREW_MAX_CONCURRENCY names crews not served: c (served: a, b)"


@in_loop
async def test_a_crew_at_its_bound_waits_while_another_crew_s_job_starts(tmp_path: Path) -> None:
    async with core(tmp_path, **BOUND_A) as it, it.http() as client:  # type: ignore[arg-type]
        await it.start(HANG, action_id="a1", crew="a")
        await it.running("a1")
        await it.start(DONE, action_id="a2", crew="a")
        await it.start(HANG, action_id="b1", crew="b")
        await it.running("b1")  # started while a2 waits: a slot of the total was free
        assert phase(it, "a2") == "queued"
        assert await waiting(client) == {"a1": None, "a2": {"on": "crew", "running": 1, "limit": 1}, "b1": None}
        assert (await client.get("/health")).json()["crew_max_concurrency"] == {"a": 1}
        metrics = (await client.get("/metrics")).text
        assert 'crew_supervisor_crew_jobs_queued{crew="a"} 1.0' in metrics
        assert 'crew_supervisor_crew_jobs_queued{crew="b"} 0.0' in metrics

        # A waiting job cancelled frees nothing: the next of its crew still waits for a1, no worker was launched.
        await it.start(HANG, action_id="a3", crew="a")
        await it.cancel("a2", "not needed")
        assert (await it.settled("a2"))[1]["launched"] is False
        assert phase(it, "a3") == "queued" and len(it.launcher.workers) == 2
        await it.start(DONE, action_id="b2", crew="b")  # both slots of the total are held now
        assert (await waiting(client))["b2"] == {"on": "slot", "running": 2, "limit": 2}

        # a1 ends: its crew's slot goes to a3 (crew a's last start is older than crew b's), not to b2.
        await it.cancel("a1")
        await it.running("a3")
        assert phase(it, "b2") == "queued"
        await it.cancel("b1")
        assert (await it.settled("b2"))[0] == "completed"
        await it.cancel("a3")


@in_loop
async def test_a_job_waiting_for_its_crew_times_out_counting_from_its_admission(tmp_path: Path) -> None:
    async with core(tmp_path, **BOUND_A) as it:  # type: ignore[arg-type]
        await it.start(HANG, action_id="a1", crew="a")
        await it.running("a1")
        await it.start(DONE, action_id="a2", crew="a", timeout_ms=300)
        event, data = await it.settled("a2")
        assert event == "failed" and data["reason"] == "timeout" and data["uncertain_outcome"] is False
        assert data["message"] == "no worker slot within timeout_ms=300" and "pid" not in data
        assert len(it.launcher.workers) == 1  # it never launched
        await it.start(DONE, action_id="b1", crew="b")
        assert (await it.settled("b1"))[0] == "completed"  # the other crew still runs beside a1


@in_loop
async def test_a_drain_fails_jobs_waiting_for_their_crew_certain(tmp_path: Path) -> None:
    async with core(tmp_path, **BOUND_A) as it:  # type: ignore[arg-type]
        await it.start(HANG, action_id="a1", crew="a")
        await it.running("a1")
        await it.start(DONE, action_id="a2", crew="a")
        skip = asyncio.Event()
        stopping = asyncio.ensure_future(it.sup.stop(60, skip))
        try:
            event, data = await it.settled("a2")
            assert event == "failed" and data["reason"] == "supervisor_stopped" and data["uncertain_outcome"] is False
            assert "a1" in it.sup.roster and not stopping.done()
        finally:
            skip.set()
        await stopping
        assert (await it.settled("a1"))[1]["reason"] == "supervisor_stopped"
        assert len(it.launcher.workers) == 1
