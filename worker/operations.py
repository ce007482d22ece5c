"""The operations a job can run on a fresh Crew, and how their results become JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from protocol import Chunk
from protocol.frames import MAX_OUTPUT_BYTES

Emit = Callable[[Chunk], None]
Operation = Callable[[Any, dict[str, Any], Emit], Awaitable[dict[str, Any]]]
OUTPUT_FIELDS = {"raw": "", "json_dict": None, "pydantic": None, "tasks_output": [], "token_usage": {}}


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
    data = to_json(chunk)
    if not isinstance(data, dict):
        data = {"content": str(data)}
    channel = "tools" if data.get("chunk_type") == "tool_call" else "llm"
    return Chunk(channel=channel, data={**data, "channel": channel})


async def run(crew: Any, inputs: dict[str, Any], emit: Emit) -> dict[str, Any]:
    crew.stream = True
    kickoff = getattr(crew, "akickoff", None) or crew.kickoff_async
    result = await kickoff(inputs=inputs)
    if hasattr(result, "__aiter__"):
        async for chunk in result:
            emit(chunk_message(chunk))
        result = result.result
    return crew_output(result)


OPERATIONS: dict[str, Operation] = {"run": run}
