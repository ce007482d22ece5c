"""Each way a job ends times its steps once each (``crew_supervisor_job_step_seconds{step}``), and only the steps
it took: what the bench's step table and an operator's dashboard add up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisor.jobs.harness import Core, core, in_loop

ALL = ["queue", "launch", "worker_start", "job", "exit", "cleanup", "journal"]


def counted(it: Core) -> dict[str, float]:
    """How many times each step was timed so far."""
    return {
        sample.labels["step"]: sample.value
        for family in it.sup.metrics.job_steps.collect()
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def stepped(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """The steps timed between two reads, in a job's order; each must be timed once."""
    taken = {step: after.get(step, 0) - before.get(step, 0) for step in after}
    assert set(taken.values()) <= {0, 1}, taken
    return [step for step in ALL if taken.get(step)]


@pytest.mark.parametrize(
    ("script", "cancelled"),
    [
        (["started", "complete"], False),
        (["started", "exit:3"], False),  # died
        (["started", "stacks", "hang"], False),  # a protocol fault: stacks nobody asked for
        (["started", "hang"], True),
    ],
    ids=["completed", "died", "protocol-fault", "cancelled"],
)
@in_loop
async def test_a_job_that_ran_times_every_step_once(tmp_path: Path, script: list[str], cancelled: bool) -> None:
    async with core(tmp_path) as it:
        before = counted(it)
        await it.start(script)
        if cancelled:
            await it.running()
            await it.cancel()
        await it.settled()
        assert stepped(before, counted(it)) == ALL


@in_loop
async def test_a_job_stopped_in_the_queue_times_only_the_steps_it_took(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1") as it:
        await it.start(["started", "hang"], action_id="busy")
        await it.running("busy")
        before = counted(it)
        await it.start(["started", "complete"], action_id="waiting")
        await it.phase_reached("waiting", "queued")
        await it.cancel("waiting")
        assert stepped(before, counted(it)) == ["queue", "cleanup", "journal"]
        await it.cancel("busy")
