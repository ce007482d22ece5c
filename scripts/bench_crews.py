"""The benchmark's crew registry: the demo crews plus crews shaped to measure one thing each.

Loaded by workers as ``AIP_CREWAI_REGISTRY=bench_crews:registry`` with ``PYTHONPATH=<repo>/scripts:<repo>``.
A crew that blocks first touches ``$BENCH_MARKER_DIR/<pid>``, so the bench cancels it only once it
really is blocked (rather than guessing with a sleep).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crewai import Agent, Crew, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context

from protocol import EVENT_FD, Chunk, pack
from worker.demo import OfflineLLM, demo, demo_llm, demo_slow, notes_and_report, prompt_text, provider_llm

MARKER_DIR = "BENCH_MARKER_DIR"
BLOCK_SECONDS = 3600.0  # the job's timeout_ms or a cancel ends it long before
DEFAULT_CHUNKS = 1000
MAX_CHUNKS = 99_000  # MAX_EVENTS_PER_RUN tops out at 100,000, started and terminal included
_CHUNKS = re.compile(r"(?:Emit|Relay) ([0-9]+) chunks")
SLOW_CALL_MS = 1500
RELAY_BATCH = 256  # frames per write: the relay worker's cost per chunk stays far below the supervisor's


def block() -> None:
    """Say we are blocked (for the bench to see), then block in time.sleep like a slow provider call."""
    directory = os.environ.get(MARKER_DIR)
    if directory:
        Path(directory, str(os.getpid())).touch()
    time.sleep(BLOCK_SECONDS)


def _single(llm: BaseLLM, description: str = "Answer briefly.", **crew_options: Any) -> Crew:
    agent = Agent(role="Bencher", goal="Answer", backstory="Quick.", llm=llm, allow_delegation=False)
    task = Task(description=description, expected_output="One line.", agent=agent)
    return Crew(agents=[agent], tasks=[task], **crew_options)


def fast() -> Crew:
    """One agent, one task, the offline model: what a job costs when CrewAI does the least it can."""
    return _single(OfflineLLM(model="offline-bench"))


BUILT = re.compile(r"Its model was built in ([0-9.]+) ms, ([0-9.]+) ms of CPU\.")


def timed_llm() -> Crew:
    """``demo-llm``, its first task saying what building its LLM took here (wall and CPU ms, ``BUILT``): how the
    bench sees that cost inside a worker."""
    wall, cpu = time.perf_counter(), time.process_time()
    llm = provider_llm()
    wall, cpu = (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000
    crew = demo_llm(llm)
    crew.tasks[0].description += f" Its model was built in {wall:.3f} ms, {cpu:.3f} ms of CPU."
    return crew


def slow_llm() -> Crew:
    """One agent on CrewAI's own ``LLM`` class whose one provider call takes 1.5 s (the loopback provider)."""
    return _single(provider_llm(f"slow-{SLOW_CALL_MS}"))


class FloodLLM(OfflineLLM):
    """Streams the number of one-character chunks the prompt asks for ("Emit N chunks"), back to back."""

    def call(self, messages: str | list[Any], *args: Any, **kwargs: Any) -> str:
        match = _CHUNKS.search(prompt_text(messages))
        count = int(match.group(1)) if match else 0
        task, agent = kwargs.get("from_task"), kwargs.get("from_agent")
        answer = f"Thought: done.\nFinal Answer: emitted {count} chunks."
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=task, from_agent=agent)
            if self._effective_stream():
                response_id = str(uuid.uuid4())
                for _ in range(count):
                    self._emit("x", task, agent, response_id)
            self._emit_call_completed_event(
                response=answer, call_type=LLMCallType.LLM_CALL, from_task=task, from_agent=agent, messages=messages
            )
        return answer


class RelayLLM(OfflineLLM):
    """Writes the chunk frames the prompt asks for ("Relay N chunks") straight to the worker's event pipe,
    bypassing CrewAI's event bus and the worker's own chunk path, then answers normally: what reaches the
    client measures the supervisor (read, journal, SSE), not CrewAI. Only in a worker: fd EVENT_FD must be
    its event pipe. Nothing else writes frames meanwhile (this model streams nothing through CrewAI), so
    these frames cannot interleave with the worker's."""

    def call(self, messages: str | list[Any], *args: Any, **kwargs: Any) -> str:
        match = _CHUNKS.search(prompt_text(messages))
        count = int(match.group(1)) if match else 0
        task, agent = kwargs.get("from_task"), kwargs.get("from_agent")
        answer = f"Thought: done.\nFinal Answer: relayed {count} chunks."
        role = getattr(agent, "role", "agent")
        # The shape of a real CrewAI text chunk as the worker forwards it (worker.operations.chunk_message).
        data = {
            "content": "x", "chunk_type": "text", "task_index": 0, "task_name": "", "task_id": "",
            "agent_role": role, "agent_id": str(getattr(agent, "id", "")), "tool_call": None, "channel": "llm",
        }  # fmt: skip
        frame = pack(Chunk(channel="llm", data=data))
        with llm_call_context():
            self._emit_call_started_event(messages=messages, from_task=task, from_agent=agent)
            for start in range(0, count, RELAY_BATCH):
                view = memoryview(frame * min(RELAY_BATCH, count - start))
                while view:
                    view = view[os.write(EVENT_FD, view) :]
            self._emit_call_completed_event(
                response=answer, call_type=LLMCallType.LLM_CALL, from_task=task, from_agent=agent, messages=messages
            )
        return answer


def _with_chunks(inputs: dict[str, Any] | None) -> dict[str, Any]:
    merged = {"chunks": DEFAULT_CHUNKS, **(inputs or {})}
    chunks = merged["chunks"]
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 0 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"chunks must be an integer from 0 to {MAX_CHUNKS}")
    return merged


def flood() -> Crew:
    """Input ``chunks`` (default 1000): that many stream chunks as fast as the worker can emit them."""
    return _single(FloodLLM(model="offline-flood"), "Emit {chunks} chunks.", before_kickoff_callbacks=[_with_chunks])


def relay() -> Crew:
    """Input ``chunks`` (default 1000): that many chunk frames written straight to the event pipe (RelayLLM)."""
    return _single(RelayLLM(model="offline-relay"), "Relay {chunks} chunks.", before_kickoff_callbacks=[_with_chunks])


class BlockingLLM(OfflineLLM):
    """The offline model, except that a prompt saying "block mode" blocks (after touching its marker)."""

    def call(self, messages: str | list[Any], *args: Any, **kwargs: Any) -> Any:
        if "block mode" in prompt_text(messages):
            block()
        return super().call(messages, *args, **kwargs)


def stubborn() -> Crew:
    """Ignores SIGTERM and blocks in time.sleep: only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the factory runs on the worker's main thread
    return _single(BlockingLLM(model="offline-stubborn"), "Wait in block mode.")


def replayable() -> Crew:
    """Two tasks. Run it with mode "answer" for replay_task_ids, then replay the second with mode "block"."""
    return notes_and_report(BlockingLLM(model="offline-replayable"), "Careful.")


registry: dict[str, Callable[[], Crew]] = {
    "demo": demo,
    "demo-slow": demo_slow,
    "fast": fast,
    "flood": flood,
    "relay": relay,
    "stubborn": stubborn,
    "replayable": replayable,
    "llm": timed_llm,
    "llm-slow": slow_llm,
}
