"""The names every layer of the supervisor shares, each spelled once: a job's statuses, its events, where a
live job is (its phase), the supervisor's own state, and the roles a token gives. The worker never sees them (the
names both sides share are protocol/vocabulary.py).

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


class EventName(enum.StrEnum):
    """A job's events, as the journal keeps them and its stream sends them: ``started`` once its worker runs it, its
    ``chunk``s, then one terminal event, named as the status it leaves the job in."""

    STARTED = "started"
    CHUNK = "chunk"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_EVENTS = (EventName.COMPLETED, EventName.FAILED, EventName.CANCELLED)  # a job's last event: one, once
ENDED = tuple(Status(event) for event in TERMINAL_EVENTS)  # a job's status once it ended: its terminal event's name


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


class Lifecycle(enum.StrEnum):
    """The supervisor's own state, from ``Supervisor.open`` to the end of its ``stop``: set by the ``Supervisor``
    alone, read by admission (whether a start is admitted), a job admitted late (how it ends) and ``/health``."""

    OPENING = "opening"  # its parts coming up: nothing listens yet
    OPEN = "open"  # serving: starts are admitted
    CLOSING = "closing"  # no new starts (503); the admissions under way are made durable and launched
    DRAINING = "draining"  # the queue closed: queued jobs fail, certain; running ones get DRAIN_SECONDS
    STOPPING = "stopping"  # every job left is killed, then the services stop
    STOPPED = "stopped"

    @property
    def admits(self) -> bool:
        """New starts are admitted (``/health`` says ``ready``); from a drain's or a stop's start, they answer 503."""
        return self in (Lifecycle.OPENING, Lifecycle.OPEN)

    @property
    def queue_closed(self) -> bool:
        """No queued job starts: one admitted now ends at once, as those queued did."""
        return self in (Lifecycle.DRAINING, Lifecycle.STOPPING, Lifecycle.STOPPED)

    @property
    def stopping(self) -> bool:
        """Every job ends now, killed if it runs."""
        return self in (Lifecycle.STOPPING, Lifecycle.STOPPED)


class LauncherName(enum.StrEnum):
    """How a job's worker is started (``LAUNCHER``): what ``/health`` and the metrics name its launcher."""

    FORKSERVER = "forkserver"  # forked by a fork server that imported CrewAI once (supervisor/processes/forkserver.py)
    SPAWN = "spawn"  # a fresh interpreter (supervisor/processes/launcher.py)


class Readiness(enum.StrEnum):
    """``/health``'s ``status``: whether the supervisor admits new starts (``Lifecycle.admits``)."""

    READY = "ready"
    DRAINING = "draining"  # from a drain's start or a stop's: a start answers 503


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
