"""The one registry plus crews that put hostile text where it travels: chunks, outputs, error types.

Apart because two of its factories raise by design (an exception class named with a terminal escape, one of
200 KB): a doctor run on the one registry would name them. ``AIP_CREWAI_REGISTRY=tests.crews.hostile_text:registry``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import llm_call_context

from tests.crews import registry as one_registry
from worker.demo import OfflineLLM, prompt_text

# The task quotes the job's input between these marks; the model streams and answers exactly that.
_QUOTED = re.compile(r"<<(.*?)>>", re.DOTALL)
# A crew's exception class name is reported as ``error_type``: one that is a terminal escape, one of 200 KB.
ESCAPING_CLASS_NAME = "Evil\x1b]0;PWNED\x07\x1b[2K\x1b[1A\u009b2J"
LONG_CLASS_NAME = "E" * 200_000


class EchoLLM(OfflineLLM):
    """Streams the quoted text as one chunk, then answers it as the final answer."""

    def call(self, messages: str | list[Any], *args: Any, **kwargs: Any) -> str:
        quoted = _QUOTED.search(prompt_text(messages))
        text = quoted.group(1) if quoted else ""
        with llm_call_context():
            if self._effective_stream():
                self._emit(text, kwargs.get("from_task"), kwargs.get("from_agent"), str(uuid.uuid4()))
        return f"Thought: I echo.\nFinal Answer: {text}"


def echo() -> Crew:
    """Input ``text``: sent back as a chunk and as the output."""
    agent = Agent(role="Echo", goal="Repeat", backstory="Says what it is told.", llm=EchoLLM(model="echo"))
    return Crew(agents=[agent], tasks=[Task(description="Repeat <<{text}>>", expected_output="It.", agent=agent)])


def _raising(class_name: str) -> Callable[[], Crew]:
    def factory() -> Crew:
        raise type(class_name, (Exception,), {})()

    return factory


registry: dict[str, Callable[[], Crew]] = {
    **one_registry,
    "echo": echo,
    "escaping-error": _raising(ESCAPING_CLASS_NAME),
    "long-error": _raising(LONG_CLASS_NAME),
}
