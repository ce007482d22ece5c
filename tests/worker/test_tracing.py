"""A job's trace in its worker: real workers running real CrewAI (offline, and on CrewAI's own ``LLM`` against the
loopback provider) with ``Start.trace`` set send their spans as ``SpanStarted``/``SpanEnded`` frames, a tree beneath
the supervisor's span; without it they send none. The test plays the supervisor, answering the ledger."""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from crewai import Agent, Task

from protocol import (
    MAX_SPAN_VALUE_CHARS,
    SPAN_ATTRIBUTES,
    TRAINING_DIR,
    Building,
    Completed,
    Effect,
    EffectEnded,
    EffectStarted,
    Failed,
    Message,
    SpanEnded,
    SpanName,
    SpanStarted,
    Started,
)
from supervisor.processes.process import WorkerProcess
from tests.crews import effects, shapes
from tests.crews.effects import STEPS
from tests.helpers import ledger
from tests.helpers.ledger import next_answered
from worker import tracing
from worker.demo import OfflineLLM
from worker.provider import URL_ENV, Provider

pytestmark = pytest.mark.usefixtures("subreaper")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SPAN_ID = re.compile(r"[0-9a-f]{16}")


async def launch(
    tmp: Path, crew: str, inputs: dict[str, Any], env: dict[str, str] | None = None, **start: Any
) -> WorkerProcess:
    """A real worker given its job (tests/helpers/ledger.py), traced unless ``trace`` says otherwise."""
    return await ledger.launch(tmp, crew, inputs, env, **{"trace": TRACEPARENT, **start})


def job(tmp: Path, crew: str, inputs: dict[str, Any], env: dict[str, str] | None = None, **start: Any) -> list[Any]:
    """Every message of one job in a real worker, its ledger answered; traced unless ``trace`` says otherwise."""
    return ledger.job(tmp, crew, inputs, env, **{"trace": TRACEPARENT, **start})


class Tree:
    """The spans of a job's frames, checked as the supervisor takes them (docs/tracing.md): each id new and 16
    lowercase hex digits, each parent "" or a span started before it, each span ended once, after its children,
    its attributes within SPAN_ATTRIBUTES."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages
        self.started: dict[str, SpanStarted] = {}
        self.ended: dict[str, SpanEnded] = {}
        self.at: dict[tuple[str, str], int] = {}  # (start|end, id) -> position in messages
        for position, message in enumerate(messages):
            if isinstance(message, SpanStarted):
                assert SPAN_ID.fullmatch(message.id) and message.id not in self.started, message
                assert message.parent == "" or message.parent in self.started, message  # its parent's start first
                assert message.parent not in self.ended, message  # never beneath a span already said ended
                assert message.name in set(SpanName), message
                self.started[message.id], self.at["start", message.id] = message, position
                valid(message.attributes)
            elif isinstance(message, SpanEnded):
                assert message.id in self.started and message.id not in self.ended, message
                assert len(message.error) <= MAX_SPAN_VALUE_CHARS
                assert message.end_ns >= self.started[message.id].start_ns
                self.ended[message.id], self.at["end", message.id] = message, position
                valid(message.attributes)
        assert set(self.ended) == set(self.started), "a span never ended"
        for span in self.started.values():
            if span.parent:  # a child is said ended before its parent, and starts after it
                assert self.at["end", span.id] < self.at["end", span.parent]
                assert self.started[span.parent].start_ns <= span.start_ns

    def named(self, name: str) -> list[SpanStarted]:
        return [span for span in self.started.values() if span.name == name]

    def one(self, name: str) -> SpanStarted:
        (span,) = self.named(name)
        return span

    def attributes(self, span: SpanStarted) -> dict[str, Any]:
        """Its attributes at start and at end."""
        return {**span.attributes, **self.ended[span.id].attributes}

    def error(self, span: SpanStarted) -> str:
        return self.ended[span.id].error

    def parent(self, span: SpanStarted) -> SpanStarted | None:
        return self.started.get(span.parent)


def valid(attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        assert key in SPAN_ATTRIBUTES and type(value) is SPAN_ATTRIBUTES[key], (key, value)
        assert not isinstance(value, str) or len(value) <= MAX_SPAN_VALUE_CHARS, (key, value)


def spans(messages: list[Any]) -> list[Any]:
    return [m for m in messages if isinstance(m, SpanStarted | SpanEnded)]


def test_a_traced_run_is_a_tree_of_its_start_kickoff_tasks_and_calls(tmp_path: Path) -> None:
    """The ``effects`` crew (four tasks, each of its own agent calling its tool; the tool of step 2 raises)."""
    messages = job(tmp_path, "effects", {"marker": "m", "fail_in_step": 2})
    assert isinstance(messages[-1], Completed), messages[-1]
    tree = Tree(messages)
    start, kickoff = tree.one(SpanName.WORKER_START), tree.one(SpanName.KICKOFF)
    assert start.parent == kickoff.parent == "" and not tree.error(start) and not tree.error(kickoff)
    kinds = [type(m) for m in messages if not isinstance(m, SpanStarted | SpanEnded)]
    assert kinds[1:3] == [Building, Started]
    # worker.start: from the Start taken (before Building) to Started said; the kickoff after it, ended before the end.
    assert tree.at["start", start.id] < messages.index(next(m for m in messages if isinstance(m, Building)))
    said = messages.index(next(m for m in messages if isinstance(m, Started)))
    assert said < tree.at["end", start.id] < tree.at["start", kickoff.id]
    assert tree.at["end", kickoff.id] < len(messages) - 1

    tasks = tree.named(SpanName.TASK)
    assert [tree.parent(task) for task in tasks] == [kickoff] * STEPS
    assert [task.attributes for task in tasks] == [
        {
            "crew_supervisor.task.index": index,
            "crew_supervisor.task.name": f"step {index + 1}",
            "crew_supervisor.agent.role": f"Clerk {index + 1}",
        }
        for index in range(STEPS)
    ]
    calls(tree, messages)
    failed = [span for span in tree.named(SpanName.TOOL_CALL) if tree.error(span)]
    assert failed and all(tree.error(span) == "RuntimeError" for span in failed)
    assert {tree.parent(span).attributes["crew_supervisor.task.index"] for span in failed} == {1}  # step 2's


def calls(tree: Tree, messages: list[Any], beneath: tuple[str, ...] = (SpanName.TASK,)) -> None:
    """Each ledger call is one span (beneath a task, or what ``beneath`` names), carrying its entry's id, name, end
    and tokens; no other."""
    started = {m.id: m for m in messages if isinstance(m, EffectStarted)}
    ended = {m.id: m for m in messages if isinstance(m, EffectEnded)}
    spans = tree.named(SpanName.LLM_CALL) + tree.named(SpanName.TOOL_CALL)
    assert sorted(span.attributes["crew_supervisor.effect.id"] for span in spans) == sorted(started)
    for span in spans:
        entry = started[span.attributes["crew_supervisor.effect.id"]]
        end, attributes = ended[entry.id], tree.attributes(span)
        assert tree.parent(span).name in beneath
        assert attributes["crew_supervisor.effect.status"] == end.status
        assert bool(tree.error(span)) == (end.status == "failed") and tree.error(span) == end.error_type
        # Opened once the supervisor holds the entry, ended before the entry's end is said.
        assert messages.index(entry) < tree.at["start", span.id] < tree.at["end", span.id] < messages.index(end)
        if entry.effect == "llm":
            assert span.name == SpanName.LLM_CALL and attributes["gen_ai.operation.name"] == "chat"
            assert attributes["gen_ai.request.model"] == entry.name
            assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
                end.prompt_tokens,
                end.completion_tokens,
            )
        else:
            assert span.name == SpanName.TOOL_CALL and attributes["gen_ai.operation.name"] == "execute_tool"
            assert attributes["gen_ai.tool.name"] == entry.name
            assert "gen_ai.usage.input_tokens" not in attributes


def test_a_job_not_traced_sends_no_span(tmp_path: Path) -> None:
    messages = job(tmp_path, "effects", {"marker": "m", "fail_in_step": 2}, trace="")
    assert isinstance(messages[-1], Completed) and not spans(messages)
    assert any(isinstance(m, EffectStarted) for m in messages)  # the same calls, in the ledger only


def test_a_crew_on_crewai_s_own_llm_has_its_calls_traced(tmp_path: Path, provider: Provider) -> None:
    """Against the loopback provider: each model call's span names its model and the tokens CrewAI booked; the
    tools the model calls natively are spans too."""
    messages = job(tmp_path, "shape-llm-tools", {}, {URL_ENV: provider.url})
    assert isinstance(messages[-1], Completed), messages[-1]
    tree = Tree(messages)
    calls(tree, messages)
    llms = [tree.attributes(span) for span in tree.named(SpanName.LLM_CALL)]
    assert [a["gen_ai.request.model"] for a in llms] == [call.model for call in provider.calls[-len(llms) :]]
    usage = messages[-1].output["token_usage"]
    assert sum(a["gen_ai.usage.input_tokens"] for a in llms) == usage["prompt_tokens"] > 0
    assert sum(a["gen_ai.usage.output_tokens"] for a in llms) == usage["completion_tokens"] > 0
    assert [tree.attributes(span)["gen_ai.tool.name"] for span in tree.named(SpanName.TOOL_CALL)] == ["word_stats"]
    assert [task.attributes["crew_supervisor.agent.role"] for task in tree.named(SpanName.TASK)] == [
        "Analyst",
        "Writer",
    ]


def test_async_tasks_each_have_their_span_beneath_the_kickoff(tmp_path: Path) -> None:
    """``shape-async``: two tasks run at once in threads of their own, then one that takes both."""
    tree = Tree(job(tmp_path, "shape-async", {}))
    kickoff, tasks = tree.one(SpanName.KICKOFF), tree.named(SpanName.TASK)
    assert sorted(task.attributes["crew_supervisor.task.index"] for task in tasks) == [0, 1, 2]
    assert all(tree.parent(task) == kickoff for task in tasks)
    by_task = {task.id: [s for s in tree.named(SpanName.LLM_CALL) if s.parent == task.id] for task in tasks}
    assert all(len(llms) == 1 for llms in by_task.values())  # each task's model call beneath its own task
    assert not any("crew_supervisor.task.name" in task.attributes for task in tasks)  # none named


def test_a_task_without_a_name_exports_neither_its_description_nor_the_inputs(tmp_path: Path) -> None:
    """``shape-context``'s tasks have no name: their descriptions are their prompts (as written, and as the inputs
    fill them in), and no span says a word of them, nor of the inputs."""
    topic = "quokka-" + uuid.uuid4().hex[:8]
    messages = job(tmp_path, "shape-context", {"topic": topic})
    assert isinstance(messages[-1], Completed), messages[-1]
    tree = Tree(messages)
    assert [task.attributes["crew_supervisor.task.index"] for task in tree.named(SpanName.TASK)] == [0, 1, 2]
    crew = shapes.shape_context()
    roles = [agent.role for agent in crew.agents]  # which do go out: "Researcher" says no word of its task's
    descriptions = [task.description for task in crew.tasks]
    words = {topic, *descriptions, *(text.replace("{topic}", topic) for text in descriptions)}
    words |= {word for text in descriptions for word in text.split() if len(word) > 3}
    words = {word for word in words if not any(word in role for role in roles)}
    said = [
        str(value)
        for frame in spans(messages)
        for value in [*frame.attributes.values(), getattr(frame, "name", ""), getattr(frame, "error", "")]
    ]
    assert not [(word, value) for value in said for word in words if word in value]


@pytest.mark.parametrize("operation", ["batch_run", "train", "test"])
def test_each_operation_that_runs_tasks_has_their_spans(tmp_path: Path, operation: str) -> None:
    """``batch_run`` runs a fresh crew per input, ``train`` and ``test`` a copy of the crew (whose agents the copy's
    kickoff ties to it); ``test`` then runs an evaluation task of no crew after each task, beneath it; ``train``
    evaluates each task's output once the crew ended, beneath the kickoff."""
    inputs = {
        "batch_run": {"inputs": [{}, {}]},
        "train": {"n_iterations": 1, "artifact_name": "traced", "feedback": "More."},
        "test": {"n_iterations": 1, "eval_llm": "offline-eval"},
    }[operation]
    (tmp_path / "training").mkdir()
    messages = job(tmp_path, "shape-context", inputs, {TRAINING_DIR: str(tmp_path / "training")}, operation=operation)
    assert isinstance(messages[-1], Completed), messages[-1]
    tree = Tree(messages)
    kickoff, tasks = tree.one(SpanName.KICKOFF), tree.named(SpanName.TASK)
    crews = [task for task in tasks if "crew_supervisor.task.index" in task.attributes]
    assert all(tree.parent(task) == kickoff for task in crews)
    runs = 2 if operation == "batch_run" else 1
    assert sorted(task.attributes["crew_supervisor.task.index"] for task in crews) == sorted([0, 1, 2] * runs)
    evaluations = [task for task in tasks if task not in crews]
    assert [tree.parent(task) for task in evaluations] == (crews if operation == "test" else [])
    calls(tree, messages, (SpanName.TASK, SpanName.KICKOFF) if operation == "train" else (SpanName.TASK,))


def test_a_replay_traces_the_tasks_it_runs_again(tmp_path: Path) -> None:
    first = job(tmp_path, "shape-context", {}, trace="")
    second_task = first[-1].output["replay_task_ids"][1]
    tree = Tree(job(tmp_path, "shape-context", {"task_id": second_task}, operation="replay"))
    tasks = tree.named(SpanName.TASK)
    assert [task.attributes["crew_supervisor.task.index"] for task in tasks] == [1, 2]  # the first one's reused
    assert [tree.parent(task) for task in tasks] == [tree.one(SpanName.KICKOFF)] * 2


def test_a_call_the_budget_holds_back_ends_its_span_failed(tmp_path: Path) -> None:
    """Held until the job is stopped, never to return: its span ends as its ledger entry does, with what it booked;
    its task and the kickoff stay open (the supervisor ends them as cut off)."""

    async def scenario() -> list[Any]:
        worker = await launch(tmp_path, "effects", {"marker": "m"}, max_tokens=1)
        try:
            seen = [await next_answered(worker)]
            while not any(isinstance(m, EffectEnded) for m in seen) or not isinstance(seen[-1], SpanEnded):
                seen.append(await next_answered(worker))
        finally:
            await worker.kill()
        return seen

    messages = asyncio.run(scenario())
    end = next(m for m in messages if isinstance(m, EffectEnded))
    (call,) = [m for m in messages if isinstance(m, SpanStarted) and m.name == SpanName.LLM_CALL]
    assert messages[-1].id == call.id and messages[-1].error == "OverBudget" == end.error_type
    assert messages[-1].attributes == {
        "crew_supervisor.effect.status": "failed",
        "gen_ai.usage.input_tokens": end.prompt_tokens,
        "gen_ai.usage.output_tokens": end.completion_tokens,
    }
    assert end.prompt_tokens > 0


def test_a_job_that_fails_before_it_starts_ends_its_start_with_the_error(tmp_path: Path) -> None:
    messages = job(tmp_path, "broken-factory", {})
    assert isinstance(messages[-1], Failed)
    tree = Tree(messages)
    start = tree.one(SpanName.WORKER_START)
    assert tree.error(start) == messages[-1].error_type and list(tree.started) == [start.id]
    assert tree.at["end", start.id] < len(messages) - 1  # said before the terminal frame


def test_a_kickoff_that_raises_ends_with_its_error(tmp_path: Path) -> None:
    messages = job(tmp_path, "shape-context", {"task_id": "no-such-task"}, operation="replay")
    assert isinstance(messages[-1], Failed)
    tree = Tree(messages)
    assert tree.error(tree.one(SpanName.KICKOFF)) == "ReplayError" == messages[-1].error_type
    assert not tree.error(tree.one(SpanName.WORKER_START))


# The trace's own rules, in this process: its frames go to a list.


def test_a_job_not_traced_opens_nothing() -> None:
    """No span, no current span set, no task class wrapped: each place a span would open checks once."""
    with tracing.span(None, SpanName.KICKOFF), tracing.call(None, Effect.TOOL, "tool", 1, None):
        assert tracing._current.get() is None
    tracing.follow(None, effects.effects())
    assert not hasattr(Task._execute_core, "traced") and not hasattr(Task._aexecute_core, "traced")
    tracing.started(None)
    tracing.held(None, "OverBudget", [1, 2])


@pytest.fixture
def sent() -> list[Message]:
    """Where the test's trace (``trace``) sends its frames."""
    return []


@pytest.fixture
def trace(sent: list[Message]) -> tracing.Trace:
    """A trace open in this process, its job started, sending into ``sent``."""
    opened = tracing.open_trace(sent.append, ("s3cret",))
    tracing.started(opened)
    return opened


def test_a_span_ended_before_its_child_is_said_ended_after_it(trace: tracing.Trace, sent: list[Message]) -> None:
    opened, release = threading.Event(), threading.Event()

    def child() -> None:
        with tracing.span(trace, SpanName.LLM_CALL):
            opened.set()
            release.wait()

    with tracing.span(trace, SpanName.KICKOFF) as kickoff:
        thread = threading.Thread(target=child)
        thread.start()
        assert opened.wait(30)
    assert [type(m) for m in sent[2:]] == [SpanStarted, SpanStarted]  # the kickoff's end held back
    release.set()
    thread.join()
    assert [(type(m), m.id) for m in sent[4:]] == [(SpanEnded, sent[3].id), (SpanEnded, kickoff.id)]
    assert sent[5].end_ns <= sent[4].end_ns  # each keeps the time it was ended at
    Tree(sent)


def test_a_span_where_no_span_is_current_goes_beneath_the_innermost_open_one(
    trace: tracing.Trace, sent: list[Message]
) -> None:
    """Beneath the open task of its thread, else the one open task, else the kickoff."""

    release, threads = threading.Event(), []

    def enter(name: SpanName) -> None:
        trace.open(name, {})  # left open: as a call under way

    def opened_in_a_thread(name: SpanName, context: contextvars.Context | None = None, stays: bool = False) -> None:
        # A thread runs in a context of its own, with no span current: as a thread CrewAI starts may. One that
        # ``stays`` runs on (as a task's does while it is open), until the test ends: its id is not reused.
        opened = threading.Event()

        def run() -> None:
            (context or contextvars.Context()).run(enter, name)
            opened.set()
            if stays:
                release.wait()

        thread = threading.Thread(target=run)
        thread.start()
        assert opened.wait(30)
        if not stays:
            thread.join()
        else:
            threads.append(thread)

    with tracing.span(trace, SpanName.KICKOFF) as kickoff:
        opened_in_a_thread(SpanName.LLM_CALL)  # no task open: beneath the kickoff
        with tracing.span(trace, SpanName.TASK) as task:
            opened_in_a_thread(SpanName.LLM_CALL)  # beneath the one task open
            inside = contextvars.copy_context()
        opened_in_a_thread(SpanName.TOOL_CALL, inside)  # its context's span has ended: beneath the kickoff
        at_kickoff = contextvars.copy_context()
        with tracing.span(trace, SpanName.TASK) as mine:
            opened_in_a_thread(SpanName.TASK, at_kickoff, stays=True)  # a second task open, in its own thread
            contextvars.Context().run(enter, SpanName.LLM_CALL)  # this thread's task
            opened_in_a_thread(SpanName.LLM_CALL)  # two tasks open, neither its thread's: the kickoff
    release.set()
    for thread in threads:
        thread.join()
    assert [(m.name, m.parent) for m in sent if isinstance(m, SpanStarted)][1:] == [
        (SpanName.KICKOFF, ""),
        (SpanName.LLM_CALL, kickoff.id),
        (SpanName.TASK, kickoff.id),
        (SpanName.LLM_CALL, task.id),
        (SpanName.TOOL_CALL, kickoff.id),
        (SpanName.TASK, kickoff.id),
        (SpanName.TASK, kickoff.id),
        (SpanName.LLM_CALL, mine.id),
        (SpanName.LLM_CALL, kickoff.id),
    ]


def test_a_span_whose_work_raises_ends_with_its_type_and_the_exception_goes_on(
    trace: tracing.Trace, sent: list[Message]
) -> None:
    secret_error = type("s3cretError", (Exception,), {})  # a secret in a type's name is masked too
    error = secret_error("no")
    with pytest.raises(secret_error) as raised, tracing.span(trace, SpanName.KICKOFF):
        raise error
    assert raised.value is error
    assert isinstance(sent[-1], SpanEnded) and sent[-1].error == "[redacted]Error"


def test_a_task_s_strings_are_masked_then_cut(trace: tracing.Trace) -> None:
    agent = Agent(role="s3cret " + "r" * 300, goal="g", backstory="b", llm=OfflineLLM(model="offline"))
    name = "x" * (MAX_SPAN_VALUE_CHARS - 3) + "s3cret and more"
    task = Task(name=name, description="d", expected_output="e", agent=agent)
    attributes = trace.task_attributes(task, agent)
    assert attributes == {
        "crew_supervisor.task.name": "x" * (MAX_SPAN_VALUE_CHARS - 3) + "[re",
        "crew_supervisor.agent.role": ("[redacted] " + "r" * 300)[:MAX_SPAN_VALUE_CHARS],
    }
