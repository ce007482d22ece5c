"""The bodies of a chat completion as the loopback provider (``provider.py``) answers them: the assistant's message
derived from the prompt (a call of the first offered tool, JSON fitting a ``response_format`` schema, or a final
answer naming a digest of the prompt), its stream's deltas, its usage, an OpenAI error. Standard library only."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Protocol

WORD = re.compile(r"\S+")
CREATED = 1_767_225_600  # a fixed `created`: answers are the same in every run


class Call(Protocol):
    """What an answer reads of a call (``provider.Call``)."""

    model: str
    messages: list[dict[str, Any]]


def text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(str(content or ""))
    return "\n".join(parts)


def reply(call: Call, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant's message: a call of the first offered tool until a tool has answered, JSON for a
    ``response_format`` schema, else a final answer naming a digest of the prompt."""
    answered_tool = any(isinstance(m, dict) and m.get("role") == "tool" for m in call.messages)
    if not answered_tool and (calling := tool_call(call, body)):
        return calling
    digest = prompt_digest(call)
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if schema is not None:
        return {"role": "assistant", "content": json.dumps(sample(schema, f"finding {digest}"))}
    return {
        "role": "assistant",
        "content": f"Thought: I know the answer.\nFinal Answer: the provider reports finding {digest}.",
    }


def tool_call(call: Call, body: dict[str, Any]) -> dict[str, Any] | None:
    """The assistant's call of the first offered tool, with arguments that fit its parameters (None: no tools)."""
    tools = [t["function"] for t in body.get("tools") or [] if isinstance(t, dict) and "function" in t]
    if not tools:
        return None
    digest = prompt_digest(call)
    arguments = json.dumps(sample(tools[0].get("parameters") or {}, digest), separators=(",", ":"))
    calling = {
        "id": f"call_{digest}",
        "type": "function",
        "function": {"name": tools[0]["name"], "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [calling]}


def prompt_digest(call: Call) -> str:
    return hashlib.sha256(text(call.messages).encode()).hexdigest()[:12]


def sample(schema: dict[str, Any], text: str, defs: dict[str, Any] | None = None) -> Any:
    """A value fitting a JSON schema: strings say ``text``, numbers are 8, arrays hold one item."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        return sample(defs.get(schema["$ref"].rpartition("/")[2], {}), text, defs)
    for union in ("anyOf", "oneOf", "allOf"):
        options = [s for s in schema.get(union, []) if s.get("type") != "null"]
        if options:
            return sample(options[0], text, defs)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if kind == "object":
        return {name: sample(sub, text, defs) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [sample(schema.get("items") or {}, text, defs)]
    return {"integer": 8, "number": 8.0, "boolean": True, "null": None}.get(kind, text)


def head(call: Call, body: dict[str, Any], kind: str) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
    return {"id": f"chatcmpl-{digest}", "object": kind, "created": CREATED, "model": call.model}


def finish(message: dict[str, Any]) -> str:
    return "tool_calls" if message.get("tool_calls") else "stop"


def deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message as a stream sends it: the role, then a word at a time, or each tool call's name, then its
    arguments a few characters a chunk (a client must join them, as it must a real provider's)."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        function = tool_call["function"]
        head = {
            "index": index,
            "id": tool_call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        pieces = re.findall(r".{1,8}", function["arguments"], re.DOTALL)
        deltas += [{"tool_calls": [head]}]
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]} for piece in pieces]
    deltas += [{"content": word} for word in re.findall(r"\S+\s*", message.get("content") or "")]
    return deltas


def usage(messages: list[dict[str, Any]], message: dict[str, Any]) -> dict[str, int]:
    prompt = len(WORD.findall(text(messages)))
    completion = len(
        WORD.findall(json.dumps(message.get("tool_calls")) if message.get("tool_calls") else message["content"])
    )
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}
