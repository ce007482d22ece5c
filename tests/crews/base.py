"""The demo crews plus crews that misbehave on purpose: the part of ``tests.crews:registry`` most tests run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from itertools import cycle
from pathlib import Path
from typing import Any

import psutil
from crewai import Agent, Crew, Task
from crewai.crews.crew_output import CrewOutput
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.rag.chromadb import config as chroma_config
from crewai.tools import tool

from tests.helpers.waiting import wait_until
from worker.demo import (
    OfflineLLM,
    demo,
    demo_effects,
    demo_knowledge,
    demo_llm,
    demo_llm_hang,
    demo_slow,
    notes_and_report,
    prompt_text,
    provider_llm,
)
from worker.spending import budget

HOUR = 3600
CALL_LOG = "llm-calls.log"  # in EVIDENCE_DIR, or the worker's cwd
HEARTBEAT = "heartbeat"
BLOCKED = "blocked"  # in EVIDENCE_DIR, or the worker's cwd: the pids of MisbehavingLLM calls that block
EVIDENCE_DIR = "CREW_TEST_EVIDENCE_DIR"  # lets a test outside the job see its files after the scratch dir is gone
BEAT_SECONDS = 0.02
HOG_RELEASE = "hog-release"  # in EVIDENCE_DIR: created by a test once the provider holds the job's call
HOG_STEP = 32 * 1024 * 1024
LONG_WORDS = 3000  # the words llm-long's provider streams beyond its answer, a chunk each


def _evidence() -> Path:
    """Where a crew leaves what a test reads: EVIDENCE_DIR if the test set it, else the worker's cwd."""
    return Path(os.environ.get(EVIDENCE_DIR) or Path.cwd())


class MisbehavingLLM(BaseLLM):
    """``sleep``: blocks in time.sleep; ``spawn``: starts a grandchild that leaves the group, then
    blocks; ``tree``: starts a child that starts a grandchild which leaves the group (``setsid``), the child
    saying ``tree <child pid> <grandchild pid>`` on the job's stdout, then blocks; ``raise``: fails with text
    that must never reach the journal; ``leak``: prints the key in LEAKED_KEY on stdout and stderr and fails
    quoting it; ``huge``: answers 5 MiB; ``gil``: blocks in C holding the interpreter's lock (a regular expression
    that backtracks for ever), so no other thread of the worker runs.
    A call that blocks first appends its pid to BLOCKED, so a test can wait until it is inside the call."""

    mode: str

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        if self.mode == "huge":
            return "Final Answer: " + "x" * (5 * 1024 * 1024)
        if self.mode == "spawn":
            subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(3600)"])
        if self.mode == "tree":
            subprocess.Popen([sys.executable, "-c", TREE_CHILD])
        if self.mode == "raise":
            raise RuntimeError("provider said: secret-token-123")
        if self.mode == "leak":  # what a provider's client does with a wrong key: quote it
            key = os.environ[LEAKED_KEY]
            print(f"calling the provider with {key}", flush=True)
            print(f"openai.AuthenticationError: Incorrect API key provided: {key}", file=sys.stderr, flush=True)
            raise RuntimeError(f"Incorrect API key provided: {key}")
        with open(_evidence() / BLOCKED, "a") as blocked:
            blocked.write(f"{os.getpid()}\n")
        if self.mode == "gil":
            re.fullmatch(r"(a+)+$", "a" * 64 + "b")  # 2**64 steps, all in C
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


# The child of a ``tree`` crew's worker: it stays in the worker's group; its own child leaves it.
TREE_CHILD = (
    "import os, subprocess, sys, time\n"
    "left = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(3600)'])\n"
    "print(f'tree {os.getpid()} {left.pid}', flush=True)\n"
    "time.sleep(3600)\n"
)


def tree() -> Crew:
    return _single(MisbehavingLLM(model="tree", mode="tree"))


FAMILY = "family.pids"  # in EVIDENCE_DIR, or the worker's cwd: a family crew's members (tests/helpers/family.py)


class FamilyLLM(BaseLLM):
    """Starts a family of processes (``tests/helpers/family.py``: a child in the worker's group, a setsid
    grandchild, a grandchild that tries to leave the job's cgroups, a child in a group of its own), waits until
    each has said what it is in FAMILY, then ``ending``: ``block`` (until the job is stopped), ``answer`` or
    ``raise``; or ``slow``: for the seconds the prompt says, then it kills its family, as a crew that stops the
    tools' servers it started does, and answers (for ``crew-supervisor chaos``, whose jobs must end clean)."""

    ending: str

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        evidence = _evidence() / FAMILY
        if not evidence.exists():  # once a job: CrewAI calls again after a raise
            for role in ("child", "mover"):
                subprocess.Popen([sys.executable, "-m", "tests.helpers.family", str(evidence), role])
        wait_until(lambda: evidence.exists() and len(evidence.read_text().splitlines()) == 4, 60)
        if self.ending == "raise":
            raise RuntimeError("the family is started")
        if self.ending == "block":
            time.sleep(HOUR)
        if self.ending == "slow":
            time.sleep(float(re.findall(r"for ([\d.]+) seconds", prompt_text(messages))[0]))
            members = [psutil.Process(int(line.split()[1])) for line in evidence.read_text().splitlines()]
            for member in members:
                member.kill()
            psutil.wait_procs(members, timeout=10)  # our children are reaped; the others are the supervisor's
        return "Final Answer: the family is started"


def family(ending: str) -> Callable[[], Crew]:
    if ending != "slow":
        return lambda: _single(FamilyLLM(model=f"family-{ending}", ending=ending))

    def slow() -> Crew:
        agent = Agent(role="Keeper", goal="Keep a family", backstory="A test.", llm=FamilyLLM(model="f", ending=ending))
        task = Task(description="Keep a family for {seconds} seconds.", expected_output="Nothing.", agent=agent)
        return Crew(
            agents=[agent], tasks=[task], before_kickoff_callbacks=[lambda inputs: {"seconds": 1, **(inputs or {})}]
        )

    return slow


def boom() -> Crew:
    return _single(MisbehavingLLM(model="boom", mode="raise"))


LEAKED_KEY = "ACME_API_KEY"


def leaky() -> Crew:
    return _single(MisbehavingLLM(model="leaky", mode="leak"))


# The variables ``spiller`` spills: a test puts one in its crew's file under a name like no secret's, and one named
# like a secret in the supervisor's environment.
SPILLED = ("SPILL_PLAIN", "SPILL_PASSWORD")
SPILLED_PIECES = (
    3,
    7,
    2,
    9,
    5,
)  # the sizes of the pieces it streams them in, in turn: a model's few characters a chunk


class SpillerLLM(OfflineLLM):
    """Writes its keys (the variables SPILLED) wherever a worker writes: on stdout and stderr, streamed a few
    characters a chunk (``key <it> `` each, in pieces of SPILLED_PIECES: each key cut several times, pieces of 6
    characters and more inside it), and its final answer; or, when its prompt says "mode raise", in the exception it
    raises (its class's name too)."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        keys = [os.environ[name] for name in SPILLED]
        print(f"spilling {' '.join(keys)}", flush=True)
        print(f"spilling {' '.join(keys)}", file=sys.stderr, flush=True)
        if "mode raise" in prompt_text(messages):
            self._track_token_usage_internal({"prompt_tokens": 1, "completion_tokens": 1})  # spent under its model
            raise type(f"Refused{keys[1]}", (RuntimeError,), {})(f"the provider refused {' and '.join(keys)}")
        with llm_call_context():
            if self._effective_stream():
                streamed, sizes, response_id = (
                    "".join(f"key {key} " for key in keys),
                    cycle(SPILLED_PIECES),
                    str(uuid.uuid4()),
                )
                while streamed:
                    size = next(sizes)
                    self._emit(streamed[:size], kwargs.get("from_task"), kwargs.get("from_agent"), response_id)
                    streamed = streamed[size:]
        return f"Thought: I spill.\nFinal Answer: the keys are {' and '.join(keys)}"


class SpillingCrew(Crew):
    """Its output's ``json_dict`` names one key by the other: a secret as a dict's key."""

    def kickoff(self, inputs: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        result = super().kickoff(inputs, *args, **kwargs)
        if isinstance(result, CrewOutput):  # a streamed kickoff runs this one again, streaming off: that one's
            key, other = (os.environ[name] for name in SPILLED)
            result.json_dict = {key: other}
        return result


def spiller() -> Crew:
    """Input ``mode``: "answer" (it completes) or "raise"."""
    # A model named with a key, as a job's record shows it (none where the crew has none: doctor builds every crew).
    llm = SpillerLLM(model="spiller-" + os.environ.get(SPILLED[1], ""))
    agent = Agent(role="Spiller", goal="Spill", backstory="Careless.", llm=llm)
    return SpillingCrew(
        agents=[agent], tasks=[Task(description="Spill in mode {mode}.", expected_output="Keys.", agent=agent)]
    )


def huge() -> Crew:
    return _single(MisbehavingLLM(model="huge", mode="huge"))


def gil_hog() -> Crew:
    return _single(MisbehavingLLM(model="gil", mode="gil"))


def broken_factory() -> Crew:
    raise ValueError("factory cannot build this crew")


def chatty() -> Crew:
    """Completes like demo but prints to stdout and stderr on the way."""
    print("panel " * 1000)
    print("warning " * 1000, file=sys.stderr)
    return _single(OfflineLLM(model="offline-demo"))


def talker() -> Crew:
    """Says something on stdout and stderr (flushed: the tail shows it at once), then ticks like demo-slow."""
    print("talker: hello on stdout", flush=True)
    print("talker: hello on stderr", file=sys.stderr, flush=True)
    return demo_slow()


def placer() -> Crew:
    """Completes like demo after saying on stdout where it runs: its cwd, HOME, CrewAI storage (and ChromaDB's),
    temporary directory and telemetry."""
    place = {name: os.environ.get(name) for name in ("HOME", "CREWAI_STORAGE_DIR", "CREWAI_DISABLE_TELEMETRY")}
    place["tempdir"] = tempfile.gettempdir()  # what Python's tempfile uses: the job's own
    place["chroma"] = chroma_config.DEFAULT_STORAGE_PATH  # computed when CrewAI was imported (worker/places.py)
    print(f"place cwd={os.getcwd()} " + " ".join(f"{k}={v}" for k, v in place.items()), flush=True)
    return _single(OfflineLLM(model="offline-demo"))


def environ() -> Crew:
    """Completes like demo after saying on stdout the names of the environment variables its worker got."""
    print("environ " + " ".join(sorted(os.environ)), flush=True)
    return _single(OfflineLLM(model="offline-demo"))


class RecordingLLM(OfflineLLM):
    """The offline model, leaving evidence in the worker's cwd: one line per call in CALL_LOG (the first word
    of the calling task, or "-"). A prompt saying "block mode" never returns: it appends a HEARTBEAT line
    every 20 ms instead, so a test can see whether anything of the job still runs."""

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
        words = str(getattr(from_task, "description", "") or "-").split()
        evidence = _evidence()
        with open(evidence / CALL_LOG, "a") as log:
            log.write(f"{words[0] if words else '-'}\n")
        prompt = messages if isinstance(messages, str) else " ".join(str(m.get("content", "")) for m in messages)
        if "block mode" in prompt:
            while True:
                with open(evidence / HEARTBEAT, "a") as beat:
                    beat.write(f"{os.getpid()}\n")
                time.sleep(BEAT_SECONDS)
        return super().call(
            messages, tools, callbacks, available_functions, from_task, from_agent, response_model=response_model
        )


class SizedLLM(OfflineLLM):
    """Streams one chunk of ``x`` per number quoted in the prompt (``<<10 20>>``: 10 characters, then 20),
    then answers "done": events of sizes a test chooses, for the bounds on reading them."""

    def call(self, messages: str | list[Any], *args: Any, **kwargs: Any) -> str:
        quoted = re.search(r"<<([\d ]*)>>", prompt_text(messages))
        task, agent = kwargs.get("from_task"), kwargs.get("from_agent")
        with llm_call_context():
            if self._effective_stream():
                response_id = str(uuid.uuid4())
                for size in quoted.group(1).split() if quoted else ():
                    self._emit("x" * int(size), task, agent, response_id)
        return "Thought: I streamed them.\nFinal Answer: done"


def sized() -> Crew:
    """Input ``sizes``: the lengths of the chunks it streams, space-separated."""
    agent = Agent(role="Sizer", goal="Stream", backstory="Streams what it is told.", llm=SizedLLM(model="sized"))
    return Crew(agents=[agent], tasks=[Task(description="Stream <<{sizes}>>", expected_output="done", agent=agent)])


def recorder() -> Crew:
    """Two tasks of one agent on a RecordingLLM; input ``mode: block`` makes it block, ignoring SIGTERM."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return notes_and_report(RecordingLLM(model="recorder"), "Writes everything down.")


def _provider_failing(status: int) -> Crew:
    """A provider that answers ``status`` every time; no retries by the SDK nor by the agent, so that it fails
    fast (CrewAI's executor may still call again on its own)."""
    agent = Agent(role="Tester", goal="Test", backstory="A test.", llm=provider_llm(f"fail-{status}", max_retries=0))
    agent.max_retry_limit = 0
    return Crew(agents=[agent], tasks=[Task(description="Test.", expected_output="Nothing.", agent=agent)])


def llm_own() -> Crew:
    """``llm`` with an LLM of each agent's own: CrewAI's ``token_usage`` then counts each call once (agents that
    share an LLM each report its whole count), as the supervisor counts them."""
    researcher = Agent(role="Researcher", goal="Find facts", backstory="Careful.", llm=provider_llm())
    writer = Agent(role="Writer", goal="Summarise", backstory="Concise.", llm=provider_llm())
    tasks = [
        Task(description="Research spending.", expected_output="Facts.", agent=researcher),
        Task(description="Summarise the research.", expected_output="A summary.", agent=writer),
    ]
    return Crew(agents=[researcher, writer], tasks=tasks)


def llm_long() -> Crew:
    """One agent whose provider streams a long answer: 3,000 words more than ``llm``'s, a chunk each."""
    agent = Agent(role="Writer", goal="Write at length", backstory="Verbose.", llm=provider_llm(f"words-{LONG_WORDS}"))
    return Crew(agents=[agent], tasks=[Task(description="Write it all.", expected_output="Many words.", agent=agent)])


@tool("count_words")
def count_words(text: str) -> str:
    """How many words a text has."""
    return str(len(text.split()))


def llm_loop() -> Crew:
    """An agent whose provider answers every call with one more call of its tool: it spends until it is stopped
    (or reaches its max_iter), as a runaway agent does."""
    agent = Agent(
        role="Looper",
        goal="Count",
        backstory="Never done.",
        llm=provider_llm("loop"),
        tools=[count_words],
        max_iter=1000,
    )
    return Crew(agents=[agent], tasks=[Task(description="Count the words.", expected_output="A count.", agent=agent)])


@budget(max_llm_calls=5)
def llm_loop_calls() -> Crew:
    """``llm-loop`` allowed five LLM calls (the supervisor allows more)."""
    return llm_loop()


@budget(max_tokens=3000)
def llm_loop_tokens() -> Crew:
    """``llm-loop`` allowed 3,000 tokens."""
    return llm_loop()


@budget(max_tokens=100_000, max_llm_calls=10)
def llm_own_budget() -> Crew:
    """``llm-own`` on a budget it stays within."""
    return llm_own()


def hang_then_hog() -> Crew:
    """``demo-llm-hang``, and a thread that, once a test creates HOG_RELEASE (when the provider holds the
    call), allocates memory until the job is stopped: a limit broken while the provider call is in flight."""

    def hog() -> None:
        release = _evidence() / HOG_RELEASE
        if not wait_until(release.exists, timeout=HOUR, interval=0.01):
            return
        held = []
        while True:
            held.append(bytearray(HOG_STEP))  # zero-filled: every page is touched
            time.sleep(0.01)

    threading.Thread(target=hog, name="hog", daemon=True).start()
    return demo_llm_hang()


registry: dict[str, Callable[[], Crew]] = {
    "demo": demo,
    "demo-slow": demo_slow,
    "stubborn": stubborn,
    "spawner": spawner,
    "tree": tree,
    **{f"family-{ending}": family(ending) for ending in ("block", "answer", "raise", "slow")},
    "boom": boom,
    "broken-factory": broken_factory,
    "huge": huge,
    "gil-hog": gil_hog,
    "leaky": leaky,
    "spiller": spiller,
    "chatty": chatty,
    "talker": talker,
    "placer": placer,
    "environ": environ,
    "demo-knowledge": demo_knowledge,
    "demo-effects": demo_effects,
    "recorder": recorder,
    "sized": sized,
    "llm": demo_llm,
    "llm-hang": demo_llm_hang,
    "llm-own": llm_own,
    "llm-long": llm_long,
    "llm-loop": llm_loop,
    "llm-loop-calls": llm_loop_calls,
    "llm-loop-tokens": llm_loop_tokens,
    "llm-own-budget": llm_own_budget,
    "llm-hang-hog": hang_then_hog,
    "llm-fail-429": lambda: _provider_failing(429),
    "llm-fail-500": lambda: _provider_failing(500),
}
