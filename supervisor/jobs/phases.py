"""A live job's phases (named in ``supervisor/enums.py``, for every layer), the moves between them, and why a
job is stopped: the state machine of each live job (``LiveJob.move``).

A job moves only forward, through ``MOVES``; ``docs/architecture.md`` draws this table (``diagram()``), and a
test keeps the drawing true. A stop is asked for with a ``StopReason``: the first one asked wins, and none is
taken once the job is settling (its outcome is decided then).
"""

from __future__ import annotations

import enum

from supervisor.enums import Phase

MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.LAUNCHING, Phase.SETTLING}),  # a slot; or stopped, timed out while waiting
    Phase.LAUNCHING: frozenset({Phase.RUNNING, Phase.SETTLING}),  # Start sent; or the launch failed
    Phase.RUNNING: frozenset({Phase.SETTLING}),  # the worker answered, died or broke the protocol; or stopped
    Phase.SETTLING: frozenset({Phase.SETTLED}),
    Phase.SETTLED: frozenset(),
}


class StopReason(enum.StrEnum):
    CANCEL = "cancel"  # an operator's or client's cancel
    TIMEOUT = "timeout"  # the job's timeout_ms, counted from admission
    LIMIT = "limit"  # a limit it broke (memory, CPU, processes, events, output): killed with no grace
    DRAIN = "drain"  # the queue closed while it waited: it never starts
    STOP = "stop"  # the supervisor is stopping


class IllegalMove(RuntimeError):
    """A move ``MOVES`` does not allow: a bug in the supervisor (``LiveJob``), never a job's doing."""


def check_move(current: Phase, to: Phase) -> None:
    if to not in MOVES[current]:
        raise IllegalMove(f"a job cannot move from {current} to {to}")


def diagram() -> str:
    """``MOVES`` as a Mermaid state diagram, for docs/architecture.md."""
    lines = ["stateDiagram-v2", f"    [*] --> {Phase.QUEUED}"]
    lines += [f"    {current} --> {to}" for current in Phase for to in sorted(MOVES[current], key=list(Phase).index)]
    lines.append(f"    {Phase.SETTLED} --> [*]")
    return "\n".join(lines)
