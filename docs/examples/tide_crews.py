"""tide_crews.py: a crew with a tool, on a real model in production and on a scripted one in tests."""

import os

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool


@tool("tide_times")
def tide_times(port: str) -> str:
    """The times of high tide at a port today."""
    return f"high tide at {port}: 06:12 and 18:40"  # a real tool would ask a tide service


def model() -> LLM:
    """The real model; under the pytest plugin's crew_provider, its scripted stand-in (same calls, no network)."""
    if url := os.environ.get("CREW_PROVIDER_URL"):
        return LLM(model="openai/gpt-4o-mini", base_url=url, api_key="scripted")
    return LLM(model="openai/gpt-4o-mini")  # reads OPENAI_API_KEY


def tides() -> Crew:
    """One agent that looks the tides of {port} up with its tool, then answers."""
    master = Agent(role="Harbour master", goal="Tell the tides", backstory="Salty.", tools=[tide_times], llm=model())
    answer = Task(description="When is high tide at {port} today?", expected_output="The times.", agent=master)
    return Crew(agents=[master], tasks=[answer])


registry = {"tides": tides}
