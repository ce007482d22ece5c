"""Request envelopes and the checks of the admission order that are about the request alone."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints

from supervisor.config import OPERATIONS

MAX_INPUT_BYTES = 1024 * 1024
MAX_INPUT_PROPERTIES = 512
MAX_KEY_BYTES = 512
DEFAULT_TIMEOUT_MS = 600_000
MAX_TIMEOUT_MS = 3_600_000

Id = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Operation = Literal["run", "batch_run", "replay", "train", "test", "knowledge_query", "memory_reset"]
assert set(Operation.__args__) == set(OPERATIONS)  # type: ignore[attr-defined]


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crew_id: Id
    action_id: Id
    operation: Operation = "run"
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_ms: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crew_id: Id
    action_id: Id
    reason: Annotated[str, StringConstraints(max_length=2048)] | None = None


def canonical(value: Any) -> bytes:
    """Compact JSON with sorted keys: the form that is measured and hashed."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def input_too_large(body: StartRequest) -> bool:
    return len(canonical(body.input)) > MAX_INPUT_BYTES


def key_problem(key: str | None) -> tuple[int, str] | None:
    """428 for a missing or blank Idempotency-Key, 400 for one too long or with control characters."""
    if key is None or not key.strip():
        return 428, "Idempotency-Key header is required"
    if len(key.encode()) > MAX_KEY_BYTES:
        return 400, f"Idempotency-Key exceeds {MAX_KEY_BYTES} bytes"
    if any(ord(c) < 0x20 for c in key):
        return 400, "Idempotency-Key contains control characters"
    return None


def input_problem(body: StartRequest) -> str | None:
    """Operation-specific input checks (422)."""
    if len(body.input) > MAX_INPUT_PROPERTIES:
        return f"input has {len(body.input)} top-level properties; at most {MAX_INPUT_PROPERTIES} allowed"
    return None


def request_hash(body: StartRequest, key: str) -> str:
    material = {
        "crew_id": body.crew_id,
        "action_id": body.action_id,
        "operation": body.operation,
        "input": body.input,
        "timeout_ms": body.timeout_ms,
        "idempotency_key": key,
    }
    return hashlib.sha256(canonical(material)).hexdigest()


def path_id_problem(action_id: str) -> str | None:
    if not 1 <= len(action_id) <= 256:
        return "action id must be 1 to 256 characters"
    if "/" in action_id or any(ord(c) < 0x20 or ord(c) == 0x7F for c in action_id):
        return "action id must not contain '/' or control characters"
    return None
