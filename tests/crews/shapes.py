"""Deterministic offline crews with the shapes real crews have: tools, context, a manager, structured
outputs, async tasks, knowledge, and the AIP client's qualification crew; and the same on CrewAI's own
``LLM`` class, over HTTP to the loopback provider at ``$CREW_PROVIDER_URL`` (native tool calls, context,
structured outputs: ``shape-llm-*``).

Part of ``tests.crews:registry``. Every factory builds a fresh Crew with fresh models, and every answer is a pure
function of the prompt, so two faithful runs of a crew give equal outputs (``tests.helpers.kickoff.comparable``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from crewai import Agent, Crew, Process, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.knowledge.source.string_knowledge_source import StringKnowledgeSource
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.tools import BaseTool, tool
from pydantic import BaseModel, Field

from worker.demo import OFFLINE_EMBEDDER, OfflineLLM, _words, prompt_text, provider_llm

_OBSERVATION = re.compile(r"\nObservation:\s*(.*)\Z", re.S)
_CONTEXT = re.compile(r"This is the context you're working with:\n(.*?)(?:\n\n(?:Provide|Begin)|\Z)", re.S)
_FINDING = re.compile(r"\b[0-9a-f]{12}\b")
_KNOWLEDGE = re.compile(r"Additional Information:\s*(.*?)(?:\n\n|\Z)", re.S)
_TASK = re.compile(r"Current Task: (.*?)\n")
_QUERY = re.compile(r"The original query is: (.*?)(?:\n|\Z)")
_FINAL = "Thought: I now know the final answer\nFinal Answer: "


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _messages(messages: str | list[Any]) -> list[dict[str, str]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in messages]


class ScriptedLLM(OfflineLLM):
    """The offline model speaking CrewAI's ReAct text protocol (no native function calling).

    ``script`` picks the behaviour: ``plain`` answers with a digest of its prompt (plus the findings of
    its context and the knowledge it was given); ``tool`` calls each of ``tool_names`` in turn on the
    task's text and then answers with their observations; ``manager`` delegates to each of ``coworkers``
    in turn (each one gets the previous one's answer as context) and then approves the last answer.
    Structured calls (``response_model``) are answered as OfflineLLM does.
    """

    script: str = "plain"
    tool_names: list[str] = Field(default_factory=list)
    tool_arguments: dict[str, Any] | None = None  # each tool's, for ``tool``; None: the task's text as ``text``
    coworkers: list[str] = Field(default_factory=list)

    def supports_function_calling(self) -> bool:
        return False  # the ReAct text protocol, as with most non-OpenAI models

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        if response_model is not None:
            return super().call(messages, tools, callbacks, available_functions, from_task, from_agent, response_model)
        answer = self.reply(_messages(messages), str(getattr(from_agent, "role", "agent")))
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=from_task, from_agent=from_agent)
            if self._effective_stream():
                response_id = _digest(prompt_text(messages) + answer)
                for piece in answer.split(" "):
                    self._emit(piece + " ", from_task, from_agent, response_id)
            self._track_token_usage_internal(
                {"prompt_tokens": _words(prompt_text(messages)), "completion_tokens": _words(answer)}
            )
            self._emit_call_completed_event(
                response=answer,
                call_type=LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
            )
        return answer

    def reply(self, messages: list[dict[str, str]], role: str) -> str:
        prompt = "\n".join(m["content"] for m in messages)
        task = _TASK.search(prompt)
        observations = [
            found.group(1).strip()
            for m in messages
            if m["role"] == "assistant" and (found := _OBSERVATION.search(m["content"]))
        ]
        if query := _QUERY.match(messages[-1]["content"]):  # CrewAI rewriting a task into a knowledge query
            return query.group(1)
        if self.script == "tool" and len(observations) < len(self.tool_names):
            arguments = self.tool_arguments or {"text": task.group(1) if task else prompt}
            return _action(self.tool_names[len(observations)], arguments)
        if self.script == "manager" and len(observations) < len(self.coworkers):
            arguments = {
                "task": task.group(1) if task else "Do the work.",
                "context": observations[-1] if observations else "Nothing is known yet.",
                "coworker": self.coworkers[len(observations)],
            }
            return _action("delegate_work_to_coworker", arguments)
        if self.script == "tool":
            return f"{_FINAL}{role} measured: {'; '.join(observations)}"
        if self.script == "manager":
            return f"{_FINAL}{role} approves: {observations[-1]}"
        parts = [f"{role} reports finding {_digest(prompt)}"]
        if (context := _CONTEXT.search(prompt)) and (findings := _FINDING.findall(context.group(1))):
            parts.append("building on " + " and ".join(dict.fromkeys(findings)))
        if knowledge := _KNOWLEDGE.search(prompt):
            parts.append(f"knowing [{' '.join(knowledge.group(1).split())}]")
        return _FINAL + ", ".join(parts) + "."


def _action(tool: str, arguments: dict[str, Any]) -> str:
    return f"Thought: I should use a tool.\nAction: {tool}\nAction Input: {json.dumps(arguments, sort_keys=True)}"


def _llm(**script: Any) -> ScriptedLLM:
    return ScriptedLLM(model="offline-shapes", **script)


class WordStats(BaseTool):
    """A deterministic tool: how many words a text has, and its checksum."""

    name: str = "word_stats"
    description: str = "Count the words of a text and give its checksum."

    def _run(self, text: str) -> str:
        return f"{len(text.split())} words, checksum {_digest(text)}"


@tool("initials")
def initials(text: str) -> str:
    """Give the initials of the words of a text."""
    return "initials " + "".join(word[0] for word in text.split()).upper()


def shape_tools() -> Crew:
    """One agent that calls two tools (a BaseTool, then a @tool) in ReAct text, sees what they observe
    and answers with it: both tools really run."""
    analyst = Agent(
        role="Analyst",
        goal="Measure texts with tools",
        backstory="Trusts tools over guesses.",
        tools=[WordStats(), initials],
        llm=_llm(script="tool", tool_names=["word_stats", "initials"]),
    )
    task = Task(description="Measure the text about {topic}.", expected_output="Word count.", agent=analyst)
    return Crew(agents=[analyst], tasks=[task], before_kickoff_callbacks=[_with_topic])


def shape_context() -> Crew:
    """Three agents in sequence; the last task reads the first two through ``context``."""
    researcher = Agent(role="Researcher", goal="Find facts on {topic}", backstory="Careful.", llm=_llm())
    critic = Agent(role="Critic", goal="Check facts on {topic}", backstory="Sceptical.", llm=_llm())
    writer = Agent(role="Writer", goal="Write about {topic}", backstory="Concise.", llm=_llm())
    research = Task(description="Research {topic}.", expected_output="Facts.", agent=researcher)
    review = Task(description="Check the research on {topic}.", expected_output="A check.", agent=critic)
    write = Task(
        description="Write up {topic} from the research and its check.",
        expected_output="A summary.",
        agent=writer,
        context=[research, review],
    )
    return Crew(
        agents=[researcher, critic, writer], tasks=[research, review, write], before_kickoff_callbacks=[_with_topic]
    )


def shape_hierarchical() -> Crew:
    """A manager (offline ``manager_llm``) delegates to a coworker with CrewAI's delegation tool."""
    researcher = Agent(role="Researcher", goal="Find facts on {topic}", backstory="Careful.", llm=_llm())
    writer = Agent(role="Writer", goal="Write about {topic}", backstory="Concise.", llm=_llm())
    task = Task(description="Produce a brief on {topic}.", expected_output="A brief.")
    return Crew(
        agents=[researcher, writer],
        tasks=[task],
        process=Process.hierarchical,
        manager_llm=_llm(script="manager", coworkers=["Researcher", "Writer"]),
        before_kickoff_callbacks=[_with_topic],
    )


class Verdict(BaseModel):
    summary: str
    score: int
    tags: list[str]


def shape_structured(llm: BaseLLM | None = None) -> Crew:
    """A task with ``output_json`` (its json_dict is filled), then one with ``output_pydantic`` (the crew's)."""
    judge = Agent(role="Judge", goal="Judge {topic}", backstory="Fair.", llm=llm or _llm())
    notes = Task(
        description="Note the evidence on {topic}.", expected_output="Notes.", agent=judge, output_json=Verdict
    )
    verdict = Task(description="Judge {topic}.", expected_output="A verdict.", agent=judge, output_pydantic=Verdict)
    return Crew(agents=[judge], tasks=[notes, verdict], before_kickoff_callbacks=[_with_topic])


def shape_async() -> Crew:
    """Two tasks with ``async_execution=True``, then a task that takes both as context."""
    north = Agent(role="North scout", goal="Scout north of {topic}", backstory="Quick.", llm=_llm())
    south = Agent(role="South scout", goal="Scout south of {topic}", backstory="Quick.", llm=_llm())
    lead = Agent(role="Lead", goal="Combine scouting on {topic}", backstory="Decisive.", llm=_llm())
    first = Task(description="Scout north of {topic}.", expected_output="A report.", agent=north, async_execution=True)
    second = Task(description="Scout south of {topic}.", expected_output="A report.", agent=south, async_execution=True)
    combine = Task(
        description="Combine the scouting on {topic}.", expected_output="A plan.", agent=lead, context=[first, second]
    )
    return Crew(agents=[north, south, lead], tasks=[first, second, combine], before_kickoff_callbacks=[_with_topic])


FACTS = (
    "Every CrewAI job runs in its own worker process, started by the supervisor.",
    "Cancelling a job kills the worker's whole process group and confirms every process is gone.",
    "The journal is a SQLite database in WAL mode; admission is durable before any work starts.",
)


def shape_knowledge() -> Crew:
    """Crew knowledge embedded offline; the answer quotes what retrieval put into the prompt."""
    librarian = Agent(role="Librarian", goal="Answer from the knowledge base", backstory="Well read.", llm=_llm())
    task = Task(description="Answer: {question}", expected_output="An answer.", agent=librarian)
    return Crew(
        agents=[librarian],
        tasks=[task],
        knowledge_sources=[StringKnowledgeSource(content=fact) for fact in FACTS],
        embedder=OFFLINE_EMBEDDER,
        before_kickoff_callbacks=[_with_question],
    )


class QualificationLLM(BaseLLM):
    """The AIP client's qualification model: 2 prompt + 3 completion tokens, chunks "case " and "triaged"."""

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
        answer = "Final Answer: case triaged"
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=from_task, from_agent=from_agent)
            if self._effective_stream():
                for chunk in ("case ", "triaged"):
                    self._emit_stream_chunk_event(
                        chunk=chunk,
                        from_task=from_task,
                        from_agent=from_agent,
                        call_type=LLMCallType.LLM_CALL,
                        response_id="aip-qualification",
                    )
            self._track_token_usage_internal({"prompt_tokens": 2, "completion_tokens": 3})
            self._emit_call_completed_event(
                response=answer,
                call_type=LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
            )
        return answer

    async def acall(self, *args: Any, **kwargs: Any) -> str:
        return self.call(*args, **kwargs)

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        return 0


def aip_qualification() -> Crew:
    """The AIP connector's end-to-end check: {"case_id": ...} gives raw "case triaged" and 5 tokens."""
    agent = Agent(
        role="Support triager",
        goal="Triage support cases",
        backstory="Qualifies the sidecar.",
        llm=QualificationLLM(model="aip-qualification"),
    )
    task = Task(description="Triage support case {case_id}.", expected_output="A triage.", agent=agent)
    return Crew(agents=[agent], tasks=[task])


def shape_llm_tools() -> Crew:
    """Two agents on CrewAI's own LLM, each with its own: the first calls two tools natively (the provider
    answers with tool calls), the second writes from the first's output as context."""
    analyst = Agent(
        role="Analyst",
        goal="Measure texts about {topic}",
        backstory="Trusts tools.",
        tools=[WordStats(), initials],
        llm=provider_llm(),
    )
    writer = Agent(role="Writer", goal="Write about {topic}", backstory="Concise.", llm=provider_llm())
    measure = Task(description="Measure the text about {topic}.", expected_output="Counts.", agent=analyst)
    write = Task(description="Write up {topic}.", expected_output="A summary.", agent=writer, context=[measure])
    return Crew(agents=[analyst, writer], tasks=[measure, write], before_kickoff_callbacks=[_with_topic])


def shape_llm_structured() -> Crew:
    """``shape-structured`` on CrewAI's own LLM: the provider answers the JSON schema CrewAI sends."""
    return shape_structured(provider_llm())


def _with_topic(inputs: dict[str, Any] | None) -> dict[str, Any]:
    return {"topic": "process supervision", **(inputs or {})}


def _with_question(inputs: dict[str, Any] | None) -> dict[str, Any]:
    return {"question": "What does cancelling a job kill?", **(inputs or {})}


SHAPES: dict[str, Callable[[], Crew]] = {
    "shape-tools": shape_tools,
    "shape-context": shape_context,
    "shape-hierarchical": shape_hierarchical,
    "shape-structured": shape_structured,
    "shape-async": shape_async,
    "shape-knowledge": shape_knowledge,
    "aip-qualification": aip_qualification,
    "shape-llm-tools": shape_llm_tools,
    "shape-llm-structured": shape_llm_structured,
}
