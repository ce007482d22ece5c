"""The operations a job can run on a fresh Crew, and how their results become JSON.

Each runs in its own worker process, so a blocking CrewAI call (replay, train, test) is simply run in a
thread: stopping the job kills the process, and nothing here needs to be interruptible.
CrewAI is imported inside functions: this module loads before the worker has switched telemetry off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from protocol import TRAINING_DIR, Chunk, Operation, WorkerSettings, partial_name
from protocol.frames import MAX_OUTPUT_BYTES
from worker import registry, resume
from worker.chunks import Coalescer

Emit = Callable[[Chunk], None]
OUTPUT_FIELDS: dict[str, Any] = {"raw": "", "json_dict": None, "pydantic": None, "tasks_output": [], "token_usage": {}}


@dataclasses.dataclass(frozen=True)
class Work:
    """What an operation gets: the job's crew (built before ``started``, so a broken factory fails first), the
    operation, its input, where chunks go, a way to build another fresh crew, the job's id, the worker's settings, and
    the secrets the supervisor masks in all it writes (which no two chunk events may hold parts of)."""

    crew: Any
    operation: Operation
    input: dict[str, Any]
    emit: Emit
    fresh: Callable[[], Any]
    job_id: str  # the action id
    settings: WorkerSettings
    secrets: tuple[str, ...] = ()
    restored: int = 0  # a resumed run's: its first tasks have their outputs (worker/resume.py)


Handler = Callable[[Work], Awaitable[dict[str, Any]]]


class OperationError(Exception):
    """A failure whose message we wrote (or is CrewAI's configuration text): safe to report verbatim."""


class ReplayError(OperationError):
    pass


class TrainingError(OperationError):
    pass


class MemoryResetError(OperationError):
    pass


class OutputTooLarge(Exception):
    pass


def to_json(value: Any) -> Any:
    """A JSON-safe copy of a CrewAI value (pydantic models keep their nested subclasses)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json", serialize_as_any=True)
    return orjson.loads(orjson.dumps(value, default=str))


def crew_output(result: Any) -> dict[str, Any]:
    """A CrewOutput as the contract's output object: raw, json_dict, pydantic, tasks_output, token_usage."""
    data = to_json(result)
    if not isinstance(data, dict):
        data = {"raw": data if isinstance(data, str) else orjson.dumps(data).decode()}
    for field, default in OUTPUT_FIELDS.items():
        data.setdefault(field, default)
    return data


def bounded(output: dict[str, Any]) -> dict[str, Any]:
    size = len(orjson.dumps(output))
    if size > MAX_OUTPUT_BYTES:
        raise OutputTooLarge(f"output of {size} bytes exceeds {MAX_OUTPUT_BYTES}")
    return output


def chunk_message(chunk: Any) -> Chunk:
    """A stream chunk on the channel the contract's connector expects: tools or llm."""
    data = _text_chunk(chunk)
    if data is None:
        data = to_json(chunk)
        if not isinstance(data, dict):
            data = {"content": str(data)}
    channel = "tools" if data.get("chunk_type") == "tool_call" else "llm"
    data["channel"] = channel
    return Chunk(channel=channel, data=data)


def _text_chunk(chunk: Any) -> dict[str, Any] | None:
    """What ``to_json`` gives for a plain text ``StreamChunk``, read off its fields (a chunk flood's
    commonest event: ``model_dump`` and the JSON round trip were ~25 us of its ~40 us here); None for
    anything else. Equal to ``to_json``'s answer: tests/worker/test_operations_worker.py checks."""
    from crewai.types.streaming import StreamChunk

    if type(chunk) is not StreamChunk or chunk.tool_call is not None:
        return None
    data = {name: getattr(chunk, name) for name in StreamChunk.model_fields}
    data["chunk_type"] = chunk.chunk_type.value
    return data


async def run(work: Work) -> dict[str, Any]:
    """The crew's ``kickoff`` (in a thread, streamed), so the answer is what ``kickoff()`` gives in-process.

    Not ``akickoff``: CrewAI 1.15's native async path fails knowledge search on the default ChromaDB
    client and swallows the error, so a crew with knowledge sources would answer without them.
    """
    crew = work.crew
    crew.stream = True
    result = await crew.kickoff_async(inputs=work.input)
    if hasattr(result, "__aiter__"):
        chunks = Coalescer(work.emit, work.settings, secrets=work.secrets)
        try:
            async for chunk in result:
                chunks.add(chunk_message(chunk))
        finally:  # the text held is sent before the terminal frame, whatever ended the stream
            chunks.flush()
        result = result.result
    resume.settle(crew, work.restored)
    return {**crew_output(result), "replay_task_ids": replay_task_ids(crew)}


def replay_task_ids(crew: Any) -> list[str]:
    """The ids a later ``replay`` of this kickoff accepts: this crew's rows in the latest-kickoff store.

    Only this crew's rows, because a concurrent job of the same crew may have replaced them already.
    """
    mine = {str(task.id) for task in crew.tasks}
    try:
        return [task_id for task_id in stored_task_ids() if task_id in mine]
    except Exception:  # the run itself succeeded; an unreadable store only means nothing is replayable
        return []


def stored_outputs() -> list[dict[str, Any]]:
    """The latest kickoff's task outputs in CREWAI_STORAGE_DIR, in task order: what replay reads."""
    from crewai.utilities.task_output_storage_handler import TaskOutputStorageHandler

    return TaskOutputStorageHandler().load() or []


def stored_task_ids() -> list[str]:
    return [str(row["task_id"]) for row in stored_outputs()]


async def batch_run(work: Work) -> dict[str, Any]:
    """Each input on a fresh crew from the factory, concurrently: each result is what ``kickoff()`` of that
    input gives. (``akickoff_for_each`` copies one crew whose copies share one LLM token counter, so every
    result reported the batch's running total.)"""
    batch = work.input["inputs"]
    crews = [work.crew, *(work.fresh() for _ in batch[1:])]
    for crew in crews:
        crew.stream = False
    results = await asyncio.gather(
        *(crew.kickoff_async(inputs=inputs) for crew, inputs in zip(crews, batch, strict=True))
    )
    outputs = [crew_output(result) for result in results]
    return {"results": outputs, "count": len(outputs)}


async def replay(work: Work) -> dict[str, Any]:
    """Re-run from ``task_id`` on; earlier tasks' stored outputs (possibly from another process) are reused."""
    crew, job = work.crew, work.input
    crew.stream = False
    task_id = job["task_id"]
    rows = stored_outputs()
    index = next((i for i, row in enumerate(rows) if str(row["task_id"]) == task_id), None)
    if index is None:
        if not rows:
            raise ReplayError("this crew has no stored kickoff to replay: run it first")
        raise ReplayError(f"task id {task_id!r} is not in this crew's latest kickoff; use one of its replay_task_ids")
    # CrewAI's own check, done here so a mismatch is reported as such (its text names no inputs or outputs).
    validate = getattr(crew, "_validate_replay_tasks", None)
    if validate is not None:
        try:
            validate(rows, index)
        except ValueError as exc:
            raise ReplayError(str(exc)) from exc
    result = await asyncio.to_thread(crew.replay, task_id, job.get("inputs"))
    # The replay rewrote the replayed tasks' ids; the earlier ones keep theirs. All are replayable now.
    return {**crew_output(result), "replay_task_ids": stored_task_ids()}


async def train(work: Work) -> dict[str, Any]:
    crew, job = work.crew, work.input
    feedback = job.get("feedback")
    if not isinstance(feedback, str) or not feedback.strip():
        # CrewAI would otherwise read stdin once per task and iteration, and fail only then.
        raise TrainingError(
            "train requires input.feedback: the human feedback CrewAI asks for after every task of every iteration"
        )
    target = training_target(work.settings, job["artifact_name"])
    n_iterations = job["n_iterations"]
    # CrewAI writes <filename>.pkl into the cwd (the job's scratch dir); a unique name avoids its own files.
    scratch = Path.cwd() / f"train-{uuid.uuid4().hex}.pkl"
    crew.stream = False

    def headless() -> None:
        from crewai.core.providers.human_input import set_provider

        # The provider is a ContextVar: set it in the thread that runs the crew.
        set_provider(feedback_provider(feedback))
        crew.train(n_iterations=n_iterations, filename=scratch.name, inputs=job.get("inputs") or {})

    # Opened before any model call: a training directory it cannot write to fails the job before any work,
    # and a kill at any point leaves only this job's own name there, which the supervisor removes.
    partial = target.with_name(partial_name(target.name, work.job_id))
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TrainingError(f"{TRAINING_DIR} cannot be written to: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            await asyncio.to_thread(headless)
            publish(scratch, out, partial, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
    return {"status": "completed", "artifact_name": job["artifact_name"], "n_iterations": n_iterations}


def feedback_provider(feedback: str) -> Any:
    """CrewAI's human-input provider, answering every prompt with ``feedback`` instead of reading stdin."""
    from crewai.core.providers.human_input import SyncHumanInputProvider

    class Feedback(SyncHumanInputProvider):
        @staticmethod  # as CrewAI's own are
        def _prompt_input(crew: Any) -> str:
            return feedback

        @staticmethod
        async def _prompt_input_async(crew: Any) -> str:
            return feedback

    return Feedback()


def training_target(settings: WorkerSettings, artifact_name: str) -> Path:
    directory = settings.training_dir
    if not os.path.isabs(directory) or not os.path.isdir(directory):
        raise TrainingError(f"{TRAINING_DIR} must name an existing absolute directory")
    return Path(directory) / artifact_name


def publish(source: Path, out: BinaryIO, partial: Path, target: Path) -> None:
    """Copy into ``out`` (the open ``partial`` beside ``target``), then rename: readers see the whole artifact
    or the old one.

    A copy, not a rename, because the scratch dir and the training dir may be on different filesystems.
    """
    with open(source, "rb") as data:
        shutil.copyfileobj(data, out)
    out.flush()
    os.fsync(out.fileno())
    os.replace(partial, target)
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


async def evaluate(work: Work) -> dict[str, Any]:
    """Score the crew with ``eval_llm``; CrewAI returns nothing and reports scores only as events."""
    crew, job = work.crew, work.input
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.types.crew_events import CrewTestResultEvent

    crew.stream = False
    name = job["eval_llm"]
    factory = registry.eval_llms(work.settings.registry).get(name)
    eval_llm = factory() if factory is not None else name
    events: list[Any] = []

    def record(source: Any, event: Any) -> None:
        events.append(event)

    crewai_event_bus.register_handler(CrewTestResultEvent, record)
    try:
        await asyncio.to_thread(crew.test, job["n_iterations"], eval_llm, job.get("inputs"))
        # Handlers run on CrewAI's thread pool: wait until every score has been recorded.
        await asyncio.to_thread(crewai_event_bus.flush)
    finally:
        crewai_event_bus.off(CrewTestResultEvent, record)
    events.sort(key=lambda event: (event.emission_sequence or 0, event.timestamp))
    scores = [
        to_json({"quality": e.quality, "execution_duration": e.execution_duration, "model": e.model}) for e in events
    ]
    return {"status": "completed", "n_iterations": job["n_iterations"], "eval_llm": name, "scores": scores}


async def knowledge_query(work: Work) -> dict[str, Any]:
    """The sync query in a thread, not aquery_knowledge: CrewAI 1.15's default (sync) ChromaDB client fails
    every async search ("requires an AsyncClientAPI") and the error is swallowed into an empty result."""
    crew, job = work.crew, work.input
    results = await asyncio.to_thread(
        crew.query_knowledge,
        job["query"],
        results_limit=job.get("results_limit", 3),
        score_threshold=job.get("score_threshold", 0.35),
    )
    return {"results": to_json(results or [])}


async def memory_reset(work: Work) -> dict[str, Any]:
    crew, job = work.crew, work.input
    command_type = job["command_type"]
    try:
        await asyncio.to_thread(crew.reset_memories, command_type)
    except RuntimeError as exc:
        # "<name> memory system is not initialized" is configuration; other reset errors may carry storage text.
        if not str(exc.__cause__ or "").endswith("is not initialized"):
            raise
        raise MemoryResetError(str(exc)) from exc
    return {"status": "completed", "command_type": command_type}


HANDLERS: dict[Operation, Handler] = {
    Operation.RUN: run,
    Operation.BATCH_RUN: batch_run,
    Operation.REPLAY: replay,
    Operation.TRAIN: train,
    Operation.TEST: evaluate,
    Operation.KNOWLEDGE_QUERY: knowledge_query,
    Operation.MEMORY_RESET: memory_reset,
}
