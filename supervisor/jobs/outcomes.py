"""How a job ends: the terminal event's name and data, and what a worker's exit status means."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from protocol import (
    BEFORE_CREW_REASONS,
    TERMINAL,
    WORKER_REASONS,
    ExitCode,
    Failed,
    FrameError,
    FrameTooLarge,
    InvalidDocument,
    Message,
    Reason,
    TruncatedFrame,
    UnknownMessage,
    VersionMismatch,
)
from supervisor.enums import EventName, Status
from supervisor.jobs.job_state import JobState
from supervisor.jobs.phases import StopReason
from supervisor.redaction import redact

# Signals the kernel sends a process for its own fault, as opposed to someone killing it.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS})


FRAME_FAULTS: dict[type[FrameError], Reason] = {
    FrameTooLarge: Reason.FRAME_TOO_LARGE,
    TruncatedFrame: Reason.FRAME_TRUNCATED,
    InvalidDocument: Reason.FRAME_INVALID,
    UnknownMessage: Reason.PROTOCOL_UNKNOWN_MESSAGE,
    VersionMismatch: Reason.PROTOCOL_VERSION_MISMATCH,
}


# Where the reference sidecar reports the same condition: the class name of what it raises there.
REFERENCE_ERROR_TYPES: dict[Reason, str] = {
    Reason.TIMEOUT: "TimeoutError",
    Reason.EVENT_TOO_LARGE: "RegistryError",
    Reason.EVENT_LIMIT_EXCEEDED: "RegistryError",
    Reason.OUTPUT_TOO_LARGE: "RegistryError",
}


# A worker names ``error_type`` (an exception's class name, which a crew chooses) and ``reason``, and writes
# ``message``: bounded here, where every failure is built, so none can make a huge event or log line.
MAX_ERROR_TYPE_CHARS = 256
MAX_MESSAGE_CHARS = 4096


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The terminal event (``completed`` data is the output itself, as the reference writes it), and what the record
    keeps beside it: the worker's exit status, and what it left running when it exited (``Leftovers.record``)."""

    event: EventName  # completed | failed | cancelled
    data: dict[str, Any]
    output: dict[str, Any] | None = None
    exit_status: int | None = None
    leftovers: dict[str, Any] | None = None


def failure(reason: Reason, message: str, uncertain: bool, error_type: str | None = None, **proof: Any) -> Outcome:
    """``reason`` is our precise name; ``error_type`` the reference's value for it where it has one."""
    data = {
        "status": Status.FAILED,
        "error_type": bounded(error_type or REFERENCE_ERROR_TYPES.get(reason, reason), MAX_ERROR_TYPE_CHARS),
        "reason": bounded(reason, MAX_ERROR_TYPE_CHARS),
        "message": bounded(message, MAX_MESSAGE_CHARS),
        "uncertain_outcome": uncertain,
    }
    return Outcome(EventName.FAILED, {**data, **proof}, exit_status=proof.get("exit_status"))


def bounded(text: str, limit: int) -> str:
    """At most ``limit`` characters; a cut one ends with "…" so that nobody takes it for the whole."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def worker_failure(failed: Failed, secrets: tuple[str, ...], *, crew_ran: bool, **proof: Any) -> Outcome:
    """A worker's own failure, in its words (its message may quote a key the crew was given, as a provider's does:
    redacted). A reason only the supervisor gives (``WORKER_REASONS`` says which a worker may), or one found before
    the crew's code runs given once it has (``crew_ran``: the worker said ``Building``), is crew code talking: not
    taken, the job fails as the protocol error it is, with the worker's claim named apart (``worker_reason``)."""
    if failed.reason in WORKER_REASONS and not (crew_ran and failed.reason in BEFORE_CREW_REASONS):
        text = redact(failed.message, secrets)
        reason = Reason(failed.reason)  # one of WORKER_REASONS: the worker's text, checked
        return failure(reason, text, failed.uncertain_outcome, error_type=failed.error_type, **proof)
    claimed = bounded(redact(failed.reason, secrets), MAX_ERROR_TYPE_CHARS)
    message = f"the worker failed its job with a reason only the supervisor gives: {claimed!r}"
    return failure(Reason.PROTOCOL_ERROR, message, True, worker_reason=claimed, **proof)


def _meaning(status: int) -> str:
    """What a worker's own exit code says, where it is one of ours (``ExitCode``)."""
    return f" ({ExitCode(status).name.lower().replace('_', ' ')})" if status in set(ExitCode) else ""


def exit_failure(status: int | None, pid: int) -> Outcome:
    """A worker that left before its result: crashed, killed by someone else, or exited."""
    if status is None:
        return failure(Reason.WORKER_EXITED, "worker exited before a result; its status is unknown", True, pid=pid)
    if status >= 0:
        return failure(
            Reason.WORKER_EXITED,
            f"worker exited with status {status}{_meaning(status)} before a result",
            True,
            exit_status=status,
            pid=pid,
        )
    sig = signal.Signals(-status)
    if sig == signal.SIGXCPU:
        error_type, how = Reason.CPU_LIMIT_EXCEEDED, "reached its CPU time limit"
    elif sig in CRASH_SIGNALS:
        error_type, how = Reason.WORKER_CRASHED, "crashed"
    else:
        error_type, how = Reason.WORKER_KILLED, "was killed from outside the supervisor"
    return failure(
        error_type,
        f"worker {how} ({sig.name}) before a result",
        True,
        exit_status=status,
        exit_signal=sig.name,
        pid=pid,
    )


def protocol_fault(got: Message | FrameError | None, wanted: str) -> tuple[Reason, str]:
    """The error type and message for a worker that sent ``got`` where ``wanted`` belonged."""
    if isinstance(got, FrameError):
        return FRAME_FAULTS.get(type(got), Reason.PROTOCOL_ERROR), f"{type(got).__name__}: {got}"
    return Reason.PROTOCOL_ERROR, f"expected {wanted}, got {'end of stream' if got is None else type(got).__name__}"


def after_terminal(trailing: list[Message | FrameError]) -> Outcome:
    """A worker spoke again after its terminal message: its result cannot be trusted."""
    if any(isinstance(message, TERMINAL) for message in trailing):
        return failure(Reason.PROTOCOL_DUPLICATE_TERMINAL, "the worker sent a second terminal message", True)
    kinds = sorted({type(message).__name__ for message in trailing})
    return failure(Reason.PROTOCOL_MESSAGE_AFTER_TERMINAL, f"the worker sent {', '.join(kinds)} after its result", True)


def interrupted(job: JobState, proof: dict[str, Any]) -> Outcome:
    """What a stop ends a job with; a supervisor stopping, or its timeout, is uncertain if the job had begun."""
    launched = proof.get("launched", True)
    if job.stop is StopReason.LIMIT and job.breach is not None:
        return failure(job.breach.error_type, job.breach.message, True, **job.breach.proof, **proof)
    if job.stop is StopReason.CANCEL:
        data = {"status": Status.CANCELLED, "reason": job.cancel_reason, **proof}
        return Outcome(EventName.CANCELLED, data, exit_status=proof.get("exit_status"))
    if job.stop is StopReason.TIMEOUT and launched:
        return failure(Reason.TIMEOUT, f"job exceeded timeout_ms={job.timeout_ms}", True, **proof)
    if job.stop is StopReason.TIMEOUT:
        return failure(Reason.TIMEOUT, f"no worker slot within timeout_ms={job.timeout_ms}", False)
    if launched:
        return failure(Reason.SUPERVISOR_STOPPED, "the supervisor stopped before the job finished", True, **proof)
    return failure(Reason.SUPERVISOR_STOPPED, "the supervisor stopped before the job started", False, **proof)
