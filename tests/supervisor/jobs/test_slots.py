"""The order waiting jobs take worker slots in (``supervisor/jobs/slots.py``): fair between crews, in admission
order within one, each crew within its own bound; and what a cancel while waiting leaves (nothing)."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.config import ConfigError
from supervisor.enums import WaitingFor
from supervisor.jobs.slots import Slots, Waiting
from tests.supervisor.jobs.harness import in_loop


class Queue:
    """Jobs taking ``slots``, each named ``<crew><n>``: ``started`` lists them as they get one."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.started: list[str] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.ended: list[str] = []

    async def add(self, *names: str) -> None:
        """Each job asks for a slot, in this order; returns once each has one or waits."""
        for name in names:
            self.tasks[name] = asyncio.ensure_future(self._take(name))
        await asyncio.sleep(0)  # each has run up to its wait

    async def _take(self, name: str) -> None:
        await self.slots.take(crew(name))
        self.started.append(name)

    async def end(self, *names: str) -> None:
        """Those jobs give their slot back, one after the other; returns once those it started have run."""
        for name in names:
            self.ended.append(name)
            self.slots.give_back(crew(name))
        await asyncio.sleep(0)

    async def drain(self) -> None:
        """End jobs as they start, oldest first, until none is left."""
        while left := [name for name in self.started if name not in self.ended]:
            await self.end(left[0])


def crew(name: str) -> str:
    return name.rstrip("0123456789")


@in_loop
async def test_a_burst_of_one_crew_does_not_hold_up_another_crew_s_job() -> None:
    queue = Queue(Slots(2))
    await queue.add(*(f"a{n}" for n in range(1, 9)), "b1")
    assert queue.started == ["a1", "a2"]
    await queue.end("a1")
    assert queue.started == ["a1", "a2", "b1"]  # not a3: crew b had no job started, crew a had
    await queue.drain()
    assert queue.started == ["a1", "a2", "b1", *(f"a{n}" for n in range(3, 9))]


@in_loop
async def test_crews_with_jobs_waiting_take_turns_each_in_admission_order() -> None:
    queue = Queue(Slots(1))
    await queue.add("a1", "a2", "a3", "a4", "b1", "b2", "c1")
    assert queue.started == ["a1"]
    await queue.drain()
    # b and c had none started (b began waiting first), then the crew whose last job started longest ago.
    assert queue.started == ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]


@in_loop
async def test_a_crew_at_its_bound_waits_without_holding_up_the_others() -> None:
    slots = Slots(3, [("a", 1)])
    queue = Queue(slots)
    await queue.add("a1", "a2", "b1", "b2", "b3")
    assert queue.started == ["a1", "b1", "b2"]  # a2 waits for its crew, not for a slot
    assert slots.waiting_for("a") == Waiting(WaitingFor.CREW, 1, 1)
    assert slots.waiting_for("b") == Waiting(WaitingFor.SLOT, 3, 3)
    assert slots.queued(["a", "b", "c"]) == {"a": 1, "b": 1, "c": 0}
    await queue.end("b1")
    assert queue.started[3:] == ["b3"]  # a slot of the total freed: a is still at its bound
    await queue.end("a1")
    assert queue.started[4:] == ["a2"]
    assert slots.held == 3 and slots.queued(["a", "b"]) == {"a": 0, "b": 0}


@in_loop
async def test_every_other_crew_takes_the_star_s_bound_and_a_named_one_its_own() -> None:
    slots = Slots(8, [("*", 1), ("a", 2)])
    assert (slots.bound("a"), slots.bound("b"), slots.bound("c")) == (2, 1, 1)
    assert slots.bounds(["a", "b"]) == {"a": 2, "b": 1}
    queue = Queue(slots)
    await queue.add("a1", "a2", "a3", "b1", "b2", "c1")
    assert queue.started == ["a1", "a2", "b1", "c1"]
    assert Slots(8, [("a", 2)]).bounds(["a", "b"]) == {"a": 2}  # without *, the others only share the total


@in_loop
async def test_a_job_cancelled_while_waiting_takes_nothing_and_leaves_its_turn() -> None:
    slots = Slots(1, [("a", 1)])
    queue = Queue(slots)
    await queue.add("a1", "a2", "b1", "a3")
    queue.tasks["a2"].cancel()
    await asyncio.wait([queue.tasks["a2"]])
    assert slots.held == 1 and slots.queued(["a", "b"]) == {"a": 1, "b": 1}
    await queue.drain()
    assert queue.started == ["a1", "b1", "a3"]
    assert slots.held == 0


@in_loop
async def test_a_job_cancelled_as_it_was_given_a_slot_gives_it_back() -> None:
    slots = Slots(1)
    queue = Queue(slots)
    await queue.add("a1", "b1", "c1")
    slots.give_back("a")  # b1 is given the slot ...
    queue.tasks["b1"].cancel()  # ... and cancelled before it ran: it gives it back, to c1
    await asyncio.wait([queue.tasks["b1"]])
    await asyncio.sleep(0)
    assert queue.started == ["a1", "c1"] and slots.held == 1


@in_loop
async def test_a_cancelled_waiter_not_yet_told_is_skipped() -> None:
    slots = Slots(1)
    queue = Queue(slots)
    await queue.add("a1", "b1", "c1")
    queue.tasks["b1"].cancel()  # its wait is cancelled now; its task hears of it on its next turn
    slots.give_back("a")  # in this same turn: the slot goes to c1, not to b1's cancelled wait
    await asyncio.wait([queue.tasks["b1"]])
    await asyncio.sleep(0)
    assert queue.started == ["a1", "c1"] and slots.held == 1


def test_bounds_for_crews_not_served_are_refused_naming_them_and_the_served() -> None:
    slots = Slots(4, [("research", 1), ("reserch", 2), ("*", 1)])
    with pytest.raises(ConfigError) as refused:
        slots.check(["writer", "research"])
    assert str(refused.value) == (
        "AIP_CREWAI_CREW_MAX_CONCURRENCY names crews not served: reserch (served: research, writer)"
    )
    slots.check(["research", "reserch"])
