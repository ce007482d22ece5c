"""How a job ends: the terminal event's name and data, and what a worker's exit status means."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

# Signals the kernel sends a process for its own fault, as opposed to someone killing it.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS})


@dataclasses.dataclass(frozen=True)
class Outcome:
    event: str  # completed | failed | cancelled
    data: dict[str, Any]
    output: dict[str, Any] | None = None


def failure(error_type: str, message: str, uncertain: bool, **proof: Any) -> Outcome:
    data = {"status": "failed", "error_type": error_type, "message": message, "uncertain_outcome": uncertain}
    return Outcome("failed", {**data, **proof})


def exit_failure(status: int | None, pid: int) -> Outcome:
    """A worker that left before its result: crashed, killed by someone else, or exited."""
    if status is None:
        return failure("worker_exited", "worker exited before a result; its status is unknown", True, pid=pid)
    if status >= 0:
        return failure(
            "worker_exited", f"worker exited with status {status} before a result", True, exit_status=status, pid=pid
        )
    sig = signal.Signals(-status)
    if sig == signal.SIGXCPU:
        error_type, how = "cpu_limit_exceeded", "reached its CPU time limit"
    elif sig in CRASH_SIGNALS:
        error_type, how = "worker_crashed", "crashed"
    else:
        error_type, how = "worker_killed", "was killed from outside the supervisor"
    return failure(
        error_type,
        f"worker {how} ({sig.name}) before a result",
        True,
        exit_status=status,
        exit_signal=sig.name,
        pid=pid,
    )
