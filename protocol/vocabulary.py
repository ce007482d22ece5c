"""The names both sides of the pipe share, each defined here once: the operations a job runs, and why one failed.

A ``StrEnum`` member equals its name as text, so each side compares and keys by these members while the frames,
the journal and the HTTP contract keep carrying the plain names.
"""

from __future__ import annotations

import enum


class Operation(enum.StrEnum):
    """An operation a job runs on its crew, in the reference's order (``ALLOWED_OPERATIONS``, ``--operation``)."""

    RUN = "run"
    BATCH_RUN = "batch_run"
    REPLAY = "replay"
    TRAIN = "train"
    TEST = "test"
    KNOWLEDGE_QUERY = "knowledge_query"
    MEMORY_RESET = "memory_reset"


class Effect(enum.StrEnum):
    """What a job's effect ledger records: each call that may reach outside the job."""

    TOOL = "tool"
    LLM = "llm"


class EffectStatus(enum.StrEnum):
    """Where a ledger entry stands. A worker ends a call ``finished`` or ``failed``; an entry still ``running`` when
    its job ends (cancelled, timed out, killed, fenced at a restart: however it ended) becomes ``uncertain``: the
    call may or may not have had its effect, and the host reconciles it (docs/reconcile-and-resume.md)."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    UNCERTAIN = "uncertain"


class Limit(enum.StrEnum):
    """A job's LLM budget, as a crew's own (``worker.spending.budget``) names it and as a worker says which one it
    held a call back for (``OverBudget.limit``)."""

    MAX_TOKENS = "max_tokens"
    MAX_LLM_CALLS = "max_llm_calls"


class SpanName(enum.StrEnum):
    """The spans a worker opens in its job's trace (``SpanStarted``), only when its ``Start`` names one (``trace``):
    all beneath the supervisor's span that ``Start.trace`` names (docs/tracing.md)."""

    WORKER_START = "worker.start"  # the Start taken -> the crew built and Started said
    KICKOFF = "kickoff"  # the operation on the crew (a run's kickoff, a train, a test, ...)
    TASK = "task"  # one task of the crew
    LLM_CALL = "llm.call"  # one LLM call, as the effect ledger counts it
    TOOL_CALL = "tool.call"  # one tool call, as the effect ledger counts it


# What a worker's span may carry: these keys only, each a value of its type (a string within MAX_SPAN_VALUE_CHARS,
# the job's secrets masked by the supervisor). The supervisor adds the job's action id, crew and operation to each.
SPAN_ATTRIBUTES: dict[str, type] = {
    "gen_ai.operation.name": str,  # "chat" (an LLM call) or "execute_tool" (a tool call): OpenTelemetry's GenAI names
    "gen_ai.request.model": str,
    "gen_ai.usage.input_tokens": int,
    "gen_ai.usage.output_tokens": int,
    "gen_ai.tool.name": str,
    "crew_supervisor.effect.id": int,  # the call's entry in the job's effect ledger (GET /jobs/{id}/effects)
    "crew_supervisor.effect.status": str,  # EffectStatus: how the call ended
    "crew_supervisor.task.index": int,  # from 0, in the crew's order
    "crew_supervisor.task.name": str,
    "crew_supervisor.agent.role": str,
}
MAX_SPAN_VALUE_CHARS = 200  # of a string a worker's span carries, and of its error type
# A job's worker spans the supervisor exports, and those open at once; past either a span is dropped and counted. All
# jobs share the supervisor's export queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default): a job's worker must not fill it
# with the spans of other jobs still in it. A large run (20 tasks of 20 calls each: 420 spans) fits in MAX_SPANS; and a
# crew nests a few deep (kickoff, task, call, a call within a tool), a few tasks at once when they run asynchronously.
MAX_SPANS = 1_000
MAX_OPEN_SPANS = 64


MAX_EFFECT_NAME_CHARS = 200  # of a tool's name or an LLM's model, as the ledger keeps it
MAX_EFFECT_ERROR_CHARS = 1000  # of a failed call's error message, as the ledger keeps it

# Operations without external effects: when one fails, its outcome is certain (as the reference says).
READ_ONLY_OPERATIONS = frozenset({Operation.KNOWLEDGE_QUERY})


class Reason(enum.StrEnum):
    """Why a job failed: its failed event's ``reason`` (``error_type`` is the reference's name, where it has one).
    A worker says the first group in its ``Failed`` (``WORKER_REASONS``); the supervisor decides the rest."""

    # The worker's
    REGISTRY_ERROR = "registry_error"  # the registry would not load: configuration
    SANDBOX_FAILED = "sandbox_failed"  # the job's sandbox could not be entered
    UNKNOWN_CREW = "unknown_crew"
    UNKNOWN_OPERATION = "unknown_operation"
    CREW_FACTORY_FAILED = "crew_factory_failed"  # the registry's factory raised, or gave no crew
    OPERATION_REFUSED = "operation_refused"  # the operation's input or its place was wrong: nothing ran
    OPERATION_FAILED = "operation_failed"  # the crew raised
    OUTPUT_TOO_LARGE = "output_too_large"
    CREW_CHANGED = "crew_changed"  # a resume's crew is not the one its earlier job ran: nothing ran
    WARMUP_FAILED = "warmup_failed"  # a fork server's, sent instead of its registry: it could not warm CrewAI
    # The supervisor's: the job's end
    TIMEOUT = "timeout"
    SUPERVISOR_STOPPED = "supervisor_stopped"
    SUPERVISOR_RESTARTED = "supervisor_restarted"  # fenced at start: its supervisor died while it ran
    SUPERVISOR_ERROR = "supervisor_error"
    CREW_ENV_INVALID = "crew_env_invalid"  # its crew's file in CREW_ENV_DIR
    LAUNCH_FAILED = "launch_failed"
    JOURNAL_ERROR = "journal_error"  # its events or its ledger could not be committed: killed
    # The supervisor's: its worker's
    WORKER_EXITED = "worker_exited"
    WORKER_CRASHED = "worker_crashed"
    WORKER_KILLED = "worker_killed"  # by someone outside the supervisor
    STRAY_PROCESSES = "stray_processes"  # left running after a result: killed
    # The supervisor's: its worker's frames
    PROTOCOL_ERROR = "protocol_error"
    PROTOCOL_DUPLICATE_TERMINAL = "protocol_duplicate_terminal"
    PROTOCOL_MESSAGE_AFTER_TERMINAL = "protocol_message_after_terminal"
    PROTOCOL_UNKNOWN_MESSAGE = "protocol_unknown_message"
    PROTOCOL_VERSION_MISMATCH = "protocol_version_mismatch"
    FRAME_TOO_LARGE = "frame_too_large"
    FRAME_TRUNCATED = "frame_truncated"
    FRAME_INVALID = "frame_invalid"
    FRAME_PIPE_CLOSED = "frame_pipe_closed"  # it closed its event pipe and ran on: killed
    # The supervisor's: a limit the job broke
    EVENT_TOO_LARGE = "event_too_large"
    EVENT_LIMIT_EXCEEDED = "event_limit_exceeded"
    PROCESS_LIMIT_EXCEEDED = "process_limit_exceeded"
    MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
    CPU_LIMIT_EXCEEDED = "cpu_limit_exceeded"
    OUTPUT_LIMIT_EXCEEDED = "output_limit_exceeded"
    DISK_LIMIT_EXCEEDED = "disk_limit_exceeded"
    TOKEN_LIMIT_EXCEEDED = "token_limit_exceeded"
    LLM_CALL_LIMIT_EXCEEDED = "llm_call_limit_exceeded"
    EFFECT_LIMIT_EXCEEDED = "effect_limit_exceeded"  # more ledger entries than MAX_EFFECTS: the next never started


# The reasons a job's worker may give in its ``Failed``: what only it can see (its registry, its crew, its operation,
# the sandbox its kernel would not let it enter). Crew code runs in the worker and can write any frame, so every other
# reason (a limit, a stray, a stop, a restart, a fault) is the supervisor's alone: one a worker gives is not taken
# (supervisor/jobs/outcomes.py: ``worker_failure``). The fork server's ``WARMUP_FAILED`` is no job's.
# ``BEFORE_CREW_REASONS`` are found before any of the crew's code runs in the job's worker, which says ``Building``
# just before it calls the crew's factory: one given after that is crew code blaming the sandbox or the
# configuration, and is not taken either.
BEFORE_CREW_REASONS = frozenset(
    {Reason.REGISTRY_ERROR, Reason.SANDBOX_FAILED, Reason.UNKNOWN_CREW, Reason.UNKNOWN_OPERATION}
)
WORKER_REASONS = BEFORE_CREW_REASONS | {
    Reason.CREW_FACTORY_FAILED,
    Reason.OPERATION_REFUSED,
    Reason.OPERATION_FAILED,
    Reason.OUTPUT_TOO_LARGE,
    Reason.CREW_CHANGED,
}
