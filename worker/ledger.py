"""A job's effect ledger, in its worker: each tool call and each LLM call said to the supervisor before it starts
(``EffectStarted``, then the calling thread waits for ``Recorded``) and when it ends (``EffectEnded``), and each
completed task of a ``run`` (``TaskDone``, waited for before the next task starts), so a resume runs none again.

The calls are caught where CrewAI hands work to a tool or a model, not at its hooks: its tool hooks see one call
where it may run a tool several times (a tool that raises is tried again, with its arguments unfiltered, then once
more), a cached answer as a call, and not a tool's exception (it hands the model "Error executing tool" and goes on);
its LLM hooks never see a call that raised. So the ledger wraps, once the job's crew is built:
- a tool's ``run``/``arun`` (``BaseTool`` and each subclass defining them: the native function-calling path calls
  them) and ``CrewStructuredTool.invoke``/``ainvoke`` (the ReAct text path: it calls the tool's ``_run`` itself);
- a model's ``call``/``acall`` (each ``BaseLLM`` subclass defining them; ``spending`` wraps a class imported later
  as its first call starts, recording that call if it is already under way, and tells the ledger what each call
  booked: its tokens, and a call the budget holds back).
Classes are wrapped again when the job builds another crew (``batch_run``): a factory may define its own.
A call made inside a call of the same object (an override calling ``super()``, a model retrying itself) is the one
call. ``id``s count from 1 per job, taken and sent under one lock so they reach the supervisor in order. In a traced
job each call is a span too, opened once the supervisor holds its entry and ended before its end is said
(``tracing.call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from protocol import (
    MAX_EFFECT_ERROR_CHARS,
    MAX_EFFECT_NAME_CHARS,
    MAX_RESUMED_BYTES,
    Effect,
    EffectEnded,
    EffectStarted,
    EffectStatus,
    Limit,
    Message,
    TaskDone,
)
from worker import masking, tracing

TASK_FIELDS = ("description", "agent", "raw", "pydantic", "json_dict", "output_format")
Arguments = Callable[[tuple[Any, ...], dict[str, Any]], Any]  # what a call's digest is of, from its arguments
_active: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("ledger_active", default=frozenset())
_usage: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("ledger_usage", default=None)
_call: contextvars.ContextVar[int | None] = contextvars.ContextVar("ledger_call", default=None)  # LLM's, under way


@dataclasses.dataclass
class Ledger:
    """The job's ledger (the worker's ``ledger``, once its crew is built): ``lock`` takes an id and sends its entry as
    one step, so ids go out in order; the waiters have a lock of their own, so the control thread hands on a
    ``Recorded`` while an entry is being written. ``trace``: the job's, which each call is a span of."""

    send: Callable[[Message], None]
    secrets: tuple[str, ...]
    trace: tracing.Trace | None = None
    last: int = 0
    waiting: dict[int, threading.Event] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    waiters: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def enter(self, make: Callable[[int], Message]) -> int:
        """Send the entry ``make(id)`` and wait until the supervisor has it. The waiter is registered before the
        frame goes out, so an answer that comes before this thread waits is not lost. ``make`` only puts the id in
        an entry built before (it cannot raise): an id taken is an id sent, else the next would come out of order."""
        recorded = threading.Event()
        with self.lock:
            self.last += 1
            entry = self.last
            with self.waiters:
                self.waiting[entry] = recorded
            self.send(make(entry))
        recorded.wait()
        return entry

    def recorded(self, entry: int) -> bool:
        with self.waiters:
            waiter = self.waiting.pop(entry, None)
        if waiter is None:
            return False
        waiter.set()
        return True

    def masked(self, text: str) -> str:
        return masking.masked(text, self.secrets)

    def size(self, data: Any) -> int:
        """The bytes of ``data`` (a decoded JSON value) as the supervisor stores it: compact JSON of it masked, each
        string masked, a dict's keys included (not its JSON text: a secret holding ``"`` is escaped there)."""
        return len(orjson.dumps(self._masked_data(data)))

    def _masked_data(self, value: Any) -> Any:
        # Recursion is safe: the data came through orjson (to_json, or a frame), which nests no deeper than 255.
        if isinstance(value, str):
            return self.masked(value)
        if isinstance(value, list):
            return [self._masked_data(item) for item in value]
        if isinstance(value, dict):
            return {self._masked_data(key): self._masked_data(item) for key, item in value.items()}
        return value

    def end(self, entry: int, error: BaseException | None, usage: list[int] | None = None) -> None:
        prompt, completion = usage or (0, 0)
        if error is None:
            self.send(EffectEnded(entry, EffectStatus.FINISHED, "", "", prompt, completion))
            return
        error_type, message = type(error).__name__, self.masked(str(error))[:MAX_EFFECT_ERROR_CHARS]
        self.send(EffectEnded(entry, EffectStatus.FAILED, error_type, message, prompt, completion))


def open_ledger(
    send: Callable[[Message], None], secrets: tuple[str, ...] = (), trace: tracing.Trace | None = None
) -> Ledger:
    """From now on every tool and LLM call of the job is in the ledger. Once the job's crew is built: the classes
    of its tools and models are imported by then. The calls are wrapped where their classes define them, and CrewAI
    calls the wrappers, which hold the ledger: one job a process, so a class is wrapped once."""
    ledger = Ledger(send, masking.ordered(secrets), trace)
    wrap_classes(ledger)
    return ledger


def wrap_classes(ledger: Ledger) -> None:
    """Wrap the tool and model classes now imported: at ``open_ledger``, and again once the job builds another crew
    (``batch_run``'s): a class its factory defines is a new one at each build."""
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import BaseTool
    from crewai.tools.structured_tool import CrewStructuredTool

    for cls in classes(BaseTool):
        _wrap(ledger, cls, ("run", "arun"), Effect.TOOL, _tool_keywords)
    _wrap(ledger, CrewStructuredTool, ("invoke", "ainvoke"), Effect.TOOL, _tool_input)
    for cls in classes(BaseLLM):
        wrap_llm(ledger, cls)


def wrap_llm(ledger: Ledger, cls: type) -> bool:
    """Put the calls of the model class ``cls`` in the ledger (a class imported after ``open_ledger``: ``spending``).
    True: some were not (a call of it under way now is not)."""
    return _wrap(ledger, cls, ("call", "acall"), Effect.LLM, _messages)


def unwrapped_call(ledger: Ledger, llm: Any, messages: Any) -> None:
    """A call of ``llm`` under way, made before its class was wrapped (its hooks run inside it: no agent's): recorded
    now, waited for, before it goes out; its end is not seen, so the supervisor makes it uncertain when the job ends.
    Nothing if this thread's call is in the ledger already (an override calling a wrapped ``super().call``)."""
    if _call.get() is None:
        ledger.enter(_started(Effect.LLM, _name(ledger, Effect.LLM, llm), messages))


def booked(prompt: int, completion: int) -> None:
    """What CrewAI booked for the LLM call under way in this thread (``spending``): its ``EffectEnded`` says it."""
    usage = _usage.get()
    if usage is not None:
        usage[0] += prompt
        usage[1] += completion


def held(ledger: Ledger, limit: Limit) -> None:
    """The LLM call under way here is held back by the job's budget (``spending``: its ``limit`` is spent) until the
    job is stopped, never to return: its end said now, failed, so the ledger shows it went no further (the call was
    not made, or its answer never reached the agent), rather than ``uncertain``."""
    entry = _call.get()
    if entry is not None:
        prompt, completion = _usage.get() or (0, 0)
        message = f"held back: the job's {limit} is spent"
        ledger.send(EffectEnded(entry, EffectStatus.FAILED, "OverBudget", message, prompt, completion))
        tracing.held(ledger.trace, "OverBudget", [prompt, completion])


def digest(arguments: Any) -> str:
    """SHA-256 of ``arguments`` as compact JSON, keys sorted (as orjson writes them); of their ``repr`` where they are
    no JSON (an int over 64 bits, say). Never raises: a call's entry is built from it."""
    try:
        text = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    except Exception:
        try:
            text = repr(arguments).encode(errors="replace")
        except Exception:  # crew code's __repr__ raised
            text = type(arguments).__qualname__.encode()
    return hashlib.sha256(text).hexdigest()


def _wrap(ledger: Ledger, cls: type, names: tuple[str, ...], effect: Effect, arguments: Arguments) -> bool:
    wrapped = False
    for name in names:
        method = vars(cls).get(name)
        if method is None or getattr(method, "ledger", False) or getattr(method, "__isabstractmethod__", False):
            continue
        wrapper = _async_entry if asyncio.iscoroutinefunction(method) else _entry
        setattr(cls, name, wrapper(ledger, method, effect, arguments))
        wrapped = True
    return wrapped


def _tool_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    tool_input = args[0] if args else kwargs.get("input")  # invoke(input, config): a dict, or its JSON text
    if isinstance(tool_input, str):  # as a dict, so the same arguments have the digest of the native path's
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(tool_input)  # as CrewAI reads a model's arguments (orjson makes a big int a float)
    return tool_input


def _tool_keywords(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return {**kwargs, "args": list(args)} if args else kwargs  # run(**arguments)


def _messages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("messages")


def _entry(ledger: Ledger, method: Callable[..., Any], effect: Effect, arguments: Arguments) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        active = _active.get()
        if id(self) in active:
            return method(self, *args, **kwargs)
        name = _name(ledger, effect, self)
        entry = ledger.enter(_started(effect, name, arguments(args, kwargs)))
        with (
            _running(ledger, entry, effect, active | {id(self)}) as usage,
            tracing.call(ledger.trace, effect, name, entry, usage),
        ):
            return method(self, *args, **kwargs)

    # A mark on the wrapper itself: mypy types a def as a Callable, which takes no attribute.
    call.ledger = True  # type: ignore[attr-defined]
    return call


def _async_entry(
    ledger: Ledger, method: Callable[..., Any], effect: Effect, arguments: Arguments
) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        active = _active.get()
        if id(self) in active:
            return await method(self, *args, **kwargs)
        name = _name(ledger, effect, self)
        # The wait in a thread: the loop runs other tasks' calls meanwhile.
        entry = await asyncio.to_thread(ledger.enter, _started(effect, name, arguments(args, kwargs)))
        with (
            _running(ledger, entry, effect, active | {id(self)}) as usage,
            tracing.call(ledger.trace, effect, name, entry, usage),
        ):
            return await method(self, *args, **kwargs)

    # A mark on the wrapper itself: mypy types a def as a Callable, which takes no attribute.
    call.ledger = True  # type: ignore[attr-defined]
    return call


@contextlib.contextmanager
def _running(ledger: Ledger, entry: int, effect: Effect, active: frozenset[int]) -> Iterator[list[int] | None]:
    """The call ``entry`` under way: its ``EffectEnded`` when it returns or raises, with what it booked (a model's
    call: the usage yielded, as ``booked`` adds to it)."""
    llm = effect == Effect.LLM
    usage = [0, 0] if llm else None
    marks = _active.set(active), _usage.set(usage), _call.set(entry if llm else None)
    try:
        yield usage
    except BaseException as exc:
        ledger.end(entry, exc, usage)
        raise
    else:
        ledger.end(entry, None, usage)
    finally:
        _call.reset(marks[2])
        _usage.reset(marks[1])
        _active.reset(marks[0])


def _name(ledger: Ledger, effect: Effect, owner: Any) -> str:
    """A call's model or tool, as its entry and its span name it: masked, then cut (a secret cut in two would pass
    the mask)."""
    return ledger.masked(str(getattr(owner, "model" if effect == Effect.LLM else "name", "")))[:MAX_EFFECT_NAME_CHARS]


def _started(effect: Effect, name: str, arguments: Any) -> Callable[[int], Message]:
    """The call's entry, all but its id: built before the id is taken."""
    summary = digest(arguments)
    return lambda entry: EffectStarted(entry, effect, name, summary)


def follow_tasks(ledger: Ledger, crew: Any, fingerprint: str, resumed: list[dict[str, Any]], max_bytes: int) -> None:
    """A ``TaskDone`` for each task of this ``run`` as it completes (``resumed``: the outputs a resume restored), sent
    from the thread that ran it, in the order of ``crew.tasks``: a task that completes before an earlier one (an
    async one) waits to be sent with it. Chained before any ``task_callback`` the crew set: CrewAI calls the crew's
    after the task's own, synchronously, once its output is set and before the next task starts.

    An output larger than ``max_bytes`` (a frame the supervisor would refuse), or one that would bring the job's
    outputs past ``MAX_RESUMED_BYTES`` (a resume could not send them), is not sent, nor any after it: a resume then
    runs again from that task. So is a task CrewAI skips (a ``ConditionalTask``: it gets no output)."""
    theirs = crew.task_callback
    lock = threading.Lock()
    done = _TasksDone(len(resumed), sum(ledger.size(output) for output in resumed))

    def task_done(output: Any) -> Any:
        with lock:
            while done.open and done.next < len(crew.tasks) and crew.tasks[done.next].output is not None:
                sent = _send_task(ledger, crew.tasks[done.next].output, done, fingerprint, max_bytes)
                done.open, done.next = sent, done.next + 1
        return theirs(output) if theirs is not None else None

    crew.task_callback = task_done


@dataclasses.dataclass
class _TasksDone:
    """Where a run's ``TaskDone``s stand: the index of the next task to send, the bytes of the outputs sent (a resume's
    restored ones included), and whether any more may be sent."""

    next: int
    bytes: int
    open: bool = True


def _send_task(ledger: Ledger, output: Any, done: _TasksDone, fingerprint: str, max_bytes: int) -> bool:
    from worker.operations import to_json

    dumped, index = to_json(output), done.next
    data = {name: dumped.get(name) for name in TASK_FIELDS}
    size = ledger.size(data)
    if size > max_bytes or done.bytes + size > MAX_RESUMED_BYTES:
        return False
    done.bytes += size
    ledger.enter(lambda entry: TaskDone(entry, index, data, fingerprint))
    return True


def classes(root: type) -> list[type]:
    """``root`` and every subclass of it now imported."""
    found, pending = [], [root]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
