"""Request envelopes and the checks of the admission order that are about the request alone."""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from protocol import Operation
from supervisor.enums import ENDED, STOPPABLE_PHASES, Phase, Status, literal
from supervisor.settings_table import MAX_ARCHIVE_AGE_SECONDS

MAX_INPUT_BYTES = 1024 * 1024
MAX_INPUT_PROPERTIES = 512
MAX_KEY_BYTES = 512
DEFAULT_TIMEOUT_MS = 600_000
MAX_TIMEOUT_MS = 3_600_000
MAX_BULK_ARCHIVE = 1000  # records one bulk archive removes; the answer says how many more matched

Id = Annotated[str, StringConstraints(min_length=1, max_length=256)]


def _addressable(action_id: str) -> str:
    """A job is read, cancelled and archived by its id in a path: admitting one no path can name would
    leave a job nobody can reach (and a retained slot nobody can free)."""
    if problem := path_id_problem(action_id):
        raise ValueError(problem)
    return action_id


ActionId = Annotated[Id, AfterValidator(_addressable)]


def one_of(names: Iterable[enum.StrEnum]) -> Any:
    """A field that holds one of ``names``' enum, checked as a ``Literal`` of their plain text: its JSON schema lists
    them inline, as the contract's always has, and a wrong value is refused in a ``Literal``'s words; the value is
    then the member. FastAPI would add an unused definition of the enum beside its fields' were it the annotation."""
    names = tuple(names)
    return Annotated[literal(names), AfterValidator(type(names[0]))]


# What the type checker sees is what the field holds: the member, made by ``one_of``'s validator.
if TYPE_CHECKING:
    OperationName = Operation
    StoppablePhase = Phase
    EndedStatus = Status
else:
    OperationName = one_of(Operation)
    StoppablePhase = one_of(STOPPABLE_PHASES)
    EndedStatus = one_of(ENDED)


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crew_id: Id
    action_id: ActionId
    operation: OperationName = Operation.RUN
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_ms: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS


class ResumeRequest(BaseModel):
    """``POST /jobs/{id}/resume``: the new job's action id (and its timeout, as a start's); the crew, the operation
    (``run``) and the input are the resumed job's."""

    model_config = ConfigDict(extra="forbid")

    action_id: ActionId
    timeout_ms: Annotated[StrictInt, Field(ge=1, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crew_id: Id
    action_id: ActionId
    reason: Annotated[str, StringConstraints(max_length=2048)] | None = None


class BulkCancelRequest(BaseModel):
    """Which live jobs one cancel stops: those of a crew, a phase, an operation (all that are named), or ``all``
    of them; ``dry_run`` names them and stops none."""

    model_config = ConfigDict(extra="forbid")

    crew_id: Id | None = None
    phase: StoppablePhase | None = None
    operation: OperationName | None = None
    reason: Annotated[str, StringConstraints(max_length=2048)] | None = None
    # JSON booleans only: a lax "yes" or 1 read as true would stop jobs, or every job, on a typo.
    dry_run: StrictBool = False
    all: StrictBool = False

    @model_validator(mode="after")
    def _names_its_jobs(self) -> BulkCancelRequest:
        if not (self.crew_id or self.phase or self.operation or self.all):
            raise ValueError("name the jobs: crew_id, phase or operation, or all: true for every live job")
        return self


class BulkArchiveRequest(BaseModel):
    """Which ended records one archive removes: those that ended more than ``older_than_seconds`` ago, of the
    ``status``-es named (default: every terminal one) and ``crew_id``, oldest end first, at most ``limit``;
    ``dry_run`` names them and removes none."""

    model_config = ConfigDict(extra="forbid")

    older_than_seconds: Annotated[StrictInt, Field(ge=0, le=MAX_ARCHIVE_AGE_SECONDS)]
    status: Annotated[list[EndedStatus], Field(min_length=1, max_length=3)] | None = None
    crew_id: Id | None = None
    # JSON booleans only, as the bulk cancel's: a lax "no" read as true would archive instead of listing.
    dry_run: StrictBool = False
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_BULK_ARCHIVE)] = MAX_BULK_ARCHIVE


def strict_json(body: bytes) -> Any:
    """A request body as RFC 8259 JSON that orjson (hash, journal, worker frames) can encode.

    Python's parser alone answers 400 for invalid UTF-8, deep nesting or an integer of more than 4,300
    digits, takes NaN, Infinity, lone surrogates and integers beyond 64 bits, which then fail as a 500 where
    they are first encoded, and reads ``1e400`` as infinity, which orjson writes as null (a different
    request then hashes the same). Raising JSONDecodeError makes each of them the 422 that malformed JSON
    gets, with the reason in the detail.
    """
    try:
        value = json.loads(body.decode(), parse_constant=_no_constant, parse_float=_finite)
        orjson.dumps(value)
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"body is not UTF-8: {exc.reason}", "", exc.start) from None
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except orjson.JSONEncodeError as exc:
        raise json.JSONDecodeError(f"value cannot be carried: {exc}", "", 0) from None
    except ValueError as exc:  # an integer past Python's digit limit for conversion
        raise json.JSONDecodeError(f"a number cannot be read: {str(exc).split(';')[0]}", "", 0) from None
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise json.JSONDecodeError(f"{text[:32]} is out of range for a number", "", 0)
    return value


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", "", 0)


def canonical(value: Any) -> bytes:
    """Compact JSON with sorted keys: the form that is measured and hashed."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def input_too_large(body: StartRequest) -> bool:
    return len(canonical(body.input)) > MAX_INPUT_BYTES


def key_problem(key: str | None) -> tuple[bool, str] | None:
    """(missing, why) for an Idempotency-Key that is missing or blank, too long or with control characters."""
    if key is None or not key.strip():
        return True, "Idempotency-Key header is required"
    # The server decodes header bytes as latin-1; encoding back counts the bytes the client sent (UTF-8 or not).
    if len(key.encode("latin-1")) > MAX_KEY_BYTES:
        return False, f"Idempotency-Key exceeds {MAX_KEY_BYTES} bytes"
    if any(ord(c) < 0x20 for c in key):
        return False, "Idempotency-Key contains control characters"
    return None


def _text_within(max_bytes: int) -> AfterValidator:
    """``Annotated[StrictStr, _text_within(n)]``: non-empty, at most ``max_bytes`` of UTF-8, no control characters."""

    def check(value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        if len(value.encode()) > max_bytes:
            raise ValueError(f"must be at most {max_bytes} bytes")
        if any(ord(c) < 0x20 for c in value):
            raise ValueError("must not contain control characters")
        return value

    return AfterValidator(check)


def _few_properties(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_INPUT_PROPERTIES:
        raise ValueError(f"has {len(value)} top-level properties; at most {MAX_INPUT_PROPERTIES} allowed")
    return value


def _not_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Inputs = Annotated[dict[str, Any], AfterValidator(_few_properties)]
Iterations = Annotated[StrictInt, Field(ge=1, le=100)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunInput(RootModel[Inputs]):
    pass


class BatchRunInput(_Closed):
    inputs: Annotated[list[Inputs], Field(min_length=1, max_length=100)]


class ReplayInput(_Closed):
    task_id: Annotated[StrictStr, _text_within(256)]
    inputs: Inputs | None = None


class TrainInput(_Closed):
    n_iterations: Iterations
    artifact_name: Annotated[StrictStr, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    inputs: Inputs | None = None
    feedback: Annotated[StrictStr, _text_within(4096)] | None = None


class TestInput(_Closed):
    n_iterations: Iterations
    eval_llm: Annotated[StrictStr, _text_within(256)]
    inputs: Inputs | None = None


class KnowledgeQueryInput(_Closed):
    query: Annotated[list[Annotated[StrictStr, _text_within(4096)]], Field(min_length=1, max_length=100)]
    results_limit: Annotated[StrictInt, Field(ge=1, le=100)] = 3
    score_threshold: Annotated[float, BeforeValidator(_not_boolean), Field(ge=0, le=1)] = 0.35


class MemoryResetInput(_Closed):
    command_type: Literal["memory", "knowledge", "agent_knowledge", "kickoff_outputs", "all"]


INPUT_MODELS: dict[str, type[BaseModel]] = {
    Operation.RUN: RunInput,
    Operation.BATCH_RUN: BatchRunInput,
    Operation.REPLAY: ReplayInput,
    Operation.TRAIN: TrainInput,
    Operation.TEST: TestInput,
    Operation.KNOWLEDGE_QUERY: KnowledgeQueryInput,
    Operation.MEMORY_RESET: MemoryResetInput,
}


def validate_input(body: StartRequest) -> dict[str, Any]:
    """The operation's input with defaults filled in; raises InputError naming the field (422)."""
    try:
        model = INPUT_MODELS[body.operation].model_validate(body.input)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("input", *first["loc"]))
        raise InputError(f"{where}: {first['msg']}") from None
    return model.model_dump(mode="json", exclude_none=True)


class InputError(ValueError):
    pass


def request_hash(body: StartRequest, key: str, resumed_from: str | None = None) -> str:
    """What fences an action id: its request material and key, and for a resume the job it continues in place of its
    input (so that a start of the same material is not taken for it, nor a resume of another job)."""
    material = {
        "crew_id": body.crew_id,
        "action_id": body.action_id,
        "operation": body.operation,
        "input": body.input,
        "timeout_ms": body.timeout_ms,
        "idempotency_key": key,
    }
    if resumed_from is not None:  # its input is the job's it continues, not the client's: that job names it
        material["resumed_from"] = resumed_from
        del material["input"]
    return hashlib.sha256(canonical(material)).hexdigest()


def path_id_problem(action_id: str) -> str | None:
    if not 1 <= len(action_id) <= 256:
        return "action id must be 1 to 256 characters"
    # Clients resolve dot segments before sending (``/jobs/..`` becomes ``/``): no path can name these.
    if action_id in (".", ".."):
        return "action id must not be '.' or '..'"
    if "/" in action_id or any(ord(c) < 0x20 or ord(c) == 0x7F for c in action_id):
        return "action id must not contain '/' or control characters"
    return None
