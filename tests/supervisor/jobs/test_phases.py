"""The job state machine: only the moves of its table, the first stop reason wins, and the drawing in
docs/architecture.md is the table's own."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol import Operation
from supervisor.enums import Phase
from supervisor.jobs.live import LiveJob
from supervisor.jobs.phases import MOVES, IllegalMove, StopReason, diagram
from supervisor.jobs.supervisor import Supervisor
from tests.conftest import ROOT
from tests.supervisor.jobs.harness import CREW, core, in_loop


@contextlib.asynccontextmanager
async def parts(tmp_path: Path) -> AsyncIterator[Supervisor]:
    """A supervisor, for the parts it wires for its jobs (its futures need a loop, so the tests run in one)."""
    async with core(tmp_path) as it:
        yield it.sup


def live_job(sup: Supervisor) -> LiveJob:
    """A job as the runner makes one, never started nor on the roster: its moves are the test's."""
    return LiveJob(sup.parts, sup.roster, "a", CREW, Operation.RUN, {}, 1000)


def reach(job: LiveJob, phase: Phase) -> None:
    """Walk ``job`` forward to ``phase`` along the longest path of the table."""
    for step in (Phase.LAUNCHING, Phase.RUNNING, Phase.SETTLING, Phase.SETTLED):
        if job.phase is phase:
            return
        job.move(step)


@pytest.mark.parametrize(("current", "to"), list(itertools.product(Phase, Phase)))
@in_loop
async def test_a_job_makes_only_the_moves_of_the_table(tmp_path: Path, current: Phase, to: Phase) -> None:
    async with parts(tmp_path) as wired:
        job = live_job(wired)
    reach(job, current)
    if to in MOVES[current]:
        job.move(to)
        assert job.phase is to
    else:
        with pytest.raises(IllegalMove, match=f"from {current} to {to}"):
            job.move(to)
        assert job.phase is current


@in_loop
async def test_every_phase_but_the_last_moves_on_and_none_moves_back() -> None:
    order = list(Phase)
    assert all(MOVES[phase] for phase in order[:-1]) and not MOVES[Phase.SETTLED]
    assert all(order.index(to) > order.index(current) for current in Phase for to in MOVES[current])


@in_loop
async def test_the_first_stop_reason_wins_and_none_once_settling(tmp_path: Path) -> None:
    async with parts(tmp_path) as wired:
        job = live_job(wired)
        assert not job.stopped.is_set()
        assert job.ask_stop(StopReason.CANCEL)
        assert not job.ask_stop(StopReason.STOP) and not job.ask_stop(StopReason.TIMEOUT)
        assert job.stop is StopReason.CANCEL and job.stopped.is_set()
        for phase in (Phase.SETTLING, Phase.SETTLED):
            late = live_job(wired)
            reach(late, phase)
            assert not late.ask_stop(StopReason.LIMIT) and late.stop is None and not late.stopped.is_set()


@in_loop
async def test_a_stop_wakes_whoever_waits_for_it(tmp_path: Path) -> None:
    async with parts(tmp_path) as wired:
        job = live_job(wired)
    waiter = asyncio.ensure_future(job.stopped.wait())
    await asyncio.sleep(0)
    job.ask_stop(StopReason.DRAIN)
    await asyncio.wait_for(waiter, 5)


def test_the_architecture_page_draws_the_table_as_it_is() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```mermaid\n{diagram()}\n```" in page, (
        "regenerate it: python -c 'from supervisor.jobs.phases import diagram; print(diagram())'"
    )


def timed(sup: Supervisor) -> dict[str, tuple[float, float]]:
    """Each step's count and seconds in all, as the metrics have them."""
    samples = [sample for family in sup.metrics.job_steps.collect() for sample in family.samples]
    counts = {sample.labels["step"]: sample.value for sample in samples if sample.name.endswith("_count")}
    sums = {sample.labels["step"]: sample.value for sample in samples if sample.name.endswith("_sum")}
    return {step: (count, sums[step]) for step, count in counts.items() if count}


@in_loop
async def test_each_step_of_a_jobs_time_is_timed_once_and_they_add_up(tmp_path: Path) -> None:
    async with parts(tmp_path) as wired:
        job = live_job(wired)
        began = job.lapped
        job.move(Phase.LAUNCHING)
        job.move(Phase.RUNNING)
        job.lap("worker_start")  # as its conversation does on Started
        job.move(Phase.SETTLING)
        job.lap("exit")  # as its conversation does once the worker is gone
        job.lap("cleanup")  # as the job does once its remains are removed
        job.move(Phase.SETTLED)
        steps = timed(wired)
    assert sorted(steps) == sorted(["queue", "launch", "worker_start", "job", "exit", "cleanup", "journal"])
    assert all(count == 1 and seconds > 0 for count, seconds in steps.values())  # a precise clock: not a still one
    assert sum(seconds for _, seconds in steps.values()) == pytest.approx(job.lapped - began)
