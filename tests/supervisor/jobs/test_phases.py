"""The job state machine: only the moves of its table, the first stop reason wins, and the drawing in
docs/architecture.md is the table's own."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from supervisor.enums import Phase
from supervisor.jobs.live import LiveJob
from supervisor.jobs.phases import MOVES, IllegalMove, StopReason, diagram
from tests.conftest import ROOT
from tests.supervisor.jobs.harness import in_loop


def live_job() -> LiveJob:
    """A job as the runner makes one (its futures need a loop, so the tests run in one)."""
    return LiveJob("a", "demo", "run", {}, 1000, 0.0, 1.0)


def reach(job: LiveJob, phase: Phase) -> None:
    """Walk ``job`` forward to ``phase`` along the longest path of the table."""
    for step in (Phase.LAUNCHING, Phase.RUNNING, Phase.SETTLING, Phase.SETTLED):
        if job.phase is phase:
            return
        job.move(step)


@pytest.mark.parametrize(("current", "to"), list(itertools.product(Phase, Phase)))
@in_loop
async def test_a_job_makes_only_the_moves_of_the_table(current: Phase, to: Phase) -> None:
    job = live_job()
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
async def test_the_first_stop_reason_wins_and_none_once_settling() -> None:
    job = live_job()
    assert not job.stopped.is_set()
    assert job.ask_stop(StopReason.CANCEL)
    assert not job.ask_stop(StopReason.STOP) and not job.ask_stop(StopReason.TIMEOUT)
    assert job.stop is StopReason.CANCEL and job.stopped.is_set()
    for phase in (Phase.SETTLING, Phase.SETTLED):
        late = live_job()
        reach(late, phase)
        assert not late.ask_stop(StopReason.LIMIT) and late.stop is None and not late.stopped.is_set()


@in_loop
async def test_a_stop_wakes_whoever_waits_for_it() -> None:
    job = live_job()
    waiter = asyncio.ensure_future(job.stopped.wait())
    await asyncio.sleep(0)
    job.ask_stop(StopReason.DRAIN)
    await asyncio.wait_for(waiter, 5)


def test_the_architecture_page_draws_the_table_as_it_is() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```mermaid\n{diagram()}\n```" in page, (
        "regenerate it: python -c 'from supervisor.jobs.phases import diagram; print(diagram())'"
    )


@in_loop
async def test_each_step_of_a_jobs_time_is_timed_once_and_they_add_up() -> None:
    admitted = asyncio.get_running_loop().time()
    steps: list[tuple[str, float]] = []
    job = LiveJob("a", "demo", "run", {}, 1000, admitted, admitted + 1, timed=lambda *step: steps.append(step))
    began = job.lapped
    job.move(Phase.LAUNCHING)
    job.move(Phase.RUNNING)
    job.lap("worker_start")  # as the relay does on Started
    job.move(Phase.SETTLING)
    job.lap("exit")  # as the relay does once the worker is gone
    job.lap("cleanup")  # as the runner does once its remains are removed
    job.move(Phase.SETTLED)
    assert [name for name, _ in steps] == ["queue", "launch", "worker_start", "job", "exit", "cleanup", "journal"]
    assert all(seconds > 0 for _, seconds in steps)  # a precise clock: not one that stands still within a turn
    assert sum(seconds for _, seconds in steps) == pytest.approx(job.lapped - began)
