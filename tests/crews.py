"""A test registry: the demo crews plus crews that misbehave on purpose.

Loaded by real workers as ``AIP_CREWAI_REGISTRY=tests.crews:registry``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM

from worker.demo import OfflineLLM, demo, demo_slow

HOUR = 3600


class MisbehavingLLM(BaseLLM):
    """``sleep``: blocks in time.sleep; ``spawn``: starts a grandchild that leaves the group, then
    blocks; ``raise``: fails with text that must never reach the journal; ``huge``: answers 5 MiB."""

    mode: str

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        if self.mode == "huge":
            return "Final Answer: " + "x" * (5 * 1024 * 1024)
        if self.mode == "spawn":
            subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(3600)"])
        if self.mode == "raise":
            raise RuntimeError("provider said: secret-token-123")
        time.sleep(HOUR)
        return "Final Answer: unreachable"

    async def acall(self, *args: Any, **kwargs: Any) -> str:
        import asyncio

        return await asyncio.to_thread(self.call, *args, **kwargs)


def _single(llm: BaseLLM) -> Crew:
    agent = Agent(role="Tester", goal="Test", backstory="A test.", llm=llm)
    return Crew(agents=[agent], tasks=[Task(description="Test.", expected_output="Nothing.", agent=agent)])


def stubborn() -> Crew:
    """Ignores SIGTERM and blocks in a thread: only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return _single(MisbehavingLLM(model="sleepy", mode="sleep"))


def spawner() -> Crew:
    return _single(MisbehavingLLM(model="spawner", mode="spawn"))


def boom() -> Crew:
    return _single(MisbehavingLLM(model="boom", mode="raise"))


def huge() -> Crew:
    return _single(MisbehavingLLM(model="huge", mode="huge"))


def broken_factory() -> Crew:
    raise ValueError("factory cannot build this crew")


def chatty() -> Crew:
    """Completes like demo but prints to stdout and stderr on the way."""
    print("panel " * 1000)
    print("warning " * 1000, file=sys.stderr)
    return _single(OfflineLLM(model="offline-demo"))


registry: dict[str, Callable[[], Crew]] = {
    "demo": demo,
    "demo-slow": demo_slow,
    "stubborn": stubborn,
    "spawner": spawner,
    "boom": boom,
    "broken-factory": broken_factory,
    "huge": huge,
    "chatty": chatty,
}
