"""Offline demo crews: a deterministic model, no network, no API key.

Choose them explicitly with ``AIP_CREWAI_REGISTRY=worker.demo:registry`` (or ``serve --demo``). The
``demo-llm`` crews run on CrewAI's own ``LLM`` class, as production crews do, against the loopback
provider at ``$CREW_PROVIDER_URL`` (``python -m worker.provider --port 8091`` serves the default).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import orjson
from chromadb import Documents, EmbeddingFunction
from crewai import LLM, Agent, Crew, Process, Task
from crewai.agents.agent_builder.base_agent import BaseAgent
from crewai.events.types.llm_events import LLMCallType
from crewai.knowledge.source.string_knowledge_source import StringKnowledgeSource
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.rag.embeddings.providers.custom.embedding_callable import CustomEmbeddingFunction
from crewai.rag.embeddings.providers.custom.types import CustomProviderSpec
from crewai.tools import BaseTool
from pydantic import BaseModel

from worker import provider

DEFAULT_SLOW_SECONDS = 30.0
MAX_SLOW_SECONDS = 3600.0
_TICK = re.compile(r"Tick for ([0-9]+(?:\.[0-9]+)?) seconds")
_WORD = re.compile(r"[a-z0-9]+")
OFFLINE_SCORE = 8  # what the offline model answers for any number a structured call asks for
EMBEDDING_DIMENSIONS = 256
EFFECTS_LOG = "effects.log"  # in the job's HOME: a line for each step demo-effects' tool recorded
EFFECT_STEPS = 3
_STEP = re.compile(r"Step ([0-9]+) of run (.*), taking ([0-9]+(?:\.[0-9]+)?) seconds")
_CURRENT_TASK = re.compile(r"Current Task: (.*?)\n")
_OBSERVED = re.compile(r"\nObservation:\s*(.*)\Z", re.S)


def prompt_text(messages: str | list[Any]) -> str:
    """The text of what a model is called with (a string, or chat messages)."""
    if isinstance(messages, str):
        return messages
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def _words(text: str) -> int:
    return max(1, len(text.split()))


def _sample(annotation: Any, text: str) -> Any:
    """A deterministic value of ``annotation``: strings say ``text``, numbers are OFFLINE_SCORE."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _sample(next((a for a in args if a is not type(None)), str), text)
    if origin is typing.Literal:
        return args[0]
    if origin in (list, set, tuple):
        return [_sample(args[0] if args else str, text)]
    if origin is dict:
        return {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _structured(annotation, text)
    if annotation in (int, float):
        return annotation(OFFLINE_SCORE)
    if annotation is bool:
        return True
    return text


def _structured(model: type[BaseModel], text: str) -> BaseModel:
    return model.model_validate({name: _sample(f.annotation, text) for name, f in model.model_fields.items()})


class OfflineLLM(BaseLLM):
    """A deterministic model: the answer is derived from the prompt, streamed word by word.

    A prompt that says "Tick for N seconds" first gets a heartbeat chunk every ``tick_seconds``
    for N seconds (``demo-slow``): the task text is the only channel from inputs to a model.
    Structured calls (``response_model``: test scores, training evaluation) get an instance of that
    model, as native providers return, so ``test`` and ``train`` work offline too.
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
    ) -> str | BaseModel:
        prompt = prompt_text(messages)
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        role = getattr(from_agent, "role", "agent")
        match = _TICK.search(prompt)
        ticks = round(float(match.group(1)) / self.tick_seconds) if match else 0
        answer = self.reply(messages, f"{role} reports finding {digest}.")
        if response_model is not None:
            return self._answer_structured(
                messages, response_model, f"{role} reports finding {digest}.", from_task, from_agent
            )
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

    def reply(self, messages: str | list[Any], finding: str) -> str:
        """What the model says to a call (not a structured one), given what it found in the prompt."""
        return f"Thought: I know the answer.\nFinal Answer: {finding}"

    async def acall(self, *args: Any, **kwargs: Any) -> str | BaseModel:
        return await asyncio.to_thread(self.call, *args, **kwargs)

    def get_input_tokens_count(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def supports_function_calling(self) -> bool:
        # BaseLLM lacks this, yet TaskEvaluator (train) calls it; True makes converters pass response_model.
        return True

    def _answer_structured(
        self, messages: str | list[Any], model: type[BaseModel], text: str, task: Any, agent: Any
    ) -> BaseModel:
        answer = _structured(model, text)
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=task, from_agent=agent)
            self._track_token_usage_internal({"prompt_tokens": _words(prompt_text(messages)), "completion_tokens": 1})
            self._emit_call_completed_event(
                response=answer.model_dump_json(),
                call_type=LLMCallType.LLM_CALL,
                from_task=task,
                from_agent=agent,
                messages=messages,
            )
        return answer

    def _emit(self, text: str, task: Any, agent: Any, response_id: str) -> None:
        self._emit_stream_chunk_event(
            chunk=text,
            from_task=task,
            from_agent=agent,
            call_type=LLMCallType.LLM_CALL,
            response_id=response_id,
        )


def provider_llm(script: str = "answer", **options: Any) -> LLM:
    """CrewAI's own ``LLM`` on the loopback provider (``worker/provider.py``) at ``$CREW_PROVIDER_URL``:
    the openai SDK over HTTP, as in production; ``script`` is the provider's script (``hang``, ``slow-1500``)."""
    url = os.environ.get(provider.URL_ENV, provider.DEFAULT_URL)
    return LLM(model=f"openai/{script}", base_url=url, api_key="demo", **options)


def _two_step_crew(llm: BaseLLM, **crew_options: Any) -> Crew:
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


def notes_and_report(llm: BaseLLM, backstory: str) -> Crew:
    """Two tasks of one agent whose prompts say the input ``mode`` ("answer" unless given): a crew to replay
    from its second task, and one whose model can be told to block (the tests' and the bench's)."""
    agent = Agent(role="Recorder", goal="Keep a record", backstory=backstory, llm=llm, allow_delegation=False)
    tasks = [
        Task(description="Gather notes in {mode} mode.", expected_output="Notes.", agent=agent),
        Task(description="Write the report in {mode} mode.", expected_output="A report.", agent=agent),
    ]
    return Crew(agents=[agent], tasks=tasks, before_kickoff_callbacks=[_with_mode])


def _with_mode(inputs: dict[str, Any] | None) -> dict[str, Any]:
    return {"mode": "answer", **(inputs or {})}


def _with_topic(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(inputs or {})
    merged.setdefault("topic", "process supervision")
    return merged


def demo() -> Crew:
    """Two agents, two sequential tasks, a streamed deterministic answer."""
    return _two_step_crew(OfflineLLM(model="offline-demo"), before_kickoff_callbacks=[_with_topic])


def demo_llm(llm: BaseLLM | None = None) -> Crew:
    """``demo`` on CrewAI's own ``LLM`` class (``llm``, or a new one on the loopback provider)."""
    return _two_step_crew(llm or provider_llm(), before_kickoff_callbacks=[_with_topic])


def demo_llm_hang() -> Crew:
    """One agent whose provider never answers: its job runs until it is cancelled or times out, and the
    provider sees the connection close when the worker is killed."""
    agent = Agent(role="Waiter", goal="Wait on {topic}", backstory="Patient.", llm=provider_llm("hang"))
    task = Task(description="Answer on {topic}.", expected_output="An answer.", agent=agent)
    return Crew(agents=[agent], tasks=[task], before_kickoff_callbacks=[_with_topic])


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


class StepLLM(OfflineLLM):
    """The offline model speaking CrewAI's ReAct text (no native function calling): it calls its agent's tool on the
    task's text, then answers with what the tool said (``demo-effects``)."""

    def supports_function_calling(self) -> bool:
        return False

    def reply(self, messages: str | list[Any], finding: str) -> str:
        said = [str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
        observed = next((found.group(1).strip() for text in said if (found := _OBSERVED.search(text))), None)
        if observed is not None:
            return f"Thought: I now know the final answer\nFinal Answer: {observed}"
        task = _CURRENT_TASK.search(prompt_text(messages))
        note = orjson.dumps({"text": task.group(1) if task else ""}).decode()
        return f"Thought: I should record this step.\nAction: {RecordStep.TOOL}\nAction Input: {note}"


class RecordStep(BaseTool):
    """A step's external effect: it takes the step's seconds, then appends ``{marker} step {n}`` to EFFECTS_LOG in the
    job's HOME (the crew's own, kept between its jobs)."""

    TOOL: ClassVar[str] = "record_step"
    name: str = TOOL
    description: str = "Record that this step's work was done."

    def _run(self, text: str) -> str:
        found = _STEP.search(text)
        step, marker, seconds = (found.group(1), found.group(2), float(found.group(3))) if found else ("?", "?", 0.0)
        time.sleep(min(seconds, MAX_SLOW_SECONDS))
        with open(os.path.join(os.path.expanduser("~"), EFFECTS_LOG), "a") as log:
            log.write(f"{marker} step {step}\n")
        return f"recorded {marker} step {step}"


def _with_marker(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = {"marker": "demo", **_with_seconds({"seconds": 1, **(inputs or {})})}
    merged.pop("topic", None)
    return merged


def demo_effects() -> Crew:
    """EFFECT_STEPS tasks, each of its own agent, each agent's tool an external effect (``RecordStep``: a line in
    the crew's HOME) that takes ``seconds`` (default 1): a run to stop half-way, look at its effect ledger, and
    resume (docs/reconcile-and-resume.md). Inputs: ``marker`` (default "demo"), ``seconds``."""
    agents: list[BaseAgent] = []
    tasks = []
    for step in range(1, EFFECT_STEPS + 1):
        agent = Agent(
            role=f"Clerk {step}",
            goal="Record each step's work",
            backstory="Keeps the books.",
            tools=[RecordStep()],
            llm=StepLLM(model="offline-effects"),
        )
        agents.append(agent)
        description = f"Step {step} of run {{marker}}, taking {{seconds}} seconds."
        tasks.append(Task(name=f"step {step}", description=description, expected_output="A record.", agent=agent))
    return Crew(agents=agents, tasks=tasks, before_kickoff_callbacks=[_with_marker])


class HashEmbedder(CustomEmbeddingFunction, EmbeddingFunction[Documents]):
    """A deterministic offline embedder: each word adds +-1 to a sha256-chosen dimension.

    Texts sharing words point the same way. Both bases: CrewAI's custom provider wants its class,
    chromadb its own protocol.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # chromadb's base __init__ only warns

    def __call__(self, input: list[str]) -> list[np.ndarray]:
        return [self._embed(text) for text in input]

    @staticmethod
    def _embed(text: str) -> np.ndarray:
        vector = np.zeros(EMBEDDING_DIMENSIONS, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            digest = hashlib.sha256(word.encode()).digest()
            vector[int.from_bytes(digest[:4], "big") % EMBEDDING_DIMENSIONS] += 1 if digest[4] & 1 else -1
        norm = float(np.linalg.norm(vector))
        if norm == 0:
            vector[0], norm = 1.0, 1.0
        return vector / norm

    @staticmethod
    def name() -> str:
        return "crew-supervisor-hash"

    def get_config(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashEmbedder:
        return HashEmbedder()


OFFLINE_EMBEDDER: CustomProviderSpec = {"provider": "custom", "config": {"embedding_callable": HashEmbedder}}
KNOWLEDGE = (
    "Every CrewAI job runs in its own worker process, started by the supervisor.",
    "Cancelling a job kills the worker's whole process group and confirms every process is gone.",
    "The journal is a SQLite database in WAL mode; admission is durable before any work starts.",
)


def demo_knowledge() -> Crew:
    """Knowledge embedded offline (HashEmbedder) at build time; ask e.g. "What does cancelling a job kill?"."""
    agent = Agent(
        role="Librarian",
        goal="Answer from the knowledge base",
        backstory="Well read.",
        llm=OfflineLLM(model="offline-demo"),
    )
    task = Task(description="Answer: {question}", expected_output="An answer.", agent=agent)
    return Crew(
        agents=[agent],
        tasks=[task],
        knowledge_sources=[StringKnowledgeSource(content=fact) for fact in KNOWLEDGE],
        embedder=OFFLINE_EMBEDDER,
        before_kickoff_callbacks=[_with_question],
    )


def _with_question(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(inputs or {})
    merged.setdefault("question", "What does cancelling a job kill?")
    return merged


registry: dict[str, Callable[[], Crew]] = {
    "demo": demo,
    "demo-slow": demo_slow,
    "demo-knowledge": demo_knowledge,
    "demo-llm": demo_llm,
    "demo-llm-hang": demo_llm_hang,
    "demo-effects": demo_effects,
}
# Evaluator models ``test`` can name (eval_llm) without a network or an API key.
eval_llms: dict[str, Callable[[], BaseLLM]] = {"offline-eval": lambda: OfflineLLM(model="offline-eval")}
