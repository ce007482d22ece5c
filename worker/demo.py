"""Offline demo crews: a deterministic model, no network, no API key.

Choose them explicitly with ``AIP_CREWAI_REGISTRY=worker.demo:registry`` (or ``serve --demo``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context

DEFAULT_SLOW_SECONDS = 30.0
MAX_SLOW_SECONDS = 3600.0
_TICK = re.compile(r"Tick for ([0-9]+(?:\.[0-9]+)?) seconds")


def _text(messages: str | list[Any]) -> str:
    if isinstance(messages, str):
        return messages
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def _words(text: str) -> int:
    return max(1, len(text.split()))


class OfflineLLM(BaseLLM):
    """A deterministic model: the answer is derived from the prompt, streamed word by word.

    A prompt that says "Tick for N seconds" first gets a heartbeat chunk every ``tick_seconds``
    for N seconds (``demo-slow``): the task text is the only channel from inputs to a model.
    """

    tick_seconds: float = 0.1

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        prompt = _text(messages)
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        role = getattr(from_agent, "role", "agent")
        match = _TICK.search(prompt)
        ticks = round(float(match.group(1)) / self.tick_seconds) if match else 0
        answer = f"Thought: I know the answer.\nFinal Answer: {role} reports finding {digest}."
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=from_task, from_agent=from_agent)
            if self._effective_stream():
                response_id = str(uuid.uuid4())
                for i in range(ticks):
                    time.sleep(self.tick_seconds)
                    self._emit(f"tick {i + 1}/{ticks}\n", from_task, from_agent, response_id)
                for piece in answer.split(" "):
                    self._emit(piece + " ", from_task, from_agent, response_id)
            self._track_token_usage_internal({"prompt_tokens": _words(prompt), "completion_tokens": _words(answer)})
            self._emit_call_completed_event(
                response=answer,
                call_type=LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
            )
        return answer

    async def acall(self, *args: Any, **kwargs: Any) -> str:
        return await asyncio.to_thread(self.call, *args, **kwargs)

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def _emit(self, text: str, task: Any, agent: Any, response_id: str) -> None:
        self._emit_stream_chunk_event(
            chunk=text,
            from_task=task,
            from_agent=agent,
            call_type=LLMCallType.LLM_CALL,
            response_id=response_id,
        )


def _two_step_crew(llm: OfflineLLM, **crew_options: Any) -> Crew:
    researcher = Agent(role="Researcher", goal="Find facts about {topic}", backstory="Careful.", llm=llm)
    writer = Agent(role="Writer", goal="Summarise findings on {topic}", backstory="Concise.", llm=llm)
    return Crew(
        agents=[researcher, writer],
        tasks=[
            Task(description="Research {topic}.", expected_output="Facts.", agent=researcher),
            Task(description="Summarise the research on {topic}.", expected_output="A summary.", agent=writer),
        ],
        process=Process.sequential,
        **crew_options,
    )


def _with_topic(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(inputs or {})
    merged.setdefault("topic", "process supervision")
    return merged


def demo() -> Crew:
    """Two agents, two sequential tasks, a streamed deterministic answer."""
    return _two_step_crew(OfflineLLM(model="offline-demo"), before_kickoff_callbacks=[_with_topic])


def _with_seconds(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = _with_topic(inputs)
    seconds = merged.setdefault("seconds", DEFAULT_SLOW_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_SLOW_SECONDS:
        raise ValueError(f"seconds must be a number from 0 to {MAX_SLOW_SECONDS:.0f}")
    return merged


def demo_slow() -> Crew:
    """Streams a tick about every 100 ms for ``seconds`` (default 30): long enough to cancel live."""
    agent = Agent(
        role="Ticker", goal="Keep time on {topic}", backstory="Patient.", llm=OfflineLLM(model="offline-demo")
    )
    task = Task(description="Tick for {seconds} seconds on {topic}.", expected_output="A tick log.", agent=agent)
    return Crew(agents=[agent], tasks=[task], before_kickoff_callbacks=[_with_seconds])


registry: dict[str, Callable[[], Crew]] = {"demo": demo, "demo-slow": demo_slow}
