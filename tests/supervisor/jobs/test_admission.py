"""Admission in the core: each refusal in the reference's order, made before anything is stored; an exact repeat
is the same job; the queue keeps order and the journal its capacity (``test_refusals`` maps each to its status)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from supervisor.enums import Lifecycle
from supervisor.jobs import admission
from supervisor.layout import crew_places
from supervisor.models import StartRequest
from tests.supervisor.jobs.harness import CREW, Core, core, in_loop

MiB = 1024 * 1024


async def refusal(it: Core, key: str | None = "key", legacy: bool = False, **fields: Any) -> type[Exception] | None:
    """The kind of refusal a start gets (None: admitted); whatever it was, nothing of it was stored."""
    body = StartRequest(**{"crew_id": CREW, "action_id": "refused", **fields})
    try:
        await it.sup.admission.admit(body, key, legacy)
    except admission.Refused as exc:
        assert it.journal.reader.get(body.action_id) is None
        return type(exc)
    return None


@pytest.mark.parametrize(
    ("start", "refused"),
    [
        # Each breaks every rule after its own too: the first rule broken is the one that answers.
        ({"input": {"blob": "x" * MiB}, "legacy": True, "operation": "replay", "key": None}, admission.InputTooLarge),
        ({"legacy": True, "operation": "batch_run", "key": None, "crew_id": "nope"}, admission.WrongRoute),
        ({"operation": "train", "key": None, "crew_id": "nope"}, admission.OperationDisabled),
        ({"key": None, "input": {"inputs": 1}, "operation": "batch_run"}, admission.KeyMissing),
        ({"key": "  ", "crew_id": "nope"}, admission.KeyMissing),
        ({"key": "k" * 513, "crew_id": "nope"}, admission.KeyInvalid),
        ({"key": "a\tb", "crew_id": "nope"}, admission.KeyInvalid),
        ({"input": {f"p{i}": i for i in range(513)}, "crew_id": "nope"}, admission.InputInvalid),
        ({"crew_id": "nope"}, admission.CrewNotFound),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
@in_loop
async def test_a_refusal_comes_in_the_references_order(
    tmp_path: Path, start: dict[str, Any], refused: type[Exception]
) -> None:
    async with core(tmp_path, allowed_operations="run,batch_run,replay") as it:
        assert await refusal(it, **start) is refused


@in_loop
async def test_an_unknown_crews_refusal_names_it_and_the_served_ones(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        with pytest.raises(admission.CrewNotFound) as refused:
            await it.sup.admission.admit(StartRequest(crew_id="nope", action_id="a"), "key", legacy=False)
    assert str(refused.value) == f"unknown crew 'nope'; this supervisor serves: {', '.join(sorted(it.sup.crews))}"


def test_an_unknown_crews_refusal_is_bounded_and_written_out() -> None:
    """At most SERVED_NAMED crews named, the rest counted; an id as the CLI shows it, a quote and a control
    character written out, so that no id ends the quoted one or drives a terminal."""
    served = [f"crew-{i:03}" for i in range(admission.SERVED_NAMED + 5)]
    said = admission.unknown_crew("x'; this supervisor serves: \x1b[2J\u0456", [*reversed(served), "b c"])
    named = ", ".join(["b\\x20c", *served[: admission.SERVED_NAMED - 1]])
    assert said == (
        "unknown crew 'x\\x27;\\x20this\\x20supervisor\\x20serves:\\x20\\x1b[2J\\u0456'; this supervisor serves: "
        f"{named} and 6 more (GET /health lists them)"
    )


@in_loop
async def test_an_exact_repeat_is_the_same_job_and_anything_else_conflicts(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        first = await it.start(["started", "complete"], action_id="once")
        assert (await it.settled("once"))[0] == "completed"
        again = await it.start(["started", "complete"], action_id="once")
        assert (again.action_id, again.request_hash, again.status) == ("once", first.request_hash, "completed")
        assert len(it.launcher.workers) == 1 and [name for name, _ in it.events("once")] == ["started", "completed"]
        changed = StartRequest(crew_id=CREW, action_id="once", input={"script": []})
        with pytest.raises(admission.ConflictingReuse):
            await it.sup.admission.admit(changed, "key-once", legacy=False)
        with pytest.raises(admission.ConflictingReuse):  # the same body under another key
            same = StartRequest(crew_id=CREW, action_id="once", input={"script": ["started", "complete"]})
            await it.sup.admission.admit(same, "key-other", legacy=False)


@in_loop
async def test_a_crew_over_its_disk_cap_is_refused_after_the_other_checks_and_its_places_measured_once(
    tmp_path: Path,
) -> None:
    """A crew whose places another supervisor's jobs filled past CREW_MAX_DISK_MB: 507 (CrewDiskFull), after every
    earlier check (a 409 still answers first), for a start of any action id."""
    async with core(tmp_path) as it:
        await it.start(["started", "complete"], action_id="once")
        assert (await it.settled("once"))[0] == "completed"
    home, _ = crew_places(tmp_path / "state", CREW)
    (home / "filled").write_bytes(b"x" * 2 * MiB)
    async with core(tmp_path, crew_max_disk_mb="1") as it:
        changed = StartRequest(crew_id=CREW, action_id="once", input={"script": []})
        with pytest.raises(admission.ConflictingReuse):
            await it.sup.admission.admit(changed, "key-once", legacy=False)
        with pytest.raises(admission.CrewDiskFull, match=rf"crew {CREW}'s HOME and storage hold 2 MiB, over its 1"):
            await it.sup.admission.admit(StartRequest(crew_id=CREW, action_id="new"), "key", legacy=False)
        assert it.journal.reader.get("new") is None
        (home / "filled").unlink()  # freed: still refused until the crew is measured again (the cache holds it)
        assert await refusal(it) is admission.CrewDiskFull


@in_loop
async def test_starts_of_one_action_id_at_once_make_one_job(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        jobs = await asyncio.gather(*(it.start(["started", "complete"], action_id="racing") for _ in range(5)))
        assert {job.request_hash for job in jobs} == {jobs[0].request_hash}
        assert (await it.settled("racing"))[0] == "completed" and len(it.launcher.workers) == 1


@in_loop
async def test_the_queue_keeps_order_and_the_journal_its_capacity(tmp_path: Path) -> None:
    async with core(tmp_path, max_concurrency="1", max_retained_runs="3") as it:
        for name in ("first", "second", "third"):
            await it.start(["started", "complete"], action_id=name)
        assert await refusal(it, input={"script": []}) is admission.JournalFull
        for name in ("first", "second", "third"):
            assert (await it.settled(name))[0] == "completed"
        # One slot, taken in admission order: the workers were spawned in that order.
        pids = [it.journal.reader.get(name).worker_pid for name in ("first", "second", "third")]  # type: ignore[union-attr]
        assert pids == [worker.pid for worker in it.launcher.workers]


@in_loop
async def test_a_journal_locked_by_another_process_is_a_temporary_refusal(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        other = sqlite3.connect(it.journal.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            assert await refusal(it, input={"script": []}) is admission.JournalUnavailable
        finally:
            other.execute("ROLLBACK")
            other.close()
        await it.start(["started", "complete"])
        assert (await it.settled())[0] == "completed"


@in_loop
async def test_after_a_drain_began_only_an_exact_repeat_is_answered(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "complete"], action_id="before")
        await it.settled("before")
        assert it.sup.lifecycle is Lifecycle.OPEN and it.sup.reads.health()["status"] == "ready"
        await it.sup.stop(drain_seconds=0)
        assert it.sup.lifecycle is Lifecycle.STOPPED and it.sup.reads.health()["status"] == "draining"
        assert (await it.start(["started", "complete"], action_id="before")).status == "completed"
        assert await refusal(it, input={"script": []}) is admission.ShuttingDown
