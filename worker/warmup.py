"""Warming the fork server: run CrewAI's first-use paths once, then make it single-threaded again.

Every forked worker would otherwise repeat CrewAI's first-kickoff work (pydantic's first validations,
lazy imports, the event bus's first emit) and, for a crew on CrewAI's own ``LLM`` class, its provider's
first use (the openai SDK's lazily built resources and response models, the httpx transport, SSE parsing:
~450-600 ms a job measured before this). The fork server does that work once, on small crews of our own
(never a registry crew): offline, then for each provider CrewAI routes to natively whose package is
installed, streamed, blocking and with a tool call, against a provider it serves itself on loopback
(``worker/provider.py``) and stops before it checks it is single-threaded (the offline crews alone where
the ``WARMUP`` setting says ``offline``). Never a network call beyond loopback; a throwaway storage
directory, so no crew's replay storage is touched. Then it quiesces what the kickoffs started: CrewAI's
event bus keeps a loop thread and a handler pool alive after a kickoff, and a fork with those threads
alive can hang the child. We stop them and mark the bus uninitialised, so CrewAI starts them afresh,
lazily, in each child on its first emit.

What quiescing relies on is read from crewai 1.15's ``CrewAIEventsBus`` (``events/event_bus.py``):
``flush``, ``_loop``, ``_loop_thread``, ``_sync_executor``, ``_executor_initialized``,
``_has_pending_events``. If a release changes them, or anything leaves a thread running or a
connection open, ``WarmupError`` says so in one line and the fork server refuses to start.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from protocol import STORAGE_DIR, WARMUP, Operation, Warmup, WorkerSettings
from worker import operations, provider, tls
from worker.state import WorkerState

# The event bus's attributes quiescing needs (crewai 1.15's CrewAIEventsBus).
BUS_ATTRIBUTES = ("flush", "_loop", "_loop_thread", "_sync_executor", "_executor_initialized", "_has_pending_events")
KICKOFFS = 2  # a second kickoff still finds first-use work (measured: child CPU ~83 -> ~71 ms)
KICKOFF_SECONDS = 60.0  # a kickoff that hangs leaves its thread: the check below then refuses
JOIN_SECONDS = 5.0  # how long a CrewAI thread may take to stop once told to
SETTLE_SECONDS = 5.0  # how long threads that were asked to end (kickoff, stream) may take to be gone
FLUSH_SECONDS = 10.0
# Native providers that speak OpenAI's chat completions (so the warm-up's provider serves them): the package
# that must be installed, and a model CrewAI routes to that provider with a custom base URL.
PROVIDERS = {"openai": ("openai", "openai/warm-up"), "openai-compatible": ("openai", "hosted_vllm/warm-up")}
# Native providers (and LiteLLM) whose APIs it does not speak: reported, when installed, as not warmed.
OTHER_PROVIDERS = {
    "anthropic": "anthropic",
    "gemini": "google.genai",
    "bedrock": "boto3",
    "azure": "azure.ai.inference",
    "litellm": "litellm",
}


class WarmupError(Exception):
    """Warming or quiescing failed; the message is one line the supervisor logs."""


@dataclasses.dataclass
class Warmth:
    """What the warm-up warmed: provider paths by name, and the ones it could not (name -> why)."""

    paths: list[str] = dataclasses.field(default_factory=list)
    not_warmed: dict[str, str] = dataclasses.field(default_factory=dict)
    tls_contexts: int = 0


def warm(state: WorkerState, ours: Iterable[threading.Thread] = ()) -> Warmth:
    """Run our own crews on every first-use path (offline ones alone with ``WARMUP=offline``), then quiesce
    CrewAI; raises WarmupError. No Python thread may be left but this one and ``ours`` (a doctor's check
    worker has its control thread; a fork server none): a thread the registry started when imported is
    refused like one the warm-up left. Last, the TLS contexts its workers will take (``state.pool``)."""
    # Native threads importing started (numpy's OpenBLAS pool, which CrewAI's import brings) stay: forks already
    # live with them. So CrewAI is imported before the baseline is taken, for a registry that imports it only in
    # its factories: they are not the warm-up's.
    try:
        import crewai  # noqa: F401
    except Exception as exc:
        raise WarmupError(f"cannot import CrewAI: {type(exc).__name__}: {exc}") from None
    native = Threads(frozenset([threading.current_thread(), *ours]), Threads.now().kernel)
    sockets = _sockets()  # the supervisor's channel: any other socket left open would be every worker's
    providers = state.settings.warmup != Warmup.OFFLINE
    try:
        for _ in range(KICKOFFS):
            warmth = rehearse(state.settings, providers)
        if not providers:
            warmth.not_warmed["providers"] = f"{WARMUP}={Warmup.OFFLINE}"
    except WarmupError:
        raise
    except Exception as exc:  # a timeout included
        raise WarmupError(f"the warm-up kickoff failed: {type(exc).__name__}: {exc}") from None
    try:
        quiesce(native)
    except WarmupError:
        raise
    except Exception as exc:  # CrewAI's internals changed shape
        raise WarmupError(f"cannot quiesce CrewAI: {type(exc).__name__}: {exc}") from None
    if _sockets() != sockets:
        raise WarmupError("the warm-up left a connection open: forked workers would share it")
    state.pool = tls.prepare()  # after the rehearsals, so none of theirs comes from the pool
    warmth.tls_contexts = len(state.pool or ())
    return warmth


def rehearse(settings: WorkerSettings, providers: bool = True) -> Warmth:
    """Our own crews on every path (or, without ``providers``, the offline one), in throwaway storage.

    The prefault probe learns the pages an idle worker copies ahead from the offline path alone: those
    every job writes. Copying a provider job's pages ahead too (twice as many) cost every idle worker
    ~20 ms of CPU and ~20 MB more, and a wave of 64 provider jobs ran slower (docs/benchmarks.md)."""
    storage = tempfile.mkdtemp(prefix="crew-warmup-")
    saved = os.environ.get(STORAGE_DIR)
    os.environ[STORAGE_DIR] = storage
    try:
        _kickoff(settings, Operation.RUN, _crew(), streamed=True)
        return _rehearse_providers(settings) if providers else Warmth()
    finally:
        if saved is None:
            os.environ.pop(STORAGE_DIR, None)
        else:
            os.environ[STORAGE_DIR] = saved
        shutil.rmtree(storage, ignore_errors=True)


def _rehearse_providers(settings: WorkerSettings) -> Warmth:
    """Each installed native provider that speaks OpenAI's API, streamed (a ``run``) and blocking (a
    ``batch_run``), a tool call in each, against a provider of our own on loopback, stopped after."""
    other = "not warmed: it speaks another API than the warm-up's provider"
    warmth = Warmth(not_warmed={name: other for name, package in OTHER_PROVIDERS.items() if _installed(package)})
    # CrewAI warns at every call that a compatible server's model has no native token count: not the log's news.
    counting = logging.getLogger("crewai.llms.base_llm")
    level = counting.level
    counting.setLevel(logging.ERROR)
    try:
        _rehearse_each(settings, warmth)
    finally:
        counting.setLevel(level)
    return warmth


def _rehearse_each(settings: WorkerSettings, warmth: Warmth) -> None:
    with provider.Provider() as stub:
        for name, (package, model) in PROVIDERS.items():
            if not _installed(package):
                warmth.not_warmed[name] = f"not installed ({package})"
                continue
            try:
                for operation, streamed in ((Operation.RUN, True), (Operation.BATCH_RUN, False)):
                    _kickoff(settings, operation, _crew(_provider_llm(model, stub.url), tool=True), streamed)
            except Exception as exc:  # CrewAI or the SDK changed: jobs pay the first use, nothing worse
                warmth.not_warmed[name] = " ".join(f"not warmed: {type(exc).__name__}: {exc}".split())[:300]
            else:
                warmth.paths.append(name)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:  # a parent package missing
        return False


def _provider_llm(model: str, url: str) -> Any:
    from crewai import LLM

    return LLM(model=model, base_url=url, api_key="warm-up", max_retries=0)


def _crew(llm: Any = None, tool: bool = False) -> Any:
    """One agent and task on the offline model; or two on ``llm``, the first with a tool to call."""
    from crewai import Agent, Crew, Task
    from crewai.agents.agent_builder.base_agent import BaseAgent

    from worker.demo import OfflineLLM

    llm = llm or OfflineLLM(model="offline-warmup")
    agents: list[BaseAgent] = [Agent(role="Warmer", goal="Answer", backstory="Quick.", llm=llm, allow_delegation=False)]
    if tool:
        agents[0].tools = [_lookup()]
        agents.append(Agent(role="Writer", goal="Write", backstory="Quick.", llm=llm, allow_delegation=False))
    tasks = [Task(description="Answer briefly.", expected_output="One line.", agent=agent) for agent in agents]
    return Crew(agents=agents, tasks=tasks)


def _lookup() -> Any:
    from crewai.tools import tool

    @tool("lookup")
    def lookup(query: str) -> str:
        """Look a word up."""
        return f"{query}: found"

    return lookup


def _kickoff(settings: WorkerSettings, operation: Operation, crew: Any, streamed: bool) -> None:
    """What a job of ``operation`` does on a fresh crew: streamed or not, the output converted; then the
    crew's HTTP clients are closed, so no connection outlives the warm-up."""
    chunks: list[Any] = []
    job_input: dict[str, Any] = {} if streamed else {"inputs": [{}]}
    loop = asyncio.new_event_loop()
    try:
        work = operations.Work(crew, operation, job_input, chunks.append, lambda: crew, "warm-up", settings)
        output = loop.run_until_complete(asyncio.wait_for(operations.HANDLERS[operation](work), KICKOFF_SECONDS))
        loop.run_until_complete(loop.shutdown_default_executor())  # the thread kickoff_async ran in
    finally:
        loop.close()
        for agent in crew.agents:
            close = getattr(getattr(agent.llm, "_client", None), "close", None)
            if callable(close):
                close()
    raw = output.get("raw") if streamed else output["results"][0].get("raw")
    if not raw or (streamed and not chunks):
        raise WarmupError("the warm-up kickoff streamed no chunks or gave no output")


@dataclasses.dataclass(frozen=True)
class Threads:
    """A process's threads at one moment: Python's, and the kernel's task ids (native threads too).

    Ids, not a count: a thread of the baseline that ended would hide a new native one from a count. So a native
    pool that replaces one of its threads during the warm-up is refused too: its new thread is not the old."""

    python: frozenset[threading.Thread]
    kernel: frozenset[str]

    @classmethod
    def now(cls) -> Threads:
        return cls(frozenset(threading.enumerate()), frozenset(os.listdir("/proc/self/task")))


def quiesce(native: Threads) -> None:
    """Stop CrewAI's event-bus threads and leave the bus to start again lazily; check that no thread is left
    besides those that were there before the warm-up (``native``)."""
    try:
        from crewai.events.event_bus import crewai_event_bus as bus
    except ImportError as exc:
        raise WarmupError(f"cannot quiesce CrewAI: no event bus to import ({exc})") from None
    missing = [name for name in BUS_ATTRIBUTES if not hasattr(bus, name)]
    if missing:
        raise WarmupError(f"cannot quiesce CrewAI: its event bus has no {', '.join(missing)}")
    if not bus.flush(timeout=FLUSH_SECONDS):
        raise WarmupError(f"cannot quiesce CrewAI: its event handlers did not finish within {FLUSH_SECONDS:.0f} s")
    if bus._executor_initialized:
        loop, thread = bus._loop, bus._loop_thread
        loop.call_soon_threadsafe(loop.stop)
        thread.join(JOIN_SECONDS)
        if thread.is_alive():
            raise WarmupError(f"cannot quiesce CrewAI: its event loop thread did not stop within {JOIN_SECONDS:.0f} s")
        loop.close()
        bus._sync_executor.shutdown(wait=True)
        bus._executor_initialized = False
        bus._has_pending_events = False
    others = _other_threads(native)
    if others:
        raise WarmupError(f"cannot quiesce CrewAI: threads still running after warm-up: {', '.join(others)}")


def _other_threads(native: Threads) -> list[str]:
    """Threads beyond ``native``, by name where Python knows them; waits a little for those ending."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        now = Threads.now()
        names = [thread.name for thread in now.python - native.python]
        extra = now.kernel - native.kernel
        if not names and not extra:
            return []
        if time.monotonic() > deadline:
            return names or [f"{len(extra)} thread(s) unknown to Python ({_comms(extra)})"]
        time.sleep(0.005)


def _comms(tasks: Iterable[str]) -> str:
    """The kernel's names of threads of this process (what ``top -H`` shows), each once with its count."""
    names: collections.Counter[str] = collections.Counter()
    for task in tasks:
        try:
            names[Path(f"/proc/self/task/{task}/comm").read_text().strip()] += 1
        except OSError:  # it has ended since
            names["ended"] += 1
    return ", ".join(name if count == 1 else f"{name} x{count}" for name, count in sorted(names.items()))


def _sockets() -> set[str]:
    """This process's open sockets, by descriptor."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.add(fd)
    return found
