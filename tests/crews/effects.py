"""A crew whose every task has an external effect a test can read, for the effect ledger and resume.

Part of ``tests.crews:registry``. ``effects``: four sequential tasks ("step 1".."step 4"), each of its own agent
(the offline ``ScriptedLLM`` calling its tool in ReAct text, then answering with what it observed), each agent with a
tool ``record_effect`` that appends ``"{marker} step {n}"`` to EFFECTS_LOG in ``base._evidence()``. Inputs:
``marker`` (default "run"); ``hang_in_step``: that step's tool first writes ``"{marker} step {n} begun"``, then
blocks until ``{marker}.release`` exists beside EFFECTS_LOG (a test waits for the line, then cancels or kills inside
the tool call; it creates the file before it resumes the run, whose input still says to hang there);
``fail_in_step``: that step's tool raises ``RuntimeError("tool failed at step n")``, writing nothing, which CrewAI
hands the model as the tool's observation (the run goes on).

``effects-large-number``: one task whose model calls the tool ``count`` with ``{"n": 10**20}``, arguments orjson
cannot write (an int over 64 bits), then answers with what it observed.

``effects-late-model``: ``effects-large-number``, whose kickoff first calls a model of a class it defines then (after
the ledger wrapped the classes it knew) directly, as crew code may: no agent's hooks before it, only its own inside.

``effects-own-tool``: a crew whose factory defines its tool's class, overriding ``run``, which its kickoff calls
directly (as CrewAI's native function-calling path does): each build is a class of its own.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool

from tests.crews.base import _evidence
from tests.crews.shapes import ScriptedLLM

EFFECTS_LOG = "effects.log"  # in EVIDENCE_DIR, or the worker's cwd
STEPS = 4
TOOL = "record_effect"
RELEASE_POLL_SECONDS = 0.05
COUNT = "count"
LARGE = 10**20  # over 64 bits
LATE_MODEL = "offline-late"
OWN_TOOL = "own_tool"


class RecordEffect(BaseTool):
    """One step's external effect: a line in EFFECTS_LOG. The job's inputs reach it in the task's text (its
    ``text``), as the model passes it on: a crew's tools see nothing else of a kickoff's inputs."""

    name: str = TOOL
    description: str = "Record that this step's work was done."
    step: int

    def _run(self, text: str) -> str:
        found = _TEXT.search(text)
        marker, hang, fail = (found.group(1), int(found.group(2)), int(found.group(3))) if found else ("run", 0, 0)
        if self.step == fail:
            raise RuntimeError(f"tool failed at step {self.step}")
        log = _evidence() / EFFECTS_LOG
        if self.step == hang:
            _append(log, f"{marker} step {self.step} begun")
            while not log.with_name(f"{marker}.release").exists():
                time.sleep(RELEASE_POLL_SECONDS)
        _append(log, f"{marker} step {self.step}")
        return f"recorded {marker} step {self.step}"


_TEXT = re.compile(r"of the (.*) run, hanging in step (-?\d+), failing in step (-?\d+)")


def _append(log: Path, line: str) -> None:
    with open(log, "a") as file:
        file.write(line + "\n")


def effects() -> Crew:
    agents, tasks = [], []
    for step in range(1, STEPS + 1):
        agent = Agent(
            role=f"Clerk {step}",
            goal="Record each step's work",
            backstory="Keeps the books.",
            tools=[RecordEffect(step=step)],
            llm=ScriptedLLM(model="offline-effects", script="tool", tool_names=[TOOL]),
        )
        agents.append(agent)
        description = (
            f"step {step} of the {{marker}} run, hanging in step {{hang_in_step}}, failing in step {{fail_in_step}}."
        )
        tasks.append(Task(name=f"step {step}", description=description, expected_output="A record.", agent=agent))
    return Crew(agents=agents, tasks=tasks, before_kickoff_callbacks=[_with_defaults])


def _with_defaults(inputs: dict[str, Any] | None) -> dict[str, Any]:
    return {"marker": "run", "hang_in_step": 0, "fail_in_step": 0, **(inputs or {})}


class Count(BaseTool):
    name: str = COUNT
    description: str = "Count to n."

    def _run(self, n: int) -> str:
        return f"counted to {n}"


def effects_large_number() -> Crew:
    llm = ScriptedLLM(model="offline-effects", script="tool", tool_names=[COUNT], tool_arguments={"n": LARGE})
    agent = Agent(role="Counter", goal="Count", backstory="Patient.", tools=[Count()], llm=llm)
    task = Task(description="Count to a large number.", expected_output="A count.", agent=agent)
    return Crew(agents=[agent], tasks=[task])


def effects_late_model() -> Crew:
    crew = effects_large_number()
    crew.before_kickoff_callbacks.append(_ask_a_late_model)
    return crew


def _ask_a_late_model(inputs: dict[str, Any] | None) -> dict[str, Any]:
    class LateLLM(BaseLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            self._invoke_before_llm_call_hooks(messages, None)  # as CrewAI's providers do in their call
            return "Nothing."

    LateLLM(model=LATE_MODEL).call([{"role": "user", "content": "Anything late?"}])
    return inputs or {}


def effects_own_tool() -> Crew:
    class OwnTool(BaseTool):
        name: str = OWN_TOOL
        description: str = "Answer."

        def run(self, *args: Any, **kwargs: Any) -> Any:
            return "answered"

        def _run(self) -> str:
            return "answered"

    crew = effects_large_number()
    own = OwnTool()
    crew.before_kickoff_callbacks.append(lambda inputs: (own.run(), inputs or {})[1])
    return crew


CREWS: dict[str, Callable[[], Crew]] = {
    "effects-own-tool": effects_own_tool,
    "effects": effects,
    "effects-large-number": effects_large_number,
    "effects-late-model": effects_late_model,
}
