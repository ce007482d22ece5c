"""The message vocabulary. Each frame holds ``{"v": PROTOCOL_VERSION, "type": <kind>, ...fields}``."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from protocol.frames import MAX_FRAME_BYTES, FrameError, FrameReader, encode

# Bump on any change a peer could misread; a mismatched worker is rejected at hello.
PROTOCOL_VERSION = 11
# A worker's ``Stacks``, all threads' together: a stack is read by a person, and a deep one is cut at its outer end.
MAX_STACK_BYTES = 256 * 1024
STACK_CUT = "(outer calls cut)\n"  # begins a stack cut to its innermost calls (``innermost``)
MAX_NAME_CHARS = 200  # of a thread's name in a ``Stacks``: the crew names its threads
# What the completed tasks' outputs of a job may add up to (each as ``len(orjson.dumps(output))``, masked as the
# supervisor masks a decoded value: each secret replaced in each string): a resume sends them all in one ``Start``
# frame, beside its input (at most 1 MiB, as admission bounds it) and the rest of the message (64 KiB).
MAX_RESUMED_BYTES = MAX_FRAME_BYTES - 1024 * 1024 - 64 * 1024
THREAD_BYTES = 64  # what a thread costs of MAX_STACK_BYTES beside its name and stack: its id, its keys


class Layer(enum.StrEnum):
    """A layer of a job's sandbox (docs/security.md), as a worker says its kernel offers it."""

    SECCOMP = "seccomp"  # no_new_privs and the deny-list of calls (worker/seccomp.py)
    FILESYSTEM = "filesystem"  # the job's own Landlock domain: reads all but what is hidden, writes its places only
    PROCESSES = "processes"  # the same domain: no process outside it traced, read through /proc or robbed of an fd
    SIGNALS = "signals"  # Landlock ABI 6: no process outside it signalled
    SOCKETS = "abstract sockets"  # Landlock ABI 6: no abstract unix socket made outside it reached


# The Landlock ABI each of a job's Landlock layers needs (5.19 brought ABI 2, 6.12 ABI 6).
LANDLOCK_ABI = {Layer.FILESYSTEM: 2, Layer.PROCESSES: 2, Layer.SIGNALS: 6, Layer.SOCKETS: 6}


class UnknownMessage(FrameError):
    """A well-formed document that is not a message of this vocabulary."""


class VersionMismatch(FrameError):
    pass


@dataclasses.dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""


# Supervisor -> worker.
@dataclasses.dataclass(frozen=True)
class Start(Message):
    """The job. ``env`` and ``cwd``, when given, become the worker's environment and working directory
    before it builds the crew: a worker forked ahead of demand learns its job's places only now. With
    ``writable`` (None: no sandbox), the worker then enters the job's own sandbox: nothing hidden readable (its
    ``SANDBOX_HIDDEN`` setting), nothing but beneath ``writable`` changed (worker/landlock.py). ``secret_names``: the
    variables of ``env`` whose values the supervisor masks in all the job writes, names only (the worker has the
    values), which the worker never cuts between two chunk events (worker/chunks.py)."""

    kind: ClassVar[str] = "start"
    job_id: str
    crew_id: str
    operation: str
    input: dict[str, Any]
    timeout_ms: int
    env: dict[str, str] | None = None
    cwd: str | None = None
    max_tokens: int = 0  # the job's LLM budget (0: none): the supervisor's, or its crew's own if lower
    max_llm_calls: int = 0
    writable: list[str] | None = None
    secret_names: list[str] = dataclasses.field(default_factory=list)
    # A resumed ``run`` (``POST /jobs/{id}/resume``): the tasks its earlier job completed, in order, each as its
    # ``TaskDone.output`` said, and the crew's ``fingerprint`` then; the worker refuses (``CREW_CHANGED``) if the
    # crew it builds now has another, and otherwise runs only the tasks after them. None: not a resume.
    resumed: list[dict[str, Any]] | None = None
    fingerprint: str = ""
    # The job's trace (docs/tracing.md): the W3C ``traceparent`` of the supervisor's span the worker's spans belong
    # beneath (``SpanStarted``). Empty: the job is not traced, and the worker opens no span.
    trace: str = ""


@dataclasses.dataclass(frozen=True)
class Recorded(Message):
    """The ledger entry ``id`` (an ``EffectStarted`` or a ``TaskDone``) is durable in the journal: the thread that
    sent it, waiting, goes on. An entry past the job's ``MAX_EFFECTS`` is never answered: the job is stopped."""

    kind: ClassVar[str] = "recorded"
    id: int


@dataclasses.dataclass(frozen=True)
class Stop(Message):
    kind: ClassVar[str] = "stop"


@dataclasses.dataclass(frozen=True)
class DumpStacks(Message):
    """Every thread's Python stack, now (``Stacks``): the job goes on. Sent to a running job's worker only."""

    kind: ClassVar[str] = "dump_stacks"


# Worker -> supervisor.
@dataclasses.dataclass(frozen=True)
class Hello(Message):
    kind: ClassVar[str] = "hello"
    pid: int


@dataclasses.dataclass(frozen=True)
class Registry(Message):
    """What a registry offers: crew ids and named evaluation models. A describing worker's answer,
    and the fork server's first word, which also says what its warm-up warmed (``worker.warmup.Warmth``)."""

    kind: ClassVar[str] = "registry"
    crews: list[str]
    eval_llms: list[str]
    warmed: dict[str, Any] = dataclasses.field(default_factory=dict)
    budgets: dict[str, Any] = dataclasses.field(default_factory=dict)  # crew id -> its own {max_tokens, max_llm_calls}
    contained: bool = False  # its processes cannot change any cgroup file (so no job can leave its cgroups)
    sandbox: list[str] = dataclasses.field(default_factory=list)  # the Layers a job's sandbox has here


@dataclasses.dataclass(frozen=True)
class Built(Message):
    """A checking worker's word on one crew (``python -m worker check``, for ``crew-supervisor doctor``),
    sent after its Registry: ``error`` is empty if the factory built a crew, else what went wrong."""

    kind: ClassVar[str] = "built"
    crew_id: str
    error: str


# Supervisor <-> fork server, over a Unix socket (the job's pipes travel beside Fork as SCM_RIGHTS).
@dataclasses.dataclass(frozen=True)
class Fork(Message):
    kind: ClassVar[str] = "fork"
    env: dict[str, str]
    cwd: str
    prefault: bool  # copy ahead the pages a job writes (an idle worker, off a start's path)


@dataclasses.dataclass(frozen=True)
class Forked(Message):
    """The worker the fork server forked; pid 0: the kernel refused the fork."""

    kind: ClassVar[str] = "forked"
    pid: int


@dataclasses.dataclass(frozen=True)
class Refused(Message):
    """The fork server will not fork (it is no longer single-threaded); it exits after saying so."""

    kind: ClassVar[str] = "refused"
    reason: str


@dataclasses.dataclass(frozen=True)
class Building(Message):
    """The worker is in its job's sandbox and calls the crew's factory now: from here on the crew's code runs in it,
    and a reason found before it (``BEFORE_CREW_REASONS``) is no longer its to give."""

    kind: ClassVar[str] = "building"


@dataclasses.dataclass(frozen=True)
class Started(Message):
    kind: ClassVar[str] = "started"


@dataclasses.dataclass(frozen=True)
class Chunk(Message):
    kind: ClassVar[str] = "chunk"
    channel: str
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Spent(Message):
    """One LLM call's usage, as CrewAI books it on its LLM (the counts its ``token_usage`` ends with), sent
    as the call completes: the supervisor keeps each job's running totals."""

    kind: ClassVar[str] = "spent"
    model: str
    prompt_tokens: int
    completion_tokens: int
    requests: int  # as CrewAI counts them: 1 a call


@dataclasses.dataclass(frozen=True)
class EffectStarted(Message):
    """A tool call or an LLM call is about to start (the job's effect ledger). The calling thread waits for
    ``Recorded(id)`` before the call goes out, so no effect happens that the journal does not hold. ``id`` counts
    the job's ledger entries from 1 (``TaskDone`` shares the count); ``digest`` is the SHA-256 of the call's
    arguments as canonical JSON (a tool's input; an LLM call's messages), never the arguments themselves. Each time
    CrewAI runs a tool is an entry: it runs one that raised up to six times (three tries, each with its arguments
    filtered, then whole); a cached answer is none."""

    kind: ClassVar[str] = "effect_started"
    id: int
    effect: str  # Effect: tool or llm
    name: str  # the tool's name, or the LLM's model (MAX_EFFECT_NAME_CHARS)
    digest: str


@dataclasses.dataclass(frozen=True)
class EffectEnded(Message):
    """How the call ``id`` ended: ``finished``, or ``failed`` with the error's type and message (a tool that raised,
    even though CrewAI hands the model the error and goes on; an LLM call that raised). Tokens for an LLM call, as
    CrewAI booked them (0 for a tool). Not waited for: a call whose end is lost stays uncertain."""

    kind: ClassVar[str] = "effect_ended"
    id: int
    status: str  # EffectStatus.FINISHED or FAILED
    error_type: str
    error_message: str  # MAX_EFFECT_ERROR_CHARS; the supervisor masks the job's secrets in it
    prompt_tokens: int
    completion_tokens: int


@dataclasses.dataclass(frozen=True)
class TaskDone(Message):
    """A task of the crew completed (``index`` in ``crew.tasks``): its output as CrewAI's ``TaskOutput`` dumps it
    (``description``, ``agent``, ``raw``, ``pydantic``, ``json_dict``, ``output_format``), and the crew's
    ``fingerprint``. Waited for (``Recorded(id)``) before the next task starts, so a resume never runs it again.
    Sent in the order of ``crew.tasks``, each index once, a resumed run's from its first task not restored on (an async
    task that completes before an earlier one waits for it). None for a task CrewAI skips (a ``ConditionalTask``), or
    whose output is over the job's ``MAX_EVENT_BYTES``, or would bring the outputs of the job's tasks (a resume's
    restored ones included) past ``MAX_RESUMED_BYTES``, nor for any task after it: a resume runs again from there.
    Sizes as the supervisor measures them: ``len(orjson.dumps(output))`` of the output masked (each secret replaced
    in each string of it, a dict's keys included)."""

    kind: ClassVar[str] = "task_done"
    id: int
    index: int
    output: dict[str, Any]
    fingerprint: str


@dataclasses.dataclass(frozen=True)
class SpanStarted(Message):
    """A span of the job's trace begins in the worker (sent only when its ``Start`` named a trace). ``id``: 16
    lowercase hex digits, new in this job; ``parent``: an id this job's worker started before, or empty for the
    supervisor's span ``Start.trace`` names. ``name`` is a ``SpanName``, ``start_ns`` the wall clock
    (``time.time_ns``), ``attributes`` within ``SPAN_ATTRIBUTES``. The supervisor exports it; one still open when the
    job ends, it ends then, as cut off."""

    kind: ClassVar[str] = "span_started"
    id: str
    parent: str
    name: str
    start_ns: int
    attributes: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SpanEnded(Message):
    """The span ``id`` ends: ``attributes`` add to its own (an LLM call's tokens, a call's status); ``error`` is the
    type of the exception its work raised (empty: none; MAX_SPAN_VALUE_CHARS)."""

    kind: ClassVar[str] = "span_ended"
    id: str
    end_ns: int
    attributes: dict[str, Any]
    error: str = ""


@dataclasses.dataclass(frozen=True)
class OverBudget(Message):
    """The worker holds back an LLM call: the job's ``limit`` (``max_tokens`` or ``max_llm_calls``) is spent. It
    waits to be stopped; no call of the job starts after this."""

    kind: ClassVar[str] = "over_budget"
    limit: str  # a Limit; the supervisor checks it is one its job has


@dataclasses.dataclass(frozen=True)
class Stacks(Message):
    """The answer to ``DumpStacks``: per thread ``{"name", "ident", "stack"}``, the stack as ``traceback`` writes
    it, innermost call last, within MAX_STACK_BYTES in all."""

    kind: ClassVar[str] = "stacks"
    threads: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Completed(Message):
    kind: ClassVar[str] = "completed"
    output: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Failed(Message):
    """``error_type`` is what the reference sidecar reports (an exception's class name where it has one);
    ``reason`` is this project's precise name for what happened."""

    kind: ClassVar[str] = "failed"
    error_type: str
    reason: str
    message: str
    uncertain_outcome: bool


def bounded_threads(threads: Iterable[tuple[str, Any, str]], clean: Callable[[str], str] = str) -> list[dict[str, Any]]:
    """``(name, ident, stack)`` of each thread as a ``Stacks`` holds them: a name (the crew's to choose) cut to
    MAX_NAME_CHARS, and all of them within MAX_STACK_BYTES (names and THREAD_BYTES each included); a stack past what
    is left keeps its innermost calls, where its thread is. Both sides bound a ``Stacks`` with it: the worker as it
    writes one, the supervisor (``clean`` redacting) as it keeps one, which crew code could have written instead."""
    kept: list[dict[str, Any]] = []
    left = MAX_STACK_BYTES
    for name, ident, stack in threads:
        if left <= len(STACK_CUT):
            break
        name = clean(name[:MAX_NAME_CHARS])
        stack = innermost(clean(stack), left - len(name.encode()))
        kept.append({"name": name, "ident": ident, "stack": stack})
        left -= len(name.encode()) + len(stack.encode()) + THREAD_BYTES
    return kept


def innermost(stack: str, limit: int) -> str:
    """``stack`` in at most ``limit`` bytes of UTF-8: whole, or its end (its innermost calls) after STACK_CUT."""
    data = stack.encode()
    if len(data) <= limit:
        return stack
    return STACK_CUT + data[len(data) - max(limit - len(STACK_CUT), 0) :].decode(errors="ignore")


TERMINAL = (Completed, Failed)
_KINDS: dict[str, type[Message]] = {
    cls.kind: cls
    for cls in (
        *(Start, Stop, DumpStacks, Recorded, Hello, Registry, Built, Building, Started, Chunk, Spent, OverBudget),
        *(EffectStarted, EffectEnded, TaskDone, SpanStarted, SpanEnded, Stacks, Completed, Failed),
        *(Fork, Forked, Refused),
    )
}
_FIELDS = {kind: typing.get_type_hints(cls) for kind, cls in _KINDS.items()}
_NAMES = {kind: [field.name for field in dataclasses.fields(cls)] for kind, cls in _KINDS.items()}


def pack(message: Message) -> bytes:
    """The frame carrying ``message``. Shallow on purpose: ``dataclasses.asdict`` deep-copies every
    chunk's data first, which measured as the largest cost per chunk in the worker."""
    document = {"v": PROTOCOL_VERSION, "type": message.kind}
    document.update((name, getattr(message, name)) for name in _NAMES[message.kind])
    return encode(document)


def decode(document: dict[str, Any]) -> Message:
    """The message a document holds; raises UnknownMessage or VersionMismatch."""
    version = document.get("v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    kind = document.get("type")
    if not isinstance(kind, str) or (cls := _KINDS.get(kind)) is None:
        raise UnknownMessage(f"unknown message type {kind!r}")
    names, checks = _CHECKS[kind]
    if document.keys() != names:
        fields = sorted(document.keys() - _ENVELOPE)
        raise UnknownMessage(f"{kind} needs fields {sorted(names - _ENVELOPE)}, got {fields}")
    for name, conforms in checks:
        if not conforms(document[name]):
            raise UnknownMessage(f"{kind}.{name} is not a {_FIELDS[kind][name]}")
    return cls(*[document[name] for name, _ in checks])


def _checker(hint: Any) -> Callable[[Any], bool]:
    """Whether a decoded value conforms to ``hint``, as a function made once per field: reading the
    type hints for every message was most of the cost of decoding one."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [_checker(arm) for arm in typing.get_args(hint)]
        return lambda value: any(conforms(value) for conforms in arms)
    if origin is list:
        (item,) = typing.get_args(hint)
        conforms = _checker(item)
        return lambda value: isinstance(value, list) and all(conforms(v) for v in value)
    if origin is dict:
        return lambda value: isinstance(value, dict)  # keys are str by JSON; values are free-form
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    return lambda value: isinstance(value, hint)


_ENVELOPE = {"v", "type"}
# Per kind: the document's keys (envelope included), then each field's check, in the dataclass's order.
_CHECKS = {
    kind: (
        {name for name in hints if name != "kind"} | _ENVELOPE,
        tuple((name, _checker(hints[name])) for name in _NAMES[kind]),
    )
    for kind, hints in _FIELDS.items()
}


class MessageReader:
    """Frames in, messages out; every error is a FrameError subclass."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._frames = FrameReader(max_bytes)

    def feed(self, data: bytes) -> list[Message]:
        return [decode(document) for document in self._frames.feed(data)]

    @property
    def inside_frame(self) -> bool:
        return self._frames.inside_frame

    def close(self) -> None:
        self._frames.close()
