"""The effect ledger and resume in a real worker running the ``effects`` crew offline; the test plays the
supervisor, answering each ledger entry with ``Recorded`` (or holding it back)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol import (
    MAX_EVENT_BYTES,
    MAX_RESUMED_BYTES,
    Building,
    Completed,
    EffectEnded,
    EffectStarted,
    ExitCode,
    Failed,
    Hello,
    Reason,
    Recorded,
    Spent,
    Started,
    TaskDone,
)
from supervisor.processes.process import WorkerProcess
from supervisor.redaction import redact_data
from tests.conftest import wait_until
from tests.crews import effects, shapes
from tests.crews.effects import EFFECTS_LOG, TOOL
from tests.helpers.kickoff import comparable
from tests.helpers.ledger import answered_to_the_end, answering, job, launch, next_answered
from worker import resume
from worker.provider import URL_ENV, Provider

pytestmark = pytest.mark.usefixtures("subreaper")
TASK_FIELDS = {"description", "agent", "raw", "pydantic", "json_dict", "output_format"}


def lines(tmp: Path) -> list[str]:
    log = tmp / EFFECTS_LOG
    return log.read_text().splitlines() if log.exists() else []


def ledger(messages: list[Any]) -> list[Any]:
    return [m for m in messages if isinstance(m, EffectStarted | EffectEnded | TaskDone)]


def output(messages: list[Any]) -> dict[str, Any]:
    assert isinstance(messages[-1], Completed), messages[-1]
    return messages[-1].output


def test_each_call_is_recorded_before_it_runs_and_each_task_once_done(tmp_path: Path) -> None:
    """The first tool call waits for its Recorded: its effect is not there while it is held back."""

    async def scenario() -> list[Any]:
        worker = await launch(tmp_path, "effects", {"marker": "m", "fail_in_step": 3})
        try:
            seen = []  # until the first tool call, the model's first call answered
            while not isinstance(message := await asyncio.wait_for(worker.next_message(), 60), EffectStarted) or (
                message.effect != "tool"
            ):
                if isinstance(message, EffectStarted):
                    worker.send(Recorded(message.id))
                seen.append(message)
            seen.append(message)
            held = await quiet(worker, 1.0)  # held back: the call does not go on (chunks held before it may come)
            assert not ledger(held) and lines(tmp_path) == [], held
            seen.extend(held)
            worker.send(Recorded(message.id))
            assert await asyncio.to_thread(wait_until, lambda: lines(tmp_path) == ["m step 1"], 30)
            seen.extend(await answered_to_the_end(worker))
            assert await worker.wait_exit(10) == 0
        except BaseException:
            await worker.kill()
            raise
        return seen

    messages = asyncio.run(scenario())
    assert [type(m) for m in messages[:3]] == [Hello, Building, Started]
    entries = ledger(messages)
    numbered = [m.id for m in entries if not isinstance(m, EffectEnded)]
    assert numbered == list(range(1, len(numbered) + 1))  # the calls and the tasks share one count
    started = {m.id: m for m in entries if isinstance(m, EffectStarted)}
    for end in ends(entries):  # each call ends once, after it started
        assert entries.index(started[end.id]) < entries.index(end)
    assert sorted(end.id for end in ends(entries)) == sorted(started)
    assert lines(tmp_path) == ["m step 1", "m step 2", "m step 4"]

    tools = [(started[end.id], end) for end in ends(entries) if started[end.id].effect == "tool"]
    assert all(call.name == TOOL and end.prompt_tokens == end.completion_tokens == 0 for call, end in tools)
    failed = [end for _, end in tools if end.status == "failed"]
    # CrewAI tries a tool that raised again (with its arguments unfiltered, then once more): each try is an effect.
    assert failed and {(end.error_type, end.error_message) for end in failed} == {
        ("RuntimeError", "tool failed at step 3")
    }
    assert [end.status for _, end in tools if end.status != "failed"] == ["finished"] * 3
    # A tool's digest is of its arguments as one JSON object (docs/reconcile-and-resume.md, step 3).
    text = "step 1 of the m run, hanging in step 0, failing in step 3."
    assert tools[0][0].digest == arguments_digest({"text": text})

    llms = [(started[end.id], end) for end in ends(entries) if started[end.id].effect == "llm"]
    assert len(llms) == 8 and all(call.name == "offline-effects" and end.status == "finished" for call, end in llms)
    usage = output(messages)["token_usage"]
    assert sum(end.prompt_tokens for _, end in llms) == usage["prompt_tokens"] > 0
    assert sum(end.completion_tokens for _, end in llms) == usage["completion_tokens"] > 0

    done = [m for m in entries if isinstance(m, TaskDone)]
    assert [m.index for m in done] == [0, 1, 2, 3]
    assert len({m.fingerprint for m in done}) == 1 and len(done[0].fingerprint) == 64
    assert all(set(m.output) == TASK_FIELDS for m in done)
    assert [m.output["raw"] for m in done] == [task["raw"] for task in output(messages)["tasks_output"]]
    # A task is done after its last call ended, and before the next task's first call.
    for task in done[:-1]:
        after = entries[entries.index(task) + 1]
        assert isinstance(after, EffectStarted) and after.effect == "llm"


async def quiet(worker: WorkerProcess, seconds: float) -> list[Any]:
    """What the worker says in ``seconds``."""
    said: list[Any] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                said.append(await worker.next_message())
    return said


def arguments_digest(arguments: Any) -> str:
    return hashlib.sha256(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)).hexdigest()


def ends(entries: list[Any]) -> list[EffectEnded]:
    return [m for m in entries if isinstance(m, EffectEnded)]


def test_a_resume_runs_only_the_tasks_after_those_done(tmp_path: Path) -> None:
    first = job(tmp_path, "effects", {"marker": "m"})
    done = [m for m in first if isinstance(m, TaskDone)]
    assert lines(tmp_path) == [f"m step {n}" for n in (1, 2, 3, 4)]
    (tmp_path / EFFECTS_LOG).unlink()

    resumed = [m.output for m in done[:2]]
    second = job(tmp_path, "effects", {"marker": "m"}, resumed=resumed, fingerprint=done[0].fingerprint)
    assert lines(tmp_path) == ["m step 3", "m step 4"]  # steps 1-2's tools are not called again
    again = [m for m in second if isinstance(m, TaskDone)]
    assert [m.index for m in again] == [2, 3] and again[0].id == 4  # the ids count from 1: model, tool, model
    assert {m.fingerprint for m in again} == {done[0].fingerprint}
    whole, continued = output(first), output(second)
    assert continued["raw"] == whole["raw"]
    assert len(continued["tasks_output"]) == 4
    for was, now in zip(whole["tasks_output"], continued["tasks_output"], strict=True):
        assert {key: value for key, value in now.items() if key != "messages"} == {
            key: value for key, value in was.items() if key != "messages"
        }
    assert len(continued["replay_task_ids"]) == 4  # the whole kickoff replayable, as after an uninterrupted one


def test_a_resume_of_a_changed_crew_is_refused_before_it_starts(tmp_path: Path) -> None:
    resumed = [{"description": "step 1", "agent": "Clerk 1", "raw": "done", "output_format": "raw"}]
    messages = job(tmp_path, "effects", {}, resumed=resumed, fingerprint="0" * 64)
    assert [type(m) for m in messages] == [Hello, Building, Failed]
    refused = messages[-1]
    assert refused.reason == Reason.CREW_CHANGED and refused.error_type == "CrewChanged"
    assert not refused.uncertain_outcome and "is not the crew the resumed job ran" in refused.message
    assert lines(tmp_path) == []


def test_a_resume_gives_later_tasks_the_restored_context(tmp_path: Path) -> None:
    first = job(tmp_path, "shape-context", {})
    done = [m for m in first if isinstance(m, TaskDone)]
    second = job(tmp_path, "shape-context", {}, resumed=[done[0].output], fingerprint=done[0].fingerprint)
    assert [m.index for m in second if isinstance(m, TaskDone)] == [1, 2]
    assert output(second)["raw"] == output(first)["raw"]  # the writer read the restored research as context
    assert "building on" in output(second)["raw"]


def test_a_recorded_nobody_waits_for_ends_the_worker(tmp_path: Path) -> None:
    async def scenario() -> int | None:
        worker = await launch(tmp_path, "effects", {})
        try:
            while not isinstance(message := await asyncio.wait_for(worker.next_message(), 60), EffectStarted):
                pass
            worker.send(Recorded(message.id + 1))
            return await worker.wait_exit(30)
        finally:
            await worker.kill()

    assert asyncio.run(scenario()) == ExitCode.PROTOCOL


def test_the_fingerprint_is_the_crew_s_tasks_as_written() -> None:
    assert resume.fingerprint(effects.effects()) == resume.fingerprint(effects.effects())
    assert resume.fingerprint(shapes.shape_context()) != resume.fingerprint(effects.effects())
    crew = effects.effects()
    kicked = effects.effects()
    for task in kicked.tasks:  # as a kickoff does: the fingerprint reads the tasks as written
        task.interpolate_inputs_and_add_conversation_history({"marker": "other", "hang_in_step": 0, "fail_in_step": 0})
    assert kicked.tasks[0].description != crew.tasks[0].description
    assert resume.fingerprint(kicked) == resume.fingerprint(crew)
    for change in ("description", "expected_output"):
        changed = effects.effects()
        setattr(changed.tasks[2], change, "step 3, reworded.")
        assert resume.fingerprint(changed) != resume.fingerprint(crew)
    changed = effects.effects()
    changed.tasks[1].agent = changed.tasks[0].agent
    assert resume.fingerprint(changed) != resume.fingerprint(crew)


def test_a_call_cut_off_has_started_and_not_ended(tmp_path: Path) -> None:
    """Killed inside the tool call of step 2: its entry has no end (the supervisor makes it uncertain)."""

    async def scenario() -> list[Any]:
        worker = await launch(tmp_path, "effects", {"marker": "m", "hang_in_step": 2})
        answers = answering(worker)
        try:
            inside = await asyncio.to_thread(wait_until, lambda: "m step 2 begun" in lines(tmp_path), 60)
            assert inside, worker.stderr.text()[-2000:]
        finally:
            await worker.kill()
        return await answers

    entries = ledger(asyncio.run(scenario()))
    assert [m.index for m in entries if isinstance(m, TaskDone)] == [0]
    last = entries[-1]
    assert isinstance(last, EffectStarted) and last.effect == "tool" and last.name == TOOL
    assert lines(tmp_path) == ["m step 1", "m step 2 begun"]


def test_async_tasks_are_done_in_the_crew_s_order(tmp_path: Path) -> None:
    messages = job(tmp_path, "shape-async", {})
    done = [m for m in messages if isinstance(m, TaskDone)]
    assert [m.index for m in done] == [0, 1, 2]
    assert [m.output["raw"] for m in done] == [task["raw"] for task in output(messages)["tasks_output"]]


def test_native_tool_calls_and_provider_calls_are_recorded(tmp_path: Path, provider: Provider) -> None:
    """CrewAI's own LLM class calling the tools natively (function calling): the other path to a tool."""
    messages = job(tmp_path, "shape-llm-tools", {}, {URL_ENV: provider.url})
    entries = ledger(messages)
    started = {m.id: m for m in entries if isinstance(m, EffectStarted)}
    answered = [m["name"] for m in provider.calls[-2].messages if m["role"] == "tool"]  # the tools' results it got
    assert answered == ["word_stats"]
    assert [started[end.id].name for end in ends(entries) if started[end.id].effect == "tool"] == answered
    assert all(end.status == "finished" for end in ends(entries))
    asked = [c["function"]["arguments"] for m in provider.calls[-2].messages for c in m.get("tool_calls") or ()]
    tools = [started[end.id].digest for end in ends(entries) if started[end.id].effect == "tool"]
    assert tools == [arguments_digest(json.loads(arguments)) for arguments in asked]  # as on the ReAct path
    llms = [end for end in ends(entries) if started[end.id].effect == "llm"]
    usage = output(messages)["token_usage"]
    assert sum(end.prompt_tokens + end.completion_tokens for end in llms) == usage["total_tokens"] > 0
    assert [m.index for m in entries if isinstance(m, TaskDone)] == [0, 1]


def test_a_task_output_over_the_event_bound_ends_the_tasks_done(tmp_path: Path) -> None:
    """Not sent (the supervisor would refuse the frame), nor any after it: a resume runs again from there."""
    inputs = {"marker": "m", "fail_in_step": 1}  # step 1's answer is the shortest
    sizes = [len(orjson.dumps(m.output)) for m in job(tmp_path, "effects", inputs) if isinstance(m, TaskDone)]
    assert sizes[0] < sizes[1]
    bounded = job(tmp_path, "effects", inputs, {MAX_EVENT_BYTES: str(sizes[0])})
    assert [m.index for m in bounded if isinstance(m, TaskDone)] == [0]
    assert len(output(bounded)["tasks_output"]) == 4  # the run itself goes on


def test_a_resume_restores_structured_outputs(tmp_path: Path) -> None:
    """A task's ``pydantic`` comes back as its ``output_pydantic`` model, not a bare one: the run then ends as an
    uninterrupted one does."""
    first = job(tmp_path, "shape-structured", {})
    done = [m for m in first if isinstance(m, TaskDone)]
    for restored in (1, 2):
        resumed = [m.output for m in done[:restored]]
        second = job(tmp_path, "shape-structured", {}, resumed=resumed, fingerprint=done[0].fingerprint)
        assert resumable(output(second)) == resumable(output(first))
    unfit = [done[0].output, {**done[1].output, "pydantic": {"summary": "no score"}}]  # not a Verdict
    refused = job(tmp_path, "shape-structured", {}, resumed=unfit, fingerprint=done[0].fingerprint)
    assert [type(m) for m in refused] == [Hello, Building, Failed] and refused[-1].reason == Reason.CREW_CHANGED


def resumable(output: dict[str, Any]) -> dict[str, Any]:
    """What a resumed run gives as an uninterrupted one does: not the restored tasks' messages, nor their usage."""
    tasks = [{key: value for key, value in task.items() if key != "messages"} for task in output["tasks_output"]]
    kept = {key: value for key, value in comparable(output).items() if key != "token_usage"}
    return {**kept, "tasks_output": tasks}


def test_a_call_with_arguments_orjson_cannot_write_is_recorded(tmp_path: Path) -> None:
    """Its digest is of their ``repr``: the call goes on, and the ids after it stay in order."""
    messages = job(tmp_path, "effects-large-number", {})
    entries = ledger(messages)
    numbered = [m.id for m in entries if not isinstance(m, EffectEnded)]
    assert numbered == list(range(1, len(numbered) + 1))
    started = {m.id: m for m in entries if isinstance(m, EffectStarted)}
    tools = [(started[end.id], end) for end in ends(entries) if started[end.id].effect == "tool"]
    assert [(call.name, end.status) for call, end in tools] == [(effects.COUNT, "finished")]
    assert len(tools[0][0].digest) == 64
    assert f"counted to {effects.LARGE}" in output(messages)["raw"]


def test_the_tasks_done_stop_where_a_resume_could_not_send_them(tmp_path: Path) -> None:
    """Restored outputs count: a task whose output would bring the job's past MAX_RESUMED_BYTES is not sent, nor any
    after it; one that just fits is."""
    first = job(tmp_path, "effects", {"marker": "m"})
    done = [m for m in first if isinstance(m, TaskDone)]
    sizes = [len(orjson.dumps(m.output)) for m in done]
    for room, sent in ((sizes[2] - 1, []), (sizes[2], [2])):
        # Two restored outputs, padded so that the third task's output has ``room`` left beside them.
        pad = MAX_RESUMED_BYTES - room - sizes[0] - sizes[1]
        resumed = [
            {**done[0].output, "raw": done[0].output["raw"] + "x" * (pad // 2)},
            {**done[1].output, "raw": done[1].output["raw"] + "x" * (pad - pad // 2)},
        ]
        (tmp_path / EFFECTS_LOG).unlink()
        second = job(tmp_path, "effects", {"marker": "m"}, resumed=resumed, fingerprint=done[0].fingerprint)
        assert [m.index for m in second if isinstance(m, TaskDone)] == sent
        assert lines(tmp_path) == ["m step 3", "m step 4"]  # the run goes on (its output, with the padding, is
        assert second[-1].reason == Reason.OUTPUT_TOO_LARGE  # too large: each later task's prompt quotes the last)


def test_a_task_output_is_measured_masked_as_the_supervisor_measures_it(tmp_path: Path) -> None:
    """Its secrets replaced in its strings, not in its JSON text (where a secret holding ``"`` is escaped)."""
    secret, named = '"a"b"c"d', {"secret_names": ["LEDGER_SECRET"]}
    env, inputs = {"LEDGER_SECRET": secret}, {"marker": secret, "fail_in_step": 1}
    done = [m for m in job(tmp_path, "effects", inputs, env, **named) if isinstance(m, TaskDone)]
    unmasked = len(orjson.dumps(done[0].output))
    sizes = [len(orjson.dumps(redact_data(m.output, (secret,)))) for m in done]
    assert sizes[0] < sizes[1] and sizes[0] < unmasked
    bounded = job(tmp_path, "effects", inputs, {**env, MAX_EVENT_BYTES: str(sizes[0])}, **named)
    assert [m.index for m in bounded if isinstance(m, TaskDone)] == [0]


def test_a_call_the_budget_holds_back_ends_failed(tmp_path: Path) -> None:
    """The call that crossed the token budget, its answer held back until the job is stopped: its end says so (not
    left running, which the supervisor makes uncertain), with what it booked."""

    async def scenario() -> list[Any]:
        worker = await launch(tmp_path, "effects", {"marker": "m"}, max_tokens=1)
        try:
            seen = [await next_answered(worker)]
            while not isinstance(seen[-1], EffectEnded):
                seen.append(await next_answered(worker))
        finally:
            await worker.kill()
        return seen

    messages = asyncio.run(scenario())
    entries = ledger(messages)
    assert [type(m) for m in entries] == [EffectStarted, EffectEnded] and entries[0].effect == "llm"
    end = entries[-1]
    assert (end.id, end.status, end.error_type) == (entries[0].id, "failed", "OverBudget")
    assert end.error_message == "held back: the job's max_tokens is spent"
    spent = next(m for m in messages if isinstance(m, Spent))
    assert (end.prompt_tokens, end.completion_tokens) == (spent.prompt_tokens, spent.completion_tokens) != (0, 0)
    assert lines(tmp_path) == []  # the answer never reached the agent: no tool call


def test_a_direct_call_of_a_model_class_defined_late_is_recorded(tmp_path: Path) -> None:
    """Its class is wrapped as its first call starts (inside that call): that call is recorded too, before it goes
    out; its end is not seen."""
    entries = ledger(job(tmp_path, "effects-late-model", {}))
    first = entries[0]
    assert isinstance(first, EffectStarted) and (first.id, first.effect, first.name) == (1, "llm", effects.LATE_MODEL)
    assert first.id not in {end.id for end in ends(entries)}
    assert [m.name for m in entries if isinstance(m, EffectStarted)].count(effects.LATE_MODEL) == 1


def test_a_tool_class_each_build_defines_is_recorded_in_each_crew_of_a_batch(tmp_path: Path) -> None:
    messages = job(tmp_path, "effects-own-tool", {"inputs": [{}, {}]}, operation="batch_run")
    own = [m for m in ledger(messages) if isinstance(m, EffectStarted) and m.name == effects.OWN_TOOL]
    assert len(own) == 2
