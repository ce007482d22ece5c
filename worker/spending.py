"""A job's LLM spend: each call's usage sent to the supervisor as CrewAI books it (``Spent``), and the job's budget
held to in the worker, so that no call starts once it is spent.

CrewAI books a call's usage on its LLM in ``_track_token_usage_internal`` (``BaseLLM``'s, or a provider's own,
as Bedrock's), synchronously, in the thread that made the call and before the call returns to its agent; a
job's ``token_usage`` is the sum of those books. Each such method is wrapped to send what it added: the same
counts, for native providers and for ``BaseLLM`` subclasses that book usage alike.

The supervisor keeps the running totals and stops a job over its budget. Its kill takes milliseconds, in which
an agent would start its next call: so the worker holds back, until it is killed, the thread whose call crossed
the token budget (before that call returns to its agent), and any call that would start once the token budget
is crossed or the calls allowed are made, saying so first (``OverBudget``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from crewai.hooks import register_before_llm_call_hook
from crewai.llms.base_llm import BaseLLM

from protocol import Message, OverBudget, Spent

MODEL_CHARS = 200  # of a model's name, as a Spent frame carries it
BUDGET_ATTRIBUTE = "crew_budget"  # set on a registry factory by ``budget``
_BOOK = "_track_token_usage_internal"
_COUNTS = ("prompt_tokens", "completion_tokens", "successful_requests")
_inside = threading.local()  # a booking under way in this thread (LLM calls run in threads of their own)
F = TypeVar("F", bound=Callable[..., Any])


def budget(*, max_tokens: int = 0, max_llm_calls: int = 0) -> Callable[[F], F]:
    """A registry factory's own LLM budget, for each job of its crew: below the supervisor's
    (``WORKER_MAX_TOKENS``, ``WORKER_MAX_LLM_CALLS``) it holds; above it, the supervisor's does. 0: none.

        @budget(max_tokens=20_000, max_llm_calls=40)
        def research() -> Crew: ...
    """
    if min(max_tokens, max_llm_calls) < 0:
        raise ValueError("a budget is a count of tokens or calls: 0 or more")

    def mark(factory: F) -> F:
        setattr(factory, BUDGET_ATTRIBUTE, {"max_tokens": max_tokens, "max_llm_calls": max_llm_calls})
        return factory

    return mark


def budgets(crews: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each crew's own budget, where its factory has one (``budget``)."""
    return {
        crew_id: dict(own) for crew_id, factory in crews.items() if (own := getattr(factory, BUDGET_ATTRIBUTE, None))
    }


@dataclasses.dataclass
class _Job:
    """This worker's job: what it may spend, and has (one job a process)."""

    send: Callable[[Message], None]
    max_tokens: int
    max_llm_calls: int
    tokens: int = 0
    calls: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def over(self) -> str | None:
        """The budget spent, if one is: the tokens crossed, or every call allowed made."""
        if self.max_tokens and self.tokens > self.max_tokens:
            return "max_tokens"
        if self.max_llm_calls and self.calls >= self.max_llm_calls:
            return "max_llm_calls"
        return None


_job: _Job | None = None


def report(send: Callable[[Message], None], max_tokens: int = 0, max_llm_calls: int = 0) -> None:
    """From now on, each call that books usage also sends it, and the budget holds. Once the job's crew is
    built: its LLMs' classes are imported by then, and each that books usage its own way is wrapped too."""
    global _job
    _job = _Job(send, max_tokens, max_llm_calls)
    for cls in _classes(BaseLLM):
        if _BOOK in vars(cls) and not getattr(vars(cls)[_BOOK], "reports", False):
            setattr(cls, _BOOK, _reporting(vars(cls)[_BOOK]))
    if max_tokens or max_llm_calls:
        register_before_llm_call_hook(_hold_when_spent)


def _reporting(book: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(book)
    def booked(self: Any, *args: Any, **kwargs: Any) -> None:
        usage = getattr(self, "_token_usage", None)
        if _job is None or _inside.__dict__.get("booking") or not isinstance(usage, dict):
            return book(self, *args, **kwargs)  # an override calling super(): counted once, by the outer
        before = [usage.get(name, 0) for name in _COUNTS]
        _inside.booking = True
        try:
            book(self, *args, **kwargs)
        finally:
            _inside.booking = False
        prompt, completion, requests = (usage.get(name, 0) - was for name, was in zip(_COUNTS, before, strict=True))
        if not (prompt or completion or requests):
            return
        with _job.lock:
            _job.tokens += max(prompt, 0) + max(completion, 0)
            _job.calls += max(requests, 0)
            crossed = _job.over() == "max_tokens"
        _job.send(Spent(str(getattr(self, "model", ""))[:MODEL_CHARS], prompt, completion, requests))
        if crossed:  # the supervisor stops the job on this Spent: the call never returns to its agent
            _hold()

    booked.reports = True  # type: ignore[attr-defined]
    return booked


def _hold_when_spent(context: Any) -> None:
    """A before-LLM-call hook: a call that would start once the budget is spent says so, and waits to be
    stopped."""
    if _job is None:
        return
    with _job.lock:
        spent = _job.over()
    if spent is not None:
        _job.send(OverBudget(spent))
        _hold()


def _hold() -> None:
    """Until the supervisor's kill: nothing of this thread reaches a provider again."""
    threading.Event().wait()


def _classes(root: type) -> list[type]:
    """``root`` and every subclass of it now imported."""
    found, pending = [], [root]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
