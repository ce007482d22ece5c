"""What the API says of a job that has no outcome yet: its contract ``status`` (``running``) and, beside it, where
it is (``phase``), in its record and in the job list, which filters on either."""

from __future__ import annotations

from pathlib import Path

from tests.core.harness import core, in_loop


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
