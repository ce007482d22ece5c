"""The crews chaos's clients start, and their inputs: the flags name them, the load starts them."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson


@dataclasses.dataclass(frozen=True)
class Crews:
    """What the clients start: a crew that completes at once and one that takes a few seconds, each with its
    input as JSON text, where ``{seconds}`` stands for the seconds a slow job is asked to take; and a crew of several
    tasks, each with a tool call (``demo-effects`` in worker/demo.py: inputs ``marker`` and ``seconds`` a step), whose
    interrupted jobs the checks read the effect ledger of and resume ("": none)."""

    fast: str = "demo"
    slow: str = "demo-slow"
    fast_input: str = "{}"
    slow_input: str = '{"seconds": {seconds}}'
    effects: str = "demo-effects"

    def input(self, slow: bool, seconds: int) -> dict[str, Any]:
        """Raises ValueError for text that is not a JSON object once ``{seconds}`` is put in."""
        value = orjson.loads((self.slow_input if slow else self.fast_input).replace("{seconds}", str(seconds)))
        if not isinstance(value, dict):
            raise ValueError(f"a JSON object, not {type(value).__name__}")
        return value
