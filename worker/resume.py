"""A resumed ``run``: the crew's fingerprint, and a fresh crew that starts after the tasks an earlier job completed.

CrewAI 1.15 resumes a crew restored from a checkpoint (``Crew.from_checkpoint``) at its first task without an output:
``Crew._get_execution_start_index`` does so whenever ``checkpoint_kickoff_event_id`` is set, and
``prepare_task_execution`` hands the earlier tasks' outputs on as context and into ``tasks_output``. A resume here
uses that, and no checkpoint file: each completed task gets its output back (``Task.output``, as its ``TaskDone``
said) and the crew gets a ``checkpoint_kickoff_event_id``. Its ``_kickoff_event_id`` stays unset, so the kickoff
still emits ``CrewKickoffStartedEvent`` (and the completed event names it) and streams as any kickoff does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

RESUMED_KICKOFF = "resumed"  # any value: CrewAI reads only that it is set


def fingerprint(crew: Any) -> str:
    """SHA-256 over the crew's process and, per task in order, its description and expected output as written (not
    interpolated: CrewAI keeps those apart once it interpolates) and its agent's role: the same crew built in
    another process has the same one; a task added, removed, reordered or reworded changes it."""
    tasks = [
        [
            _written(task, "description"),
            _written(task, "expected_output"),
            _written(task.agent, "role") if task.agent is not None else "",
        ]
        for task in crew.tasks
    ]
    process = getattr(crew.process, "value", str(crew.process))
    return hashlib.sha256(orjson.dumps({"process": process, "tasks": tasks})).hexdigest()


def _written(owner: Any, field: str) -> str:
    original = getattr(owner, f"_original_{field}", None)
    return str(original if original is not None else getattr(owner, field, ""))


def refusal(crew_id: str, crew: Any, resumed: list[dict[str, Any]], was: str, now: str) -> str | None:
    """Why this crew cannot continue the resumed job (the words of ``CrewChanged``), or None. Names no input or
    output: only counts and fingerprints."""
    if now != was:
        return f"crew {crew_id} is not the crew the resumed job ran: its fingerprint is {now}, the job's was {was}"
    if len(resumed) > len(crew.tasks):
        return (
            f"crew {crew_id} is not the crew the resumed job ran: it has {len(crew.tasks)} tasks, the job completed"
            f" {len(resumed)}"
        )
    return None


def restore(crew: Any, resumed: list[dict[str, Any]]) -> None:
    """Give back each completed task's output; the kickoff then starts at the first task without one. Raises
    ValueError (pydantic's ValidationError) for an output no task of this crew gives."""
    from crewai.tasks.task_output import TaskOutput

    for task, output in zip(crew.tasks, resumed, strict=False):
        task.output = TaskOutput(**{**output, "pydantic": _structured(task, output.get("pydantic"))})
    crew.checkpoint_kickoff_event_id = RESUMED_KICKOFF


def _structured(task: Any, dumped: Any) -> Any:
    """A task's ``pydantic`` output as its own model: TaskOutput declares a bare ``BaseModel``, which would take the
    dumped dict as a model with no fields (whose dump is ``{}``, and whose ``str()`` fails)."""
    model = getattr(task, "output_pydantic", None)
    return None if model is None or dumped is None else model.model_validate(dumped)


def settle(crew: Any, restored: int) -> None:
    """After the kickoff: the restored outputs as the tasks now are (interpolated, and named as CrewAI names a
    task's output, its name or else its description, so as an uninterrupted run gives them), and in CrewAI's
    latest-kickoff store with the others, so ``replay`` finds the whole kickoff (CrewAI's ``_store_execution_log``:
    it stores only the tasks it runs). Their ``messages`` are not kept: a resume has them not."""
    for index, task in enumerate(crew.tasks[:restored]):
        output = task.output
        output.name, output.expected_output = task.name or task.description, task.expected_output
        crew._store_execution_log(task, output, index)
