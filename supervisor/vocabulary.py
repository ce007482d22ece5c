"""The names every layer of the supervisor shares, each spelled once: a job's statuses, its terminal events,
where a live job is (its phase), and the roles a token gives. The worker never sees them (the names both sides
share are protocol/vocabulary.py).

It imports nothing of ours, so each layer may import it, the console's CLI too (which reaches only the journal).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Literal


class Status(enum.StrEnum):
    """A job's status, as the journal keeps it and the contract shows it: running until it ended, then its last
    event's name."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_EVENTS = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)  # a job's last event: one of them, once


class Phase(enum.StrEnum):
    """Where a live job is: the runner's state machine moves it only forward (supervisor/jobs/phases.py)."""

    QUEUED = "queued"  # admitted and durable, waiting for a worker slot
    LAUNCHING = "launching"  # a slot taken: its worker is being spawned, journaled, bounded and sent Start
    RUNNING = "running"  # its worker's frames are relayed to the journal
    SETTLING = "settling"  # the outcome is decided: the worker is being killed or reaped, the terminal written
    SETTLED = "settled"  # the terminal event is committed


class WaitingFor(enum.StrEnum):
    """What a queued job waits for (supervisor/jobs/slots.py): a free slot of MAX_CONCURRENCY, or one of its crew's
    own (CREW_MAX_CONCURRENCY), its crew being at its bound."""

    SLOT = "slot"
    CREW = "crew"


# Where a job of status running is, as the operator's API and the CLI show it (settled, its status says the rest).
LIVE_PHASES = (Phase.QUEUED, Phase.LAUNCHING, Phase.RUNNING, Phase.SETTLING)
# Where a cancel still reaches a job: a settling job's outcome is decided.
STOPPABLE_PHASES = (Phase.QUEUED, Phase.LAUNCHING, Phase.RUNNING)


class Role(enum.StrEnum):
    """Whose token a request carries, from least to most it may do (``ROLES``); each route declares the least it
    needs (``supervisor/scopes.py``)."""

    OBSERVER = "observer"  # reads: health, jobs, events, output, metrics, workers
    OPERATOR = "operator"  # and cancels, archives, asks for stacks; never starts
    CONTRACT = "contract"  # the contract's token (BEARER_TOKEN): everything


ROLES = (Role.OBSERVER, Role.OPERATOR, Role.CONTRACT)


def literal(names: Iterable[enum.StrEnum]) -> Any:
    """``names`` as a ``Literal`` of their plain text: a pydantic model's (or FastAPI parameter's) JSON schema then
    lists them inline, as the contract's always has, where an Enum would add a definition of its own."""
    return Literal[tuple(name.value for name in names)]
