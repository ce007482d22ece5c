"""What plain in-process CrewAI gives for a job: the reference a faithful sidecar must match.

    python -m tests.helpers.kickoff <module:attr> <crew_id> <run|batch_run|replay> <json input>
    python -m tests.helpers.kickoff --each < jobs.json    # [[module:attr, crew_id, operation, input], ...]

Prints one JSON line: ``run`` is ``crew.kickoff(inputs=input)``; ``batch_run`` kicks off a fresh crew from
the factory per ``input["inputs"]`` item; ``replay`` kicks off with ``input`` and then, as the sidecar's
replay job does, replays the second task (the first of a one-task crew) on a fresh crew from the stored
outputs. Each ``CrewOutput`` is written as JSON by ``from_crewai``, from CrewAI's own objects alone: nothing
here shares code with how the worker writes its output, so a product that drops or bends a field differs.
CrewAI's storage is a fresh directory unless CREWAI_STORAGE_DIR is set.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from typing import Any

import orjson

from protocol import QUIET_CREWAI

# What a faithful run may legitimately add or change: the sidecar's ids of this kickoff's stored tasks
# (new ids every kickoff). Measured with CrewAI 1.15: crew_output() holds no other ids, times or pids.
VOLATILE = frozenset({"replay_task_ids"})


def comparable(output: dict[str, Any]) -> dict[str, Any]:
    """The parts of an output (a crew output, or batch_run's ``{"results", "count"}``) that two faithful
    runs must give equally: raw, pydantic, json_dict, every task output (raw, agent, messages, ...) and
    token_usage. Crewai-free, so a test process can compare without importing CrewAI."""
    if isinstance(output.get("results"), list) and "count" in output:
        return {**output, "results": [comparable(result) for result in output["results"]]}
    return {key: value for key, value in output.items() if key not in VOLATILE}


def from_crewai(result: Any) -> dict[str, Any]:
    """A ``CrewOutput`` as JSON, from CrewAI's own models: each one's ``model_dump(mode="json")``, the
    structured outputs dumped as what they are (CrewAI declares them as a bare ``BaseModel``, whose dump
    would be ``{}``)."""
    return {
        **result.model_dump(mode="json", exclude={"pydantic", "tasks_output"}),
        "pydantic": _model(result.pydantic),
        "tasks_output": [
            {**task.model_dump(mode="json", exclude={"pydantic"}), "pydantic": _model(task.pydantic)}
            for task in result.tasks_output
        ],
    }


def _model(value: Any) -> Any:
    return None if value is None else value.model_dump(mode="json")


def reference(spec: str, crew_id: str, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What CrewAI alone gives for the job: the registry's factory is the crew's, nothing else of ours runs."""
    module, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module), attr)[crew_id]
    if operation == "run":
        return from_crewai(factory().kickoff(inputs=payload))
    if operation == "batch_run":
        results = [from_crewai(factory().kickoff(inputs=inputs)) for inputs in payload["inputs"]]
        return {"results": results, "count": len(results)}
    if operation == "replay":
        first = factory()
        first.kickoff(inputs=payload)
        task_id = str(first.tasks[min(1, len(first.tasks) - 1)].id)
        return from_crewai(factory().replay(task_id, payload))
    raise ValueError(f"unknown operation {operation!r}")


def answer(spec: str, crew_id: str, operation: str, payload: dict[str, Any]) -> None:
    """Print the reference output as one line and exit at once (teardown after CrewAI costs a second)."""
    # Only the answer reaches stdout. Whatever else is written there goes to stderr, by its file descriptor:
    # CrewAI's panels, and a newline one of its threads printed after the crew had ended (seen at load: two
    # blank lines among the answers, which then outnumbered the jobs).
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    storage = os.environ.get("CREWAI_STORAGE_DIR") or tempfile.mkdtemp(prefix="kickoff-storage-")
    os.environ["CREWAI_STORAGE_DIR"] = storage
    quiet()
    try:
        output = reference(spec, crew_id, operation, payload)
    except Exception as exc:
        output = {"error": f"{type(exc).__name__}: {exc}"}
    channel.write(orjson.dumps(output) + b"\n")
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def answer_each(jobs: list[list[Any]]) -> None:
    """``--each``: jobs ``[spec, crew_id, operation, input]`` from stdin, one line each, in order.

    CrewAI and the registries are imported once; each job then runs in a child forked from this process,
    which never runs a crew (a fork after a crew ran would hang): every job starts as fresh as a worker.
    """
    quiet()
    for spec in {job[0] for job in jobs}:
        importlib.import_module(spec.partition(":")[0])
    storage = os.environ.get("CREWAI_STORAGE_DIR")
    for spec, crew_id, operation, payload in jobs:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                if storage is None:  # a fresh store per job unless the caller chose one
                    os.environ.pop("CREWAI_STORAGE_DIR", None)
                answer(spec, crew_id, operation, payload)
            finally:
                os._exit(70)  # only if answer() did not exit: a child must never return into this loop
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.stdout.buffer.write(orjson.dumps({"error": f"job exited with status {status}"}) + b"\n")
    sys.stdout.flush()


def quiet() -> None:
    """CrewAI offline, as every worker runs it (the switches of ``protocol.QUIET_CREWAI``), and its first-run
    tracing prompt answered in the storage directory, if one is set."""
    os.environ.update(QUIET_CREWAI)
    storage = os.environ.get("CREWAI_STORAGE_DIR")
    if storage:
        os.makedirs(storage, exist_ok=True)
        with open(os.path.join(storage, ".crewai_user.json"), "w") as marker:
            marker.write('{"first_execution_done": true}')


def main(argv: list[str]) -> None:
    if argv == ["--each"]:
        answer_each(orjson.loads(sys.stdin.buffer.read()))
    else:
        spec, crew_id, operation, payload = argv
        answer(spec, crew_id, operation, orjson.loads(payload))


if __name__ == "__main__":
    main(sys.argv[1:])
