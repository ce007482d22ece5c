"""Per-crew Prometheus series through the real job core: each crew's jobs by outcome, how long each took from
admission to its terminal event, and its tokens, for the crews this supervisor serves only (a start for any other crew
is refused before any metric), beside the series that are not by crew."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor.jobs.harness import core, in_loop

KILLS = "crew_supervisor_kills_total"
CREW_FAMILIES = ("crew_supervisor_crew_jobs_finished", "crew_supervisor_crew_job_seconds", "crew_supervisor_llm_tokens")


async def samples(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample ``/metrics`` gives, by its name and its labels."""
    text = (await client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def of_crews(found: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    """The crews the per-crew families have a series for."""
    return {dict(labels)["crew"] for name, labels in found if name.startswith(CREW_FAMILIES)}


@in_loop
async def test_each_served_crew_gets_its_series_and_an_unknown_crew_none(tmp_path: Path) -> None:
    async with core(tmp_path, crews=("a", "b")) as it, it.http() as client:
        refused = await client.post(
            "/jobs",
            json={"crew_id": "not-served", "action_id": "x", "input": {"script": ["started", "complete"]}},
            headers={"Idempotency-Key": "k"},
        )
        assert refused.status_code == 404, refused.text
        assert of_crews(await samples(client)) == set()  # nothing of a crew not served, and no job yet

        await it.start(["started", "spend", "complete"], action_id="a-done", crew="a")
        await it.start(["started", "fail"], action_id="b-failed", crew="b")
        await it.start(["started", "hang"], action_id="b-cancelled", crew="b")
        await it.running("b-cancelled")
        await it.cancel("b-cancelled", "said by a canceller: free text")
        for action_id in ("a-done", "b-failed"):
            await it.settled(action_id)
        found = await samples(client)

    assert of_crews(found) == {"a", "b"}

    def sample(name: str, **labels: str) -> float:
        return found.get((f"crew_supervisor_{name}", tuple(sorted(labels.items()))), 0.0)

    for crew, outcome in (("a", "completed"), ("b", "failed"), ("b", "cancelled")):
        assert sample("crew_jobs_finished_total", crew=crew, operation="run", outcome=outcome) == 1.0
        assert sample("crew_job_seconds_count", crew=crew, outcome=outcome) == 1.0
        assert sample("crew_job_seconds_sum", crew=crew, outcome=outcome) > 0
    assert sample("crew_jobs_finished_total", crew="a", operation="run", outcome="failed") == 0.0
    tokens = [sample("llm_tokens_total", crew="a", kind=kind) for kind in ("prompt", "completion")]
    assert tokens == [10.0, 5.0]  # the scripted call's usage
    # The series not by crew go on as before: every job, and the kill the cancel confirmed, counted as a cancel's
    # (what its canceller said is free text: no label holds it).
    for outcome in ("completed", "failed", "cancelled"):
        assert sample("jobs_finished_total", operation="run", outcome=outcome) == 1.0
    assert {dict(labels)["reason"]: value for (name, labels), value in found.items() if name == KILLS} == {
        "cancelled": 1.0
    }
