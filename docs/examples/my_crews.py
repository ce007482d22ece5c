"""my_crews.py: the crews a sidecar serves, as AIP_CREWAI_REGISTRY=my_crews:registry."""

import os

from crewai import LLM, Agent, BaseLLM, Crew, Task


def model() -> BaseLLM:
    """The real model in production; a deterministic offline one for tests and CI."""
    if os.environ.get("MY_CREWS_OFFLINE"):
        from worker.demo import OfflineLLM  # ships with crew-supervisor: no network, no key

        return OfflineLLM(model="offline")
    return LLM(model="openai/gpt-4o-mini")  # reads OPENAI_API_KEY; any model LLM takes


def research() -> Crew:
    """Two agents in sequence: facts on {topic}, then a summary."""
    researcher = Agent(role="Researcher", goal="Facts on {topic}", backstory="Careful.", llm=model())
    writer = Agent(role="Writer", goal="Summarise {topic}", backstory="Concise.", llm=model())
    facts = Task(description="Research {topic}.", expected_output="Facts.", agent=researcher)
    summary = Task(description="Summarise the facts.", expected_output="A summary.", agent=writer)
    return Crew(agents=[researcher, writer], tasks=[facts, summary])


def watch() -> Crew:
    """A long job, to cancel: the offline model ticks every 0.1 s for {seconds} seconds."""
    watcher = Agent(role="Watcher", goal="Watch {topic}", backstory="Patient.", llm=model())
    log = Task(description="Tick for {seconds} seconds.", expected_output="A log.", agent=watcher)
    return Crew(agents=[watcher], tasks=[log])


# Crew id -> a zero-arg factory: every job gets a fresh Crew from it.
registry = {"research": research, "watch": watch}
