"""What a job may spend on LLM calls (``Budget``: the supervisor's, or its crew's own where lower) and what it has
spent so far (``Spending``, as its worker reports each call)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from protocol import Limit, Reason, Spent
from supervisor.processes.limits import Breach

MODEL_CHARS = 200  # of the model a worker names: it goes into the record and a stopped job's terminal


@dataclasses.dataclass
class Spending:
    """A job's LLM usage so far, as its worker reports each call (``Spent``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    model: str | None = None  # the last call's

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def summary(self) -> dict[str, Any]:
        """As a job's record says it (``llm_spent``): tokens, calls and the last call's model."""
        return {"tokens": self.tokens, "llm_calls": self.llm_calls, "model": self.model}

    def add(self, spent: Spent) -> Spent:
        """Count one call; returns it with its counts as counted (a worker cannot take back what it spent)."""
        counted = Spent(
            spent.model[:MODEL_CHARS],
            max(spent.prompt_tokens, 0),
            max(spent.completion_tokens, 0),
            max(spent.requests, 0),
        )
        self.prompt_tokens += counted.prompt_tokens
        self.completion_tokens += counted.completion_tokens
        self.llm_calls += counted.requests
        self.model = counted.model
        return counted


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a job may spend on LLM calls (0: no limit): the supervisor's, or its crew's own where that is lower."""

    max_tokens: int = 0
    max_llm_calls: int = 0

    @classmethod
    def own(cls, described: Any) -> Budget:
        """A crew's own budget as its registry describes it; what is no count of tokens or calls counts as none."""
        if not isinstance(described, Mapping):
            return cls()
        return cls(*(_count(described.get(name)) for name in (Limit.MAX_TOKENS, Limit.MAX_LLM_CALLS)))

    def within(self, other: Budget) -> Budget:
        """The lower of each limit of the two, where 0 is none."""
        return Budget(_lower(self.max_tokens, other.max_tokens), _lower(self.max_llm_calls, other.max_llm_calls))

    def breach(self, spent: Spending, held: Limit | None = None) -> Breach | None:
        """The limit ``spent`` is over: tokens crossed, more calls than allowed, or the worker holding a call
        back (``held``: which of the job's limits it says is spent, as ``OverBudget`` does)."""
        proof = {"tokens": spent.tokens, "llm_calls": spent.llm_calls, "model": spent.model}
        if self.max_tokens and (held is Limit.MAX_TOKENS or spent.tokens > self.max_tokens):
            message = f"the job spent {spent.tokens} LLM tokens, over its {self.max_tokens}"
            return Breach(Reason.TOKEN_LIMIT_EXCEEDED, message, {**proof, "limit": self.max_tokens})
        if self.max_llm_calls and (held is Limit.MAX_LLM_CALLS or spent.llm_calls > self.max_llm_calls):
            message = (
                f"the job made its {self.max_llm_calls} LLM calls and would have made another"
                if held is Limit.MAX_LLM_CALLS
                else f"the job made {spent.llm_calls} LLM calls, over its {self.max_llm_calls}"
            )
            return Breach(Reason.LLM_CALL_LIMIT_EXCEEDED, message, {**proof, "limit": self.max_llm_calls})
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _lower(one: int, other: int) -> int:
    return min(one, other) if one and other else one or other


def named_limit(text: str) -> Limit | None:
    """The limit a worker names (``OverBudget.limit``, untrusted text); None: no limit of ours."""
    return next((limit for limit in Limit if limit == text), None)
