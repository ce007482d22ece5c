"""A job's effect ledger, the supervisor's side (``supervisor/jobs/ledger.py``): each call a worker starts is durable
before it is answered ``Recorded``, its end kept with its error masked, a run's completed tasks kept; whatever still
runs when the job ends (however it ends) is ``uncertain``; a ledger frame out of order or out of bounds is the job's
protocol fault; past MAX_EFFECTS the job is stopped. Scripted workers: crew code can write any frame."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from supervisor.models import StartRequest
from tests.supervisor.jobs.harness import DEADLINE, TOKEN, Core, core, identity, in_loop


def ledger(it: Core, action_id: str = "job") -> list[tuple[int, str, str, str]]:
    """Each entry as (id, kind, name, status)."""
    return [(entry.id, entry.kind, entry.name, entry.status) for entry in it.journal.reader.effects(action_id)]


def rows(it: Core, query: str) -> list[tuple[Any, ...]]:
    """What the journal holds, read on a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(it.journal.path)) as db:
        return db.execute(query).fetchall()


async def acked(acks: Path, entry: int) -> None:
    """Until the worker says it was answered ``Recorded(entry)``."""
    async with asyncio.timeout(DEADLINE):
        while f"recorded {entry}\n" not in (acks.read_text() if acks.exists() else ""):
            await asyncio.sleep(0.005)


@in_loop
async def test_each_call_is_recorded_with_its_end_and_a_runs_tasks_with_their_output(tmp_path: Path) -> None:
    script = [
        "started",
        "effect:tool:search",
        "end:1:finished",
        "effect:llm:openai/gpt-4o",
        f"end:2:failed:ValueError:the provider said no to {TOKEN}",
        "task:0",
        "effect:tool:write",
        "complete",  # entry 4 never ends: the job's end makes it uncertain
    ]
    async with core(tmp_path) as it:
        await it.start(script, acks=str(tmp_path / "acks"))
        event, _ = await it.settled()
        assert event == "completed"
        assert ledger(it) == [
            (1, "tool", "search", "finished"),
            (2, "llm", "openai/gpt-4o", "failed"),
            (4, "tool", "write", "uncertain"),
        ]
        entries = it.journal.reader.effects("job")
        assert entries[1].error_type == "ValueError" and TOKEN not in str(entries[1].error_message)
        assert "the provider said no to" in str(entries[1].error_message)
        assert (entries[1].prompt_tokens, entries[1].completion_tokens) == (3, 2)
        assert entries[2].ended_at is None and entries[0].ended_at is not None
        assert entries[0].started_at <= entries[0].ended_at
        assert (tmp_path / "acks").read_text() == "recorded 1\nrecorded 2\nrecorded 3\nrecorded 4\n"
        assert it.journal.reader.tasks_completed("job") == 1
        async with it.http() as client:
            answer = (await client.get("/jobs/job/effects")).json()
        assert answer["action_id"] == "job" and answer["tasks_completed"] == 1
        assert [entry["status"] for entry in answer["effects"]] == ["finished", "failed", "uncertain"]
        assert set(answer["effects"][0]) == {
            *("id", "kind", "name", "status", "started_at", "ended_at", "args_digest"),
            *("error_type", "error_message", "prompt_tokens", "completion_tokens"),
        }
        assert answer["effects"][0]["args_digest"] == "0" * 64
        async with it.http() as client:
            metrics = (await client.get("/metrics")).text
        for kind, status in (("tool", "finished"), ("llm", "failed"), ("tool", "uncertain")):
            assert f'crew_supervisor_effects_total{{crew="scripted",kind="{kind}",status="{status}"}} 1.0' in metrics


@in_loop
async def test_a_call_is_durable_before_its_worker_hears_so_and_uncertain_once_its_job_is_cancelled(
    tmp_path: Path,
) -> None:
    acks = tmp_path / "acks"
    async with core(tmp_path) as it:
        await it.start(["started", "effect:tool:charge_card", "hang"], acks=str(acks))
        await acked(acks, 1)
        assert ledger(it) == [(1, "tool", "charge_card", "running")]  # read on the reader: committed
        async with it.http() as client:
            running = (await client.get("/jobs/job/effects")).json()["effects"]
        assert [(entry["status"], entry["ended_at"]) for entry in running] == [("running", None)]
        await it.cancel()
        event, _ = await it.settled()
        assert event == "cancelled" and ledger(it) == [(1, "tool", "charge_card", "uncertain")]
        assert it.journal.reader.inconsistent() == []


@in_loop
async def test_a_tasks_output_is_kept_masked_for_a_resume(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "task:0", "task:1", "fail"])
        assert (await it.settled())[0] == "failed"
        # The row as a resume reads it (another module's read).
        done = rows(it, "SELECT task_index, fingerprint, output FROM tasks_done WHERE action_id = 'job' ORDER BY 1")
    assert [(index, fingerprint) for index, fingerprint, _ in done] == [(0, "fingerprint"), (1, "fingerprint")]
    assert orjson.loads(done[1][2])["raw"] == "done 1"


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (["entry:2:tool:x"], "ledger entry 2 out of order: expected 1"),
        (["effect:tool:x", "entry:1:tool:y"], "ledger entry 1 out of order: expected 2"),
        (["entry:1:shell:x"], "no such effect 'shell'"),
        ([f"entry:1:tool:{'n' * 201}"], "a name or digest over its bound"),
        (["end:1:finished"], "ledger entry 1 ended, but no such call is running"),
        (["effect:tool:x", "end:1:finished", "end:1:finished"], "ledger entry 1 ended, but no such call is running"),
        (["effect:tool:x", "end:1:uncertain"], "a call ends finished or failed"),
        (["effect:tool:x", f"end:1:failed:E:{'m' * 1001}"], "an error over its bound"),
        (["task:0", "task:2"], "completed task 2 out of order: expected 1"),
        (["task:-1"], "completed task -1 out of order"),
    ],
    ids=[
        "first-not-1",
        "id-repeated",
        "unknown-kind",
        "long-name",
        "end-unknown",
        "end-twice",
        "end-uncertain",
        "long-error",
        "task-skipped",
        "task-negative",
    ],
)
@in_loop
async def test_a_ledger_frame_out_of_order_or_bounds_is_a_protocol_fault(
    tmp_path: Path, script: list[str], said: str
) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", *script, "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "protocol_error" and said in data["message"], data
        assert data["uncertain_outcome"] is True and data["stop_confirmed"] is True
        assert all(status != "running" for *_, status in ledger(it))


@in_loop
async def test_a_completed_task_in_a_job_that_is_no_run_is_a_protocol_fault(tmp_path: Path) -> None:
    async with core(tmp_path, allowed_operations="run,test") as it:
        test = {"n_iterations": 1, "eval_llm": "scripted", "inputs": {"script": ["started", "task:0", "hang"]}}
        body = StartRequest(crew_id="scripted", action_id="job", operation="test", input=test)
        await it.sup.admission.admit(body, "key-job", legacy=False)
        event, data = await it.settled()
        assert event == "failed" and "only a run has them" in data["message"], data


@in_loop
async def test_a_tasks_output_over_the_event_bound_is_a_fault(tmp_path: Path) -> None:
    async with core(tmp_path, max_event_bytes="1024") as it:
        await it.start(["started", "task:0:2000", "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "event_too_large", data
        assert "MAX_EVENT_BYTES is 1024" in data["message"]
        assert rows(it, "SELECT count(*) FROM tasks_done") == [(0,)]


@in_loop
async def test_past_max_effects_the_next_call_never_starts_and_the_job_fails(tmp_path: Path) -> None:
    acks = tmp_path / "acks"
    async with core(tmp_path, max_effects="2") as it:
        await it.start(["started", "effect:tool:a", "end:1:finished", "effect:tool:b", "effect:tool:c"], acks=str(acks))
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == data["error_type"] == "effect_limit_exceeded", data
        assert data["limit"] == 2 and "MAX_EFFECTS" in data["message"] and data["uncertain_outcome"] is True
        assert data["stop_confirmed"] is True and data["signal"] == "SIGKILL"  # no grace, as over any limit
        assert ledger(it) == [(1, "tool", "a", "finished"), (2, "tool", "b", "uncertain")]
        assert acks.read_text() == "recorded 1\nrecorded 2\n"  # the third was never answered


@in_loop
async def test_an_archived_record_takes_its_ledger_with_it(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "effect:tool:a", "task:0", "complete"])
        await it.settled()
        assert await it.journal.archive("job") == ["job"]
        assert rows(it, "SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM tasks_done)") == [(0,)]
        async with it.http() as client:
            assert (await client.get("/jobs/job/effects")).status_code == 404


@in_loop
async def test_task_outputs_past_what_a_resume_carries_are_a_protocol_fault(tmp_path: Path) -> None:
    # Each under MAX_EVENT_BYTES; twelve fit MAX_RESUMED_BYTES (3 MiB), the thirteenth would not.
    async with core(tmp_path) as it:
        await it.start(["started", *(f"task:{index}:250000" for index in range(13)), "hang"])
        event, data = await it.settled()
        assert event == "failed" and data["reason"] == "protocol_error", data
        assert "completed task 12: the job's task outputs would take over" in data["message"]
        assert it.journal.reader.tasks_completed("job") == 12


def commits(it: Core) -> float:
    """The journal's commits so far."""
    counted = it.sup.metrics.registry.get_sample_value("crew_supervisor_journal_commit_seconds_count")
    assert counted is not None
    return counted


@in_loop
async def test_a_worker_that_does_not_wait_for_its_tasks_answers_is_held_back_by_their_commits(tmp_path: Path) -> None:
    go = tmp_path / "go"
    async with core(tmp_path) as it:
        await it.start(["started", "await-go", "flood:600:2000", "hang"], go=str(go))
        await it.running()
        before = commits(it)
        # Another process holds the journal's write lock a while: whatever the relay took meanwhile would queue in
        # the writer, and commit together once it is free (before: every task sent by then in one commit).
        with contextlib.closing(sqlite3.connect(it.journal.path, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            go.touch()
            async with asyncio.timeout(DEADLINE):
                while "pipe_write" not in Path(f"/proc/{identity(it)[0]}/wchan").read_text():  # its pipe is full
                    await asyncio.sleep(0.005)
            db.execute("ROLLBACK")
        async with asyncio.timeout(DEADLINE):
            while it.journal.reader.tasks_completed("job") < 600:
                await asyncio.sleep(0.005)
        # The relay took each task only once the one before it had committed: one commit each, at least.
        assert commits(it) - before >= 600
        await it.cancel()


@in_loop
async def test_a_completed_run_keeps_its_tasks_count_but_not_what_only_a_resume_reads(tmp_path: Path) -> None:
    async with core(tmp_path) as it:
        await it.start(["started", "task:0", "task:1", "complete"])
        assert (await it.settled())[0] == "completed"
        done = rows(it, "SELECT task_index, fingerprint, output FROM tasks_done WHERE action_id = 'job' ORDER BY 1")
        assert done == [(0, "fingerprint", b""), (1, "fingerprint", b"")]  # its output holds them
        assert rows(it, "SELECT count(*) FROM inputs") == [(0,)]
        assert it.journal.reader.tasks_completed("job") == 2
