"""Each LLM call's usage, sent to the supervisor as CrewAI books it (``Spent``), so that it keeps a job's running
totals while the job runs: a job's ``token_usage`` is known only once it ends.

CrewAI books a call's usage on its LLM in ``_track_token_usage_internal`` (``BaseLLM``'s, or a provider's own,
as Bedrock's), synchronously, in the thread that made the call and before the call returns to its agent; a
job's ``token_usage`` is the sum of those books. Each such method is wrapped to send what it added: the same
counts, for native providers and for ``BaseLLM`` subclasses that book usage alike.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from crewai.llms.base_llm import BaseLLM

from protocol import Message, Spent

MODEL_CHARS = 200  # of a model's name, as a Spent frame carries it
_BOOK = "_track_token_usage_internal"
_COUNTS = ("prompt_tokens", "completion_tokens", "successful_requests")
_inside = threading.local()  # a booking under way in this thread (LLM calls run in threads of their own)


def report(send: Callable[[Message], None]) -> None:
    """From now on, each call that books usage also sends it. Once the job's crew is built: its LLMs' classes
    are imported by then, and each that books usage its own way is wrapped too."""
    for cls in _classes(BaseLLM):
        if _BOOK in vars(cls) and not getattr(vars(cls)[_BOOK], "reports", False):
            setattr(cls, _BOOK, _reporting(vars(cls)[_BOOK], send))


def _reporting(book: Callable[..., None], send: Callable[[Message], None]) -> Callable[..., None]:
    @functools.wraps(book)
    def booked(self: Any, *args: Any, **kwargs: Any) -> None:
        usage = getattr(self, "_token_usage", None)
        if _inside.__dict__.get("booking") or not isinstance(usage, dict):  # an override calling super(): once
            return book(self, *args, **kwargs)
        before = [usage.get(name, 0) for name in _COUNTS]
        _inside.booking = True
        try:
            book(self, *args, **kwargs)
        finally:
            _inside.booking = False
        prompt, completion, requests = (usage.get(name, 0) - was for name, was in zip(_COUNTS, before, strict=True))
        if prompt or completion or requests:
            send(Spent(str(getattr(self, "model", ""))[:MODEL_CHARS], prompt, completion, requests))

    booked.reports = True  # type: ignore[attr-defined]
    return booked


def _classes(root: type) -> list[type]:
    """``root`` and every subclass of it now imported."""
    found, pending = [], [root]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
