"""What the API says of a job that has no outcome yet: its contract ``status`` (``running``) and, beside it, where
it is (``phase``), in its record and in the job list, which filters on either."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from tests.supervisor.jobs.harness import DEADLINE, core, in_loop


@in_loop
async def test_a_running_job_says_where_it_is_and_the_list_filters_on_it(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it, it.http() as client:
        await it.start(["started", "hang"], action_id="first")
        await it.start(["started", "complete"], action_id="waiting")
        await it.running("first")

        async def record(action_id: str) -> tuple[str, str | None]:
            job = (await client.get(f"/jobs/{action_id}")).json()
            return job["status"], job["phase"]

        async def listed(**params: str) -> list[tuple[str, str, str | None]]:
            jobs = (await client.get("/jobs", params=params)).json()["jobs"]
            return [(job["action_id"], job["status"], job["phase"]) for job in jobs]

        assert await record("first") == ("running", "running")
        assert await record("waiting") == ("running", "queued")
        assert await listed() == [("waiting", "running", "queued"), ("first", "running", "running")]
        assert await listed(phase="queued") == [("waiting", "running", "queued")]
        assert await listed(phase="running") == [("first", "running", "running")]
        assert await listed(phase="settling") == []
        assert await listed(status="running", phase="queued") == [("waiting", "running", "queued")]
        for bad in ("settled", "completed", ""):
            assert (await client.get("/jobs", params={"phase": bad})).status_code == 422

        await it.cancel("first", "enough")
        assert (await it.settled("waiting"))[0] == "completed"
        assert await record("first") == ("cancelled", None)
        assert await listed() == [("waiting", "completed", None), ("first", "cancelled", None)]
        assert await listed(phase="running") == []

        # When each was admitted and ended (the list's rows as the records), and why the cancelled one ended.
        first, waiting = [(await client.get(f"/jobs/{name}")).json() for name in ("first", "waiting")]
        assert first["admitted_at"] <= waiting["admitted_at"] and first["ended_at"] <= waiting["ended_at"]
        rows = {job["action_id"]: job for job in (await client.get("/jobs")).json()["jobs"]}
        for job in (first, waiting):
            assert job["admitted_at"] < job["ended_at"]
            assert rows[job["action_id"]]["ended_at"] == job["ended_at"]
        assert (rows["first"]["reason"], rows["waiting"]["reason"]) == ("enough", None)


@in_loop
async def test_a_job_s_llm_spend_is_kept_as_each_call_completes(tmp_path: Path, caplog: Any) -> None:
    go = tmp_path / "go"
    async with core(tmp_path) as it, it.http() as client:
        await it.start(["started", "spend", "spend", "refund", "await-go", "spend", "complete"], go=str(go))
        await it.running()

        async def spent() -> dict[str, Any]:
            (worker,) = (await client.get("/workers")).json()["workers"]
            return worker

        async with asyncio.timeout(DEADLINE):
            while (await spent())["llm_calls"] < 2:
                await asyncio.sleep(0.01)
        now = await spent()
        # Two calls; the usage a worker "took back" counts as nothing: what was spent stays spent.
        assert (now["tokens"], now["prompt_tokens"], now["completion_tokens"]) == (30, 20, 10)
        assert (now["llm_calls"], now["model"]) == (2, "scripted-model")
        record = (await client.get("/jobs/job")).json()
        assert record["llm_spent"] == {"tokens": 30, "llm_calls": 2, "model": "scripted-model"}
        with caplog.at_level(logging.INFO, logger="crew_supervisor.jobs"):
            go.touch()
            assert (await it.settled())[0] == "completed"
        (finished,) = [record for record in caplog.records if record.getMessage() == "job finished"]
        assert (finished.__dict__["tokens"], finished.__dict__["llm_calls"]) == (45, 3)
        assert (await client.get("/jobs/job")).json()["llm_spent"] is None  # its output's token_usage says it now
        metrics = (await client.get("/metrics")).text
        assert 'crew_supervisor_llm_tokens_total{crew="scripted",kind="prompt"} 30.0' in metrics
        assert 'crew_supervisor_llm_tokens_total{crew="scripted",kind="completion"} 15.0' in metrics
        assert 'crew_supervisor_llm_calls_total{crew="scripted"} 3.0' in metrics
