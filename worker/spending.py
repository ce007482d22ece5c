"""A job's LLM spend: each call's usage sent to the supervisor as CrewAI books it (``Spent``), and the job's budget
held to in the worker, so that no call starts once it is spent.

CrewAI books a call's usage on its LLM in ``_track_token_usage_internal`` (``BaseLLM``'s, or a provider's own,
as Bedrock's), synchronously, in the thread that made the call and before the call returns to its agent; a
job's ``token_usage`` is the sum of those books. Each such method is wrapped to send what it added: the same
counts, for native providers and for ``BaseLLM`` subclasses that book usage alike.

The supervisor keeps the running totals and stops a job over its budget. Its kill takes milliseconds, in which
an agent would start its next call: so the worker holds back, until it is killed, the thread whose call crossed
the token budget (before that call returns to its agent), and any call that would start once the token budget
is crossed or as many calls as allowed have started, saying so first (``OverBudget``). Calls already in flight
then still finish at the provider (and are billed); only their answers are held back. A call a provider makes
inside another (a tool-use follow-up) passes no hook of its own: it is counted, not held.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from protocol import Limit, Message, OverBudget, Spent
from worker import ledger
from worker.ledger import Ledger

MODEL_CHARS = 200  # of a model's name, as a Spent frame carries it
BUDGET_ATTRIBUTE = "crew_budget"  # set on a registry factory by ``budget``
_BOOK = "_track_token_usage_internal"
_COUNTS = ("prompt_tokens", "completion_tokens", "successful_requests")
F = TypeVar("F", bound=Callable[..., Any])


def budget(*, max_tokens: int = 0, max_llm_calls: int = 0) -> Callable[[F], F]:
    """A registry factory's own LLM budget, for each job of its crew: below the supervisor's
    (``WORKER_MAX_TOKENS``, ``WORKER_MAX_LLM_CALLS``) it holds; above it, the supervisor's does. 0: none.

        @budget(max_tokens=20_000, max_llm_calls=40)
        def research() -> Crew: ...
    """
    for value in (max_tokens, max_llm_calls):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"a budget is a whole count of tokens or calls, 0 or more, not {value!r}")

    def mark(factory: F) -> F:
        # Their text as keys: orjson writes no enum as a key of the Registry frame it goes into.
        setattr(
            factory, BUDGET_ATTRIBUTE, {Limit.MAX_TOKENS.value: max_tokens, Limit.MAX_LLM_CALLS.value: max_llm_calls}
        )
        return factory

    return mark


def budgets(crews: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each crew's own budget, where its factory has one (``budget``)."""
    own = {crew_id: getattr(factory, BUDGET_ATTRIBUTE, None) for crew_id, factory in crews.items()}
    return {crew_id: dict(value) for crew_id, value in own.items() if isinstance(value, dict)}


@dataclasses.dataclass
class Spending:
    """The job's spend (the worker's ``spending``, once its crew is built): what it may spend, and has (one job a
    process). ``lock`` orders a booking's count, its ``Spent`` and a hook's ``OverBudget``, so the supervisor reads
    them as they happened. ``ledger``: the job's, which says first that a call held back goes no further."""

    send: Callable[[Message], None]
    max_tokens: int
    max_llm_calls: int
    ledger: Ledger
    tokens: int = 0
    started: int = 0  # calls let through the hook: a slot each, taken before the call starts
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    inside: threading.local = dataclasses.field(default_factory=threading.local)  # a booking under way, per thread

    def crossed(self) -> bool:
        return bool(self.max_tokens) and self.tokens > self.max_tokens


def report(send: Callable[[Message], None], max_tokens: int, max_llm_calls: int, entries: Ledger) -> Spending:
    """From now on, each call that books usage also sends it, and the budget holds. Once the job's crew is
    built: its LLMs' classes are imported by then (one imported later is wrapped as its first call starts). CrewAI
    calls the wrappers and the hook, which hold the spending: one job a process, so a class is wrapped once."""
    # Here, not at the top: importing CrewAI writes under HOME, which is the job's only once the worker set it up.
    from crewai.hooks import register_before_llm_call_hook
    from crewai.llms.base_llm import BaseLLM

    spending = Spending(send, max_tokens, max_llm_calls, entries)
    for cls in ledger.classes(BaseLLM):
        _wrap(spending, cls)
    register_before_llm_call_hook(functools.partial(_before_call, spending))
    return spending


def _wrap(spending: Spending, cls: type) -> None:
    if _BOOK in vars(cls) and not getattr(vars(cls)[_BOOK], "reports", False):
        setattr(cls, _BOOK, _reporting(spending, vars(cls)[_BOOK]))


def _reporting(job: Spending, book: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(book)
    def booked(self: Any, *args: Any, **kwargs: Any) -> None:
        usage = getattr(self, "_token_usage", None)
        if job.inside.__dict__.get("booking") or not isinstance(usage, dict):
            return book(self, *args, **kwargs)  # an override calling super(): counted once, by the outer
        # One booking at a time: threads sharing an LLM would each count the other's tokens as their own.
        with job.lock:
            before = [usage.get(name, 0) for name in _COUNTS]
            job.inside.booking = True
            try:
                book(self, *args, **kwargs)
            finally:
                job.inside.booking = False
            prompt, completion, requests = (usage.get(name, 0) - was for name, was in zip(_COUNTS, before, strict=True))
            ledger.booked(prompt, completion)
            if not (prompt or completion or requests):
                return
            job.tokens += max(prompt, 0) + max(completion, 0)
            job.send(Spent(str(getattr(self, "model", ""))[:MODEL_CHARS], prompt, completion, requests))
            crossed = job.crossed()
        if crossed:  # the supervisor stops the job on this Spent: the call never returns to its agent
            _hold(job, Limit.MAX_TOKENS)

    # A mark on the wrapper itself: mypy types a def as a Callable, which takes no attribute.
    booked.reports = True  # type: ignore[attr-defined]
    return booked


def _before_call(job: Spending, context: Any) -> None:
    """A before-LLM-call hook: takes the call's slot, or, once the budget is spent, says so and waits to be
    stopped; and wraps the booking and the calls (the ledger's) of an LLM class imported since ``report``. An agent's
    hooks run before its call, which then goes through the wrapper; a direct call's run inside it, already under way
    unwrapped: the ledger records it here."""
    llm = getattr(context, "llm", None)
    _wrap(job, type(llm))
    if ledger.wrap_llm(job.ledger, type(llm)) and getattr(context, "executor", None) is None:
        ledger.unwrapped_call(job.ledger, llm, getattr(context, "messages", None))
    if not (job.max_tokens or job.max_llm_calls):
        return
    with job.lock:
        spent = Limit.MAX_TOKENS if job.crossed() else None
        if spent is None and job.max_llm_calls and job.started >= job.max_llm_calls:
            spent = Limit.MAX_LLM_CALLS
        if spent is None:
            job.started += 1
            return
        job.send(OverBudget(spent))
    _hold(job, spent)


def _hold(job: Spending, limit: Limit) -> None:
    """Until the supervisor's kill: nothing of this thread reaches a provider again. The ledger says first that the
    call under way goes no further."""
    ledger.held(job.ledger, limit)
    threading.Event().wait()
