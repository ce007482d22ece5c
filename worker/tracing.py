"""A job's trace, in its worker (docs/tracing.md): when its ``Start`` names one (``Start.trace``), its start, its
operation, each task, each LLM call and each tool call are spans, sent to the supervisor as ``SpanStarted`` and
``SpanEnded`` frames on the event pipe; the supervisor exports them beneath its ``worker`` span (a worker holds no
exporter, no endpoint, no key). Not traced: nothing is opened, and each place a span would open costs one check.

A span's parent is the span current in its context (a ``ContextVar``). CrewAI runs a kickoff, its tasks and its
model calls in threads of its own, and a thread may not have its caller's context: a span opened where no span is
current (or where the current one has ended) goes beneath the innermost open task of its thread, else the job's only
open task, else the open kickoff, else the supervisor's span (parent ""). A span said ended while one of its children
is open is sent ended when its last child is: each ``SpanStarted`` reaches the supervisor before its children's,
each ``SpanEnded`` after theirs.

Tasks are caught where CrewAI runs one (``Task._execute_core``/``_aexecute_core``: a crew's sequential and
asynchronous tasks, a replay's, a training's and a test's, and a task run on its own as a test's evaluation), calls
where the ledger brackets them (worker/ledger.py, which opens their spans here).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from protocol import MAX_SPAN_VALUE_CHARS, Effect, EffectStatus, Message, SpanEnded, SpanName, SpanStarted
from worker import masking

_UNTRACED: AbstractContextManager[None] = contextlib.nullcontext()


@dataclasses.dataclass(eq=False)
class Span:
    """An open span: ``children`` still open beneath it; once it is ended, ``ending`` holds its end until they are."""

    id: str
    name: SpanName
    parent: Span | None
    thread: int  # where it was opened: a fallback parent for a span opened there without a context
    children: int = 0
    ended: bool = False
    ending: SpanEnded | None = None


_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar("trace_span", default=None)


class Trace:
    """The job's spans (the worker's ``trace``, once its Start named one): ``lock`` makes choosing a parent, counting
    it and sending the frame one step, so the frames go out in the order they say."""

    def __init__(self, send: Callable[[Message], None], secrets: tuple[str, ...]) -> None:
        self.send = send
        self.secrets = secrets
        self.lock = threading.Lock()
        self.tasks: list[Span] = []  # open, in the order they opened
        self.kickoffs: list[Span] = []
        self.crews: list[Any] = []  # the job's crews, for a task's index where its agent names no crew (a replay)
        self.starting: Span | None = None  # worker.start, until the job has started

    def open(self, name: SpanName, attributes: dict[str, Any]) -> Span:
        with self.lock:
            parent = self._parent()
            span = Span(_new_id(), name, parent, threading.get_ident())
            self.send(SpanStarted(span.id, parent.id if parent else "", name, time.time_ns(), attributes))
            if parent is not None:
                parent.children += 1
            if name == SpanName.TASK:
                self.tasks.append(span)
            elif name == SpanName.KICKOFF:
                self.kickoffs.append(span)
        return span

    def end(self, span: Span, attributes: dict[str, Any] | None = None, error: str = "") -> None:
        """``span`` ends now (``error``: the type of the exception its work raised); said once its children ended.
        Ending it again does nothing."""
        end_ns = time.time_ns()
        with self.lock:
            if span.ended:
                return
            span.ended = True
            for still in (self.tasks, self.kickoffs):
                if span in still:
                    still.remove(span)
            span.ending = SpanEnded(span.id, end_ns, attributes or {}, self.text(error) if error else "")
            said: Span | None = span
            while said is not None and said.children == 0 and said.ending is not None:
                self.send(said.ending)
                said.ending, said = None, said.parent
                if said is not None:
                    said.children -= 1

    @contextlib.contextmanager
    def span(self, name: SpanName, attributes: dict[str, Any]) -> Iterator[Span]:
        """A span around the work in the block, current in it; the block's exception ends it with ``error`` set and
        goes on unchanged."""
        span = self.open(name, attributes)
        mark = _current.set(span)
        try:
            yield span
        except BaseException as exc:
            self.end(span, error=type(exc).__name__)
            raise
        else:
            self.end(span)
        finally:
            _current.reset(mark)

    def _parent(self) -> Span | None:
        current = _current.get()
        if current is not None and not current.ended:
            return current
        thread = threading.get_ident()
        mine = [span for span in self.tasks if span.thread == thread]
        if mine:
            return mine[-1]
        if len(self.tasks) == 1:
            return self.tasks[0]
        return self.kickoffs[-1] if self.kickoffs else None

    def text(self, value: Any) -> str:
        """A string a span carries: masked, then cut (a secret cut in two would pass the supervisor's mask)."""
        return masking.masked(str(value), self.secrets)[:MAX_SPAN_VALUE_CHARS]

    def task_attributes(self, task: Any, agent: Any) -> dict[str, Any]:
        """A task's index in its crew (none for a task of no crew of the job: a test's evaluation), its name if the
        crew gave it one, and its agent's role (as the crew wrote it, before the inputs went in). Never its
        description, which is its prompt: a task without a name is told by its index."""
        attributes: dict[str, Any] = {}
        name = getattr(task, "name", None)
        if name:
            attributes["crew_supervisor.task.name"] = self.text(name)
        index = self._index(task, agent)
        if index is not None:
            attributes["crew_supervisor.task.index"] = index
        role = getattr(agent, "_original_role", None) or getattr(agent, "role", None)
        if role:
            attributes["crew_supervisor.agent.role"] = self.text(role)
        return attributes

    def _index(self, task: Any, agent: Any) -> int | None:
        # The agent's crew first: train and test run a copy of the job's crew, whose agents the kickoff tied to it.
        own = getattr(getattr(task, "agent", None), "crew", None)
        for crew in (getattr(agent, "crew", None), own, *self.crews):
            for index, each in enumerate(getattr(crew, "tasks", None) or ()):
                if each is task:
                    return index
        return None


def open_trace(send: Callable[[Message], None], secrets: tuple[str, ...] = ()) -> Trace:
    """As the job's ``Start`` is taken, if it names a trace: the job is traced, its ``worker.start`` opened. Each
    function below takes the job's trace, None when it is not traced."""
    trace = Trace(send, masking.ordered(secrets))
    trace.starting = trace.open(SpanName.WORKER_START, {})
    return trace


def started(trace: Trace | None, error: str = "") -> None:
    """The job has started (``Started`` said), or will not (``error``: the type of what ends it first)."""
    if trace is not None and trace.starting is not None:
        trace.end(trace.starting, error=error)


def span(trace: Trace | None, name: SpanName, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A span around a block of work (``Trace.span``); nothing when the job is not traced."""
    return _UNTRACED if trace is None else trace.span(name, attributes or {})


def follow(trace: Trace | None, crew: Any) -> None:
    """The tasks of ``crew`` (the job's, or another it builds: ``batch_run``'s) each a span when they run: the run
    of their classes wrapped, and the crew known for their indexes."""
    if trace is None:
        return
    from crewai import Task

    trace.crews.append(crew)
    classes: set[type] = {Task, *(type(task) for task in getattr(crew, "tasks", None) or ())}
    for cls in classes:
        for each in cls.__mro__:
            _wrap_task(trace, each)


def call(
    trace: Trace | None, effect: Effect, name: str, entry: int, usage: list[int] | None
) -> AbstractContextManager[Any]:
    """The span of the ledger's call ``entry`` (its model's or tool's ``name``), around it: how it ended, and for a
    model what it booked (``usage``, read at its end)."""
    return _UNTRACED if trace is None else _call(trace, effect, name, entry, usage)


@contextlib.contextmanager
def _call(trace: Trace, effect: Effect, name: str, entry: int, usage: list[int] | None) -> Iterator[None]:
    llm = effect == Effect.LLM
    attributes = {
        "gen_ai.operation.name": "chat" if llm else "execute_tool",
        "gen_ai.request.model" if llm else "gen_ai.tool.name": name[:MAX_SPAN_VALUE_CHARS],  # masked by the ledger
        "crew_supervisor.effect.id": entry,
    }
    span = trace.open(SpanName.LLM_CALL if llm else SpanName.TOOL_CALL, attributes)
    mark = _current.set(span)
    try:
        yield
    except BaseException as exc:
        trace.end(span, _call_end(EffectStatus.FAILED, usage), type(exc).__name__)
        raise
    else:
        trace.end(span, _call_end(EffectStatus.FINISHED, usage))
    finally:
        _current.reset(mark)


def held(trace: Trace | None, error: str, usage: list[int] | None) -> None:
    """The LLM call under way in this context is held back by the job's budget, never to return (worker/spending.py):
    its span ends now, failed, as its ledger entry does."""
    current = _current.get()
    if trace is not None and current is not None and current.name == SpanName.LLM_CALL:
        trace.end(current, _call_end(EffectStatus.FAILED, usage), error)


def _call_end(status: EffectStatus, usage: list[int] | None) -> dict[str, Any]:
    if usage is None:
        return {"crew_supervisor.effect.status": str(status)}
    return {
        "crew_supervisor.effect.status": str(status),
        "gen_ai.usage.input_tokens": usage[0],
        "gen_ai.usage.output_tokens": usage[1],
    }


def _wrap_task(trace: Trace, cls: type) -> None:
    """The run of ``cls``'s tasks, each a span of ``trace``: CrewAI calls the wrapper, which holds the trace (one job
    a process: a class is wrapped once)."""
    for name in ("_execute_core", "_aexecute_core"):
        method = vars(cls).get(name)
        if method is not None and not getattr(method, "traced", False):
            setattr(cls, name, (_async_task if asyncio.iscoroutinefunction(method) else _task)(trace, method))


def _task(trace: Trace, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with trace.span(SpanName.TASK, trace.task_attributes(self, _agent(self, args, kwargs))):
            return method(self, *args, **kwargs)

    # A mark on the wrapper itself: mypy types a def as a Callable, which takes no attribute.
    run.traced = True  # type: ignore[attr-defined]
    return run


def _async_task(trace: Trace, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with trace.span(SpanName.TASK, trace.task_attributes(self, _agent(self, args, kwargs))):
            return await method(self, *args, **kwargs)

    # A mark on the wrapper itself: mypy types a def as a Callable, which takes no attribute.
    run.traced = True  # type: ignore[attr-defined]
    return run


def _agent(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The agent that runs the task: the one CrewAI hands it (a hierarchical crew's manager), else its own."""
    return (args[0] if args else kwargs.get("agent")) or getattr(task, "agent", None)


def _new_id() -> str:
    # From the kernel, not ``random``: a worker cloned by the fork server runs no at-fork hook to reseed it.
    return f"{int.from_bytes(os.urandom(8), 'big') or 1:016x}"
