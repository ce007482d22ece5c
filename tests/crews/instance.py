"""A registry holding a Crew instance beside a factory: workers refuse the instance, in words naming the fix
(``worker/registry.py``), and the factory's jobs run. Apart because a value that is not a factory is refused
by design, and the tests read the whole registry's answer (``1 of 2 crews build``)."""

from __future__ import annotations

from typing import Any

from crewai import LLM

from worker.demo import demo, demo_llm

# Built at import on CrewAI's own LLM class, as a user's module would; a refused crew never calls its model.
registry: dict[str, Any] = {
    "instance": demo_llm(LLM(model="openai/answer", base_url="http://127.0.0.1:9/v1", api_key="x")),
    "demo": demo,
}
